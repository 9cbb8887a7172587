"""The manager's gRPC service: job status, commands to a running coordinator, metrics.

A coordinator attaches (``Attach``: its step records in, commands out). Status and
commands address a job by id; every command gets an id, is queued for the job's
coordinator, and is carried out at a step boundary (Sync-Switch Fig. 9); the call
answers with the outcome (FAILED_PRECONDITION and the engine's reason when it refused),
or "queued" after ``command_wait_s``. A retried request (same ``request_id``) returns
the first answer and issues nothing new; another command under a used ``request_id`` is
refused, not dropped. Bad input gets INVALID_ARGUMENT with a message; an unknown job
NOT_FOUND. A `tfsync run` job's manager takes no SubmitJob or Resume (StandaloneService).

Step records are summarised into the job store in batches (``flush_every`` records or
``flush_s`` seconds), never one transaction per step.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

import grpc

from tfsync.api.transport import split_address
from tfsync.api.v1 import manager_pb2
from tfsync.base.exits import shown
from tfsync.manager.resources import ResourceBoard, ResourceReports
from tfsync.manager.store import StepSummary, Store, StoreError
from tfsync.manager.store_types import EVENT_KINDS
from tfsync.policy.base import PolicyError
from tfsync.policy.catalogue import from_numbers
from tfsync.policy.checks import check_batch_sizes, check_switch, check_workers

logger = logging.getLogger(__name__)

RECENT_STEPS = 10_000  # step records a StreamMetrics call can replay
MAX_ID = 128  # characters of a request id
MAX_NAME = 256  # characters of a protocol name in a step record or hello
MAX_WORKERS = 100_000  # a sanity bound on a coordinator's worker count (job files have their own)
MAX_DETAIL = 64 * 1024  # characters of a run event's detail_json
PAUSES = ("paused", "unpaused")   # events the status shows while they hold (the run's records keep them)
SWITCH_METHODS = {manager_pb2.SWITCH_METHOD_HOT: "hot", manager_pb2.SWITCH_METHOD_RESTART: "restart"}


def switch_fields(request: manager_pb2.SwitchRequest) -> tuple[dict, str, float | None]:
    """A SwitchRequest read off the wire: (the options in the types the protocol declares,
    the method, the learning-rate factor or None); an unset method is hot. The manager checks
    these before queuing the switch, the coordinator's link hands them to the engine."""
    options = from_numbers(request.protocol, request.options)
    lr_scale = options.pop("lr_scale", None)  # the engine's, not the policy's
    method = "hot" if request.method == manager_pb2.SWITCH_METHOD_UNSPECIFIED else \
        SWITCH_METHODS.get(request.method, str(request.method))
    return options, method, None if lr_scale is None else float(lr_scale)


def one_line(text: str, limit: int = 300) -> str:
    """The first line of ``text``, at most ``limit`` characters."""
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def refuse(context, error: BaseException) -> None:
    """End a call whose request a check refused (``error``: an InvalidCommand, a ConfigError,
    the request's own fault): INVALID_ARGUMENT with the check's line, which the command line
    prints as it is (``tfsync.api.client.InvalidArgument``, exit 2)."""
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, one_line(error))


def hello_problem(hello) -> str | None:
    """What is wrong with an AttachHello's numbers, or None."""
    if not 1 <= hello.workers <= MAX_WORKERS:
        return f"hello.workers {hello.workers}: expected 1..{MAX_WORKERS}"
    if hello.run_id < 0:
        return f"hello.run_id {hello.run_id}: expected the job's run id (>= 0)"
    if hello.step < 0:
        return f"hello.step {hello.step}: expected 0 or more"
    if len(hello.protocol) > MAX_NAME:
        return f"hello.protocol: expected at most {MAX_NAME} characters, got {len(hello.protocol)}"
    return None


def step_problem(rec, workers: int) -> str | None:
    """What is wrong with a StepRecord from a coordinator of ``workers`` workers, or None."""
    if not 0 <= rec.worker < workers:
        return f"step.worker {rec.worker}: expected 0..{workers - 1}"
    for name in ("step", "samples", "batch_size"):
        if getattr(rec, name) < 0:
            return f"step.{name} {getattr(rec, name)}: expected 0 or more"
    for name in ("start", "end"):
        if not math.isfinite(getattr(rec, name)):
            return f"step.{name} {getattr(rec, name)}: expected a finite Unix time"
    if len(rec.protocol) > MAX_NAME:
        return f"step.protocol: expected at most {MAX_NAME} characters, got {len(rec.protocol)}"
    return None


def event_problem(ev) -> str | None:
    if not (math.isfinite(ev.time) and ev.time >= 0):
        return f"event.time {ev.time}: expected a finite Unix time (or 0: now)"
    if len(ev.detail_json) > MAX_DETAIL:
        return f"event.detail_json: expected at most {MAX_DETAIL} characters, got {len(ev.detail_json)}"
    return None


@dataclass
class JobRuntime:
    """What the manager knows of a job while it runs."""

    job_id: str
    name: str
    run_id: int = 0
    workers: int = 0
    protocol: str = ""
    step: int = 0
    samples: int = 0
    loss: float = float("nan")
    batch_sizes: dict = field(default_factory=dict)
    commands: queue.Queue = field(default_factory=queue.Queue)
    results: dict = field(default_factory=dict)  # command id -> CommandResult
    answered: dict = field(default_factory=dict)  # request id -> ((kind, request), CommandAck)
    attached: bool = False
    pending: list = field(default_factory=list)  # step summaries not yet in the store
    flushed: float = 0.0
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=RECENT_STEPS))
    received: int = 0          # step records so far (StreamMetrics readers wait on it)
    ended: bool = False        # the run is over: metric streams end
    paused: str = ""           # why the job waits (every node lost), while it does
    changed: threading.Condition = field(default_factory=threading.Condition)


class ManagerService(ResourceReports):
    def __init__(self, store: Store, board: ResourceBoard | None = None, flush_every: int = 200,
                 flush_s: float = 1.0, command_wait_s: float = 60.0):
        super().__init__(board or ResourceBoard(store))
        self.store, self.flush_every, self.flush_s = store, flush_every, flush_s
        # a command is answered with its outcome once the engine has carried it out (or
        # refused it) at a step boundary, or after this long with "queued"
        self.command_wait_s = command_wait_s
        self.jobs: dict[str, JobRuntime] = {}
        self._lock = threading.Lock()

    # -- jobs ---------------------------------------------------------------------------
    def register(self, job_id: str, name: str) -> JobRuntime:
        with self._lock:
            return self.jobs.setdefault(job_id, JobRuntime(job_id, name))

    def _job(self, job_id: str, context) -> JobRuntime:
        job = self.jobs.get(job_id)
        if job is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no running job {shown(job_id)} on this manager")
        return job

    def GetStatus(self, request, context):
        job = self._job(request.job_id, context)
        try:
            stored = self.store.job(job.job_id)
            state, stored_fields = stored.state, {"created": stored.created, "updated": stored.updated,
                                                  "run_dir": stored.run_dir}
        except KeyError:
            state, stored_fields = ("running" if job.attached else "submitted"), {}
        sizes = [job.batch_sizes.get(w, 0) for w in range(job.workers)]
        return manager_pb2.JobStatus(job_id=job.job_id, name=job.name, state=manager_pb2.JobState.Value(f"JOB_STATE_{state.upper()}"),
                                     protocol=job.protocol, step=job.step, samples=job.samples,
                                     loss=job.loss, run_id=job.run_id, batch_sizes=sizes, message=job.paused,
                                     **stored_fields)

    def close(self) -> None:
        """The manager is going: write what it still holds (the last resource samples)."""
        self.board.flush()

    def end(self, job_id: str) -> None:
        """The job's run is over: its metric streams end once they have sent every record."""
        job = self.jobs.get(job_id)
        if job is not None:
            with job.changed:
                job.ended, job.paused = True, ""
                job.changed.notify_all()

    def StreamMetrics(self, request, context):
        if request.from_step < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"from_step {request.from_step} is negative; expected 0 (all held) or a step")
        job = self._job(request.job_id, context)
        with job.changed:  # the records still held from from_step on, then each new one
            held = [r for r in job.recent if r.step >= request.from_step]
            seen = job.received
        yield from held
        while context.is_active():
            with job.changed:
                job.changed.wait_for(lambda: job.received > seen or job.ended, timeout=0.5)
                new = min(job.received - seen, len(job.recent))
                batch = list(job.recent)[len(job.recent) - new:] if new else []
                seen, ended = job.received, job.ended
            yield from batch
            if ended and not batch:
                return

    # -- commands -------------------------------------------------------------------------
    def _issue(self, request, context, kind: str, slow: bool = False) -> manager_pb2.CommandAck:
        """Queue a command for the job's engine and answer with its outcome; ``slow``: one
        that restarts the tasks (a scale, a restart switch) is waited for 5 x as long."""
        job = self._job(request.job_id, context)
        wait_s = self.command_wait_s * (5 if slow else 1)
        if len(request.request_id) > MAX_ID:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request_id: expected at most {MAX_ID} characters, "
                          f"got {len(request.request_id)}")
        if request.request_id and request.request_id in job.answered:
            command, first = job.answered[request.request_id]
            if command != (kind, request):  # a client reusing ids would lose this command without a word
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request_id {shown(request.request_id)} was used "
                              f"for another command ({command[0]}); a retry repeats its command unchanged, "
                              "a new command needs a new request_id")
            return manager_pb2.CommandAck(job_id=job.job_id, command_id=first.command_id, duplicate=True,
                                          message=first.message)
        cmd = manager_pb2.Command(command_id=uuid.uuid4().hex[:12], job_id=job.job_id, **{kind: request})
        job.commands.put(cmd)
        logger.info("job %s: %s queued as %s", job.job_id, kind, cmd.command_id)
        with job.changed:  # the engine checks and carries it out at its next step boundary
            job.changed.wait_for(lambda: cmd.command_id in job.results or job.ended or not context.is_active(),
                                 timeout=wait_s)
            result, ended = job.results.get(cmd.command_id), job.ended
        if result is None and ended:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"the run ended before it carried out the {kind}; see `tfsync "
                          "status` and the run's log")
        if result is not None and not result.ok:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT if result.invalid else grpc.StatusCode.FAILED_PRECONDITION,
                          f"{kind} refused by the running job: {one_line(result.message)}")
        message = one_line(result.message) if result is not None else (
            f"{kind} queued; not carried out within {wait_s:.0f} s (the job acts at a step "
            "boundary; see `tfsync status`)")
        ack = manager_pb2.CommandAck(job_id=job.job_id, command_id=cmd.command_id, message=message)
        if request.request_id:
            job.answered[request.request_id] = ((kind, request), ack)
        return ack

    def Switch(self, request, context):
        # the wire's form (an enum, numbers) read here; what it means is checked where the
        # engine checks it (tfsync.policy.checks), so every way in says the same
        if request.method == manager_pb2.SWITCH_METHOD_UNSPECIFIED:
            request.method = manager_pb2.SWITCH_METHOD_HOT
        try:
            check_switch(request.protocol, *switch_fields(request))
        except (ValueError, PolicyError) as e:
            refuse(context, e)
        return self._issue(request, context, "switch", slow=request.method == manager_pb2.SWITCH_METHOD_RESTART)

    def SetBatchSizes(self, request, context):
        job = self._job(request.job_id, context)
        try:
            check_batch_sizes(list(request.batch_sizes), job.workers)
        except ValueError as e:
            refuse(context, e)
        return self._issue(request, context, "set_batch_sizes")

    def Scale(self, request, context):
        job = self._job(request.job_id, context)
        try:
            check_workers(request.workers)
            if request.workers == job.workers:
                raise ValueError(f"the job already runs {job.workers} workers")
        except ValueError as e:
            refuse(context, e)
        return self._issue(request, context, "scale", slow=True)

    def Join(self, request, context):
        if not request.job_id:   # the hook was not told the job: the manager's only running one
            with self._lock:
                running = [j for j in self.jobs.values() if j.attached and not j.ended]
            if len(running) != 1:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"job_id: this manager runs {len(running)} "
                              "jobs; name the one to join (`tfsync hook --join ... --job JOB_ID`)")
            request.job_id = running[0].job_id
        self._job(request.job_id, context)   # NOT_FOUND where no such job runs here
        try:
            if len(request.hook_address) > MAX_NAME:
                raise ValueError(f"hook_address: expected at most {MAX_NAME} characters")
            _, port = split_address(request.hook_address)
            if not port:
                raise ValueError(f"hook_address {shown(request.hook_address)}: port 0 is not where a hook listens")
            request.workers = request.workers or 1
            check_workers(request.workers)
        except ValueError as e:
            refuse(context, e)
        return self._issue(request, context, "join", slow=True)

    def Checkpoint(self, request, context):
        return self._issue(request, context, "checkpoint")

    def Stop(self, request, context):
        return self._issue(request, context, "stop")

    # -- what only a standalone manager does (StandaloneService) -------------------------------
    def SubmitJob(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "this manager serves one job (`tfsync run`) and takes no "
                      "submissions; submit jobs to a standalone manager (`tfsync manager`, `tfsync submit`)")

    def Resume(self, request, context):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this manager serves one running job (`tfsync run`); "
                      "resume an ended job with `tfsync resume JOB`, or through a standalone manager")

    # -- the coordinator's stream ------------------------------------------------------------
    def Attach(self, request_iterator, context):
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "hello" or not first.hello.job_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Attach must open with a hello naming the job")
        hello = first.hello
        job = self._job(hello.job_id, context)
        problem = hello_problem(hello) or self._run_problem(job, hello.run_id)
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        job.run_id, job.workers, job.protocol, job.step = hello.run_id, hello.workers, hello.protocol, hello.step
        job.attached = True
        try:
            if self.store.job(job.job_id).state == "submitted":  # a submitted job's coordinator is up
                self.store.set_job_state(job.job_id, "running")
        except KeyError:
            pass
        bad: list[str] = []  # the reader's reason to end the stream
        reader = threading.Thread(target=self._read, args=(job, request_iterator, bad), daemon=True,
                                  name=f"attach-{job.job_id}")
        reader.start()
        try:
            while context.is_active() and not bad and (reader.is_alive() or not job.commands.empty()):
                try:
                    yield job.commands.get(timeout=0.2)
                except queue.Empty:
                    continue
            reader.join(timeout=1.0)
            if bad:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad[0])
        finally:
            job.attached = False
            self._flush(job)

    def _run_problem(self, job: JobRuntime, run_id: int) -> str | None:
        """Why ``run_id`` is not a run of the stored job (None: it is, or the job is not stored)."""
        try:
            runs = [r.id for r in self.store.runs(job.job_id)] if self._stored(job.job_id) else None
        except StoreError as e:
            logger.warning("job %s: cannot read its runs: %s", job.job_id, e)
            return None
        if runs is not None and run_id not in runs:
            return f"hello.run_id {run_id} is not a run of job {job.job_id} (its runs: {runs[-5:]})"
        return None

    def _stored(self, job_id: str) -> bool:
        try:
            self.store.job(job_id)
        except KeyError:
            return False
        return True

    def _read(self, job: JobRuntime, request_iterator, bad: list) -> None:
        try:
            for msg in request_iterator:
                kind = msg.WhichOneof("kind")
                if kind == "step":
                    problem = step_problem(msg.step, job.workers)
                    if problem is None:
                        self._step(job, msg.step)
                elif kind == "event":
                    problem = event_problem(msg.event)
                    if problem is None:
                        self._event(job, msg.event)
                elif kind == "result":
                    problem = None
                    with job.changed:
                        job.results[msg.result.command_id] = msg.result
                        job.changed.notify_all()
                    logger.info("job %s: command %s %s: %s", job.job_id, shown(msg.result.command_id),
                                "done" if msg.result.ok else "refused", one_line(msg.result.message))
                else:
                    problem = f"a {kind or 'empty'} message after the hello; expected step, event or result"
                if problem:
                    bad.append(problem)
                    return
        except grpc.RpcError:
            pass  # the coordinator went away; its status stays as last reported

    def _step(self, job: JobRuntime, rec) -> None:
        with job.changed:
            job.recent.append(rec)
            job.received += 1
            job.changed.notify_all()
        job.step, job.samples, job.loss, job.protocol = rec.step, rec.samples, rec.loss, rec.protocol
        job.batch_sizes[rec.worker] = rec.batch_size
        job.pending.append(StepSummary(job.run_id, rec.step, rec.end, rec.batch_size, rec.loss, rec.protocol,
                                       tuple(job.batch_sizes.get(w, 0) for w in range(job.workers))))
        if len(job.pending) >= self.flush_every or time.time() - job.flushed > self.flush_s:
            self._flush(job)

    def _event(self, job: JobRuntime, ev) -> None:
        if ev.kind not in (*EVENT_KINDS, *PAUSES):
            return  # the store keeps the kinds the job's history needs
        try:
            detail = json.loads(ev.detail_json or "{}")
        except (ValueError, RecursionError):
            detail = {"text": ev.detail_json}
        if not isinstance(detail, dict):
            detail = {"value": detail}
        if ev.kind in PAUSES:   # what the status says while the job waits for its nodes
            job.paused = "" if ev.kind == "unpaused" else one_line(
                f"paused since {time.strftime('%H:%M:%S', time.localtime(ev.time or time.time()))}: "
                f"{detail.get('reason', '')}; it goes on when a node answers (waits up to "
                f"{detail.get('wait_s', '?')} s)")
            return
        if ev.kind == "switch" and isinstance(detail.get("to"), str) and len(detail["to"]) <= MAX_NAME:
            job.protocol = detail["to"]   # what status says from the switch's answer on, not from the next step
        if ev.kind == "scaled" and type(detail.get("to")) is int and 0 < detail["to"] <= MAX_WORKERS:
            with job.changed:   # before the steps of the new workers (the stream keeps its order)
                job.workers = detail["to"]
                job.batch_sizes = {w: b for w, b in job.batch_sizes.items() if w < job.workers}
        if not job.run_id:
            return
        try:
            self.store.add_event(job.run_id, ev.kind, detail, at=ev.time or None)
        except (StoreError, ValueError, RecursionError) as e:  # a broken store; a detail JSON cannot write
            logger.warning("job %s: %s event not stored: %s", job.job_id, ev.kind, one_line(e))
            return
        logger.info("job %s: %s %s", job.job_id, ev.kind, one_line(detail))

    def _flush(self, job: JobRuntime) -> None:
        pending, job.pending, job.flushed = job.pending, [], time.time()
        if pending and job.run_id:
            try:
                self.store.add_steps(pending)
            except StoreError as e:  # the run goes on; its metrics.jsonl keeps every step
                logger.warning("job %s: %d step summaries not stored: %s", job.job_id, len(pending), e)
