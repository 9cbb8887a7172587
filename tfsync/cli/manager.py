"""`tfsync status | metrics | switch | stop | checkpoint | batch-sizes | scale | hook`: talk
to a running job's manager, or run a node hook. A job is named by its job file or its run directory; its
control files (``control/manager.json``, ``control/token``) are read from there. `tfsync
status` of a job no manager answers for reads the job store instead (``cli/jobs.py``)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from tfsync.base.exits import EXIT_INTERRUPTED, BadInput
from tfsync.cli.lookup import ControlError, NotRunning, locate


ENV_CA = "TFSYNC_CA"   # the CA certificate of a TLS manager, when --ca is not given
INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1  # the API's integer fields (batch sizes, steps)
# How long a command waits for its answer: the manager answers "queued" after 60 s (300 s
# for a scale or a restart switch, which restart the tasks), a little before these
COMMAND_S, SLOW_COMMAND_S = 90, 330


def client_tls(args, info: dict | None = None):
    """The TLS settings of a call to a manager: ``--ca`` (or $TFSYNC_CA) and ``--server-name``;
    None for plaintext. A job whose manager.json says its manager serves TLS needs a CA; the
    plaintext manager of a `tfsync run` job is reached without, even with $TFSYNC_CA set."""
    from tfsync.api import transport

    if info and str(info.get("address", "")).startswith("unix:"):
        return None   # a socket in the user's 0700 folder: no network to protect
    ca = args.ca or (os.environ.get(ENV_CA) if info is None or info.get("tls") else None)
    server_name = args.server_name or (info or {}).get("server_name")
    if ca:
        return transport.TlsConfig(ca_file=ca, server_name=server_name)
    if info and info.get("tls"):
        raise ControlError(f"the manager of job {info['job_id']} at {info['address']} serves TLS: pass --ca PATH "
                           f"(or set {ENV_CA}), the CA certificate of its --tls-cert"
                           + (f" (the manager uses {info['ca']})" if info.get("ca") else ""))
    return None


def _stub(args):
    """The job's manager (a ``tfsync.api.client.Client``: its calls raise tfsync errors) and
    its manager.json; NotRunning where it does not answer, a TransportInputError (exit 2)
    where it answers TLS this client does not speak."""
    from tfsync.api import client, transport
    from tfsync.api.v1 import manager_pb2_grpc

    info, token = locate(args.target)
    try:
        tls = client_tls(args, info)
        channel = transport.make_channel(info["address"], token=token, tls=tls)
        transport.wait_ready(channel, 5.0, f"the manager of job {info['job_id']} at {info['address']}",
                             target=info["address"], tls=tls)
    except transport.TransportInputError:
        raise
    except transport.TransportError as e:
        raise NotRunning(f"{e} (the run may have ended)", info) from None
    return client.Client(manager_pb2_grpc.ManagerStub(channel)), info


def _call(args, make, ended=None):
    """Send one control call; print the answer (JSON with --json). ``ended(args, NotRunning)``
    answers instead where no manager does (default: NotRunning, one line, exit 2); a refused
    call raises the manager's own line (``tfsync.api.client``)."""
    from google.protobuf.json_format import MessageToDict

    from tfsync.api import client

    info = {}
    try:
        stub, info = _stub(args)
        reply = make(stub, info["job_id"])
    except NotRunning as e:
        if ended is None:
            raise
        return ended(args, e)
    except client.Unreachable as e:
        if ended is None or e.code != "UNAVAILABLE":
            raise
        return ended(args, NotRunning(f"the manager of job {info['job_id']} has gone: {e.details}", info))
    d = MessageToDict(reply, preserving_proto_field_name=True)
    print(json.dumps(d, indent=2) if args.json else _text(d))
    return 0


def _text(d: dict) -> str:
    if "command_id" in d:
        return f"{d.get('message', 'queued')} (command {d['command_id']}{', already issued' if d.get('duplicate') else ''})"
    sizes = " ".join(str(b) if b else "-" for b in d.get("batch_sizes", []))   # -: no step since it joined
    return (f"job {d.get('job_id')} ({d.get('name')}): {d.get('state', '').replace('JOB_STATE_', '').lower()}, "
            f"{d.get('protocol', '?')}, step {d.get('step', 0)}, samples {d.get('samples', 0)}, "
            f"loss {float(d.get('loss', 'nan')):.4f}, batch sizes [{sizes}]"
            + (f"\n{d['message']}" if d.get("message") else ""))


def cmd_status(args):
    from tfsync.api.v1 import manager_pb2
    from tfsync.cli.jobs import show_ended
    return _call(args, lambda s, j: s.GetStatus(manager_pb2.GetStatusRequest(job_id=j), timeout=10), show_ended)


def _option(text: str) -> tuple[str, object]:
    """``NAME=VALUE`` with VALUE read as a TOML value (``3``, ``0.5``, ``true``)."""
    import tomllib

    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise BadInput(f"--option {text!r}: expected NAME=VALUE, e.g. depth=3")
    try:
        return name.strip(), tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return name.strip(), value  # a bare word: text, which a switch cannot carry (to_numbers says so)


def cmd_switch(args):
    from tfsync.api.v1 import manager_pb2
    from tfsync.policy import catalogue

    method = manager_pb2.SWITCH_METHOD_RESTART if args.method == "restart" else manager_pb2.SWITCH_METHOD_HOT
    given = dict(_option(text) for text in args.option)
    if args.staleness is not None:
        given["staleness"] = args.staleness
    options = catalogue.to_numbers(given)
    if args.lr_scale is not None:
        options["lr_scale"] = float(args.lr_scale)
    return _call(args, lambda s, j: s.Switch(manager_pb2.SwitchRequest(
        request_id=uuid.uuid4().hex, job_id=j, protocol=args.to, method=method, options=options),
        timeout=SLOW_COMMAND_S))


def cmd_stop(args):
    from tfsync.api.v1 import manager_pb2
    return _call(args, lambda s, j: s.Stop(manager_pb2.StopRequest(
        request_id=uuid.uuid4().hex, job_id=j, checkpoint=not args.no_checkpoint), timeout=COMMAND_S))


def cmd_checkpoint(args):
    from tfsync.api.v1 import manager_pb2
    return _call(args, lambda s, j: s.Checkpoint(manager_pb2.CheckpointRequest(
        request_id=uuid.uuid4().hex, job_id=j), timeout=COMMAND_S))


def cmd_scale(args):
    from tfsync.api.v1 import manager_pb2
    from tfsync.policy.checks import check_workers
    check_workers(args.workers)   # the manager's and the engine's check
    return _call(args, lambda s, j: s.Scale(manager_pb2.ScaleRequest(
        request_id=uuid.uuid4().hex, job_id=j, workers=args.workers), timeout=SLOW_COMMAND_S))


def check_range(name: str, values, lo: int, hi: int, why: str = "") -> None:
    """BadInput where an integer argument is refused before any call (the message's request
    fields would otherwise raise past their 32 or 64 bits)."""
    bad = next((v for v in values if not lo <= v <= hi), None)
    if bad is not None:
        raise BadInput(f"{name} {bad}: expected an integer from {lo} to {hi}{why}")


def cmd_batch_sizes(args):
    from tfsync.api.v1 import manager_pb2
    check_range("batch size", args.sizes, -INT32_MAX - 1, INT32_MAX, " (one per worker)")   # what the request carries
    return _call(args, lambda s, j: s.SetBatchSizes(manager_pb2.SetBatchSizesRequest(
        request_id=uuid.uuid4().hex, job_id=j, batch_sizes=args.sizes), timeout=COMMAND_S))


def cmd_metrics(args):
    """Print step records as the job's manager receives them, until the run ends."""
    from google.protobuf.json_format import MessageToDict

    from tfsync.api.v1 import manager_pb2

    from tfsync.api import client

    check_range("--from-step", [args.from_step], 0, INT64_MAX)
    try:
        stub, info = _stub(args)
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
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except client.Unreachable as e:
        if e.code != "UNAVAILABLE":
            raise
        return 0  # the run ended and its manager with it
    return 0


def cmd_manager(args):
    """Serve a standalone manager until interrupted; submitted jobs' coordinators are its children."""
    import signal
    import threading

    from tfsync.api import auth, transport
    from tfsync.manager import daemon
    from tfsync.manager.home import default_store, home

    token_file = Path(args.token_file or home() / "manager.token").expanduser()
    token = auth.read_token(token_file) if token_file.exists() else auth.write_token(token_file)
    tls = None
    if args.tls_cert or args.tls_key:  # its coordinators check the certificate with --tls-ca
        ca = args.tls_ca or args.tls_cert
        tls = transport.TlsConfig(args.tls_cert, args.tls_key, ca and os.path.abspath(ca), args.tls_server_name)
        transport.server_credentials(tls)
        transport.channel_credentials(tls)
    elif args.tls_ca or args.tls_server_name:
        raise BadInput("--tls-ca and --tls-server-name need --tls-cert and --tls-key")
    store = args.store or default_store()
    Path(store).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    server, service, port = daemon.serve(args.listen, token=token, token_file=str(token_file), store_path=store,
                                         home=home(), tls=tls, allow_remote=args.allow_remote)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before the banner: whoever read it may stop us at once
        signal.signal(sig, lambda *_: done.set())
    print(f"tfsync manager listening on {args.listen.rsplit(':', 1)[0]}:{port} (token in {token_file}, "
          f"job store {store})", flush=True)
    done.wait()
    service.coordinators.stop_all()  # each job stops at a step boundary with its tasks, resumable
    server.stop(grace=2.0)
    service.close()
    service.store.close()
    return 0


def cmd_submit(args):
    """Send a job file to a standalone manager, which trains it."""
    import dataclasses
    import os

    from tfsync.api import auth, client, transport
    from tfsync.api.v1 import manager_pb2, manager_pb2_grpc
    from tfsync.job.config import load_job
    from tfsync.manager.home import home

    cfg = load_job(args.job, overrides=args.set)
    paths = {"run_dir": os.path.abspath(cfg.job.run_dir)}
    data = dataclasses.replace(cfg.data, path=os.path.abspath(args.data or cfg.data.path)) \
        if (args.data or cfg.data.path) else cfg.data
    cfg = dataclasses.replace(cfg, job=dataclasses.replace(cfg.job, **paths), data=data)
    token = auth.read_token(os.path.expanduser(args.token_file or home() / "manager.token"))
    tls = client_tls(args)
    channel = transport.make_channel(args.manager, token=token, tls=tls)  # a bad --ca: bad input
    transport.wait_ready(channel, 10.0, f"the manager at {args.manager}", target=args.manager, tls=tls)
    status = client.Client(manager_pb2_grpc.ManagerStub(channel)).SubmitJob(manager_pb2.SubmitJobRequest(
        request_id=uuid.uuid4().hex, name=cfg.job.name, config_json=json.dumps(cfg.to_dict())), timeout=30)
    if args.json:
        from google.protobuf.json_format import MessageToDict
        print(json.dumps(MessageToDict(status, preserving_proto_field_name=True), indent=2))
    else:
        print(f"submitted job {status.job_id} ({status.name}); follow it with `tfsync status {args.job}` or "
              f"`tfsync metrics {args.job}`; outputs in {status.run_dir}")
    return 0


def tls_options(p) -> None:
    p.add_argument("--ca", metavar="PATH", help=f"connect with TLS, checking the manager's certificate with this CA "
                   f"certificate (PEM; default ${ENV_CA}); for a manager started with --tls-cert")
    p.add_argument("--server-name", help="the name in the manager's certificate, if its address is not")


def add_commands(sub) -> None:
    def job_command(name, help_, func, target_help="the job file, or the run directory"):
        p = sub.add_parser(name, help=help_, description=help_ + ". The job is named by its job file "
                           "or its run directory; the command reaches its manager on loopback with "
                           "the job's token (run_dir/control/token).")
        p.add_argument("target", metavar="JOB", help=target_help)
        p.add_argument("--json", action="store_true", help="print the answer as JSON")
        tls_options(p)
        p.set_defaults(func=func)
        return p

    from tfsync.policy import catalogue

    stat = job_command("status", "show a running job's protocol, step, loss and batch sizes; an ended "
                       "job's final state and results", cmd_status,
                       "the job file, or the run directory; for an ended job also its id or name")
    stat.description += (" Where no manager answers (the job has ended), the job is looked up in the job store "
                         "(by the run directory, or by a job id or name as JOB) and its final state and "
                         "results are shown.")
    stat.add_argument("--store", help="the job store to look an ended job up in (default: the one the job's "
                                      "manager.json names, else $TFSYNC_HOME/jobs.db)")
    sw = job_command("switch", "switch a running job to another protocol at its next step boundary", cmd_switch)
    protocols = catalogue.names()
    sw.add_argument("--to", required=True, metavar="PROTOCOL", help="the protocol: " + ", ".join(protocols)
                    + " (the job's manager checks it, with the options, as the engine does)")
    sw.add_argument("--method", choices=("hot", "restart"), default="hot",
                    help="hot: swap the policy in place (default); restart: checkpoint and restart the tasks")
    sw.add_argument("--staleness", type=int, help="for " + ", ".join(catalogue.taking("staleness")))
    sw.add_argument("-o", "--option", action="append", default=[], metavar="NAME=VALUE",
                    help="another numeric or true/false option of the protocol, as a job file's "
                         "[[protocol]] sets it (e.g. -o depth=3); repeat for more")
    sw.add_argument("--lr-scale", type=float, help="learning rate multiplier from the switch on (default: the "
                    "configuration policy's for the new protocol, by switch.lr: n x for BSP and LB-BSP with the default "
                    "'linear', x1 for the others)")
    st = job_command("stop", "stop a running job at its next step boundary (checkpoint first)", cmd_stop)
    st.add_argument("--no-checkpoint", action="store_true", help="stop without saving a checkpoint")
    job_command("checkpoint", "checkpoint a running job now", cmd_checkpoint)
    m = job_command("metrics", "print a running job's step records as they arrive, until it ends "
                    "(--json: one JSON object per line)", cmd_metrics)
    m.add_argument("--from-step", type=int, default=0,
                   help="first replay the records the manager still holds from this step on (default: all held)")
    bs = job_command("batch-sizes", "set a running job's per-worker batch sizes", cmd_batch_sizes)
    bs.add_argument("sizes", type=int, nargs="+", help="one batch size per worker")
    sc = job_command("scale", "go on with another number of workers (checkpoint, restart, restore)", cmd_scale)
    sc.description += (" The N workers' tasks start while the old ones train; at its next step boundary the job "
                       "drains, checkpoints, stops the old tasks and goes on with the new ones restored from the "
                       "checkpoint: a shrink drops the highest-numbered workers, a "
                       "grow adds new ones, nothing counted is lost. The learning rate and batch follow the job "
                       "file's cluster.scale ('local': each worker's batch kept, the rate by switch.lr for the "
                       "new count; 'global': the global batch and the rate kept). The answer says what it cost. "
                       "Not for a job on a platform's tasks (TF_CONFIG).")
    sc.add_argument("--workers", type=int, required=True, metavar="N",
                    help="the new worker count, within the job file's cluster.min_workers and max_workers")
    mg = sub.add_parser("manager", help="run a standalone manager that trains submitted jobs",
                        description="Serve the tfsync Manager API: `tfsync submit` sends it jobs, which it "
                                    "trains (one coordinator process each, tasks on the job's hooks or on this "
                                    "machine) and records in the job store. Every call needs the manager's "
                                    "token. Ctrl-C stops every job at a step boundary, with a checkpoint.")
    mg.add_argument("--listen", default="127.0.0.1:7000", help="host:port (default 127.0.0.1:7000; port 0: any)")
    mg.add_argument("--token-file", help="the manager's token (created, mode 0600, if missing; "
                                         "default $TFSYNC_HOME/manager.token)")
    mg.add_argument("--store", help="job store (default $TFSYNC_HOME/jobs.db)")
    mg.add_argument("--tls-cert", help="serve TLS with this certificate (PEM) ...")
    mg.add_argument("--tls-key", help="... and this key")
    mg.add_argument("--tls-ca", help="the CA certificate its coordinators check --tls-cert with "
                                     "(default: --tls-cert itself, for a self-signed certificate)")
    mg.add_argument("--tls-server-name", help="a name in --tls-cert, for clients whose address is not in it "
                                              "(e.g. --listen 0.0.0.0:7000)")
    mg.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --listen address")
    mg.set_defaults(func=cmd_manager)
    sb = sub.add_parser("submit", help="send a job file to a standalone manager (tfsync manager)",
                        description="Send a job file to a running `tfsync manager`, which trains it. Paths "
                                    "in the job (run_dir, data.path) are made absolute first. Then `tfsync "
                                    "status|metrics|switch|stop JOB` reach it as for `tfsync run`.")
    sb.add_argument("job", help="path to the job file (TOML)")
    sb.add_argument("--manager", default="127.0.0.1:7000", help="the manager's host:port (default 127.0.0.1:7000)")
    sb.add_argument("--token-file", help="the manager's token file (default $TFSYNC_HOME/manager.token, "
                                         "where `tfsync manager` puts it)")
    sb.add_argument("--data", help="data path (overrides data.path)")
    from tfsync.job.overrides import OVERRIDE_HELP
    sb.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=OVERRIDE_HELP)
    sb.add_argument("--json", action="store_true", help="print the job's status as JSON")
    tls_options(sb)
    sb.set_defaults(func=cmd_submit)
    from tfsync.cli.jobs import add_commands as add_store_commands
    add_store_commands(sub)
    # `tfsync hook ...` is handed to tfsync.hooks.node.main whole (tfsync.cli.main); listed here for --help.
    sub.add_parser("hook", help="run this node's hook agent (starts its TF tasks for a manager); "
                                "`tfsync hook --help` for its options", add_help=False)
