"""The manager `tfsync run` embeds: a gRPC server on loopback, or on a Unix socket in the run's control folder
when the run has a network of its own (or ``--manager-listen``), for one job, its job store
entry, the coordinator's link to it, and a node hook on loopback (``nodes``, the
engine's cluster factory) that runs the job's PS and worker tasks on this machine.

The job's control files live in ``<run_dir>/control/``: ``token`` (0600, the per-job
secret every control call must carry) and ``manager.json`` (address, job and run ids,
pid), which `tfsync status|switch|stop|checkpoint` read. The job store is
``$TFSYNC_HOME/jobs.db`` (default ``~/.tfsync``), shared by all runs of the user, so
recurring jobs find their earlier runs.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tfsync.api import auth, transport
from tfsync.api.v1 import manager_pb2_grpc
from tfsync.base import isolation, safefile
from tfsync.engine.hook_cluster import HookNodes
from tfsync.hooks.node import serve as serve_hook
from tfsync.manager.home import default_store
from tfsync.manager.link import ManagerLink
from tfsync.manager.service import ManagerService
from tfsync.manager.store import Store
from tfsync.manager.store_types import run_results
from tfsync.switch.trials import config_signature

logger = logging.getLogger(__name__)

@dataclass
class EmbeddedManager:
    server: object
    address: str
    service: ManagerService
    store: Store
    job_id: str
    run_id: int
    link: ManagerLink
    control_dir: Path
    hook: object           # the local node hook (tfsync.hooks.node.HookServer)
    nodes: HookNodes       # the engine's cluster factory: tasks through that hook

    def finish(self, state: str, summary: dict | None = None) -> None:
        """Record the outcome, close the link and the server (idempotent enough to call in
        a ``finally``)."""
        try:
            self.link.close()
            self.service.end(self.job_id)
            if summary is not None:
                for key, value in run_results(summary).items():
                    self.store.set_result(self.run_id, key, value)
            self.store.set_job_state(self.job_id, state)
        finally:
            self.hook.stop()
            self.server.stop(grace=1.0)
            transport.remove_unix_socket(self.address)
            self.service.close()
            (self.control_dir / "manager.json").unlink(missing_ok=True)
            self.store.close()


def local_hook(run_dir: str, token: str, job_id: str) -> tuple[object, HookNodes]:
    """A node hook on loopback in this process (task logs in run_dir/logs) and the engine's
    cluster factory that runs the tasks through it."""
    # its tasks go in a private network namespace where they can (root): no alarm unless one does not
    hook, port = serve_hook(f"{transport.DEFAULT_HOST}:0", token=token, log_dir=os.path.join(run_dir, "logs"),
                            warn_now=False)
    return hook, HookNodes([(f"{transport.DEFAULT_HOST}:{port}", token)], job_id=job_id, joinable=False)


@dataclass
class AttachedCoordinator:
    """A coordinator started by a standalone manager (`tfsync manager`): its link to that
    manager and, when the job file lists no hooks, a hook of its own for the tasks."""

    link: ManagerLink
    hook: object | None
    nodes: HookNodes | None
    control_dir: Path

    def finish(self, state: str, summary: dict | None = None) -> None:
        """The manager records the outcome when this process exits."""
        try:
            self.link.close()
        finally:
            if self.hook is not None:
                self.hook.stop()
            (self.control_dir / "manager.json").unlink(missing_ok=True)


def attach(address: str, token_file: str, job_id: str, run_id: int, run_dir: str, workers: int, protocol: str,
           local_tasks: bool, tls: transport.TlsConfig | None = None) -> AttachedCoordinator:
    """``tls``: the client settings for a manager that serves TLS (its CA), also recorded in
    manager.json so that `tfsync status` knows the job's manager needs ``--ca``."""
    token = auth.read_token(token_file)
    channel = transport.make_channel(address, token=token, tls=tls)
    transport.wait_ready(channel, 10.0, f"the manager at {address}", target=address, tls=tls)
    link = ManagerLink(channel, job_id, run_id, workers, protocol)
    hook, nodes = local_hook(run_dir, token, f"{job_id}-r{run_id}") if local_tasks else (None, None)
    info = {"address": address, "job_id": job_id, "run_id": run_id, "pid": os.getpid(), "standalone": True}
    if tls is not None:
        info.update(tls=True, ca=os.path.abspath(tls.ca_file), server_name=tls.server_name)
    control = write_control(run_dir, token, info)
    return AttachedCoordinator(link, hook, nodes, control)


def write_control(run_dir: str, token: str, info: dict) -> Path:
    """``run_dir/control/``: the token (0600) and manager.json, which `tfsync status | switch
    | stop ...` read to reach the job's manager."""
    control = Path(safefile.make_dir(Path(run_dir) / "control", mode=0o700))
    auth.write_token(control / "token", token)
    safefile.write(control / "manager.json", json.dumps(info, indent=2), mode=0o600)
    return control


def start(run_dir: str, name: str, config: dict, workers: int, protocol: str,
          store_path: str | None = None, resume: bool = False, listen: str | None = None,
          allow_remote: bool = False, token: str | None = None) -> EmbeddedManager:
    """``resume``: a new run of the newest stored job with this run directory (if any).
    ``listen``: where the manager listens (default: loopback, a free port; another
    machine's hooks join through a reachable address, ``allow_remote``), with ``token``
    (default: a new one for this run). An unusable run directory fails first, before the
    store holds anything; a failure after that stops what was started and records the
    job as failed."""
    token = token or auth.new_token()
    control = Path(safefile.make_dir(Path(run_dir) / "control", mode=0o700))
    # in a network of its own (tfsync.base.isolation) this process's loopback is no one
    # else's: the commands reach it through a socket in the 0700 control folder
    listen = listen or (transport.unix_address(str(control), "manager.sock") if isolation.active()
                        else f"{transport.DEFAULT_HOST}:0")
    store_path = store_path or default_store()
    Path(store_path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = Store(store_path)
    earlier = [j for j in store.jobs() if j.run_dir == os.path.abspath(run_dir)] if resume else []
    job = earlier[-1] if earlier else store.create_job(
        name, config_signature(config), config, run_dir=os.path.abspath(run_dir),
        token_path=str((control / "token").resolve()))
    store.set_job_state(job.id, "running")
    run = store.start_run(job.id, kind="resume" if earlier else "train")
    service = ManagerService(store)
    service.register(job.id, name)
    server, hook = None, None
    try:
        server, port = transport.make_server(listen, token=token, allow_remote=allow_remote)
        manager_pb2_grpc.add_ManagerServicer_to_server(service, server)
        server.start()
        address = listen if listen.startswith("unix:") else f"{listen.rsplit(':', 1)[0]}:{port}"
        link = ManagerLink(transport.make_channel(address, token=token), job.id, run.id, workers, protocol)
        hook, nodes = local_hook(run_dir, token, f"{job.id}-r{run.id}")
        info = {"address": address, "job_id": job.id, "run_id": run.id, "pid": os.getpid(), "store": store_path,
                "hook": nodes.hooks[0][0]}
        write_control(run_dir, token, info)
    except BaseException:
        if hook is not None:
            hook.stop()
        if server is not None:
            server.stop(grace=None)
        store.set_job_state(job.id, "failed")
        store.close()
        raise
    logger.info("manager for job %s at %s (control files in %s)", job.id, address, control)
    return EmbeddedManager(server, address, service, store, job.id, run.id, link, control, hook, nodes)
