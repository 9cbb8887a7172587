"""What comes back from the workers: the engine's loop (tfsync.engine.loop) waits here
for the next finished step (``Arrivals.next``), watching for dead tasks (it hands them to
the loop, which recovers a lost worker or ends the run: ``on_dead``), for a step past
``timeout_s`` and for the policy's timers; the run log counts it (``RunLog.record``)."""

from __future__ import annotations

import collections
import logging
import queue
import re
import time
from typing import Callable

import tensorflow as tf

from .phase import EngineError

logger = logging.getLogger(__name__)

DEAD_CHECK_S = 0.5   # how often the tasks are looked at while results keep coming


class Arrivals:
    """The finished steps of the lifecycle's current generation, as the links drained
    them: what it holds is its own (the rest of a drained batch, the backlog, when the
    tasks were last looked at). ``in_flight()``: the steps granted and not yet counted;
    ``on_dead(cause)``: the loop's answer to dead tasks of the current generation (True
    where it recovered, having replaced the cluster; it raises for a loss it cannot
    recover)."""

    def __init__(self, lifecycle, in_flight: Callable[[], int], on_dead: Callable[[BaseException | None], bool],
                 timeout_s: float):
        self.lifecycle, self.in_flight, self.on_dead, self.timeout_s = lifecycle, in_flight, on_dead, timeout_s
        self.held = None              # (generation, rows) of a drained batch not yet taken
        self.backlog = Backlog()      # the batches waiting behind each one taken
        self.dead_checked = 0.0       # when the tasks were last looked at (monotonic)

    def next(self, wake_at: Callable[[], float | None]):
        """The next finished step's row (a round's marker row too: ``pilot.is_marker``);
        None when a timer is due (``wake_at()``, read at each pass: a recovery while waiting
        may set another), or when a lost worker's recovery left
        nothing in flight (while draining, nothing more is granted). The rows come in the
        batches the links drained: the rest of a batch waits in ``held``, and goes with
        its generation."""
        waited, lifecycle = 0.0, self.lifecycle
        while True:
            held = self.held
            if held is not None and held[0] is not lifecycle.current:
                held = self.held = None   # rows of a replaced generation
            if held is not None:
                value = held[1].popleft()
                if not held[1]:
                    self.held = None
                return value
            if time.monotonic() - self.dead_checked > DEAD_CHECK_S:  # results may keep coming from others
                self.dead_checked = time.monotonic()
                if self.on_dead(None) and self.in_flight() == 0:
                    return None  # a lost worker's recovery replaced the cluster: nothing is outstanding
                lifecycle.channel.check()
            timeout, at = 0.5, wake_at()
            if at is not None:
                timeout = max(0.0, min(timeout, at - time.time()))
            try:
                gen, value, err = lifecycle.results.get(timeout=timeout)
            except queue.Empty:
                waited += timeout
                if at is not None and time.time() >= at:
                    return None
                if self.on_dead(None) and self.in_flight() == 0:
                    return None  # (a drain, the workload done: the recovery granted nothing)
                if waited > self.timeout_s:
                    raise EngineError(
                        f"no step finished in {self.timeout_s:.0f} s (outstanding steps: "
                        f"{self.in_flight()}); raise train.timeout_s if steps are this slow")
                continue
            if gen is not lifecycle.current:
                continue  # a step of a replaced generation
            if err is not None:
                time.sleep(0.2)  # let the OS report a task that just died
                if self.on_dead(err) or lifecycle.recovering:
                    # a closure of a lost worker: the cluster was restarted from its state, and
                    # while draining nothing is granted again (waiting would end in the timeout)
                    if self.in_flight() == 0:
                        return None
                    continue
                err = root_error(lifecycle.results, gen, err)
                raise EngineError(f"a training step failed: {type(err).__name__}: {error_line(err)}") from err
            self.backlog.note(lifecycle.results.qsize())
            self.held = (gen, collections.deque(value))


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


def root_error(results: queue.Queue, gen, err: BaseException, wait_s: float = 1.0) -> BaseException:
    """The error that failed the step: where ``err`` says only that the closure was
    cancelled (ClusterCoordinator cancels every closure once one fails, and which one's
    fetch reports first is a race), the failed closure's own error if it arrives within
    ``wait_s`` on ``results`` (the lifecycle's queue); else ``err``."""
    if not isinstance(err, tf.errors.CancelledError):
        return err
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            other_gen, _, other = results.get(timeout=left)
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
