"""What a person sees of a run: the progress display, the report `tfsync run` writes at its
end (and `tfsync report` for several runs), TensorBoard's scalars, and metrics.jsonl's one
time base. Two real runs: a short main job (BSP -> ASP; tests/conftest.py's main_job, which
tests/test_run_job.py shares), and LB-BSP -> ASP by a restart switch with a worker killed
mid-run (a recovery)."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from helpers import DATA, kill_worker, linear_job, records, wait_for

pytestmark = pytest.mark.cluster

# (6 epochs: an LB-BSP phase long enough, at the engine's speed, that the worker killed
# after its first 10 steps dies in it, not at or after the restart switch)
LBBSP_RESTART = linear_job("lb-restart", {"name": "lbbsp", "predictor": "ema", "until": 0.5}, "asp", epochs=6,
                           extra='[switch]\nmethod = "restart"\n')

FIGURES = {"loss", "timeline", "workers", "switches"}


def start(tmp_path, text, *extra):
    run_dir, job = tmp_path / "run", tmp_path / "job.toml"
    job.write_text(text.format(run_dir=run_dir))
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"), TFSYNC_NO_REPORT="0")  # the report: on
    proc = subprocess.Popen([sys.executable, "-m", "tfsync.cli", "run", str(job), "--data", DATA, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return proc, run_dir


def finish(proc, timeout=300):
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    return out, err


def check_report(path, figures):
    """The page exists, embeds each figure (and its PNG is beside it), and needs no network."""
    page = open(path).read()
    assert page.count('<img alt="') == len(figures)
    assert page.count("data:image/png;base64,") == len(figures)
    assert not re.search(r"(src|href)=\"(https?:)?//", page), "the page must open offline"
    files = os.path.splitext(path)[0] + "_files"
    assert {os.path.splitext(n)[0] for n in os.listdir(files)} == figures
    for n in os.listdir(files):
        with open(os.path.join(files, n), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    return page


def tensorboard_scalars(run_dir):
    """{tag: [(step, value)]} read back with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    texts = {t: [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(t)] for t in acc.Tags()["tensors"]}
    return scalars, texts


def test_the_main_job_shows_progress_a_report_and_tensorboard_scalars(main_job):
    out, err, run_dir, summary = main_job   # (its run: tests/conftest.py)
    lines = [json.loads(x) for x in open(run_dir / "metrics.jsonl")]

    # one time base: a run line first, then every time in seconds since it, in order
    assert lines[0]["event"] == "run" and lines[0]["schema"] == 2 and lines[0]["time"] == 0.0
    assert lines[0]["started_at"] == pytest.approx(summary["time_base"], abs=1e-3)
    pushes = [r for r in lines if "worker" in r and "event" not in r]
    assert all(0 < p["start"] < p["end"] < p["time"] <= summary["wall_s"] + 1 for p in pushes)
    events = [r for r in lines[1:] if "event" in r]
    assert {"phase", "switch", "checkpoint", "eval"} <= {e["event"] for e in events}
    assert all(0 < e["time"] <= summary["wall_s"] + 1 for e in events)
    assert summary["timeline"][0]["time"] == pytest.approx(summary["init_s"], abs=0.5)

    # the terminal: a line when the cluster starts, then progress whose rate is measured
    # over training time: steps/s at a line = pushes by then / seconds since training began
    assert "starting 1 PS + 2 workers" in err and "Traceback" not in err
    assert not [ln for ln in err.splitlines() if re.match(r"[IWE]\d{4} |WARNING: All log messages", ln)]
    shown = re.findall(r"(\d+)% ([\d,]+)/[\d,]+ samples .*? (\d+\.\d) steps/s", err)
    assert len(shown) >= 5   # a line a tenth of the run, at most one each 0.2 s: fewer on a fast machine
    checked = 0
    for _, samples, rate in shown[3:]:
        at = next(p for p in pushes if p["samples"] >= int(samples.replace(",", "")))
        expected = at["pushes"] / (at["time"] - summary["init_s"])
        assert float(rate) == pytest.approx(expected, rel=0.10), (samples, rate, expected)
        checked += 1
    assert checked >= 2
    assert summary["pushes_per_s"] == pytest.approx(summary["pushes"] / summary["train_s"], rel=1e-3)

    # the report written at the end, its path printed
    report = re.search(r"^report: (.+\.html)$", out, re.M).group(1)
    assert report == str(run_dir / "report.html")
    page = check_report(report, FIGURES)
    assert "seen" in page and "bsp -&gt; asp" in page

    # TensorBoard: global loss, test numbers, learning rate, staleness, per-worker speed and
    # batch size, the protocol as text at each phase
    scalars, texts = tensorboard_scalars(run_dir)
    for tag in ("train/loss", "train/lr", "train/staleness", "train/phase", "test/loss", "test/accuracy",
                "samples_per_s/worker0", "samples_per_s/worker1", "batch_size/worker0", "loss/worker1"):
        assert scalars.get(tag), f"no {tag} in {sorted(scalars)}"
    steps = [step for step, _ in scalars["train/lr"]]   # a point per block of pushes, the last at the last
    assert steps == sorted(set(steps)) and steps[-1] == pushes[-1]["pushes"]
    lr = dict(scalars["train/lr"])
    assert {round(v, 4) for v in lr.values()} == {0.1, 0.05}  # BSP n x eta, then ASP eta
    assert [v for _, v in scalars["train/phase"]] == [0, 1]
    assert [t.split()[0] for t in texts["protocol"]] == ["bsp", "asp"]
    assert scalars["test/accuracy"][-1][1] == pytest.approx(summary["evals"][-1]["accuracy"], abs=1e-6)
    assert max(v for _, v in scalars["train/staleness"]) > 0  # ASP steps ran beside others' updates


@pytest.mark.slow
def test_a_report_shows_lbbsp_a_restart_switch_and_a_recovery(tmp_path):
    proc, run_dir = start(tmp_path, LBBSP_RESTART, "--json")
    try:
        pushed = lambda: [r for r in records(run_dir) if "worker" in r and "event" not in r]  # noqa: E731
        # early in the LB-BSP phase: a task killed while the restart switch connects to the
        # next generation's tasks would hang TensorFlow's connect
        wait_for("10 LB-BSP steps", lambda: len(pushed()) >= 10, 180)
        kill_worker(proc.pid, 1)
    finally:
        out, _ = finish(proc)
    summary = json.loads(out)
    assert [s["method"] for s in summary["switches"]] == ["restart"] and summary["recoveries"]

    from tfsync.report import load_run, write_report
    run = load_run(str(run_dir))
    assert sum(p.get("predicted", 0) > 0 for p in run.pushes if p["protocol"] == "lbbsp") >= 20
    assert all(p["turnaround_s"] > 0 for p in run.pushes if "predicted" in p)  # what the prediction is compared with
    assert not any("predicted" in p for p in run.pushes if p["protocol"] == "asp")
    assert {"worker_lost", "worker_rejoined", "switch"} <= {e["event"] for e in run.events}
    check_report(run_dir / "report.html", FIGURES)

    # two runs side by side: `tfsync report A B -o`; one figure of workers per run
    other = tmp_path / "copy"
    shutil.copytree(run_dir, other, ignore=shutil.ignore_patterns("checkpoints", "logs", "report*"))
    both = tmp_path / "both.html"
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "report", str(run_dir), str(other), "-o", str(both)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == str(both), r.stderr
    check_report(both, {"loss", "timeline", "workers_1", "workers_2", "switches"})
    assert write_report([str(run_dir)], str(tmp_path / "again.html")).endswith("again.html")
