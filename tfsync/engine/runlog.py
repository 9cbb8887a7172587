"""A run's log: what it counted and what it leaves behind, in one place.

The ledger (pushes, updates, samples, clocks and grants, counted as the simulator counts:
tfsync.policy.ledger), the records (metrics.jsonl, TensorBoard, summary.json:
``records.RunRecorder``), the phase timeline, the switches, the checkpoints taken (the
files: ``checkpoints.CheckpointDir``), the recoveries, the test curve, and the run's
clock (when it started, when training began, and the counts then). The engine's loop
counts through it and has it record what its parts decided (a switch, a scale, a
recovery); the summary reads it. Nothing here talks to a cluster: a checkpoint is given
the generation to save.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Callable

import numpy as np

from ..policy.base import Push, PushMode
from ..policy.ledger import Ledger
from ..policy.pushlog import push_record
from .checkpoints import CheckpointDir
from .control import BATCH, MODE, MODE_AGGREGATE, ROUND, SEQ
from .phase import EngineError
from .records import RunRecorder

logger = logging.getLogger(__name__)


class RunLog:
    """``on_event(kind, fields)``: called after each event is recorded (the engine's
    observers)."""

    def __init__(self, run_dir: str, workers: int, tensorboard: bool = True,
                 on_event: Callable[[str, dict], None] | None = None):
        self.run_dir = run_dir
        self.ledger = Ledger(workers)
        self.recorder = RunRecorder(run_dir, tensorboard=tensorboard)
        self.timeline: list[dict] = []      # one entry per phase begun: protocol, samples, time, rate
        self.switches: list[dict] = []
        self.scales: list[dict] = []        # one entry per change of the worker count (tfsync.engine.scaling)
        self.checkpoints: list[dict] = []   # checkpoint events: path, updates, samples, pushes, why
        self.recoveries: list[dict] = []    # one entry per restart after a lost task
        self.evals: list = []               # the test curve (tfsync.engine.evaluator.Evaluation)
        self.on_event = on_event
        self.started_at = time.time()
        self.train_started: float | None = None   # when this run's training began
        self.train_counts = (0, 0)   # pushes and samples then (a resumed run's: not zero)
        self.train_cpu_at = 0.0      # this process's CPU seconds when training began
        self.train_cpu_s = 0.0       # ... and those it spent while it trained (training_ended)
        self._ckpt_dir = CheckpointDir(os.path.join(run_dir, "checkpoints"), keep=3)
        self._last_ckpt_updates = 0

    def begin(self, workers: int, ps: int, resume: bool) -> None:
        """The run starts now: the records' first line."""
        self.started_at = time.time()
        self.recorder.begin(self.started_at, resume=resume, workers=workers, ps=ps)

    def training_began(self) -> None:
        """Rates over training time start here (tfsync.base.progress, the summary)."""
        self.train_started = time.time()
        self.train_counts = (self.ledger.pushes, self.ledger.samples)
        self.train_cpu_at, self.train_cpu_s = time.process_time(), 0.0

    def training_ended(self) -> None:
        """The coordinator's CPU while it trained (``coordinator_load``) ends here."""
        self.train_cpu_s = time.process_time() - self.train_cpu_at

    def since(self, now: float | None = None) -> float:
        """Seconds on the records' time base."""
        return self.recorder.since(now)

    def event(self, kind: str, **fields) -> None:
        """Something that happened to the run: metrics.jsonl, then ``on_event``."""
        self.recorder.event(kind, **fields)
        if self.on_event is not None:
            self.on_event(kind, fields)

    # -- pushes ---------------------------------------------------------------------------
    def record(self, result, protocol: str, predicted: float | None,
               turnaround: float | None = None) -> tuple[Push, dict]:
        """Count a finished step's row (``[worker, *token, start, end, loss, version,
        rate, landed]``) in the ledger and write its metrics line; returns both. A loss that
        is not finite ends the run (as TerminateOnNaN: nothing after it is counted or
        saved). ``turnaround``: the push's, where the PS measured it (``Ledger.push``)."""
        r = np.asarray(result)
        wid, token, (start, end, loss, version, rate) = r[0], r[1:5].astype(np.int64), r[5:10]
        s, w = self.ledger, int(wid)
        if int(token[SEQ]) != s.clocks[w] + 1:
            logger.warning("worker %d pushed step %d, expected %d", w, int(token[SEQ]), s.clocks[w] + 1)
        if not math.isfinite(loss):
            raise EngineError(f"worker {w}'s step {int(token[SEQ])} had a loss of {loss} after {s.updates} updates: "
                              "training diverged (lower the learning rate, check the data for NaN); the last good "
                              f"checkpoint is {self.last_good_checkpoint()}")
        mode = PushMode.AGGREGATE if int(token[MODE]) >= MODE_AGGREGATE else PushMode.APPLY   # AGGREGATE, ROUND
        now = time.time()
        push = s.push(w, int(token[BATCH]), mode, int(token[ROUND]), int(version), start=float(start),
                      end=float(end), arrival=now, loss=float(loss), turnaround=turnaround)
        line = push_record(push, time=self.since(now), pushes=s.pushes, updates=s.updates,
                           samples=s.samples, protocol=protocol, lr=float(rate), predicted=predicted)
        self.recorder.push(line)
        return push, line

    # -- phases and switches --------------------------------------------------------------
    def begin_phase(self, phase, base_lr: float | None, stats_of_previous: dict | None = None) -> dict:
        """A timeline entry for ``phase`` starting now (and the previous one's final stats)."""
        if stats_of_previous is not None and self.timeline:
            self.timeline[-1]["stats"] = stats_of_previous
        s = self.ledger
        start = {"protocol": phase.policy.name, "samples": s.samples, "updates": s.updates,
                 "time": round(self.since(), 4), "policy": phase.policy.describe(),
                 "lr_scale": phase.lr_scale, "lr": None if base_lr is None else base_lr * phase.lr_scale}
        self.timeline.append(start)
        self.recorder.phase(start, s.pushes, len(self.timeline) - 1)
        return start

    def switched(self, event: dict) -> None:
        self.switches.append(event)
        self.event("switch", **event)

    def scaled(self, event: dict) -> None:
        self.scales.append(event)
        self.event("scaled", **event)

    def recovered(self, recovery: dict, kind: str | None = None, **fields) -> None:
        """A restart after a lost task (``recovery``: the task, what was lost, the
        checkpoint, the seconds); with ``kind``, the event that says so (its ``fields``,
        default the recovery's)."""
        self.recoveries.append(recovery)
        if kind is not None:
            self.event(kind, **(fields or recovery))

    # -- checkpoints ------------------------------------------------------------------------
    def updates_to_checkpoint(self, every: int) -> int | None:
        """Updates until a checkpoint every ``every`` updates is due (None: none are taken)."""
        return max(every - (self.ledger.updates - self._last_ckpt_updates), 0) if every else None

    def checkpoint_due(self, every: int) -> bool:
        """Whether ``every`` updates have passed since the last checkpoint (0: never due)."""
        return self.updates_to_checkpoint(every) == 0

    def checkpoint(self, gen, state: Callable[[], dict], why: str) -> str:
        """Save ``gen``'s weights and ``state()`` (the ledger and the policy's, beside them);
        never weights that went non-finite: the run ends instead, and the last checkpoint
        stays the last good one."""
        t = time.time()
        bad = gen.non_finite()
        if bad:
            raise EngineError(f"the weights are no longer finite after update {self.ledger.updates} ({bad[0]} has "
                              f"NaN or inf; training diverged: lower the learning rate); the last good checkpoint "
                              f"is {self.last_good_checkpoint()}")
        s = self.ledger
        path = self._ckpt_dir.save(gen, s.updates, state())
        self._last_ckpt_updates = s.updates
        self.checkpoints.append({"path": path, "updates": s.updates, "samples": s.samples, "pushes": s.pushes,
                                 "why": why, "seconds": round(time.time() - t, 4), "workers": s.num_workers})
        self.event("checkpoint", path=path, updates=s.updates, why=why, samples=s.samples, pushes=s.pushes,
                   round=s.round, workers=s.num_workers)
        return path

    def last_good_checkpoint(self) -> str:
        """The path of the newest checkpoint (only finite weights are saved), or "none"."""
        return self.checkpoints[-1]["path"] if self.checkpoints else "none"

    def rewind(self, checkpoint: dict, why: str) -> None:
        """Go back to the counters of ``checkpoint`` (a checkpoint event: samples, updates,
        pushes): what came after it is trained again and its records are set aside."""
        self.ledger.rewind(*(checkpoint.get(k, 0) for k in ("samples", "updates", "pushes")))
        self.rewound(why)

    def rewound(self, why: str) -> None:
        """The ledger went back (a rewind, or a policy's undo): the push records after its
        count are set aside."""
        self._last_ckpt_updates = self.ledger.updates
        self.recorder.rewind(self.ledger.pushes, why)

    # -- the test curve -----------------------------------------------------------------------
    def log_eval(self, e) -> None:
        """Keep and record a point of the test curve."""
        self.evals.append(e)
        self.recorder.evaluation(e.to_dict(), self.ledger.pushes if e.pushes is None else e.pushes)
