"""What comes back from the workers: the engine's loop (tfsync.engine.loop) waits for the
next finished step (watching for dead tasks: a lost worker is recovered, any other loss
ends the run; a step past ``timeout_s``; the policy's timers); the run log counts it
(``RunLog.record``)."""

from __future__ import annotations

import collections
import logging
import queue
import re
import time
from typing import TYPE_CHECKING

import tensorflow as tf

from .phase import EngineError
from .pilot import ROUND_CLOSED, is_marker
from .recovery import recover_lost_workers

if TYPE_CHECKING:
    from .loop import Loop

logger = logging.getLogger(__name__)


def next_result(loop: Loop):
    """The next finished step of the current generation; None when a timer is due, or
    when a lost worker's recovery left nothing in flight (while draining, nothing more is
    granted); ROUND_CLOSED after a round the PS closed itself (tfsync.engine.pilot).
    The rows come in the batches the links drained: the rest of a batch waits in
    ``loop.held``, and goes with its generation."""
    waited = 0.0
    while True:
        held = loop.held
        if held is not None and held[0] is not loop.lifecycle.current:
            held = loop.held = None   # rows of a replaced generation
        if held is not None:
            value = held[1].popleft()
            if not held[1]:
                loop.held = None
            if is_marker(value):   # the PS closed a round itself
                loop.pilot.observe(value)
                return ROUND_CLOSED
            return value
        if time.monotonic() - loop.lifecycle.dead_checked > 0.5:  # results may keep coming from others
            loop.lifecycle.dead_checked = time.monotonic()
            if raise_if_dead(loop) and loop.in_flight() == 0:
                return None  # a lost worker's recovery replaced the cluster: nothing is outstanding
            loop.lifecycle.channel.check()
        timeout = 0.5
        if loop.wake_at is not None:
            timeout = max(0.0, min(timeout, loop.wake_at - time.time()))
        try:
            gen, value, err = loop.lifecycle.results.get(timeout=timeout)
        except queue.Empty:
            waited += timeout
            if loop.wake_at is not None and time.time() >= loop.wake_at:
                return None
            if raise_if_dead(loop) and loop.in_flight() == 0:
                return None  # (a drain, the workload done: the recovery granted nothing)
            if waited > loop.timeout_s:
                raise EngineError(
                    f"no step finished in {loop.timeout_s:.0f} s (outstanding steps: "
                    f"{loop.in_flight()}); raise train.timeout_s if steps are this slow")
            continue
        if gen is not loop.lifecycle.current:
            continue  # a step of a replaced generation
        if err is not None:
            time.sleep(0.2)  # let the OS report a task that just died
            if raise_if_dead(loop, err) or loop.lifecycle.recovering:
                # a closure of a lost worker: the cluster was restarted from its state, and
                # while draining nothing is granted again (waiting would end in the timeout)
                if loop.in_flight() == 0:
                    return None
                continue
            err = root_error(loop, gen, err)
            raise EngineError(f"a training step failed: {type(err).__name__}: {error_line(err)}") from err
        loop.backlog.note(loop.lifecycle.results.qsize())
        loop.held = (gen, collections.deque(value))


class Backlog:
    """How far the loop falls behind the links: each time it takes a drained batch, the
    batches already waiting behind it (none while it keeps up)."""

    def __init__(self):
        self.batches, self.waiting, self.most = 0, 0, 0

    def note(self, waiting: int) -> None:
        self.batches += 1
        self.waiting += waiting
        self.most = max(self.most, waiting)

    @property
    def mean(self) -> float:
        return self.waiting / self.batches if self.batches else 0.0


def root_error(loop: Loop, gen, err: BaseException, wait_s: float = 1.0) -> BaseException:
    """The error that failed the step: where ``err`` says only that the closure was
    cancelled (ClusterCoordinator cancels every closure once one fails, and which one's
    fetch reports first is a race), the failed closure's own error if it arrives within
    ``wait_s``; else ``err``."""
    if not isinstance(err, tf.errors.CancelledError):
        return err
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            other_gen, _, other = loop.lifecycle.results.get(timeout=left)
        except queue.Empty:
            break
        if other_gen is gen and other is not None and not isinstance(other, tf.errors.CancelledError):
            return other
    return err


def error_line(err: BaseException) -> str:
    """The line of a TF error that says what went wrong: a step's error starts with "Graph
    execution error:" and the stack of where the failing op was defined."""
    # several workers failing at once: "2 root error(s) found." then "(0) INVALID_ARGUMENT:  <what>"
    lines = [re.sub(r"^\(\d+\) [A-Z_]+:\s*", "", line.strip()) for line in str(err).splitlines()]
    noise = ("Graph execution error", "Detected at node", "File ", "[[", "Additional GRPC", ":UNKNOWN:")
    said = [line for line in lines if line and not line.startswith(noise)
            and not re.match(r"\d+ (root error\(s\) found|successful operations)", line)]
    return said[0] if said else next((line for line in lines if line), type(err).__name__)


def raise_if_dead(loop: Loop, cause: BaseException | None = None) -> bool:
    """Recover from lost workers (True if it did); raise for any other dead task."""
    # one look at the tasks: a second could see a death the first did not (a hook's report
    # arriving in between) and end the run for a worker that can be recovered
    dead = loop.lifecycle.current.cluster.dead_tasks()
    if loop.lifecycle.recovering is None and recover_lost_workers(loop, loop.policy, dead):
        return True
    lost = loop.lifecycle.recovering or ()
    dead = [d for d in dead if d[0] != "worker" or d[1] not in lost]
    if dead:
        job, i, code = dead[0]
        raise EngineError(
            f"task {job}:{i} died (exit code {code}); logs in {loop.log.run_dir}/logs, "
            f"last checkpoint in {loop.log.run_dir}/checkpoints") from cause
    return False
