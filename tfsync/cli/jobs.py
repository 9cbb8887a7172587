"""`tfsync jobs | runs`, and `tfsync status` for a job that has ended: what the job store
($TFSYNC_HOME/jobs.db, or --store) holds about jobs, their runs and results. Reading never
creates a store: a missing one lists as empty."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time

from tfsync.base.exits import EXIT_BAD_INPUT, fail
from tfsync.manager.store_types import JOB_STATES

ENDED = ("stopped", "failed", "done")
NO_JOBS = ("no jobs yet in the job store {path}; start one with `tfsync run JOB_FILE` "
           "(or `tfsync submit` to a `tfsync manager`)")


@contextlib.contextmanager
def existing_store(path: str):
    """The Store at ``path``, or None where there is no file (Store() would make one)."""
    if not os.path.isfile(path):
        yield None
        return
    from tfsync.manager.store import Store
    with Store(path) as store:
        yield store


def find_job(store, *, job_id: str | None = None, run_dir: str | None = None, key: str | None = None):
    """The job with ``job_id``, else the newest whose run directory is ``run_dir``, else the
    job whose id is ``key``, else the newest named ``key``; None if none."""
    jobs = store.jobs()[::-1]  # newest first
    same = os.path.realpath(run_dir) if run_dir else None
    for match in (lambda j: j.id == job_id, lambda j: same and j.run_dir and os.path.realpath(j.run_dir) == same,
                  lambda j: j.id == key, lambda j: j.name == key):
        found = next((j for j in jobs if match(j)), None)
        if found is not None:
            return found
    return None


# -- formatting -------------------------------------------------------------------------------
def when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def duration(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(round(s), 60)
    return f"{m}m{sec:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def protocols(config) -> list[str]:
    """The protocol names of a stored job config, in order ([] if it names none)."""
    phases = config.get("protocol") if isinstance(config, dict) else None
    return [p["name"] for p in phases or () if isinstance(p, dict) and isinstance(p.get("name"), str)] \
        if isinstance(phases, list) else []


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_SHOWN = {"test_accuracy": lambda v: f"test accuracy {v:.2%}",
          "converged_accuracy": lambda v: f"converged accuracy {v:.2%}",
          "test_loss": lambda v: f"test loss {v:.4g}",
          "wall_s": lambda v: f"wall {duration(v)}", "train_s": lambda v: f"training {duration(v)}",
          "time": lambda v: f"time {duration(v)}",
          "pushes": lambda v: f"{v:,} steps", "samples": lambda v: f"{v:,} samples",
          "exit_code": lambda v: f"exit code {v}"}


def first_test(results: dict) -> str:
    """A job's first test number for its row: the accuracy, else (a regression) the loss."""
    if _number(results.get("test_accuracy")):
        return f"acc {results['test_accuracy']:.2%}"
    return f"loss {results['test_loss']:.4g}" if _number(results.get("test_loss")) else "-"


def results_text(results: dict) -> str:
    """Results in words: known keys first, other numbers and words as ``key value`` ("" if none).
    A search trial scored on its loss (``extra.metric`` "neg_log_loss") shows that loss."""
    extra = results.get("extra") if isinstance(results.get("extra"), dict) else {}
    if extra.get("metric") == "neg_log_loss" and _number(results.get("converged_accuracy")):
        loss = math.exp(-results["converged_accuracy"])   # the trial's score is -ln(converged test loss)
        results = {"converged test loss": float(f"{loss:.4g}"),
                   **{k: v for k, v in results.items() if k != "converged_accuracy"}}
    parts = [show(results[k]) for k, show in _SHOWN.items() if _number(results.get(k))]
    parts += [f"{k.replace('test_', 'test ', 1)} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
              for k, v in results.items() if k not in _SHOWN and k != "stopped" and (_number(v) or isinstance(v, str))]
    return ", ".join(parts)


def totals_text(record: dict) -> str:
    """A job of several runs (resumed): its wall and training time in all and per run ("" for one run)."""
    walls, trains = record["run_walls"], record["run_trains"]
    if len(walls) < 2:
        return ""
    each = lambda vs: " + ".join(duration(v) for v in vs)  # noqa: E731
    text = f"{len(walls)} runs: wall {duration(record['wall_s'])} in all ({each(walls)})"
    if len(trains) == len(walls):   # not a total over fewer runs than the wall time's
        text += f", training {duration(record['train_s'])} ({each(trains)})"
    return text


def table(header: tuple, rows: list[tuple]) -> str:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in (header, *rows))


# -- records (the --json output) ---------------------------------------------------------------
def protocols_ran(store, job) -> list[str]:
    """What the job trained with, in order, a protocol a command switched to marked "(by
    command)"; the job file's plan while nothing has trained yet."""
    ran = store.protocols_ran(job.id)
    if not ran:
        return protocols(job.config)
    by_command = [(e.detail.get("from"), e.detail.get("to")) for run in store.runs(job.id)
                  for e in store.events(run.id, "switch")
                  if e.detail.get("by") == "command" and e.detail.get("from") != e.detail.get("to")]
    out = ran[:1]
    for before, now in zip(ran, ran[1:]):
        manual = (before, now) in by_command
        if manual:   # each command's switch marks one change, the first that matches it
            by_command.remove((before, now))
        out.append(f"{now} (by command)" if manual else now)
    return out


def job_record(store, job) -> dict:
    runs = store.runs(job.id)
    done = [store.results(run.id) for run in runs if run.kind != "trial"]
    walls = [r["wall_s"] for r in done if _number(r.get("wall_s"))]
    trains = [r["train_s"] for r in done if _number(r.get("train_s"))]
    return {"id": job.id, "name": job.name, "state": job.state, "created": job.created,
            "ended": job.updated if job.state in ENDED else None, "protocols": protocols_ran(store, job),
            "workers": workers_ran(store, job, runs),
            "plan": protocols(job.config),
            "runs": len(runs), "results": store.results(runs[-1].id) if runs else {},
            "wall_s": sum(walls) if walls else None,   # every run's, a resumed job's too
            "train_s": sum(trains) if trains else None, "run_walls": walls, "run_trains": trains,
            "run_dir": job.run_dir, "signature": job.signature}


def workers_ran(store, job, runs) -> list[int]:
    """The job's worker counts in order: the first, then each a scale left (every run's)."""
    counts = [int(job.config.get("cluster", {}).get("workers") or 0)] if isinstance(job.config, dict) else []
    for run in runs:
        counts += [e.detail["to"] for e in store.events(run.id, "scaled") if isinstance(e.detail.get("to"), int)]
    return [n for i, n in enumerate(counts) if n and (i == 0 or n != counts[i - 1])]


def scales_text(store, run) -> list[str]:
    return [f"{e.detail.get('from')} -> {e.detail.get('to')} workers ({e.detail.get('by')})"
            for e in store.events(run.id, "scaled")]


def run_state(job, run, results: dict, latest: bool) -> str:
    """A run's outcome: the job's state for its latest run, else what its results say
    ("ended": interrupted or killed, and continued by a later run)."""
    if run.kind == "trial":
        return "done" if results else "ended"
    if latest:
        return job.state
    if results.get("stopped"):
        return "stopped"
    return "failed" if "exit_code" in results else "done" if "wall_s" in results else "ended"


def run_records(store, job) -> list[dict]:
    runs = store.runs(job.id)
    out = []
    for i, run in enumerate(runs):
        results, last = store.results(run.id), store.last_step(run.id)
        latest = i == len(runs) - 1
        state = run_state(job, run, results, latest)
        if run.kind == "trial":  # stored once it has finished; its steps are not
            ended = None
        elif latest:
            ended = job.updated if state in ENDED else None
        else:
            ended = last.time if last else None
        switches = [f"{e.detail.get('from')} -> {e.detail.get('to')}"
                    + (" (by command)" if e.detail.get("by") == "command" else "")
                    for e in store.events(run.id, "switch")]
        out.append({"id": run.id, "kind": run.kind, "started": run.started, "ended": ended, "state": state,
                    "results": results, "switches": switches, "scales": scales_text(store, run),
                    "last_step": None if last is None else {"step": last.step, "time": last.time, "loss": last.loss,
                                                            "protocol": last.protocol},
                    "search": run.config.get("search") if isinstance(run.config, dict) else None})
    return out


# -- commands ---------------------------------------------------------------------------------
def cmd_jobs(args) -> int:
    from tfsync.manager.home import default_store
    path = args.store or default_store()
    with existing_store(path) as store:
        jobs = store.jobs(args.state)[::-1] if store else []
        shown = jobs[:args.limit] if args.limit else jobs
        records = [job_record(store, j) for j in shown]
        total = len(store.jobs()) if store and args.state else len(jobs)
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    if not records:
        print(NO_JOBS.format(path=path) if not total else
              f"no {args.state} jobs in the job store {path} ({total} in all; `tfsync jobs` lists them)")
        return 0
    rows = [(r["id"], r["name"], r["state"], when(r["created"]), when(r["ended"]), " -> ".join(r["protocols"]) or "-",
             " -> ".join(map(str, r["workers"])) or "-", str(r["runs"]),
             first_test(r["results"]),
             duration(r["wall_s"]) if r["wall_s"] is not None else "-",
             duration(r["train_s"]) if r["train_s"] is not None else "-", r["run_dir"] or "-")
            for r in records]
    print(table(("JOB", "NAME", "STATE", "CREATED", "ENDED", "PROTOCOLS", "WORKERS", "RUNS", "TEST", "WALL", "TRAINING",
                 "RUN DIR"), rows))
    if len(shown) < len(jobs):
        print(f"({len(shown)} newest of {len(jobs)} jobs; --limit 0 lists all)")
    return 0


def cmd_runs(args) -> int:
    from tfsync.cli.lookup import run_dir_of

    from tfsync.manager.home import default_store
    path = args.store or default_store()
    with existing_store(path) as store:
        run_dir = str(run_dir_of(args.job)) if os.path.exists(args.job) else None
        job = find_job(store, run_dir=run_dir, key=args.job) if store else None
        if job is None:
            return fail(f"no job {args.job!r} in the job store {path}" + ("" if store else " (there is none yet)")
                        + "; `tfsync jobs` lists the jobs with their ids and names", EXIT_BAD_INPUT)
        record, runs = job_record(store, job), run_records(store, job)
    if args.json:
        print(json.dumps({"job": record, "runs": runs}, indent=2))
        return 0
    print(f"job {job.id} ({job.name}): {job.state}, {' -> '.join(record['protocols']) or 'no protocol'}, "
          f"run dir {job.run_dir or '-'}")
    rows = []
    for r in runs:
        text = results_text(r["results"]) or "-"
        if r["search"]:
            text = f"switch at {r['search'].get('fraction')} (trial {r['search'].get('run')}): {text}"
        elif not r["results"] and r["last_step"]:
            text = f"step {r['last_step']['step']} ({r['last_step']['protocol']})"
        if r["switches"]:
            text = f"switched {', '.join(r['switches'])}; {text}"
        if r["scales"]:
            text = f"scaled {', '.join(r['scales'])}; {text}"
        rows.append((str(r["id"]), r["kind"], when(r["started"]), when(r["ended"]), r["state"], text))
    print(table(("RUN", "KIND", "STARTED", "ENDED", "STATE", "RESULTS"), rows) if rows else "no runs yet")
    totals = totals_text(record)
    if totals:
        print(totals)
    return 0


def show_ended(args, e) -> int:
    """`tfsync status` when no manager answers for the job (``e``, a NotRunning): its final
    state and results from the job store, or one line saying it is found nowhere."""
    from tfsync.cli.lookup import run_dir_of

    from tfsync.manager.home import default_store
    path = args.store or e.info.get("store") or default_store()
    with existing_store(path) as store:
        job = find_job(store, job_id=e.info.get("job_id"), run_dir=str(run_dir_of(args.target)),
                       key=args.target) if store else None
        if job is None:
            return fail(f"{e}; the job store {path} has no job with that run directory, id or name either",
                        EXIT_BAD_INPUT)
        record, runs = job_record(store, job), store.runs(job.id)
    if args.json:
        print(json.dumps({"job_id": job.id, "name": job.name, "state": f"JOB_STATE_{job.state.upper()}",
                          "run_id": runs[-1].id if runs else 0, "run_dir": job.run_dir, "created": job.created,
                          "updated": job.updated, "protocols": record["protocols"], "results": record["results"],
                          "store": path}, indent=2))
        return 0
    ended = f" at {when(job.updated)}" if job.state in ENDED else ""
    text = results_text(record["results"])
    print(f"job {job.id} ({job.name}): {job.state}{ended}, {' -> '.join(record['protocols']) or 'no protocol'}"
          + (f", {text}" if text else ""))
    note = "" if job.state in ENDED else (f"; the store says {job.state}, but no manager answers: it may be "
                                          "starting, or its process was killed (`tfsync resume JOB` continues it)")
    totals = totals_text(record)
    if totals:
        print(f"{totals}; the results above are the last run's")
    print(f"run dir {job.run_dir or '-'}; from the job store {path}{note}")
    return 0


def _count(text: str) -> int:
    try:
        n = int(text)
        if n >= 0:
            return n
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r}: expected a count >= 0 (0: all)")


def add_commands(sub) -> None:
    j = sub.add_parser("jobs", help="list the jobs in the job store, newest first",
                       description="List the jobs `tfsync run`, `tfsync manager` and `tfsync search` recorded "
                                   "in the job store, newest first: id, name, state, when created and ended, "
                                   "protocols, runs, the latest run's test accuracy and wall time, run "
                                   "directory. `tfsync runs JOB` shows one job's runs.")
    j.add_argument("--store", help="job store (default $TFSYNC_HOME/jobs.db)")
    j.add_argument("--state", choices=JOB_STATES, help="only jobs in this state")
    j.add_argument("--limit", type=_count, default=20, metavar="N", help="at most N jobs (default 20; 0: all)")
    j.add_argument("--json", action="store_true", help="print a JSON list (Unix times, all results)")
    j.set_defaults(func=cmd_jobs)
    r = sub.add_parser("runs", help="list one job's runs (start, resumes, search trials) and their results",
                       description="List the runs of one job in the job store: each start, resume or "
                                   "search trial, with its kind, start and end, outcome and results.")
    r.add_argument("job", metavar="JOB",
                   help="a job id or name (as `tfsync jobs` shows), a run directory or a job file")
    r.add_argument("--store", help="job store (default $TFSYNC_HOME/jobs.db)")
    r.add_argument("--json", action="store_true", help="print the job and its runs as JSON (Unix times)")
    r.set_defaults(func=cmd_runs)
