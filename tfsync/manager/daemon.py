"""The standalone manager (`tfsync manager`): owns jobs from submission to end.

    tfsync manager --listen 127.0.0.1:7000 --token-file ~/.tfsync/manager.token
    tfsync submit jobs/mnist.toml --manager 127.0.0.1:7000 --token-file ~/.tfsync/manager.token

``SubmitJob`` stores the job (state submitted) and a run, writes the configuration to
``$TFSYNC_HOME/jobs/<job id>/job.json`` and starts the job's coordinator: a
``tfsync run --attach`` process that attaches to this manager (its step records come in,
commands go out) and runs the tasks on the job file's node hooks, or on a hook of its own
on this machine. Status, metrics, switch, batch sizes, checkpoint and stop then work as
for a `tfsync run` job; ``Resume`` starts a coordinator that continues the job from its
newest checkpoint. When a coordinator exits, the job's state (done, stopped, failed) and
results go to the job store; its output is in ``jobs/<job id>/coordinator.log``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import grpc

from tfsync.api import transport
from tfsync.api.v1 import manager_pb2, manager_pb2_grpc
from tfsync.base import safefile
from tfsync.base.exits import EXIT_DONE, EXIT_INTERRUPTED, shown
from tfsync.manager.service import MAX_ID, MAX_NAME, ManagerService, refuse
from tfsync.manager.store import ManagerLock, Store
from tfsync.manager.store_types import run_results

logger = logging.getLogger(__name__)

EXIT_STATES = {EXIT_DONE: "done", EXIT_INTERRUPTED: "stopped"}  # a coordinator's exit code (tfsync.base.exits)


class Coordinators:
    """The coordinator processes of submitted jobs, one per running job. A local job's
    attaches at ``local``, the manager's Unix socket (plaintext: only this user may open
    it); one on hooks at ``address``, with TLS (checked with ``tls.ca_file``) where the
    manager serves it."""

    def __init__(self, service: ManagerService, address: str, local: str, token_file: str, home: Path,
                 tls: transport.TlsConfig | None = None):
        self.service, self.address, self.local, self.token_file, self.home = service, address, local, token_file, home
        self.tls = tls
        self.procs: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()

    def start(self, job, run, resume: bool = False) -> None:
        folder = self.home / "jobs" / job.id
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        safefile.write(folder / "job.json", json.dumps(job.config, indent=2), mode=0o600)
        # a local job's coordinator has a network of its own (tfsync.base.isolation): it attaches
        # through the socket; one whose tasks run on hooks, at the address (with TLS where served)
        on_hooks = bool((job.config.get("cluster") or {}).get("hooks"))
        cmd = [sys.executable, "-m", "tfsync.cli", "resume" if resume else "run", str(folder / "job.json"), "--json",
               "--attach", self.address if on_hooks else self.local, "--token-file", self.token_file,
               "--job-id", job.id, "--run-id", str(run.id)]
        if self.tls is not None and on_hooks:
            cmd += ["--ca", os.path.abspath(self.tls.ca_file or self.tls.cert_file)]
            cmd += ["--server-name", self.tls.server_name] if self.tls.server_name else []
        with self._lock:
            if job.id in self.procs and self.procs[job.id].poll() is None:
                raise RuntimeError(f"job {job.id} is running already (coordinator pid {self.procs[job.id].pid})")
            with safefile.open_append(folder / "coordinator.log", binary=True) as log:
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
            self.procs[job.id] = proc
        threading.Thread(target=self._watch, args=(job, run, proc), daemon=True, name=f"coord-{job.id}").start()
        logger.info("job %s (%s): coordinator pid %d, run %d", job.id, job.name, proc.pid, run.id)

    def _watch(self, job, run, proc: subprocess.Popen) -> None:
        out, _ = proc.communicate()
        state = EXIT_STATES.get(proc.returncode, "failed")
        try:
            summary = json.loads(out or b"{}")
        except ValueError:
            summary = {}
        if summary.get("stopped"):
            state = "stopped"
        store = self.service.store
        for key, value in run_results(summary).items():
            store.set_result(run.id, key, value)
        if state == "failed":
            store.set_result(run.id, "exit_code", proc.returncode)
        store.set_job_state(job.id, state)
        self.service.end(job.id)
        logger.info("job %s: coordinator exited with %d: %s", job.id, proc.returncode, state)

    def stop_all(self) -> None:
        with self._lock:
            procs = list(self.procs.values())
        for p in procs:
            if p.poll() is None:
                p.terminate()  # tfsync run ends on SIGTERM as on Ctrl-C: tasks stopped
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


class StandaloneService(ManagerService):
    """ManagerService that also takes submissions and resumes (``Coordinators``)."""

    def __init__(self, store: Store):
        super().__init__(store)
        self.submitted: dict[str, tuple] = {}  # request id -> (request, job id), for a retried SubmitJob
        self.coordinators: Coordinators | None = None

    def SubmitJob(self, request, context):
        from tfsync.job.config import JobConfig
        from tfsync.job.fields import check_field
        from tfsync.switch.trials import config_signature

        if len(request.request_id) > MAX_ID or len(request.signature) > MAX_NAME:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request_id and signature: expected at most {MAX_ID} "
                          f"and {MAX_NAME} characters")
        try:
            cfg = JobConfig.from_json(request.config_json, source="config_json")
            if request.name:
                check_field("job.name", request.name, source="name")
        except ValueError as e:  # a ConfigError
            refuse(context, e)
        if not os.path.isabs(cfg.job.run_dir):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"job.run_dir {shown(cfg.job.run_dir)} must be absolute "
                          "(the manager runs elsewhere than the client; `tfsync submit` makes it so)")
        config = cfg.to_dict()
        with self._lock:
            if request.request_id in self.submitted:  # a retried call: the job it submitted
                first, job_id = self.submitted[request.request_id]
                if first != request:  # another job under a used id would be lost without a word
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request_id {shown(request.request_id)} was used "
                                  f"for another submission (job {job_id}); a new job needs a new request_id")
                return self._status(job_id, context)
            job = self.store.create_job(request.name or cfg.job.name, request.signature or config_signature(config),
                                        config, run_dir=cfg.job.run_dir)
            if request.request_id:
                self.submitted[request.request_id] = (request, job.id)
        self._launch(job, resume=False, context=context)
        return self._status(job.id, context)

    def Resume(self, request, context):
        try:
            job = self.store.job(request.job_id)
        except KeyError:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {shown(request.job_id)} in this manager's job store")
        if job.state in ("running", "submitted") and job.id in self.jobs and not self.jobs[job.id].ended:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"job {job.id} is {job.state}; nothing to resume")
        from tfsync.engine.records import last_checkpoint
        if last_checkpoint(job.run_dir) is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"job {job.id} has no checkpoint in {job.run_dir} to resume from")
        with self._lock:
            self.jobs.pop(job.id, None)
        self._launch(job, resume=True, context=context)
        return self._status(job.id, context)

    def _launch(self, job, resume: bool, context) -> None:
        run = self.store.start_run(job.id, kind="resume" if resume else "train")
        runtime = self.register(job.id, job.name)
        runtime.run_id = run.id
        self.store.set_job_state(job.id, "submitted")
        try:
            self.coordinators.start(job, run, resume=resume)
        except (OSError, RuntimeError) as e:
            self.store.set_job_state(job.id, "failed")
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"could not start job {job.id}: {e}")

    def _status(self, job_id: str, context) -> manager_pb2.JobStatus:
        return self.GetStatus(manager_pb2.GetStatusRequest(job_id=job_id), context)


def serve(listen: str, *, token: str, token_file: str, store_path: str, home: Path,
          tls: transport.TlsConfig | None = None, allow_remote: bool = False):
    """Start the standalone manager; returns (grpc server, service, port). A store served
    by another manager is refused (StoreError naming it); nothing is started then."""
    lock = ManagerLock(store_path).acquire()
    try:
        store = Store(store_path)
        service = StandaloneService(store)
        server, port = transport.make_server(listen, token=token, tls=tls, allow_remote=allow_remote)
        # its coordinators attach through a socket in the 0700 home: a local job's process has a
        # network of its own (tfsync.base.isolation), where the manager's loopback is not
        local = transport.unix_address(str(home), "manager.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(local[len("unix:"):])   # a killed manager's (the store lock says none runs)
        if not server.add_insecure_port(local):
            raise transport.TransportError(f"cannot listen on {local}")
    except BaseException:
        lock.release()
        raise
    service.lock = lock
    manager_pb2_grpc.add_ManagerServicer_to_server(service, server)
    server.start()
    address = f"{listen.rsplit(':', 1)[0]}:{port}"
    service.coordinators = Coordinators(service, address, local, os.path.abspath(token_file), home, tls)
    lock.note(address)
    return server, service, port
