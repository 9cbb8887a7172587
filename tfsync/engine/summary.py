"""What a run's ``summary.json`` says, from an engine at its end: counters, rates over
training time, the final test scores and the curve, switches, checkpoints, recoveries,
and what protects the task ports."""

from __future__ import annotations

import json
import logging
import os
import time

from ..base import arrays, netns
from ..base.curves import converged_accuracy
from .evaluator import Evaluation, scores

logger = logging.getLogger(__name__)


def test_scores(engine) -> dict:
    """``evaluator.scores`` (loss, accuracy, metrics) of the current weights on the whole
    test set, computed on the coordinator (after a background evaluation still running)."""
    setup, gen = engine.setup, engine.generation
    if setup.x_test is None or gen is None:
        return {"loss": None, "accuracy": None, "metrics": {}}
    if engine.evaluator is not None:
        engine.evaluator.wait()
    local = setup.model_fn()
    local.set_weights(gen.model.get_weights())
    return scores(local, setup.x_test, setup.y_test, setup.loss_fn, setup.metrics)


def summarize(engine, wall: float, t_init: float, total: int, stopped=None, resume: dict | None = None) -> dict:
    """``stopped``: the StopRequested that ended the run early; ``resume``: the checkpoint
    event it resumed from."""
    log, gen, ev = engine.runlog, engine.generation, engine.evaluator
    s = log.ledger
    train = max(wall - t_init, 1e-9)
    final = test_scores(engine)
    acc = final["accuracy"]
    if ev is not None:  # the curve's last point, on the evaluator's own test subset
        for e in ev.drain():
            log.log_eval(e)
        t = time.perf_counter()
        last = final if arrays.length(ev.y) == arrays.length(engine.setup.y_test) else ev.evaluate(gen)
        log.log_eval(Evaluation(s.updates, s.samples, log.since(), last["accuracy"],
                                time.perf_counter() - t, last["loss"], last["metrics"], s.pushes))
    curve = [e.accuracy for e in log.evals if e.accuracy is not None]
    return whole_job(engine.run_dir, resume, {
        **_counts(log, wall, train, engine.workers, engine.ps, total),
        "init_s": round(t_init, 3),
        "ps_rounds": engine.loop.pilot.rounds,   # BSP rounds the PS closed and opened itself (tfsync.engine.pilot)
        "pushes_per_s": round((s.pushes - log.train_counts[0]) / train, 3),
        # finished steps' rows (a PS round's marker too) per drain of the PS's queue (tfsync.engine.links)
        "rows_per_drain": round(engine.lifecycle.drained_rows / max(engine.lifecycle.drained_batches, 1), 3),
        "coordinator": coordinator_load(log.train_cpu_s, train, s.pushes - log.train_counts[0],
                                        engine.loop.arrivals.backlog),
        "test_accuracy": acc, "test_loss": final["loss"],
        **{f"test_{k}": v for k, v in final["metrics"].items()},
        # time the loop spent with the manager's link: its records and events, and taking commands
        "control_s": round(engine.control_seconds(), 6),
        "optimizer_iterations": int(gen.optimizer.iterations.numpy()),
        "meta": engine.setup.meta,
        "evals": [e.to_dict() for e in log.evals],
        "converged_accuracy": converged_accuracy(curve) if curve else acc,
        "evals_skipped": ev.skipped if ev is not None else 0,
        # what protects the task ports: a string (local cluster), or per node (hooks)
        "task_ports": gen.cluster.task_ports() if hasattr(gen.cluster, "task_ports")
        else netns.describe(getattr(gen.cluster, "network", None)),
        # each worker's last CPU/memory reading (cpu: contention; "node" where its hook measured it)
        "resources": {str(w): r for w, r in sorted(engine.lifecycle.monitor.latest().items())},
        "stopped": stopped is not None,
        **({"resumed_from": resume} if resume else {}),
        **({"stop_checkpoint": stopped.checkpoint_path} if stopped is not None else {}),
    })


COORDINATOR_BUSY = 0.8   # of a core: above it, the coordinator may be what limits training


def coordinator_load(cpu_s: float, train_s: float, pushes: int, backlog) -> dict:
    """The coordinator's CPU while it trained (this process: the engine's loop and links,
    TensorFlow's client, a background evaluation): seconds, the share of a core it kept
    busy, and per push; and how far its loop fell behind the records (``backlog``,
    tfsync.engine.results.Backlog: the drained batches waiting behind each one it took,
    on average and at most; several drains can land at once while it keeps up, so this is
    told, not judged). Its work is one Python thread for the most part, so near a whole
    core it is what limits training: said in ``busy`` and in a warning, never slow in
    silence."""
    cores = cpu_s / train_s if train_s > 0 else 0.0
    load = {"cpu_s": round(cpu_s, 3), "cores": round(cores, 3),
            "ms_per_push": round(1000 * cpu_s / pushes, 4) if pushes else None,
            "batches_waiting": round(backlog.mean, 3), "batches_waiting_max": backlog.most,
            "busy": cores >= COORDINATOR_BUSY}
    if load["busy"]:
        logger.warning("the coordinator kept %.2f of a core busy while it trained (%.2f ms a push; %.2f drained "
                       "batches of records waited behind each it took): it may be what limits training; larger "
                       "batches or ASP's queue_s make fewer, larger calls", cores, load["ms_per_push"] or 0.0,
                       load["batches_waiting"])
    return load


def failure_summary(engine, wall: float, total: int, error: BaseException, resume: dict | None = None) -> dict:
    """What a run that failed (a full disk) had done: its counters, phases and checkpoints,
    without the test evaluation a finished run gets; ``failed`` says why it ended."""
    began = engine.runlog.train_started
    train = time.time() - began if began else 0.0
    return {"failed": str(error), **_counts(engine.runlog, wall, train, engine.workers, engine.ps, total),
            "stopped": False, **({"resumed_from": resume} if resume else {})}


def _counts(log, wall: float, train: float, workers: int, ps: int, total: int) -> dict:
    """What every summary says of run log ``log``: the run's clock, counters, phases,
    switches, scales (``workers``: the count at the end), checkpoints and recoveries;
    rates over training time (``train``: the cluster's start left out), a resumed run's
    over its own pushes and samples."""
    s = log.ledger
    return {"wall_s": round(wall, 3), "started_at": round(log.started_at, 3), "train_s": round(train, 3),
            "samples_per_s": round((s.samples - log.train_counts[1]) / train, 3) if train > 0 else 0.0,
            "time_base": round(log.recorder.origin, 3), "workers": workers, "ps": ps,
            "pushes": s.pushes, "updates": s.updates, "samples": s.samples, "dropped": s.dropped,
            "run_samples": s.samples - log.train_counts[1],   # this run's own (a resumed run's, after its checkpoint)
            "workload_samples": total, "timeline": log.timeline, "switches": log.switches, "scales": log.scales,
            "checkpoints": log.checkpoints, "recoveries": log.recoveries, "clocks": list(s.clocks)}


def whole_job(run_dir: str, resume: dict | None, summary: dict) -> dict:
    """``summary`` of a run; of a resumed run, the whole job's: the earlier runs' phases
    (those begun before the checkpoint it resumed from), switches, checkpoints and
    recoveries before its own, all on the job's one time base (its first phase marked
    ``resumed``), each run in ``runs`` with its own rates, and the job's totals."""
    previous = _read_summary(run_dir) if resume else None
    this = _run_brief(summary)
    if previous is None:
        return {**summary, "runs": [this]}
    kept = [ph for ph in previous.get("timeline", []) if ph.get("samples", 0) <= resume.get("samples", 0)]
    runs = previous.get("runs") or [_run_brief(previous)]
    runs = runs + [this]
    train = sum(r["train_s"] for r in runs)
    return {**summary,
            "timeline": kept + [{**ph, "resumed": True} if i == 0 else ph for i, ph in enumerate(summary["timeline"])],
            "switches": [sw for sw in previous.get("switches", []) if sw.get("index", 0) < len(kept)]
            + [{**sw, "index": sw["index"] + len(kept)} for sw in summary["switches"]],
            "checkpoints": previous.get("checkpoints", []) + summary["checkpoints"],
            "recoveries": previous.get("recoveries", []) + summary["recoveries"],
            # each run's evaluations (``time``: seconds since that run began), those before the checkpoint kept
            "evals": [e for e in previous.get("evals", []) if e.get("samples", 0) <= resume.get("samples", 0)]
            + summary.get("evals", []),
            "injected": previous.get("injected", []),  # slowdowns injected in the earlier runs
            "runs": runs, "job_wall_s": round(sum(r["wall_s"] for r in runs), 3), "job_train_s": round(train, 3),
            "job_samples_per_s": round(sum(r["samples"] for r in runs) / train, 3) if train > 0 else 0.0}


def _run_brief(summary: dict) -> dict:
    """One run of a job as the whole job's summary lists it: its own samples and rates."""
    train = float(summary.get("train_s") or 0.0)
    return {"started_at": summary.get("started_at"), "wall_s": float(summary.get("wall_s") or 0.0), "train_s": train,
            "init_s": summary.get("init_s"),
            "samples": summary["run_samples"] if "run_samples" in summary   # (a summary from before it was kept)
            else round(float(summary.get("samples_per_s") or 0.0) * train),
            "samples_per_s": summary.get("samples_per_s"), "pushes_per_s": summary.get("pushes_per_s"),
            "stopped": bool(summary.get("stopped")), **({"failed": summary["failed"]} if "failed" in summary else {})}


def _read_summary(run_dir: str) -> dict | None:
    """The summary.json an earlier run of the job left (None: none, or not readable)."""
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
