"""The report and the progress display without a cluster: run directories written here
as the engine writes them (schema 2) and as it wrote them before (schema 1: events in Unix
time), bad input refused in one line, and the progress rates measured over training time."""

import io
import json
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from tfsync.base.progress import Progress
from tfsync.cli import main
from tfsync.report import ReportError, load_run, write_report
from tfsync.report.plots import gapped, smooth

pytestmark = pytest.mark.unit

T0 = 1_795_000_000.0


def push(i, worker, t, protocol="bsp", **extra):
    return {"time": t, "pushes": i, "updates": i // 2, "samples": 32 * i, "worker": worker, "step": i,
            "protocol": protocol, "batch_size": 32, "start": t - 0.05, "end": t - 0.01, "compute_s": 0.04,
            "samples_per_s": 800.0, "loss": 2.0 / i, "mode": "aggregate", "round": i // 2, "dropped": False,
            "version": 0, "staleness": 0, "lr": 0.1, **extra}


def write_run(path, schema=2):
    """A run of 40 pushes, BSP then ASP by a restart switch, a checkpoint and an eval."""
    path.mkdir()
    origin = T0 if schema == 1 else 0.0  # schema 1: events and push start/end in Unix time
    lines = [{"event": "run", "schema": 2, "time": 0.0, "started_at": T0}] if schema == 2 else []
    lines.append({"event": "phase", "time": 5.0, "protocol": "bsp", "samples": 0, "updates": 0})
    for i in range(1, 41):
        p = push(i, i % 2, 5.0 + 0.1 * i, "bsp" if i <= 20 else "asp", predicted=900.0)
        p["start"] += origin
        p["end"] += origin
        lines.append(p)
        if i == 20:
            lines += [{"event": "switch", "time": origin + 7.5, "index": 1, "from": "bsp", "to": "asp",
                       "method": "restart", "samples": 640, "updates": 10, "drain_s": 0.01, "save_s": 0.1,
                       "stop_old_s": 0.2, "start_new_s": 0.4, "overhead_s": 0.8},
                      {"event": "checkpoint", "time": origin + 7.0, "path": "x", "updates": 10},
                      {"event": "eval", "time": 7.0, "samples": 640, "updates": 10, "accuracy": 0.5, "loss": 1.0}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"cut short')
    summary = {"started_at": T0, "wall_s": 10.0, "init_s": 5.0, "workers": 2, "ps": 1, "pushes": 40,
               "updates": 20, "samples": 1280, "samples_per_s": 256.0, "test_accuracy": 0.5, "test_loss": 1.0,
               "test_mae": 0.25, "meta": {"job": "toy"},
               "timeline": [{"protocol": "bsp", "time": 5.0, "samples": 0},
                            {"protocol": "asp", "time": 7.5, "samples": 640}],
               "switches": [json.loads(json.dumps(lines[22 if schema == 2 else 21]))]}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


@pytest.mark.parametrize("schema", [1, 2])
def test_a_run_is_read_on_one_time_base_whatever_its_schema(tmp_path, schema):
    run = load_run(str(write_run(tmp_path / "run", schema)))
    assert run.name == "toy" and run.workers == [0, 1] and run.protocols == ["bsp", "asp"]
    assert len(run.pushes) == 40  # the line a crash cut short is left out
    (sw,) = run.of("switch")
    assert sw["time"] == pytest.approx(7.5) and run.of("checkpoint")[0]["time"] == pytest.approx(7.0)
    assert all(p["start"] == pytest.approx(p["time"] - 0.05) for p in run.pushes)


def test_the_report_has_every_figure_and_a_table_and_opens_offline(tmp_path):
    out = write_report([str(write_run(tmp_path / "run"))])
    assert out == str(tmp_path / "run" / "report.html")
    page = open(out).read()
    assert page.count("data:image/png;base64,") == 4 and "http" not in page
    assert "bsp -&gt; asp" in page and "test mae" in page and "0.25" in page
    assert sorted(p.name for p in (tmp_path / "run" / "report_files").iterdir()) == [
        "loss.png", "switches.png", "timeline.png", "workers.png"]


def test_report_refuses_bad_input_in_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.strip().endswith("no metrics.jsonl there; give the run directory of a `tfsync run`")
    a, b = write_run(tmp_path / "a"), write_run(tmp_path / "b")
    assert main(["report", str(a), str(b)]) == 2
    assert "-o" in capsys.readouterr().err
    (a / "summary.json").write_text("{not json")
    with pytest.raises(ReportError, match="summary.json: not JSON"):
        load_run(str(a))
    assert main(["report", str(b), str(b / "summary.json"), "-o", str(tmp_path / "ab.html")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "ab.html")


def test_smoothing_and_gaps():
    assert list(smooth([1, 3, 5, 7], 2)) == [1, 2, 4, 6]
    t, y = gapped([0, 0.1, 5, 5.1], [1, 2, 3, 4])
    assert np.isnan(t[2]) and np.isnan(y[2]) and list(y[[0, 1, 3, 4]]) == [1, 2, 3, 4]


def fake_engine(pushes, samples, started):
    state = types.SimpleNamespace(pushes=pushes, samples=samples, batch_sizes=[0, 0])
    log = types.SimpleNamespace(train_started=started, train_counts=(pushes, samples))
    return types.SimpleNamespace(ledger=state, history=[], runlog=log, ps=1, workers=2, run_dir="r")


def test_progress_of_a_resumed_run_shows_its_own_rate_the_sizes_in_force_and_ends_at_the_workload(monkeypatch):
    """Issue 32 cases 2 and 6: a run resumed at 3,200 samples counts its own; after a
    switch a worker's batch is the one granted now, not its last push's; the last round's
    overshoot does not show as 11,520/11,504."""
    now = [1000.0]
    monkeypatch.setattr("tfsync.base.progress.time.time", lambda: now[0])
    out = io.StringIO()
    progress, policy = Progress(stream=out, live=False), types.SimpleNamespace(name="asp")
    engine = fake_engine(100, 3200, started=990.0)   # resumed: 100 pushes, 3,200 samples before
    last = types.SimpleNamespace(worker=1, batch_size=1, samples_per_s=500.0, loss=0.5)   # LB-BSP's b=1
    engine.history, engine.ledger.batch_sizes = [last], [32, 32]   # ASP grants 32 now
    engine.ledger.pushes, engine.ledger.samples = 200, 6400
    progress(engine, policy, 6300)
    assert progress.rates(engine) == (10.0, 10.0, 320.0)
    text = out.getvalue()
    assert "100% 6,300/6,300 samples" in text and "w1 b=32 500/s" in text, text


def test_the_live_bar_ends_showing_where_the_run_ended():
    """On a terminal `tfsync run` draws a live bar; at the end it shows the samples the
    run trained (the ledger's), capped at the workload."""
    out = io.StringIO()
    progress, policy = Progress(stream=out, live=True, interval=0), types.SimpleNamespace(name="bsp")
    engine = fake_engine(0, 0, started=0.0)
    engine.ledger.pushes, engine.ledger.samples = 100, 3200
    progress(engine, policy, 6400)
    engine.ledger.samples = 6464   # the last round went past the workload while the bar was not redrawn
    progress.done()
    assert "6400/6400" in out.getvalue().replace(",", ""), out.getvalue()


def test_a_stopped_run_says_stopped_not_done():
    from tfsync.cli import format_summary
    s = {"wall_s": 26.3, "init_s": 5.0, "pushes": 90, "updates": 45, "pushes_per_s": 4.0, "samples_per_s": 128.0,
         "train_s": 21.3, "samples": 2880, "workload_samples": 6400, "timeline": [], "switches": []}
    assert format_summary(s).startswith("done in 26.3 s")
    first = format_summary({**s, "stopped": True}).splitlines()[0]
    assert first.startswith("stopped (tfsync stop) at 2,880 of 6,400 samples after 26.3 s"), first


def test_progress_rates_count_training_time_only(monkeypatch):
    """A cluster that took 20 s to start does not lower the rate; ETA from the same rate."""
    now = [1000.0]
    monkeypatch.setattr("tfsync.base.progress.time.time", lambda: now[0])
    out = io.StringIO()
    progress, policy = Progress(stream=out, live=False), types.SimpleNamespace(name="bsp")
    engine = fake_engine(0, 0, started=990.0)  # training began 10 s ago, 20 s after the process
    progress.starting(engine)
    engine.ledger.pushes, engine.ledger.samples = 100, 3200
    progress(engine, policy, 6400)
    assert progress.rates(engine) == (10.0, 10.0, 320.0)
    text = out.getvalue()
    assert text.splitlines()[0].startswith("starting 1 PS + 2 workers")
    assert "50% 3,200/6,400 samples  elapsed 0:10  eta 0:10  bsp  10.0 steps/s" in text


@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian's chromium (apt-get install chromium)")
def test_the_report_renders_in_a_real_browser(tmp_path):
    """experiments/report_screenshot.py: headless Chromium draws the page offline, figures included."""
    from PIL import Image

    page = write_report([str(write_run(tmp_path / "run"))])
    shot = tmp_path / "shot.png"
    script = os.path.join(os.path.dirname(__file__), "..", "experiments", "report_screenshot.py")
    subprocess.run([sys.executable, script, page, str(shot), "--height", "2600"], check=True, timeout=180)
    img = np.asarray(Image.open(shot).convert("RGB"))
    assert img.shape[:2] == (2600, 1200)
    colors = {tuple(c) for c in img[::4, ::4].reshape(-1, 3)}
    assert len(colors) > 200  # plots drawn, not a blank or an error page
    blue = np.all(np.abs(img.astype(int) - (0x48, 0x78, 0xa8)) < 12, axis=-1)
    assert blue.sum() > 2000  # BSP's colour in the timeline and the curves


def write_resumed_run(path):
    """A job stopped at 12 s and resumed at 20 s (cluster up at 22 s): LB-BSP at 2x the rate,
    then ASP; worker 1 injected 3x slower from 7 to 10 s and detected from 8 s until the
    stop; test loss, accuracy and top3 at every 2 s."""
    path.mkdir()
    lines = [{"event": "run", "schema": 2, "time": 0.0, "started_at": T0},
             {"event": "phase", "time": 5.0, "protocol": "lbbsp", "samples": 0, "updates": 0, "lr_scale": 2.0}]
    times = [5.0 + 0.1 * i for i in range(1, 61)] + [22.0 + 0.1 * i for i in range(1, 41)]
    for i, t in enumerate(times, 1):
        p = push(i, i % 2, t, "lbbsp" if t < 12 else "asp")
        if t < 12:
            p.update(predicted=500.0 + i, turnaround_s=0.08)   # seen: 32 / 0.08 = 400 samples/s
        lines.append(p)
    lines += [{"event": "run", "schema": 2, "time": 20.0, "started_at": T0 + 20, "resumed": True},
              {"event": "resume", "time": 20.0, "samples": 1920}]
    lines += [{"event": "eval", "time": t, "samples": int(320 * t), "accuracy": 0.5 + t / 100, "loss": 2.0 - t / 20,
               "metrics": {"accuracy": 0.5 + t / 100, "top3": 0.8 + t / 200}} for t in (6, 8, 10, 24, 26)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = {"meta": {"job": "toy"}, "started_at": T0 + 20, "time_base": T0, "wall_s": 6.0, "init_s": 2.0, "workers": 2, "ps": 1,
               "pushes": 100, "samples": 3200, "test_accuracy": 0.76, "test_loss": 0.7, "test_top3": 0.93,
               "timeline": [{"protocol": "lbbsp", "time": 5.0, "samples": 0, "lr_scale": 2.0,
                             "stats": {"detected": [[T0 + 8.0, 1, "became"]]}},
                            {"protocol": "asp", "time": 22.0, "samples": 1920, "lr_scale": 1.0, "resumed": True}],
               "runs": [{"started_at": T0, "wall_s": 12.0, "train_s": 7.0, "init_s": 5.0, "stopped": True},
                        {"started_at": T0 + 20, "wall_s": 6.0, "train_s": 4.0, "init_s": 2.0}],
               "job_wall_s": 18.0, "job_train_s": 11.0,
               "injected": [{"time": 7.0, "what": "begin", "worker": 1, "slowdown": 3.0},
                            {"time": 10.0, "what": "end", "worker": 1, "slowdown": 3.0}],
               "switches": []}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts] + [ax.get_title() for ax in fig.axes]


def spans(ax):
    """(x0, x1) of the shaded spans and bars of an axis."""
    return {(round(p.get_x(), 3), round(p.get_x() + p.get_width(), 3)) for p in ax.patches
            if hasattr(p, "get_width")} | {(round(min(p.get_xy()[:, 0]), 3), round(max(p.get_xy()[:, 0]), 3))
                                           for p in ax.patches if not hasattr(p, "get_width")}


def test_the_report_shows_slowdowns_every_test_number_rates_and_a_resumed_job_on_one_time_axis(tmp_path):
    """Issue 32 case 5, on the figures' data: the injected slowdown shaded with its factor on
    the timeline and worker plots, the detected one too; the test loss, accuracy and top3
    each plotted; LB-BSP's predicted speed beside the speed it learns from in the same
    units; the phases' rates marked on the loss plot; both runs of the resumed job on one
    time base from 0, with the stop shown and no test line drawn across it."""
    from tfsync.report import plots
    from tfsync.report.load import slowdowns

    run = load_run(str(write_resumed_run(tmp_path / "run")))
    assert [(s.worker, s.start, s.end, s.source, s.factor) for s in slowdowns(run)] == [
        (1, 7.0, 10.0, "injected", 3.0), (1, 8.0, run.end_time, "detected", None)]

    timeline = plots.timeline([run])
    ax = timeline.axes[0]
    # slowdowns, the first run's start (init_s, 2 s, is the resumed run's), the stop, the restart
    assert {(7.0, 10.0), (8.0, run.end_time), (0.0, 5.0), (12.0, 20.0), (20.0, 22.0)} <= spans(ax)
    assert "w1 3x slower" in texts(timeline) and "w1 straggler" in texts(timeline)
    assert ax.get_xlim()[0] == 0.0

    workers = plots.workers(run)
    speed, *_, predicted = workers.axes
    assert (7.0, 10.0) in spans(speed) and (7.0, 10.0) in spans(predicted)
    assert "worker 1 3x slower (injected)" in texts(workers) and speed.get_xlim() == ax.get_xlim()
    lines = {line.get_label(): line.get_ydata() for line in predicted.lines}
    assert np.allclose(lines["worker 0: measured"][~np.isnan(lines["worker 0: measured"])], 400.0)
    assert np.nanmin(lines["worker 0: predicted"]) > 500

    loss = plots.loss_curves([run])
    labels = {line.get_label() for a in loss.axes for line in a.lines}
    assert {"toy: test accuracy", "toy: test top3"} <= labels
    assert [a.get_title() for a in loss.axes][-2:] == ["test loss (background evaluator) vs time",
                                                        "test loss (background evaluator) vs samples"]
    assert {"lbbsp 2x rate", "asp 1x rate (resumed)"} <= set(texts(loss))
    test_loss = loss.axes[-2].lines[0]
    assert np.isnan(test_loss.get_xdata()).sum() == 1 and np.nanmax(test_loss.get_xdata()) == 26  # broken at the stop
    assert loss.axes[0].get_xlim() == ax.get_xlim()

    waits = workers.axes[3]   # between a worker's steps: none drawn across the stop (the job's gap, shaded)
    assert all(y < 1.0 for c in waits.collections for _, y in c.get_offsets()), "a wait drawn across the stop"

    page = open(write_report([run.path])).read()   # the table: the job's runs, each one's times, what ran
    for row in ("<th>runs</th><td>2: stopped, then resumed: done</td>", "<td>18.0 (12.0 + 6.0)</td>",
                "<td>11.0 (7.0 + 4.0)</td>", "<td>lbbsp -&gt; asp</td>",
                "<th>cluster start (s)</th><td>7.0 (5.0 + 2.0)</td>"):
        assert row in page, row


def test_a_resumed_jobs_summary_keeps_the_slowdowns_injected_before_the_stop(tmp_path):
    from tfsync.engine.summary import whole_job

    before = {"injected": [{"time": 7.0, "what": "begin", "worker": 1, "slowdown": 3.0}], "timeline": [],
              "switches": [], "checkpoints": [], "recoveries": [], "train_s": 5.0, "samples_per_s": 100.0}
    (tmp_path / "summary.json").write_text(json.dumps(before))
    now = {"timeline": [{"protocol": "asp", "time": 22.0, "samples": 1920}], "switches": [], "checkpoints": [],
           "recoveries": [], "train_s": 4.0, "samples_per_s": 100.0}
    assert whole_job(str(tmp_path), {"samples": 1920}, now)["injected"] == before["injected"]


def test_a_step_error_of_several_workers_is_said_by_its_first_root_error():
    """Two workers failing on one NaN at once: TF says "2 root error(s) found." first; the
    line tfsync shows is what went wrong (the full suite saw this on a loaded machine)."""
    from tfsync.engine.results import error_line

    err = RuntimeError("Graph execution error:\n\n2 root error(s) found.\n  (0) INVALID_ARGUMENT:  the loss : Tensor "
                       "had NaN values\n\t [[{{node CheckNumerics}}]]\n  (1) INVALID_ARGUMENT:  the loss : Tensor had "
                       "NaN values\n0 successful operations.\n0 derived errors ignored.")
    assert error_line(err) == "the loss : Tensor had NaN values"
    assert error_line(RuntimeError("Graph execution error:\n\nthe loss : Tensor had NaN values")) == \
        "the loss : Tensor had NaN values"


def test_the_report_shows_how_a_scale_changed_the_worker_count(tmp_path):
    """A run scaled 2 -> 3 -> 2: the summary table says so, and the timeline is drawn with
    each scale's cost (tfsync scale)."""
    run = write_run(tmp_path / "run")
    with open(run / "metrics.jsonl", "a") as f:   # (after the line a crash cut short)
        f.write("\n" + "".join(json.dumps({"event": "scaled", "time": t, "from": a, "to": b, "seconds": 0.5,
                                           "by": "command"}) + "\n" for t, a, b in ((6.0, 2, 3), (8.0, 3, 2))))
    page = open(write_report([str(run)])).read()
    assert "<th>workers / PS</th><td>2 -&gt; 3 -&gt; 2 / 1</td>" in page
    assert load_run(str(run)).of("scaled")[1]["to"] == 2


def test_the_report_says_each_move_of_the_choosing_policy_and_why(tmp_path):
    run = write_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["time_base"] = T0
    summary["timeline"][1]["stats"] = {"moves": 3}   # LB-BSP's count of size changes: not moves of protocol
    summary["timeline"][0].update(protocol="auto")
    summary["timeline"][0]["stats"] = {"moves": [
        {"time": T0 + 6.5, "from": "lbbsp", "to": "asp", "why": "w1's steps 5.5x the median at the smallest batch"},
        {"time": T0 + 9.0, "from": "asp", "to": "drain", "why": "back to LB-BSP once ASP's steps are in"}]}
    (run / "summary.json").write_text(json.dumps(summary))
    page = open(write_report([str(run)])).read()
    assert "<h2>Protocol moves (auto)</h2>" in page
    assert "<td>6.5</td><td>lbbsp -&gt; asp</td><td>w1&#x27;s steps 5.5x the median at the smallest batch</td>" in page
    assert "Protocol moves" not in open(write_report([str(write_run(tmp_path / "plain"))])).read()


def test_the_coordinators_load_is_said_and_a_busy_one_is_warned_of(caplog):
    """summary.json's ``coordinator``: its CPU while it trained, the share of a core, per
    push, and the drained batches that waited behind each its loop took; at 0.8 of a core
    or more it may be what limits training, said in ``busy``, in a warning and in the
    report's table, never slow in silence."""
    from tfsync.engine.results import Backlog
    from tfsync.engine.summary import coordinator_load
    from tfsync.report.page import SUMMARY_ROWS

    keeps_up = Backlog()
    for waiting in (0, 1, 0, 0):
        keeps_up.note(waiting)
    calm = coordinator_load(3.0, 10.0, 2000, keeps_up)
    assert calm == {"cpu_s": 3.0, "cores": 0.3, "ms_per_push": 1.5, "batches_waiting": 0.25,
                    "batches_waiting_max": 1, "busy": False} and not caplog.records
    busy = coordinator_load(9.0, 10.0, 3000, keeps_up)
    assert busy["busy"] and busy["cores"] == 0.9
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "0.90 of a core" in warning and "3.00 ms a push" in warning and "limits training" in warning
    behind = Backlog()
    for waiting in (2, 1, 1, 0):
        behind.note(waiting)
    late = coordinator_load(3.0, 10.0, 2000, behind)   # told: drains can land together while it keeps up
    assert not late["busy"] and (late["batches_waiting"], late["batches_waiting_max"]) == (1.0, 2)
    assert len(caplog.records) == 1 and "1.00 drained batches" not in caplog.records[-1].getMessage()
    coordinator_load(9.0, 10.0, 2000, behind)
    assert "1.00 drained batches" in caplog.records[-1].getMessage()
    assert coordinator_load(0.0, 0.0, 0, Backlog()) == {"cpu_s": 0.0, "cores": 0.0, "ms_per_push": None, "batches_waiting": 0.0,
                                             "batches_waiting_max": 0, "busy": False}
    row = dict(SUMMARY_ROWS)["coordinator CPU"]
    show = lambda load: row(types.SimpleNamespace(summary={"coordinator": load}))  # noqa: E731
    assert show(calm) == "0.30 of a core, 1.50 ms a step"
    assert show(busy) == "0.90 of a core, 3.00 ms a step: it may be what limits training"
    assert row(types.SimpleNamespace(summary={})) == "-"   # a run from before it was measured
