"""`tfsync status | metrics | switch | stop | checkpoint | batch-sizes | hook`: talk to a running job's
manager, or run a node hook. A job is named by its job file or its run directory; its
control files (``control/manager.json``, ``control/token``) are read from there."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from tfsync.cli import EXIT_BAD_INPUT, EXIT_FAILED, _fail


class ControlError(RuntimeError):
    pass


def locate(target: str) -> tuple[dict, str]:
    """(manager.json contents, token) of the job at ``target`` (job file or run dir)."""
    from tfsync.manager.auth import read_token

    path = Path(target)
    if path.is_file():
        from tfsync.config import ConfigError, load_job
        try:
            path = Path(load_job(str(path)).job.run_dir)
        except ConfigError as e:
            raise ControlError(str(e)) from None
    info = path / "control" / "manager.json"
    if not info.is_file():
        raise ControlError(f"{target}: no running job there (no {info}); start it with `tfsync run JOB`")
    return json.loads(info.read_text()), read_token(path / "control" / "token")


def _stub(target: str):
    import grpc

    from tfsync.api.v1 import manager_pb2_grpc
    from tfsync.manager import transport

    info, token = locate(target)
    channel = transport.make_channel(info["address"], token=token)
    try:
        transport.wait_ready(channel, 5.0, f"the manager of job {info['job_id']} at {info['address']}")
    except transport.TransportError as e:
        raise ControlError(f"{e} (the run may have ended)") from None
    return manager_pb2_grpc.ManagerStub(channel), info, grpc


def _call(args, make):
    """Send one control call; print the answer (JSON with --json)."""
    from google.protobuf.json_format import MessageToDict

    try:
        stub, info, grpc = _stub(args.target)
        reply = make(stub, info["job_id"])
    except ControlError as e:
        return _fail(str(e), EXIT_BAD_INPUT)
    except Exception as e:  # grpc.RpcError: the manager's own message
        if hasattr(e, "code"):
            return _fail(f"{e.code().name}: {e.details()}", EXIT_BAD_INPUT if e.code().name in
                         ("INVALID_ARGUMENT", "NOT_FOUND") else EXIT_FAILED)
        raise
    d = MessageToDict(reply, preserving_proto_field_name=True)
    print(json.dumps(d, indent=2) if args.json else _text(d))
    return 0


def _text(d: dict) -> str:
    if "command_id" in d:
        return f"{d.get('message', 'queued')} (command {d['command_id']}{', already issued' if d.get('duplicate') else ''})"
    sizes = " ".join(str(b) for b in d.get("batch_sizes", []))
    return (f"job {d.get('job_id')} ({d.get('name')}): {d.get('state', '').replace('JOB_STATE_', '').lower()}, "
            f"{d.get('protocol', '?')}, step {d.get('step', 0)}, samples {d.get('samples', 0)}, "
            f"loss {float(d.get('loss', 'nan')):.4f}, batch sizes [{sizes}]")


def cmd_status(args):
    from tfsync.api.v1 import manager_pb2
    return _call(args, lambda s, j: s.GetStatus(manager_pb2.GetStatusRequest(job_id=j), timeout=10))


def cmd_switch(args):
    from tfsync.api.v1 import manager_pb2
    method = manager_pb2.SWITCH_METHOD_RESTART if args.method == "restart" else manager_pb2.SWITCH_METHOD_HOT
    options = {k: float(v) for k, v in (("staleness", args.staleness), ("lr_scale", args.lr_scale)) if v is not None}
    return _call(args, lambda s, j: s.Switch(manager_pb2.SwitchRequest(
        request_id=uuid.uuid4().hex, job_id=j, protocol=args.to, method=method, options=options), timeout=10))


def cmd_stop(args):
    from tfsync.api.v1 import manager_pb2
    return _call(args, lambda s, j: s.Stop(manager_pb2.StopRequest(
        request_id=uuid.uuid4().hex, job_id=j, checkpoint=not args.no_checkpoint), timeout=10))


def cmd_checkpoint(args):
    from tfsync.api.v1 import manager_pb2
    return _call(args, lambda s, j: s.Checkpoint(manager_pb2.CheckpointRequest(
        request_id=uuid.uuid4().hex, job_id=j), timeout=10))


def cmd_batch_sizes(args):
    from tfsync.api.v1 import manager_pb2
    return _call(args, lambda s, j: s.SetBatchSizes(manager_pb2.SetBatchSizesRequest(
        request_id=uuid.uuid4().hex, job_id=j, batch_sizes=args.sizes), timeout=10))


def cmd_metrics(args):
    """Print step records as the job's manager receives them, until the run ends."""
    from google.protobuf.json_format import MessageToDict

    from tfsync.api.v1 import manager_pb2

    try:
        stub, info, grpc = _stub(args.target)
        for rec in stub.StreamMetrics(manager_pb2.StreamMetricsRequest(job_id=info["job_id"],
                                                                       from_step=args.from_step)):
            if args.json:
                print(json.dumps(MessageToDict(rec, preserving_proto_field_name=True,
                                               always_print_fields_with_no_presence=True,
                                               unquote_int64_if_possible=True)), flush=True)
            else:
                speed = rec.batch_size / max(rec.end - rec.start, 1e-9)
                print(f"step {rec.step:>7}  worker {rec.worker}  batch {rec.batch_size:>4}  {speed:>9,.0f} samples/s  "
                      f"loss {rec.loss:.4f}  {rec.protocol}  samples {rec.samples}", flush=True)
    except ControlError as e:
        return _fail(str(e), EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # grpc.RpcError: the manager's own message
        if hasattr(e, "code"):
            if e.code().name == "UNAVAILABLE":
                return 0  # the run ended and its manager with it
            return _fail(f"{e.code().name}: {e.details()}", EXIT_FAILED)
        raise
    return 0


def add_commands(sub) -> None:
    def job_command(name, help_, func):
        p = sub.add_parser(name, help=help_, description=help_ + ". The job is named by its job file "
                           "or its run directory; the command reaches its manager on loopback with "
                           "the job's token (run_dir/control/token).")
        p.add_argument("target", metavar="JOB", help="the job file, or the run directory")
        p.add_argument("--json", action="store_true", help="print the answer as JSON")
        p.set_defaults(func=func)
        return p

    job_command("status", "show a running job's protocol, step, loss and batch sizes", cmd_status)
    sw = job_command("switch", "switch a running job to another protocol at its next step boundary", cmd_switch)
    sw.add_argument("--to", required=True, help="protocol name (bsp, asp, ssp, pssp, elastic_bsp, lbbsp)")
    sw.add_argument("--method", choices=("hot", "restart"), default="hot",
                    help="hot: swap the policy in place (default); restart: checkpoint and restart the tasks")
    sw.add_argument("--staleness", type=int, help="for ssp / pssp")
    sw.add_argument("--lr-scale", type=float, help="learning rate multiplier from the switch on (default: keep)")
    st = job_command("stop", "stop a running job at its next step boundary (checkpoint first)", cmd_stop)
    st.add_argument("--no-checkpoint", action="store_true", help="stop without saving a checkpoint")
    job_command("checkpoint", "checkpoint a running job now", cmd_checkpoint)
    m = job_command("metrics", "print a running job's step records as they arrive, until it ends "
                    "(--json: one JSON object per line)", cmd_metrics)
    m.add_argument("--from-step", type=int, default=0,
                   help="first replay the records the manager still holds from this step on (default: all held)")
    bs = job_command("batch-sizes", "set a running job's per-worker batch sizes", cmd_batch_sizes)
    bs.add_argument("sizes", type=int, nargs="+", help="one batch size per worker")
    # `tfsync hook ...` is handed to tfsync.hooks.node.main whole (tfsync.cli.main); listed here for --help.
    sub.add_parser("hook", help="run this node's hook agent (starts its TF tasks for a manager); "
                                "`tfsync hook --help` for its options", add_help=False)
