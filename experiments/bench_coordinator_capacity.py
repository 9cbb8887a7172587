"""How many pushes a second the coordinator's Python sustains on one core (issue 55), with
no TF task: the engine's real loop, run log (metrics.jsonl and TensorBoard), ledger,
policy and observers, fed finished steps' rows by a stand-in PS.

The stand-in takes the tokens the loop releases and answers with the rows the real PS
would queue (``[worker, *token, start, end, loss, version, rate, landed]``; for rounds
the PS closes itself, the rows and the marker row of each round), handed to the loop in
drained blocks of ``--block`` rows, as the links hand them on (tfsync.engine.links). So
the figure is the CPU of everything the coordinator does per push in Python, and
nothing else: the remote calls' own cost (TensorFlow's runtime, gRPC) comes on top, and
``bench_coordinator_scale.py`` measures the whole on real clusters.

For each protocol (ASP; BSP with rounds the coordinator closes; BSP with rounds on the
PS; LB-BSP) and block size: pushes/s and CPU per push (this process's CPU time over the
pushes), median of ``--repeats``. Writes results/bench_coordinator_capacity.csv and .png.

    python experiments/bench_coordinator_capacity.py --workers 8 --pushes 20000
"""

from __future__ import annotations

import argparse
import collections
import csv
import os
import queue
import shutil
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

from tfsync import policy as P  # noqa: E402
from tfsync.engine.callbacks import CallbackList, ControllerLink  # noqa: E402
from tfsync.engine.commands import Controller  # noqa: E402
from tfsync.engine.control import MODE, MODE_ROUND, ROUND, ROW_LEN  # noqa: E402
from tfsync.engine.loop import Loop  # noqa: E402
from tfsync.engine.phase import Phase  # noqa: E402
from tfsync.engine.runlog import RunLog  # noqa: E402
from tfsync.engine.scaling import Elastic  # noqa: E402
from testbed_bench import write_csv  # noqa: E402

PROTOCOLS = {"asp": ("asp", True), "bsp (coordinator rounds)": ("bsp", False), "bsp (PS rounds)": ("bsp", True),
             "lbbsp": ("lbbsp", True)}
STEP_S = 0.004   # the stand-in workers' step: a model of a few milliseconds


class StandInPS:
    """The PS's queues, counted as the PS counts: tokens per worker in, finished steps'
    rows out, in blocks; the rounds it closes itself (``rounds``) with their markers."""

    def __init__(self, workers: int, block: int):
        self.block, self.clock = block, time.time()
        self.gates = [collections.deque() for _ in range(workers)]
        self.out: collections.deque = collections.deque()
        self.updates, self.halted, self.round_call, self.sized = 0, 0, None, 0

    # -- the channel's calls ---------------------------------------------------------------
    def release(self, rows: np.ndarray) -> None:
        for r in rows:
            if r[1 + MODE] != MODE_ROUND:   # (a round the PS closes: its rows come with its marker)
                self.gates[int(r[0])].append(r[1:].copy())

    def barrier(self, num_required: int, rows: np.ndarray) -> None:
        if num_required:
            self.updates += 1
        self.release(rows)

    def rounds(self, k: int, epoch: int, tokens: np.ndarray, version: int) -> None:
        """Close rounds 1..k, the first the one granted (``tokens`` less one round), and
        release rounds 2..k (``PSControl.rounds``)."""
        self.round_call = [k, epoch, tokens - [0, 0, 0, 1, 1], 0, version]

    def set_sizes(self, sizes) -> None:
        self.sized = int(np.asarray(sizes)[0])

    # -- the rows the workers' steps leave -----------------------------------------------------
    def _row(self, worker: int, token, version: int) -> np.ndarray:
        self.clock += STEP_S / len(self.gates)
        return np.array([worker, *token, self.clock - STEP_S, self.clock, 0.5, version, 0.01, self.clock])

    def _steps(self) -> list:
        if self.round_call is not None:
            return self._round()
        rows = []
        for w, gate in enumerate(self.gates):
            if gate:
                token = gate.popleft()
                rows.append(self._row(w, token, self.updates))
                self.updates += int(token[MODE]) == 0
        return rows

    def _round(self) -> list:
        k, epoch, tokens, i, version = self.round_call
        rows = [self._row(int(t[0]), t[1:] + [0, 0, i, i], self.updates) for t in tokens]
        self.updates += 1
        more = i + 1 < k and self.halted < epoch
        self.round_call[3] += 1
        if not more:
            self.round_call = None
        closed = tokens[0, 1 + ROUND] + i
        marker = [-1, len(tokens), MODE_ROUND, closed, float(more), self.clock, self.clock, max(self.sized, version),
                  self.updates, 0.01, 0]
        return rows + [np.array(marker, np.float64)]

    def next_block(self) -> np.ndarray:
        while len(self.out) < self.block:
            rows = self._steps()
            if not rows:
                break
            self.out.extend(rows)
        n = min(self.block, len(self.out))
        return np.array([self.out.popleft() for _ in range(n)]).reshape(n, ROW_LEN)


class Results:
    """The lifecycle's queue of results: the stand-in PS's next block, at once."""

    def __init__(self, ps: StandInPS, gen, blocks: bool):
        self.ps, self.gen, self.blocks = ps, gen, blocks
        self.held: collections.deque = collections.deque()

    def get(self, timeout=None):
        if self.blocks:
            block = self.ps.next_block()
            if not len(block):
                raise queue.Empty
            return self.gen, block, None
        if not self.held:
            self.held.extend(self.ps.next_block())
        if not self.held:
            raise queue.Empty
        return self.gen, self.held.popleft(), None

    def qsize(self) -> int:
        """Batches waiting behind the one taken: the stand-in makes each when it is asked."""
        return 0

    def put(self, item) -> None:
        raise RuntimeError(f"the stand-in cluster failed: {item}")


def stand_in_lifecycle(workers: int, block: int) -> SimpleNamespace:
    """What the loop uses of a lifecycle, its generation and channel; calls to the PS go
    to the stand-in at once."""
    ps = StandInPS(workers, block)
    control = SimpleNamespace(halt=lambda epoch: setattr(ps, "halted", epoch), set_sizes=ps.set_sizes)
    gen = SimpleNamespace(links=SimpleNamespace(set_linger=lambda s: None), control=control,
                          cluster=SimpleNamespace(dead_tasks=lambda: []), set_hyper=lambda **kw: None)
    channel = SimpleNamespace(release=ps.release, barrier=ps.barrier, call=lambda fn: fn(), check=lambda: None,
                              sync=lambda: None)
    return SimpleNamespace(current=gen, channel=channel, results=Results(ps, gen, blocks=True),
                           recovering=None, monitor=SimpleNamespace(latest=lambda: {}),
                           returned=lambda: [], on_close=[], workers=workers, next_cluster=None, ps=ps,
                           sync=lambda: None)


def run_once(protocol: str, ps_rounds: bool, workers: int, pushes: int, block: int, batch: int = 32) -> float:
    """CPU seconds per push of the loop over ``pushes`` pushes."""
    out = tempfile.mkdtemp(prefix="capacity-")
    try:
        log = RunLog(out, workers, tensorboard=True)
        log.begin(workers, 1, resume=False)
        life = stand_in_lifecycle(workers, block)
        callbacks = CallbackList([ControllerLink(Controller())])
        loop = Loop(life, log, lambda p, n: 1.0, Elastic("local", None, None, None), Controller(),
                    on_push=lambda push, line: callbacks.call("on_push", None, push, line),
                    on_step_done=callbacks.step_done, epoch_samples=10 ** 9, ps_rounds=ps_rounds)
        # the PS-run rounds' call, made at once (the real one runs in a thread of its own)
        loop.pilot._run = lambda gen, k, epoch, tokens, version: life.ps.rounds(k, epoch, tokens, version)
        policy = P.get(protocol, batch_size=batch) if protocol == "lbbsp" else \
            P.get(protocol, sizer=P.BatchSizer(batch))
        log.training_began()
        t0 = time.process_time()
        loop.run_phase(Phase(policy), pushes * batch)
        used = time.process_time() - t0
        log.recorder.close()
        assert log.ledger.pushes >= pushes, (protocol, log.ledger.pushes)
        return used / log.ledger.pushes
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--pushes", type=int, default=20000, help="pushes per run")
    p.add_argument("--blocks", default="1,8,32", help="rows per drained block, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--label", default="", help="a name for this code's rows (e.g. before, after)")
    p.add_argument("--out", default="results", help="results folder")
    args = p.parse_args(argv)
    blocks = [int(b) for b in args.blocks.split(",")]
    rows = []
    for name, (protocol, ps_rounds) in PROTOCOLS.items():
        for block in blocks:
            per = statistics.median(run_once(protocol, ps_rounds, args.workers, args.pushes, block)
                                    for _ in range(args.repeats))
            rows.append({"code": args.label, "protocol": name, "workers": args.workers, "block": block,
                         "cpu_ms_per_push": round(1000 * per, 4), "pushes_per_core_s": round(1 / per)})
            print(f"{args.label:8s} {name:26s} block {block:3d}: {1000 * per:.3f} ms a push, "
                  f"{1 / per:,.0f} pushes/s on one core", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_coordinator_capacity.csv")
    old = []
    if args.label and os.path.exists(path):   # other code's rows stay beside these
        with open(path) as f:
            old = [r for r in csv.DictReader(f) if r["code"] != args.label]
    write_csv(path, old + rows)
    _plot(old + rows, os.path.join(args.out, "bench_coordinator_capacity.png"))
    print(f"wrote {path}")
    return 0


def _plot(rows, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    codes = list(dict.fromkeys(r["code"] for r in rows))
    names = list(dict.fromkeys(r["protocol"] for r in rows))
    blocks = sorted({int(r["block"]) for r in rows})
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.4), sharey=True)
    for ax, name in zip(np.atleast_1d(axes), names):
        for code in codes:
            mine = sorted((int(r["block"]), float(r["cpu_ms_per_push"])) for r in rows
                          if r["code"] == code and r["protocol"] == name)
            ax.plot([b for b, _ in mine], [v for _, v in mine], "o-", label=code or "this code")
        ax.axhline(0.2 if name == "asp" else 0.1, color="grey", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(blocks, [str(b) for b in blocks])
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("rows per drained block")
    np.atleast_1d(axes)[0].set_ylabel("coordinator CPU ms per push (Python)")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.suptitle(f"the coordinator's Python per push, {rows[0]['workers']} workers (dotted: issue 55's target)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
