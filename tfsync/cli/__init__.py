"""The ``tfsync`` command line (``tfsync.cli:main``): the top of tfsync's layers. This
package holds the job runner (``jobrun``) and one module per group of sub-commands; this
module assembles them (each adds its parsers with ``add_commands`` and imports nothing of
this one) and runs ``tfsync run`` / ``tfsync resume`` itself. Known errors print one line on stderr
and exit non-zero (``tfsync.base.exits``): 2 for bad input (job file, data), 1 for a failed run,
130 when interrupted."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time

from ..base import rundir
from ..base.exits import (EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, BadInput, codes_help, fail, interrupt,
                          report_error)
from ..base.quiet import ENV_VERBOSE, end_process, native_logs_off, quiet_tf_loggers

ENV_NO_REPORT = "TFSYNC_NO_REPORT"  # set (not "0"): `tfsync run` writes no report (--no-report)


def format_summary(s: dict) -> str:
    acc = s.get("test_accuracy")
    ended = f"stopped (tfsync stop) at {s['samples']:,} of {s['workload_samples']:,} samples after" \
        if s.get("stopped") else "done in"
    lines = [
        f"{ended} {s['wall_s']:.1f} s (cluster start {s['init_s']:.1f} s): {s['pushes']} steps, "
        f"{s['updates']} updates, {s['pushes_per_s']:.1f} steps/s, {s['samples_per_s']:.0f} samples/s "
        f"over {s.get('train_s', s['wall_s']):.1f} s of training"
        + (f", test accuracy {acc:.2%}" if acc is not None else "")
        + (f", test loss {s['test_loss']:.4g}" if s.get("test_loss") is not None else ""),
    ]
    parts = []
    for i, ph in enumerate(s["timeline"]):
        sw = next((x for x in s["switches"] if x["index"] == i), None)
        how = f", {sw['method']} switch {sw['overhead_s']:.2f} s" if sw else ", resumed" if ph.get("resumed") else ""
        parts.append(f"{ph['protocol']} from {ph['samples']} samples at {ph['time']:.1f} s{how}")
    lines.append("protocols: " + " -> ".join(parts))
    if s.get("scales"):
        lines.append(f"workers: {s['scales'][0]['from']}" + "".join(
            f" -> {sc['to']} at {sc['samples']:,} samples ({sc['by']}, {sc['seconds']:.1f} s)" for sc in s["scales"]))
    return "\n".join(lines)


def manager_token(args) -> str | None:
    """The embedded manager's token where it listens for other machines' hooks to join
    (``--manager-listen``): read from ``--manager-token-file`` (made if missing); else None,
    a new token for this run (``run_dir/control/token``). Options that cannot be honoured
    are refused first."""
    from ..api import auth, transport
    if not args.manager_listen:
        if args.manager_token_file or args.allow_remote:
            raise BadInput("--manager-token-file and --allow-remote are for --manager-listen")
        return None
    if args.no_manager or args.attach:
        raise BadInput("--manager-listen is for the manager `tfsync run` embeds (not with --no-manager or --attach)")
    try:
        transport.check_listen(args.manager_listen, args.allow_remote, None, warn=False)
    except (ValueError, transport.TransportError) as e:
        raise BadInput(f"--manager-listen: {e}") from None
    if not args.manager_token_file:
        return None
    path = os.path.expanduser(args.manager_token_file)
    return auth.read_token(path) if os.path.exists(path) else auth.write_token(path)


def cmd_run(args) -> int:
    from ..job.config import load_job

    from .jobrun import tasks_here, with_run_dir

    cfg = load_job(args.job, overrides=args.set)
    args.manager_token = manager_token(args)   # bad options refused before the run directory is touched
    here = tasks_here(cfg)
    if args.manager_listen and here:
        print("tfsync: warning: this job's tasks run on this machine (no cluster.hooks): no hook can join it; "
              "--manager-listen serves its status and commands", file=sys.stderr)
    if args.run_dir:
        cfg = with_run_dir(cfg, args.run_dir)
    isolate(args, here and not args.manager_listen and (not args.attach or args.attach.startswith("unix:")))
    from .search import stored_switch_point
    cfg, found = stored_switch_point(cfg)
    with rundir.claim(cfg.job.run_dir, "tfsync resume" if getattr(args, "resume", False) else "tfsync run") as run_dir:
        return _run(args, with_run_dir(cfg, run_dir), found)


def isolate(args, local: bool) -> None:
    """A local run's process goes into a network of its own (tfsync.base.isolation) before
    it starts anything: `tfsync` runs itself again there (exec: same pid). Where none can
    be had it is refused there in one line, unless the user accepted open ports. A
    program calling ``main`` keeps its process: its cluster's namespace and guard are
    tfsync.base.netns's, or it is refused there."""
    from ..base import isolation
    accept_open_ports(args)
    if local and args.own_process and not os.environ.get(isolation.ENV):   # (set: in one, or refused one)
        run_isolated([sys.executable, "-m", "tfsync.cli", *sys.argv[1:]], replace=True)


def run_isolated(command: list[str], replace: bool) -> int:
    """``command`` run by ``python -m tfsync.base.isolation`` (a fresh process of one thread,
    which a user namespace needs): in place of this process (``replace``: exec, same pid),
    else as a child whose exit code is returned."""
    argv = [sys.executable, "-m", "tfsync.base.isolation", *command]
    if not replace:
        import subprocess
        return subprocess.run(argv).returncode
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(sys.stderr.fileno(), 2)   # the real stderr (tfsync.base.quiet sent fd 2 to /dev/null)
    os.execv(sys.executable, argv)


def accept_open_ports(args) -> None:
    """``--open-ports``: said to this process and those it starts (tfsync.base.isolation)."""
    if args.open_ports:
        from ..base import isolation
        os.environ[isolation.OPEN_ENV] = "1"


def cmd_isolate(args) -> int:
    accept_open_ports(args)
    command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    if not command:
        raise BadInput("tfsync isolate: name a command to run, e.g. `tfsync isolate -- python train.py`")
    return run_isolated(command, replace=args.own_process)


def resumed_changes(checkpoint: str, plan: bool) -> dict:
    """What commands had changed in the phase checkpoint ``checkpoint`` was taken in
    (engine ``Phase.changed``), said on stderr; empty with ``plan`` (said too)."""
    from ..engine.checkpoints import load_state
    changed = (load_state(checkpoint) or {}).get("changed", {})
    if not changed:
        return {}
    what = []
    if "protocol" in changed:
        options = ", ".join(f"{k} {v}" for k, v in changed.get("options", {}).items())
        what.append(f"{changed['protocol']}{f' ({options})' if options else ''} at learning rate "
                    f"x{changed['lr_scale']:g}")
    if "batch_sizes" in changed:
        what.append(f"batch sizes {changed['batch_sizes']}")
    if plan:
        print(f"--plan: the job file's plan, not {' and '.join(what)} as commands had set it", file=sys.stderr)
        return {}
    print(f"goes on with {' and '.join(what)} as commands set it, until the plan's next phase "
          "(`tfsync resume --plan`: the job file's plan)", file=sys.stderr)
    return changed


def _run(args, cfg, found) -> int:
    if found is not None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(found["stored"]))
        from ..switch.plan import SwitchPlan
        print(f"switch point: {SwitchPlan.words(found['fraction'])} (found by `tfsync search` "
              f"on {when}; set switch.point = \"job\" to use the job file's)", file=sys.stderr)
    from .jobrun import own_process_imports, run_job
    if args.own_process:
        own_process_imports(cfg)
    from ..base.nospace import NoSpaceError
    from ..base.usercode import UserCodeError

    resume = None
    if getattr(args, "resume", False):
        from ..engine.records import finished, last_intact_checkpoint
        done = finished(cfg.job.run_dir, cfg.train.epochs)
        if done is not None:
            print(f"{cfg.job.name} is done: it trained {done['samples']:,} of {done['workload_samples']:,} samples "
                  f"({cfg.job.run_dir}/summary.json); nothing to resume, nothing started (raise train.epochs to "
                  f"train on, or `tfsync run {args.job}` to start again)", file=sys.stderr)
            return 0
        resume, skipped = last_intact_checkpoint(cfg.job.run_dir)
        for path, why in skipped:
            print(f"skipped checkpoint {path}: it does not read back ({why})", file=sys.stderr)
        if resume is None and skipped:
            return fail(f"{cfg.job.run_dir}: no checkpoint reads back whole (newest: {skipped[0][0]}: "
                        f"{skipped[0][1]}); start the job again with `tfsync run {args.job}`", EXIT_FAILED)
        if resume is None:
            return fail(f"{cfg.job.run_dir}: no checkpoint to resume from; start the job with "
                        f"`tfsync run {args.job}` (checkpoints need train.checkpoint_every > 0)", EXIT_BAD_INPUT)
        print(f"resuming {cfg.job.name} from {resume['path']} ({resume['samples']} samples done)", file=sys.stderr)
        changed = resumed_changes(resume["path"], args.plan)
        if changed:
            resume = {**resume, "changed": changed}
    else:
        from ..engine.records import set_aside_previous_run
        moved = set_aside_previous_run(cfg.job.run_dir)
        if moved:
            print(f"the previous run's outputs in {cfg.job.run_dir} were moved to {moved}", file=sys.stderr)
    from ..base.progress import Progress
    progress = None if (args.json or args.quiet) else Progress()
    manager, state, summary = None, "failed", None
    try:
        if args.attach:  # started by a standalone manager (tfsync manager), which records the outcome
            from ..api.transport import TlsConfig
            from ..manager import embedded
            manager = embedded.attach(args.attach, args.token_file, args.job_id, args.run_id, cfg.job.run_dir,
                                      (resume or {}).get("workers") or cfg.cluster.workers, cfg.protocol[0].name,
                                      local_tasks=not cfg.cluster.hooks,
                                      tls=TlsConfig(ca_file=args.ca, server_name=args.server_name) if args.ca else None)
        elif not args.no_manager:  # embedded: status/switch/stop reach this run through it
            import dataclasses

            from ..manager import embedded
            manager = embedded.start(cfg.job.run_dir, cfg.job.name, dataclasses.asdict(cfg),
                                     (resume or {}).get("workers") or cfg.cluster.workers, cfg.protocol[0].name,
                                     resume=resume is not None, listen=args.manager_listen,
                                     allow_remote=args.allow_remote, token=args.manager_token)
        summary = run_job(cfg, progress=progress, data_path=args.data,
                          controller=manager.link if manager else None, resume=resume,
                          cluster_factory=manager.nodes if manager else None)
        state = "stopped" if summary.get("stopped") else "done"
    except UserCodeError as e:   # which job file named the code (main turns every TfsyncError into its line)
        return fail(f"{args.job}: {e}", e.exit_code)
    except NoSpaceError as e:
        from ..engine.records import last_intact_checkpoint
        if resume is None and last_intact_checkpoint(cfg.job.run_dir)[0] is None:
            raise e.then(f"`tfsync run {args.job}` starts the job again (it has no checkpoint yet)") from None
        raise
    except KeyboardInterrupt:
        state = "stopped"
        if progress:
            progress.done()
        return fail(f"interrupted; all tasks stopped. Checkpoints: {cfg.job.run_dir}/checkpoints",
                    EXIT_INTERRUPTED)
    finally:
        if manager:
            manager.finish(state, summary)
    if progress:
        progress.done()
    report = None if args.no_report else _report(cfg.job.run_dir)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
        print(f"run directory: {os.path.abspath(cfg.job.run_dir)}")
        print(f"report: {report}" if report else f"report: `tfsync report {cfg.job.run_dir}`"
              + ("" if args.no_report else " (it failed here)"))
    return 0


def cmd_tfconfig(args) -> int:
    """Print the TF_CONFIG of every task of a job for the addresses given."""
    import shlex

    from ..base import tfconfig
    from ..job.config import load_job

    cfg = load_job(args.job, overrides=args.set)
    spec = {"chief": [args.chief], "ps": args.ps.split(","), "worker": args.workers.split(",")}
    for job, key, count in (("ps", "ps", cfg.cluster.ps), ("worker", "workers", cfg.cluster.workers)):
        if len(spec[job]) != count:
            return fail(f"--{key}: {len(spec[job])} addresses, but the job has cluster.{key} = {count}", EXIT_BAD_INPUT)
    for job, addresses in spec.items():
        for a in addresses:
            if a.count(":") != 1 or not a.rsplit(":", 1)[1].isdigit():
                return fail(f"--{'workers' if job == 'worker' else job}: {a!r} is not host:port", EXIT_BAD_INPUT)
    configs = tfconfig.generate(spec)
    if args.json:
        print(json.dumps({f"{job}:{i}": value for (job, i), value in configs.items()}, indent=2))
        return 0
    for (job, i), value in configs.items():
        runs = f"tfsync run {args.job}" if job == "chief" else "python -m tfsync.engine.server"
        print(f"# {job} {i} at {spec[job][i]}: runs `{runs}`")
        print(f"TF_CONFIG={shlex.quote(value)}")
    return 0


def _report(run_dir: str) -> str | None:
    """The run's report.html (tfsync.report), or None and a one-line warning: a report
    that cannot be drawn does not fail a finished run."""
    try:
        from ..report import write_report
        return os.path.abspath(write_report([run_dir]))
    except Exception as e:  # noqa: BLE001  (matplotlib missing, a figure that cannot be drawn, ...)
        logging.getLogger("tfsync.report").warning("no report: %s", e)
        return None


def build_parser() -> argparse.ArgumentParser:
    # The epilog keeps its lines (a table); the description is wrapped here for the same reason.
    p = argparse.ArgumentParser(
        prog="tfsync", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Parameter-server training with per-worker synchronization control\n"
                    "(BSP, ASP, SSP, Sync-Switch) on TensorFlow's ParameterServerStrategy.",
        epilog=codes_help() + "\n`tfsync COMMAND --help` describes a command.")
    from ..base.version import VERSION
    from ..job.overrides import OVERRIDE_HELP
    p.add_argument("--version", action="version", version=f"tfsync {VERSION}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: policy decisions)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    r = sub.add_parser("run", help="train a job file on a local cluster",
                       description="Train the job described by a TOML job file (see jobs/mnist.toml) "
                                   "on PS and worker task processes started on this machine. "
                                   "Writes metrics.jsonl, TensorBoard scalars, checkpoints and "
                                   "summary.json to the job's run directory.")
    rs = sub.add_parser("resume", help="continue a job from its last checkpoint (after a crash or a stop)",
                        description="Continue the job described by a TOML job file from the newest "
                                    "checkpoint in its run directory: weights, optimizer state and "
                                    "progress continue; records are appended to metrics.jsonl. What "
                                    "commands changed before the stop (a `tfsync switch`, "
                                    "`tfsync batch-sizes`) holds until the plan's next phase.")
    rs.add_argument("--plan", action="store_true",
                    help="follow the job file's plan from the checkpoint, dropping what commands changed")
    for q in (r, rs):
        q.add_argument("job", help="path to the job file (TOML)")
        q.add_argument("--data", help="data path (overrides data.path): a Keras .npz or an MNIST IDX folder")
        q.add_argument("--run-dir", help="run directory (overrides job.run_dir)")
        q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=OVERRIDE_HELP)
        q.add_argument("--json", action="store_true", help="print the summary as JSON on stdout, no progress bar")
        q.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
        q.add_argument("--no-report", action="store_true",
                       default=os.environ.get(ENV_NO_REPORT, "") not in ("", "0"),
                       help=f"do not write run_dir/report.html at the end (`tfsync report` makes it later; "
                            f"default: ${ENV_NO_REPORT})")
        q.add_argument("--no-manager", action="store_true",
                       help="no embedded manager: the run cannot be reached by status/switch/stop")
        q.add_argument("--manager-listen", metavar="HOST:PORT",
                       help="where the embedded manager listens (default: loopback, a free port); an address other "
                            "machines reach lets their hooks join the job (`tfsync hook --join HOST:PORT`)")
        q.add_argument("--allow-remote", action="store_true",
                       help="allow a non-loopback --manager-listen (plaintext: keep it on a trusted network)")
        q.add_argument("--manager-token-file", metavar="PATH",
                       help="with --manager-listen: the manager's token (created, mode 0600, if missing; default: "
                            "a new one for the run, in run_dir/control/token); joining hooks need a copy (their "
                            "--manager-token-file): it controls this job, keep it as you keep the hooks' token")
        q.add_argument("--attach", metavar="ADDRESS", help="report to the standalone manager at ADDRESS instead of "
                       "embedding one (set by `tfsync manager` for submitted jobs, with the options below)")
        q.add_argument("--open-ports", action="store_true",
                       help="where no network of its own can be had for the run (an ordinary user with "
                            "unprivileged user namespaces off), run anyway with the TF task ports open to every "
                            "local user (default: refuse, saying why)")
        q.add_argument("--token-file", help=argparse.SUPPRESS)
        q.add_argument("--job-id", help=argparse.SUPPRESS)
        q.add_argument("--run-id", type=int, default=0, help=argparse.SUPPRESS)
        q.add_argument("--ca", help=argparse.SUPPRESS)           # the CA of a TLS manager
        q.add_argument("--server-name", help=argparse.SUPPRESS)  # and the name in its certificate
    r.set_defaults(func=cmd_run)
    rs.set_defaults(func=cmd_run, resume=True)
    iso = sub.add_parser("isolate", help="run a program (your own script using tfsync's Python API or Keras "
                         "path) in a network of its own",
                         description="Run CMD in a new network namespace holding only loopback, so the TF task "
                                     "ports of the local clusters it starts reach no other user or machine (as "
                                     "`tfsync run` does for itself). Root makes the namespace and, under sudo, "
                                     "CMD runs as the user who ran sudo; an ordinary user needs unprivileged "
                                     "user namespaces. CMD has no network beyond this loopback: stage its data "
                                     "first.")
    iso.add_argument("--open-ports", action="store_true",
                     help="where no namespace can be had, run CMD anyway with open task ports (default: refuse)")
    iso.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- CMD [ARG ...]")
    iso.set_defaults(func=cmd_isolate)
    tc = sub.add_parser("tfconfig", help="print each task's TF_CONFIG (Kubernetes TFJob, Slurm)",
                        description="The TF_CONFIG of every task of a job on the given addresses, for platforms "
                                    "that start the tasks themselves: each PS and worker runs "
                                    "`python -m tfsync.engine.server` with its TF_CONFIG, the chief runs "
                                    "`tfsync run JOB` with its own (the engine then connects to those tasks). "
                                    "Workers read the training records from data/ under their working "
                                    "directory (a shared run directory), or use a data function that "
                                    "returns a per-worker tf.data factory.")
    tc.add_argument("job", help="path to the job file (TOML): its cluster.workers and cluster.ps")
    tc.add_argument("--chief", required=True, metavar="HOST:PORT", help="the coordinator's address")
    tc.add_argument("--ps", required=True, metavar="HOST:PORT,...", help="the parameter servers' addresses")
    tc.add_argument("--workers", required=True, metavar="HOST:PORT,...", help="the workers' addresses")
    tc.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=OVERRIDE_HELP)
    tc.add_argument("--json", action="store_true", help='print {"job:index": TF_CONFIG} as JSON')
    tc.set_defaults(func=cmd_tfconfig)
    from .search import add_commands as add_search_commands
    add_search_commands(sub)
    from .rl import add_commands
    add_commands(sub)
    from .manager import add_commands as add_control_commands
    add_control_commands(sub)
    from .predict import add_commands as add_predict_commands
    add_predict_commands(sub)
    from .report import add_commands as add_report_commands
    add_report_commands(sub)
    from .testbed import add_commands as add_testbed_commands
    add_testbed_commands(sub)
    from .k8s import add_commands as add_k8s_commands
    add_k8s_commands(sub)
    return p


def main(argv=None) -> int:
    """The command line (``argv``: a program's or a test's arguments; None: this process
    is `tfsync`, which ends once the command is done: ``tfsync.base.quiet.end_process``)."""
    if argv is not None:
        return _main(list(argv), from_command_line=False)
    end_process(_main(sys.argv[1:], from_command_line=True))


def _main(argv: list, from_command_line: bool) -> int:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # not a log line per failed TLS handshake; tfsync says why
    if argv[:1] == ["hook"]:
        from ..hooks.node import main as hook_main
        return hook_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    args.own_process = from_command_line   # tfsync's process: not a program (or a test) calling main()
    # SIGTERM (kill, timeout, a batch system) ends a run as Ctrl-C does: every task stopped,
    # a paused (injected) worker continued first, the job store told
    signal.signal(signal.SIGTERM, interrupt)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2" if args.verbose else "3")
    if args.verbose:  # TF's start-up lines and gRPC logs too (tfsync.base.quiet)
        os.environ[ENV_VERBOSE] = "1"
    if from_command_line:
        native_logs_off()
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    quiet_tf_loggers()
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return args.func(args)
    except Exception as e:
        return report_error(e)
