"""``tfsync search JOB``: the switch-point search for a recurring job (Sync-Switch §IV-B1,
Algorithm 1) on the local cluster, and ``tfsync search --show JOB``.

Every trial is one training of the job file with BSP for a share of the workload, then
ASP, run in a child process (``python -m tfsync.cli.trial``), so a trial that fails
or is interrupted never takes the search down with it. Trials and the answer go to the
job store under the job's signature (``config_signature``): a search that is stopped
resumes from its stored trials, a later search of the same recurring job reuses them,
and ``tfsync run`` then switches at the stored point (``switch.point = "auto"``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time

from ..base import rundir
from ..base.exits import EXIT_FAILED, EXIT_INTERRUPTED, BadInput, TfsyncError, fail
from ..switch.plan import SwitchPlan

EVALS_PER_RUN = 20  # when the job file sets no train.eval_every: the curve's resolution


def add_commands(sub) -> None:
    s = sub.add_parser(
        "search", help="find when to switch from BSP to ASP for a recurring job (binary search)",
        description="Binary search (Sync-Switch, Algorithm 1) for the earliest switch from BSP to ASP "
                    "whose converged test accuracy stays within --beta of BSP's (a job with no accuracy, "
                    "e.g. a regression: whose converged test loss stays within a factor exp(--beta) of "
                    "BSP's, about --beta relative). Trains the job file "
                    "R times per setting on a local cluster; trials are stored in the job store, so an "
                    "interrupted search resumes and `tfsync run` uses the answer. Then ASP only is trained R "
                    "times too, and the answer is whichever acceptable plan trained fastest: ASP only, the "
                    "switch point found, or BSP only.")
    s.add_argument("job", help="path to the job file (TOML)")
    s.add_argument("--runs", type=int, default=3, metavar="R", help="training runs per setting (default 3)")
    s.add_argument("--settings", type=int, default=4, metavar="M", help="switch points tried (default 4)")
    s.add_argument("--beta", type=float, default=0.01,
                   help="accuracy margin below the target (default 0.01); for a job without accuracy, the "
                        "margin on -ln(test loss), i.e. a test loss up to exp(beta) times the target's")
    target = s.add_mutually_exclusive_group()
    target.add_argument("--target", type=float, help="target accuracy A (default: the mean of R BSP runs)")
    target.add_argument("--target-loss", type=float, metavar="L",
                        help="for a job without accuracy (e.g. a regression): the test loss to reach "
                             "(default: the mean -ln(test loss) of R BSP runs)")
    s.add_argument("--ends", action=argparse.BooleanOptionalAction, default=True,
                   help="also train ASP only and answer the fastest acceptable plan (default); --no-ends: "
                        "Algorithm 1's switch point as printed, R trials fewer")
    s.add_argument("--data", help="data path (overrides data.path)")
    from ..job.overrides import OVERRIDE_HELP
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=OVERRIDE_HELP + " (the job's signature is that of the overridden job: give `tfsync run` "
                        "the same --set to use the answer)")
    s.add_argument("--store", help="job store (default $TFSYNC_HOME/jobs.db)")
    s.add_argument("--show", action="store_true", help="print the stored result for this job and exit")
    s.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    s.set_defaults(func=cmd_search)


def _job_words(args) -> str:
    """The job file and its --set options as a command line repeats them."""
    import shlex
    return " ".join(shlex.quote(w) for w in [args.job, *(f"--set={t}" for t in args.set)])


def open_store(path: str | None = None):
    from ..manager.home import default_store
    from ..manager.store import Store
    return Store(path or default_store())


def stored_switch_point(cfg, store_path: str | None = None):
    """``(cfg with the stored switch point, its record)`` for a bsp -> asp job whose
    ``switch.point`` is "auto" and whose recurring-job signature has a stored search
    result; otherwise ``(cfg, None)``."""
    from .jobrun import with_switch_point
    from ..switch.trials import config_signature
    if cfg.switch.point != "auto" or [p.name for p in cfg.protocol] != ["bsp", "asp"]:
        return cfg, None
    from ..manager.home import default_store
    path = store_path or default_store()
    if not os.path.exists(path):
        return cfg, None
    with open_store(path) as store:
        found = store.switch_point(config_signature(cfg.to_dict()))
    if found is None:
        return cfg, None
    fraction, detail, when = found
    return with_switch_point(cfg, fraction), {"fraction": fraction, "stored": when, **detail}


def trial_config(cfg, fraction: float, run: int):
    """The job of trial ``run`` at ``fraction``: its own seed and run directory."""
    from .jobrun import with_switch_point
    t = with_switch_point(cfg, fraction)
    run_dir = os.path.join(cfg.job.run_dir, "search", f"bsp{fraction:.6g}_run{run}")
    switch = dataclasses.replace(t.switch, stragglers="none", point="job")  # trials run the plan as given
    return dataclasses.replace(t, job=dataclasses.replace(t.job, seed=cfg.job.seed + run, run_dir=run_dir),
                               switch=switch)


class TrialScoreError(BadInput, ValueError):
    """A trial reports nothing the search can compare (exit 2): no test accuracy, no test loss > 0."""


class TrialFailed(TfsyncError, RuntimeError):
    """A trial's process failed (exit 1); the trials done before it are stored."""


def trial_score(summary: dict) -> tuple[float, str]:
    """(score, metric) of a trial: its converged test accuracy ("accuracy") where the job
    reports one; else -ln of its converged test loss ("neg_log_loss": higher is better, and
    a margin beta on it is a relative margin exp(beta) on the loss). TrialScoreError when
    neither can be had."""
    from ..base.curves import converged_accuracy
    if summary.get("converged_accuracy") is not None:
        return float(summary["converged_accuracy"]), "accuracy"
    losses = [e["loss"] for e in summary.get("evals", []) if e.get("loss") is not None]
    loss = converged_accuracy(losses) if losses else summary.get("test_loss")  # the same convergence rule
    if loss is None:
        raise TrialScoreError("tfsync search compares test accuracy, or the test loss where there is none, and this "
                         "job reports neither (give the data function test arrays, or [data] validation)")
    if not (math.isfinite(loss) and loss > 0):
        raise TrialScoreError(f"tfsync search compares -ln(test loss) where a job has no accuracy, and a trial's "
                              f"converged test loss is {loss!r} (not > 0)")
    return -math.log(loss), "neg_log_loss"


def run_trial_process(cfg, data_path: str | None) -> dict:
    """Train ``cfg`` in a child process; its summary. TrialFailed on failure."""
    request = {"config": cfg.to_dict(), "data": data_path, "evals_per_run": EVALS_PER_RUN}
    out = os.path.join(cfg.job.run_dir + ".summary.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    # a local trial in a network of its own, as `tfsync run` (tfsync.base.isolation)
    from .jobrun import tasks_here
    isolated = [sys.executable, "-m", "tfsync.base.isolation"] if tasks_here(cfg) else []
    proc = subprocess.Popen([*isolated, sys.executable, "-m", "tfsync.cli.trial", out], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(json.dumps(request))
    except BaseException:  # Ctrl-C or SIGTERM: the trial stops its tasks (and continues a paused one)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    if proc.returncode != 0:
        tail = (err.strip().splitlines() or ["(no output)"])[-1]
        raise TrialFailed(f"trial in {cfg.job.run_dir} failed (exit {proc.returncode}): {tail}; the trials done "
                          "so far are stored: run the same command to resume")
    with open(out) as f:
        return json.load(f)


def confidence(accuracies, threshold: float) -> float | None:
    """Probability that the mean converged accuracy of this setting is >= ``threshold``,
    from its R runs (Student's t); None with one run."""
    if len(accuracies) < 2:
        return None
    from scipy import stats
    sd = statistics.stdev(accuracies)
    mean = statistics.fmean(accuracies)
    if sd == 0:
        return 1.0 if mean >= threshold else 0.0
    return float(stats.t.cdf((mean - threshold) / (sd / math.sqrt(len(accuracies))), len(accuracies) - 1))


def describe(result, settings, metric: str = "accuracy") -> dict:
    threshold = result.target - settings.beta
    return {
        "fraction": result.fraction, "target": result.target, "beta": settings.beta, "metric": metric,
        "runs": settings.runs, "settings": settings.settings, "bsp": list(result.bsp),
        "tried": [{"fraction": s.fraction, "scores": list(s.accuracies), "mean": s.score,
                   "accepted": s.accepted, "confidence": confidence(s.accuracies, threshold)}
                  for s in result.settings],
        "trials_run": result.trials_run, "trials_reused": result.trials_reused,
        "search_time_s": round(result.time, 3),
        "searched": result.searched, "times": {str(f): round(t, 3) for f, t in sorted(result.times.items())},
    }


def trial_scales(summary: dict) -> list[dict]:
    """How a trial's worker count changed (a lost worker under ``cluster.min_workers``: a
    trial takes no commands): from, to, by what, at which share of its workload."""
    total = summary.get("workload_samples") or 0
    return [{"from": s["from"], "to": s["to"], "by": s["by"],
             "at": round(s["samples"] / total, 4) if total else None} for s in summary.get("scales", [])]


def short(fraction: float, then: str = " then ASP") -> str:
    """A plan in a progress line: "BSP only", "ASP only" or "BSP 0.25 then ASP"."""
    return "BSP only" if fraction >= 1.0 else "ASP only" if fraction <= 0.0 else f"BSP {fraction:.4g}{then}"


def why(d: dict) -> str:
    """Why the search answered ``d["fraction"]``: the candidates' mean training times when
    the ends were tried, else Algorithm 1's reason for BSP only."""
    times = {float(k): v for k, v in d.get("times", {}).items()}   # a search stored before 2026-11-29 has none
    if len(times) > 1:
        return " (acceptable and fastest: " + ", ".join(
            f"{short(k, '') if k in (0.0, 1.0) else f'switch at {k:.4g}'} {v:.0f} s"
            for k, v in sorted(times.items(), key=lambda kv: kv[1])) + " of training on average)"
    return " (no earlier switch was acceptable)" if d["fraction"] >= 1.0 else ""


def format_result(d: dict, signature: str) -> str:
    f = d["fraction"]
    plan = SwitchPlan.words(f) + why(d)
    what = "accuracy" if d.get("metric", "accuracy") == "accuracy" else "-ln(test loss)"
    given = (f" (mean of {len(d['bsp'])} BSP runs: " + ", ".join(f"{a:.4f}" for a in d["bsp"]) + ")"
             if d["bsp"] else " (given)")
    lines = [f"switch point for job signature {signature}: {plan}",
             f"target {what} {d['target']:.4f}{given}, accepted when the mean converged {what} >= "
             f"{d['target'] - d['beta']:.4f}" + ("" if what == "accuracy" else
                                                  f" (a test loss <= {math.exp(d['beta'] - d['target']):.4g})"),
             f"{'BSP share':>10} {'runs':>5} {'mean':>7} {'scores':<28} {'P(acceptable)':>13}  verdict"]
    for s in d["tried"]:
        conf = "n/a (1 run)" if s["confidence"] is None else f"{s['confidence']:.2f}"
        scores = s.get("scores", s.get("accuracies", []))   # (named "accuracies" by searches before 2026-11-29)
        accs = ", ".join(f"{a:.4f}" for a in scores)
        lines.append(f"{s['fraction']:>10.4g} {len(scores):>5} {s['mean']:>7.4f} {accs:<28} {conf:>13}  "
                     + ("accept" if s["accepted"] else "reject"))
    chosen = next((s for s in d["tried"] if s["fraction"] == f), None)
    if chosen is not None and chosen["confidence"] is not None:
        lines.append(f"how sure: the chosen point is acceptable with probability {chosen['confidence']:.2f} "
                     f"(t-test over its {len(chosen.get('scores', chosen.get('accuracies', [])))} runs)")
    for t in d.get("scaled", []):   # their scores are not all of the signature's worker count
        what = short(t["fraction"], "")
        how = ", ".join(f"{s['from']} -> {s['to']} workers ({s['by']}"
                        + (f", at {100 * s['at']:.0f} % of its workload)" if s.get("at") is not None else ")")
                        for s in t["scales"])
        lines.append(f"scaled during the search: {what} run {t['run']}: {how}")
    lines.append(f"cost: {d['trials_run']} trials trained, {d['trials_reused']} reused, "
                 f"{d['search_time_s']:.0f} s of training")
    return "\n".join(lines)


def other_searches(store, cfg) -> str:
    """Where a search of a job of the same name is stored under another signature: the
    settings of the signature that differ, as the ``--set`` that would find it ("" if none)."""
    from ..switch.trials import config_signature
    mine = cfg.to_dict()
    for job in reversed(store.jobs()):
        if job.name != cfg.job.name or job.signature == config_signature(mine) or \
                store.switch_point(job.signature) is None:
            continue
        theirs, ours = _signed(job.config), _signed(mine)
        sets = " ".join(f"--set {k}={v}" for k, v in sorted(theirs.items()) if ours.get(k) != v and v != "null")
        return (f"; a search of {cfg.job.name} is stored with other settings (signature {job.signature}): add "
                f"{sets or 'the settings it had'} to see it (the settings are part of the signature)")
    return ""


def _signed(config: dict) -> dict[str, str]:
    """The settings of a job config that its signature covers, as ``--set`` keys and values."""
    from ..switch.trials import NOT_IN_SIGNATURE
    out = {}
    for section, values in config.items():
        left_out = NOT_IN_SIGNATURE.get(section, ())
        if isinstance(values, dict) and left_out != "*":
            out.update({f"{section}.{k}": json.dumps(v) if not isinstance(v, str) else v
                        for k, v in values.items() if k not in left_out and not isinstance(v, (dict, list))})
    return out


def cmd_search(args) -> int:
    from ..job.config import load_job
    from ..base.progress import progress_bar
    from ..switch.search import SearchSettings, binary_search
    from ..switch.trials import JobStoreTrials, TrialResult, config_signature

    cfg = load_job(args.job, overrides=args.set)
    if args.target_loss is not None and not (math.isfinite(args.target_loss) and args.target_loss > 0):
        raise BadInput(f"--target-loss {args.target_loss}: must be a test loss > 0")
    target = args.target if args.target_loss is None else -math.log(args.target_loss)  # on the score's scale
    settings = SearchSettings(beta=args.beta, settings=args.settings, runs=args.runs, target=target, seed=0,
                              ends=args.ends)
    signature = config_signature(cfg.to_dict())
    with open_store(args.store) as store, contextlib.ExitStack() as held:
        if args.show:
            found = store.switch_point(signature)
            if found is None:
                trials = [r for r, _ in store.runs_by_signature(signature) if r.kind == "trial"]
                return fail(f"no switch point stored for {args.job} (signature {signature}; {len(trials)} "
                            f"trial runs stored){other_searches(store, cfg)}; run `tfsync search "
                            f"{_job_words(args)}`", EXIT_FAILED)
            fraction, detail, when = found
            if args.json:
                print(json.dumps({"signature": signature, "stored": when, **detail}, indent=2))
            else:
                print(format_result(detail, signature))
                print(f"stored {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(when))}")
            return 0
        # the trials' directories are inside it: one search at a time
        run_dir = held.enter_context(rundir.claim(cfg.job.run_dir, "tfsync search"))
        job = store.create_job(cfg.job.name, signature, cfg.to_dict(), run_dir=run_dir)
        store.set_job_state(job.id, "running")
        trials = JobStoreTrials(store, job.id)
        total = settings.runs * (settings.settings + (settings.target is None) + settings.ends)
        bar = progress_bar()
        expect = "accuracy" if args.target is not None else "neg_log_loss" if args.target_loss is not None else None
        done = {"n": 0, "metric": expect, "scaled": []}

        def run_trial(fraction: float, seed: int) -> TrialResult:
            run = seed - settings.seed
            tcfg = trial_config(cfg, fraction, run)
            what = short(fraction)
            bar(done["n"], total, f"training trial {done['n'] + 1} of {total}: {what}, run {run} ...")
            summary = run_trial_process(tcfg, args.data)
            try:
                score, metric = trial_score(summary)
            except TrialScoreError as e:
                raise TrialScoreError(f"{args.job}: {e}") from None
            if expect and metric != expect:
                raise TrialScoreError(f"{args.job}: " + (
                    "this job reports no test accuracy: give --target-loss, not --target" if expect == "accuracy"
                    else "this job reports a test accuracy: give --target, not --target-loss"))
            key = "accuracy" if metric == "accuracy" else "loss"
            curve = [[e["time"], e[key]] for e in summary.get("evals", []) if e.get(key) is not None]
            return TrialResult(score, float(summary["wall_s"]),
                               {"run_dir": tcfg.job.run_dir, "test_accuracy": summary.get("test_accuracy"),
                                "test_loss": summary.get("test_loss"), "metric": metric,
                                "seed": tcfg.job.seed, "curve": curve, "scales": trial_scales(summary)})

        def progress(p: dict) -> None:  # every trial, run now or found in the store
            done["n"] += 1
            r = p["result"]
            done["metric"] = r.extra.get("metric", "accuracy")  # a trial stored before losses: accuracy
            if r.extra.get("scales"):
                done["scaled"].append({"fraction": p["fraction"], "run": p["run"], "scales": r.extra["scales"]})
            what = short(p["fraction"], "")
            score = (f"accuracy {r.converged_accuracy:.4f}" if done["metric"] == "accuracy"
                     else f"test loss {math.exp(-r.converged_accuracy):.4g}")
            bar(done["n"], total, f"{what} run {p['run']}: {score}, {r.time:.0f} s"
                + (" (stored)" if p["reused"] else ""))

        try:
            result = binary_search(run_trial, signature, settings, trials, progress)
        except KeyboardInterrupt:
            store.set_job_state(job.id, "stopped")
            return fail(f"search interrupted; {done['n']} trials are stored. Run the same command to resume",
                        EXIT_INTERRUPTED)
        except BaseException:
            store.set_job_state(job.id, "failed")
            raise
        detail = {**describe(result, settings, done["metric"] or "accuracy"), "scaled": done["scaled"]}
        store.set_switch_point(signature, result.fraction, detail)
        store.set_job_state(job.id, "done")
    if args.json:
        print(json.dumps({"signature": signature, **detail}, indent=2))
    else:
        print(format_result(detail, signature))
        bsp = "BSP" if cfg.switch.stragglers == "none" else f"BSP with the {cfg.switch.stragglers} straggler policy"
        now = f"runs {bsp} to the end" if detail["fraction"] >= 1.0 else \
            "runs ASP alone" if detail["fraction"] <= 0.0 else "switches at this point"
        print(f"stored; `tfsync run {_job_words(args)}` now {now} (switch.point = \"auto\")")
    return 0
