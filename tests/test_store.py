"""The job store on real SQLite files: round trips, WAL, reopening, other processes, threads."""

import sqlite3
import subprocess
import sys
import textwrap
import threading

import pytest

from tfsync.manager import store as store_module
from tfsync.manager.store import ResourceRecord, StepSummary, Store, StoreError

pytestmark = pytest.mark.unit


@pytest.fixture
def db(tmp_path):
    store = Store(tmp_path / "state" / "jobs.db")
    try:
        yield store
    finally:
        store.close()


def _steps(run_id, first, count, protocol="bsp"):
    return [StepSummary(run_id, s, 1000.0 + s, 64, 2.0 / (s + 1), protocol, (48, 16))
            for s in range(first, first + count)]


def test_wal_mode_and_schema_version(db):
    assert db.pragma("journal_mode") == "wal"
    assert db.pragma("user_version") == 3


def test_job_run_steps_events_results_round_trip(db):
    job = db.create_job("mnist", "sig-a", {"train": {"samples": 60000}}, run_dir="runs/m", token_path="t")
    assert job.state == "submitted" and job.config == {"train": {"samples": 60000}}
    db.set_job_state(job.id, "running")
    assert db.job(job.id).state == "running" and db.job(job.id).updated >= job.updated
    run = db.start_run(job.id)
    assert run.config == job.config and db.runs(job.id) == [run]
    db.add_steps(_steps(run.id, 0, 5))
    got = db.steps(run.id)
    assert [s.step for s in got] == [0, 1, 2, 3, 4] and got[3] == _steps(run.id, 3, 1)[0]
    assert [s.step for s in db.steps(run.id, from_step=3)] == [3, 4]
    db.add_event(run.id, "worker_lost", {"worker": 1}, at=10.0)
    db.add_event(run.id, "checkpoint", {"path": "ckpt-4", "step": 4}, at=11.0)
    assert [e.kind for e in db.events(run.id)] == ["worker_lost", "checkpoint"]
    assert db.events(run.id, "worker_lost")[0].detail == {"worker": 1}
    db.set_result(run.id, "accuracy", 0.97)
    db.set_result(run.id, "curve", [1, 2])
    assert db.results(run.id) == {"accuracy": 0.97, "curve": [1, 2]}
    db.add_resources([ResourceRecord("node-a", 5.0, job.id, 12.5, 40.0, ({"pid": 7, "rss_bytes": 9},))])
    assert db.resources("node-a")[0].processes == ({"pid": 7, "rss_bytes": 9},)


def test_bad_values_are_rejected_with_the_allowed_ones(db):
    job = db.create_job("j", "s", {})
    with pytest.raises(ValueError, match="'paused' is not one of submitted, running"):
        db.set_job_state(job.id, "paused")
    with pytest.raises(ValueError, match="event kind"):
        db.add_event(db.start_run(job.id).id, "exploded")
    with pytest.raises(KeyError, match="no job 'nope'"):
        db.job("nope")


def test_retried_submit_returns_the_same_job_and_conflicts_are_refused(db):
    first = db.create_job("j", "s", {"a": 1}, job_id="job-1")
    assert db.create_job("j", "s", {"a": 1}, job_id="job-1") == first
    assert len(db.jobs()) == 1
    with pytest.raises(StoreError, match="exists with another"):
        db.create_job("j", "s", {"a": 2}, job_id="job-1")


def test_last_step_is_the_newest_of_its_run(db):
    job = db.create_job("j", "s", {})
    r1, r2 = db.start_run(job.id), db.start_run(job.id, "resume")
    assert db.last_step(r1.id) is None
    db.add_steps(_steps(r1.id, 5, 3) + _steps(r1.id, 0, 2) + _steps(r2.id, 20, 1))
    assert db.last_step(r1.id) == _steps(r1.id, 7, 1)[0] and db.last_step(r2.id).step == 20


def test_runs_by_signature_spans_jobs(db):
    a, b, other = db.create_job("a", "sig", {}), db.create_job("b", "sig", {}), db.create_job("c", "x", {})
    ra, rb = db.start_run(a.id, "trial", {"switch_at": 0.5}), db.start_run(b.id, "trial", {"switch_at": 0.25})
    db.start_run(other.id)
    db.set_result(ra.id, "time_to_accuracy", 30.0)
    found = db.runs_by_signature("sig")
    assert [(r.id, r.config["switch_at"], res) for r, res in found] == [
        (ra.id, 0.5, {"time_to_accuracy": 30.0}), (rb.id, 0.25, {})]


def test_reopening_the_file_keeps_everything(tmp_path):
    path = tmp_path / "jobs.db"
    with Store(path) as s:
        job = s.create_job("j", "s", {"k": [1, 2]})
        run = s.start_run(job.id)
        s.add_steps(_steps(run.id, 0, 3))
        s.set_job_state(job.id, "done")
    with Store(path) as s:
        assert s.job(job.id).state == "done" and s.job(job.id).config == {"k": [1, 2]}
        assert [x.step for x in s.steps(run.id)] == [0, 1, 2]
        assert s.pragma("journal_mode") == "wal"


def test_newer_schema_is_refused(tmp_path):
    import sqlite3
    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=7")
    conn.close()
    with pytest.raises(StoreError, match="schema version 7.*upgrade tfsync"):
        Store(path)


def test_write_from_another_process_is_visible(db, tmp_path):
    job = db.create_job("j", "s", {})
    run = db.start_run(job.id)
    db.add_steps(_steps(run.id, 0, 1))  # this connection has read the file before the other writes
    assert [s.step for s in db.steps(run.id)] == [0]
    code = textwrap.dedent(f"""
        from tfsync.manager.store import Store, StepSummary
        s = Store({str(db.path)!r})
        s.add_steps([StepSummary({run.id}, 1, 1.0, 32, 0.5, "asp", (32,))])
        s.add_event({run.id}, "switch", {{"to": "asp"}})
        s.set_job_state({job.id!r}, "stopped")
        s.close()
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert [s.step for s in db.steps(run.id)] == [0, 1]
    assert db.events(run.id)[0].detail == {"to": "asp"} and db.job(job.id).state == "stopped"


def test_concurrent_inserts_from_threads_lose_nothing(db):
    job = db.create_job("j", "s", {})
    runs = [db.start_run(job.id).id for _ in range(4)]
    errors = []

    def writer(run_id):
        try:
            for batch in range(20):
                db.add_steps(_steps(run_id, batch * 10, 10))
                db.add_event(run_id, "worker_rejoined", {"batch": batch})
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads) and errors == []
    for r in runs:
        assert [s.step for s in db.steps(r)] == list(range(200))
        assert len(db.events(r)) == 20


def _sample(node, t, **kw):
    from tfsync.api.v1 import common_pb2

    return common_pb2.ResourceSample(node=node, time=t, **kw)


def test_resource_board_writes_the_latest_sample_per_node_once_the_interval_is_over(db, caplog, monkeypatch):
    from tfsync.api.v1 import common_pb2
    from tfsync.manager.resources import ResourceBoard

    now = [0.0]
    board = ResourceBoard(db, flush_interval=1.0, clock=lambda: now[0])
    proc = common_pb2.ProcessSample(task=common_pb2.TaskRef(job="ps", index=0), pid=5, alive=True, rss_bytes=7)
    for t in (1.0, 2.0):  # two reports of node-a within the interval: only the newest is written
        board.report(_sample("node-a", t, cpu_percent=10 * t, processes=[proc]))
    board.report(_sample("node-b", 1.5))
    assert db.resources("node-a") == [] and board.flushed == 0  # the interval is not over
    now[0] = 1.0
    board.report(_sample("node-b", 3.0))  # the interval is over: every node reported since, in one write
    got = db.resources("node-a")
    assert [(r.time, r.cpu_percent) for r in got] == [(2.0, 20.0)] and [r.time for r in db.resources("node-b")] == [3.0]
    assert got[0].processes[0]["task"] == "ps:0" and got[0].processes[0]["rss_bytes"] == 7 and board.flushed == 2
    board.report(_sample("node-b", 4.0))
    assert [r.time for r in db.resources("node-b")] == [3.0]  # within the next interval
    assert board.flush() == 1 and board.flush() == 0
    assert [r.time for r in db.resources("node-b")] == [3.0, 4.0]

    def broken(records):
        raise StoreError("job store 'jobs.db' is read-only")

    monkeypatch.setattr(db, "add_resources", broken)  # a failing store: logged, the reports still taken
    now[0] = 3.0
    with caplog.at_level("WARNING"):
        board.report(_sample("node-c", 6.0))
    assert board.flushed == 3 and "1 resource samples not stored: job store 'jobs.db' is read-only" in caplog.text
    monkeypatch.undo()
    board.report(_sample("node-c", 7.0))
    assert board.flush() == 1 and [r.time for r in db.resources("node-c")] == [7.0]


def test_the_managers_resource_reports_reach_the_store_by_its_end(tmp_path):
    """The embedded manager of `tfsync run`: samples reported within the last interval are
    written when it finishes."""
    from tfsync.api import auth, transport
    from tfsync.api.v1 import manager_pb2, manager_pb2_grpc
    from tfsync.manager import embedded

    m = embedded.start(str(tmp_path / "run"), "res", {"model": {"name": "linear"}, "cluster": {"workers": 1}},
                       workers=1, protocol="bsp", store_path=str(tmp_path / "jobs.db"))
    try:
        token = auth.read_token(m.control_dir / "token")
        with transport.make_channel(m.address, token=token) as channel:
            stub = manager_pb2_grpc.ManagerStub(channel)
            reply = stub.ReportResources(manager_pb2.ReportResourcesRequest(sample=_sample("n1", 7.0, cpu_percent=30.0)),
                                         timeout=10)
            stub.StreamReportResources(iter([manager_pb2.ReportResourcesRequest(sample=_sample("n2", 8.0))]), timeout=10)
        assert reply.interval_s == 1.0
    finally:
        m.finish("done")
    with Store(tmp_path / "jobs.db") as db:
        assert [(r.time, r.cpu_percent) for r in db.resources("n1")] == [(7.0, 30.0)]
        assert [r.time for r in db.resources("n2")] == [8.0]


def test_switch_points_and_migration_from_schema_1(tmp_path):
    """A version-1 store (before switch points) is migrated in place; nothing is lost."""
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    conn.executescript(store_module._SCHEMA_V1 + "PRAGMA user_version=1;")
    conn.execute("INSERT INTO jobs VALUES ('j1', 'old', 'sig', '{}', 'done', 1.0, 1.0, '', '')")
    conn.commit()
    conn.close()
    with Store(path) as db:
        assert db.pragma("user_version") == store_module.SCHEMA_VERSION and db.job("j1").name == "old"
        assert db.switch_point("sig") is None
        db.set_switch_point("sig", 0.25, {"target": 0.98})
        db.set_switch_point("sig", 0.125, {"target": 0.98, "runs": 3})  # a later search replaces it
        fraction, detail, when = db.switch_point("sig")
        assert fraction == 0.125 and detail == {"target": 0.98, "runs": 3} and when > 0
        assert db.switch_point("other") is None


def test_migration_from_schema_2_keeps_the_events_and_takes_scaled_ones(tmp_path):
    """A version-2 store's events table is made anew (its CHECK takes 'scaled', a change of
    the worker count); every event is kept with its id, and the index is there again."""
    path = tmp_path / "v2.db"
    conn = sqlite3.connect(path)
    conn.executescript(store_module._SCHEMA_V1 + store_module._SCHEMA_V2 + "PRAGMA user_version=2;")
    conn.execute("INSERT INTO jobs VALUES ('j1', 'old', 'sig', '{}', 'done', 1.0, 1.0, '', '')")
    conn.execute("INSERT INTO runs VALUES (1, 'j1', 'train', '{}', 1.0)")
    conn.execute("INSERT INTO events VALUES (7, 1, 'switch', 2.0, '{\"to\": \"asp\"}')")
    conn.commit()
    with pytest.raises(sqlite3.IntegrityError):   # the old CHECK refuses it
        conn.execute("INSERT INTO events VALUES (8, 1, 'scaled', 3.0, '{}')")
    conn.close()
    with Store(path) as db:
        assert db.pragma("user_version") == 3
        db.add_event(1, "scaled", {"from": 2, "to": 3}, at=4.0)
        assert [(e.kind, e.detail) for e in db.events(1)] == [("switch", {"to": "asp"}),
                                                              ("scaled", {"from": 2, "to": 3})]
        with pytest.raises(ValueError):
            db.add_event(1, "grown", {})
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT id FROM events WHERE kind = 'switch'").fetchall() == [(7,)]
    assert "events_by_run" in {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    conn.close()
