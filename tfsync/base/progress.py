"""The progress display of `tfsync run`: samples done of the workload, elapsed training
time, ETA, the protocol running now, steps/s and each worker's batch size and speed;
and ``progress_bar``, the plain bar of `tfsync search` and `tfsync policy`.

Rates are over training time only: from the moment the engine's first generation was up
(its run log's ``train_started``), not from the process start, so the cluster's start-up does not
drag them down. On a terminal the display is a live `rich` progress bar on stderr; else
(a log file, CI) one plain line per tenth of the workload.
"""

from __future__ import annotations

import sys
import time


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, m, s = seconds // 3600, seconds // 60 % 60, seconds % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """``Progress()(engine, policy, total)`` after each push; ``done()`` at the end."""

    def __init__(self, stream=None, interval: float = 0.2, live: bool | None = None):
        self.stream = stream or sys.stderr
        self.interval = interval
        self.live = self.stream.isatty() if live is None else live
        self._bar = self._task = self._engine = None
        self._last, self._decile = 0.0, -1
        self.started = None  # (time, pushes, samples) where training began

    def starting(self, engine) -> None:
        """Said once the run's directory is ready and the cluster starts (20-30 s of silence else)."""
        self._say(f"starting {engine.ps} PS + {engine.workers} workers (run directory {engine.run_dir}) ...")

    def event(self, kind: str, fields: dict) -> None:
        """A scale or a switch, said as it happens (between two progress lines)."""
        if kind == "scaled":
            self._say(f"scaled {fields['from']} -> {fields['to']} workers ({fields['by']}) in "
                      f"{fields['seconds']:.1f} s, at {fields['samples']:,} samples")
        elif kind == "switch":
            self._say(f"switched {fields['from']} -> {fields['to']} ({fields['method']}, {fields['by']}) in "
                      f"{fields['overhead_s']:.2f} s, at {fields['samples']:,} samples")

    def rates(self, engine, now: float | None = None) -> tuple[float, float, float]:
        """(seconds of training, steps/s, samples/s) measured since training began."""
        now = time.time() if now is None else now
        t0, p0, s0 = self.started
        elapsed = max(now - t0, 1e-9)
        return elapsed, (engine.ledger.pushes - p0) / elapsed, (engine.ledger.samples - s0) / elapsed

    def __call__(self, engine, policy, total: int) -> None:
        now = time.time()
        self._engine = engine
        if self.started is None:
            began = engine.runlog.train_started or now   # a resumed run: from its own start
            self.started = (began, *engine.runlog.train_counts) if began < now else \
                (now, engine.ledger.pushes, engine.ledger.samples)
            self._say(f"cluster up; training {total:,} samples")
        if now - self._last < self.interval:
            return
        samples = min(engine.ledger.samples, total)   # the last round may train past the workload
        frac = samples / max(total, 1)
        if not self.live and int(frac * 10) == self._decile:
            return
        self._last, self._decile = now, int(frac * 10)
        elapsed, steps_s, samples_s = self.rates(engine, now)
        eta = (total - samples) / samples_s if samples_s > 0 and elapsed >= 2 else float("inf")  # 2 s: a rate
        info = self._info(engine, policy, steps_s)
        if self.live:
            self._show(total, samples, policy.name, info)
        else:
            self._say(f"{frac:4.0%} {samples:,}/{total:,} samples  elapsed {_clock(elapsed)}  "
                      f"eta {_clock(eta) if eta != float('inf') else '?'}  {policy.name}  {info}")

    @staticmethod
    def _info(engine, policy, steps_s: float) -> str:
        workers = {}
        sizes = engine.ledger.batch_sizes   # in force: the latest grant's, not the last push's (a switch)
        for p in reversed(engine.history):
            if p.worker < len(sizes):   # (a worker a scale removed: gone)
                workers.setdefault(p.worker, p)
        speed = "  ".join(f"w{w} b={sizes[w] or p.batch_size} {p.samples_per_s:,.0f}/s"
                          for w, p in sorted(workers.items()))
        loss = engine.history[-1].loss if engine.history else float("nan")
        return f"{steps_s:.1f} steps/s  loss {loss:.3f}  {speed}"

    def _show(self, total: int, samples: int, protocol: str, info: str) -> None:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar, TaskProgressColumn,
                                       TextColumn, TimeElapsedColumn, TimeRemainingColumn)

            self._bar = Bar(TextColumn("{task.description}"), BarColumn(bar_width=24), TaskProgressColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                            TextColumn("{task.fields[info]}"),
                            console=Console(file=self.stream), transient=False, redirect_stdout=False,
                            redirect_stderr=False)
            self._bar.start()
            self._task = self._bar.add_task(protocol, total=total, info=info)
        self._bar.update(self._task, completed=min(samples, total), description=protocol, info=info)

    def _say(self, line: str) -> None:
        if self._bar is not None:
            self._bar.console.print(line)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def done(self) -> None:
        """End the display, the bar showing where the run ended (steps that finished while
        it drained were not shown as they came)."""
        if self._bar is not None:
            total = self._bar.tasks[0].total
            self._bar.update(self._task, completed=min(self._engine.ledger.samples, total))
            self._bar.stop()
            self._bar = None


def progress_bar(stream=None):
    """``update(done, total, message)``: one line redrawn on a terminal, else a line per
    update; on ``stream`` (default: the process's stderr at the call)."""
    stream = stream or sys.stderr
    t0 = time.time()

    def update(done: int, total: int, message: str = "") -> None:
        frac = done / max(total, 1)
        bar = "#" * int(frac * 24) + "-" * (24 - int(frac * 24))
        # nothing done yet: no rate to project from (not the time so far over a share of 0)
        eta = f"{(time.time() - t0) / frac * (1 - frac):,.0f} s" if frac > 0 else "?"
        line = f"[{bar}] {done}/{total}  eta {eta}  {message}"
        if stream.isatty():
            stream.write("\r" + line[:160].ljust(120) + ("\n" if done >= total else ""))
        else:
            stream.write(line + "\n")
        stream.flush()

    return update
