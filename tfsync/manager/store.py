"""The manager's job store: one SQLite file (stdlib sqlite3, WAL mode).

Tables: jobs, runs (a job has one per start, resume or search trial), steps (one summary
per step of a run), events (worker lost / rejoined, task restarted, switch, checkpoint),
results (key -> JSON per run), resource samples of nodes and the switch point the search
found per job signature. (Schema 1's ``switches`` table is not written: a run's switches
are its ``switch`` events.)

Threads: each thread gets its own connection (``threading.local``), so readers never wait
for one another; SQLite serialises writers (WAL allows one writer and many readers, across
threads and processes) and a writer waits up to ``busy_timeout`` seconds for another.
Every write is one transaction. The schema version is ``PRAGMA user_version``.
The dataclasses it returns live in ``tfsync.manager.store_types`` (re-exported here).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
import uuid

from tfsync.base.exits import TfsyncError
from tfsync.manager.store_types import EVENT_KINDS, JOB_STATES, RUN_KINDS, Event, Job, ResourceRecord, Run, StepSummary

logger = logging.getLogger(__name__)

__all__ = ["Store", "StoreError", "Job", "Run", "StepSummary", "Event", "ResourceRecord", "JOB_STATES", "RUN_KINDS",
           "EVENT_KINDS"]

SCHEMA_VERSION = 3

# Written out in full, not derived from the tuples above: a released schema never changes;
# a new column or state is a new migration (version 1 -> 2) in _MIGRATIONS.
_SCHEMA_V1 = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, signature TEXT NOT NULL, config TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('submitted', 'running', 'stopped', 'failed', 'done')),
    created REAL NOT NULL, updated REAL NOT NULL,
    run_dir TEXT NOT NULL DEFAULT '', token_path TEXT NOT NULL DEFAULT '');
CREATE INDEX jobs_by_signature ON jobs (signature);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL REFERENCES jobs (id),
    kind TEXT NOT NULL CHECK (kind IN ('train', 'resume', 'trial')), config TEXT NOT NULL,
    started REAL NOT NULL);
CREATE INDEX runs_by_job ON runs (job_id);
CREATE TABLE steps (
    run_id INTEGER NOT NULL REFERENCES runs (id), step INTEGER NOT NULL, time REAL NOT NULL,
    samples INTEGER NOT NULL, loss REAL, protocol TEXT NOT NULL, batch_sizes TEXT NOT NULL,
    PRIMARY KEY (run_id, step));
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER NOT NULL REFERENCES runs (id),
    kind TEXT NOT NULL CHECK (kind IN ('worker_lost', 'worker_rejoined', 'task_restarted', 'switch',
                                                'checkpoint')), time REAL NOT NULL, detail TEXT NOT NULL);
CREATE INDEX events_by_run ON events (run_id, kind);
CREATE TABLE switches (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER NOT NULL REFERENCES runs (id),
    step INTEGER NOT NULL, time REAL NOT NULL, from_protocol TEXT NOT NULL, to_protocol TEXT NOT NULL,
    method TEXT NOT NULL CHECK (method IN ('hot', 'restart')), detail TEXT NOT NULL);
CREATE TABLE results (
    run_id INTEGER NOT NULL REFERENCES runs (id), key TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (run_id, key));
CREATE TABLE resources (
    node TEXT NOT NULL, time REAL NOT NULL, job_id TEXT NOT NULL, cpu_percent REAL NOT NULL,
    memory_percent REAL NOT NULL, processes TEXT NOT NULL);
CREATE INDEX resources_by_node ON resources (node, time);
"""
# Version 2: the switch point the recurring-job search found, per job signature.
_SCHEMA_V2 = """
CREATE TABLE switch_points (
    signature TEXT PRIMARY KEY, fraction REAL NOT NULL, detail TEXT NOT NULL, updated REAL NOT NULL);
"""
# Version 3: events of a change of the worker count ('scaled': elastic workers). SQLite
# cannot change a CHECK: the table is made anew and its rows copied.
_SCHEMA_V3 = """
CREATE TABLE events_v3 (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER NOT NULL REFERENCES runs (id),
    kind TEXT NOT NULL CHECK (kind IN ('worker_lost', 'worker_rejoined', 'task_restarted', 'switch',
                                                'checkpoint', 'scaled')), time REAL NOT NULL, detail TEXT NOT NULL);
INSERT INTO events_v3 (id, run_id, kind, time, detail) SELECT id, run_id, kind, time, detail FROM events;
DROP TABLE events;
ALTER TABLE events_v3 RENAME TO events;
CREATE INDEX events_by_run ON events (run_id, kind);
"""
_MIGRATIONS = {0: _SCHEMA_V1, 1: _SCHEMA_V2, 2: _SCHEMA_V3}  # version -> script that brings it to version + 1


class StoreError(TfsyncError, RuntimeError):
    """The store file cannot be used, or a request contradicts what it holds."""


def _problem(path: str, e: sqlite3.Error, busy_timeout: float) -> str:
    """One line for what SQLite said about the store at ``path``."""
    text = str(e)
    if "locked" in text or "busy" in text:
        return (f"job store {path!r} is locked by another process (waited {busy_timeout:.0f} s); "
                "wait for it to finish, or use another store (--store / TFSYNC_HOME)")
    if "readonly" in text or "read-only" in text:
        return f"job store {path!r} is read-only ({text}); make it and its directory writable, or use another store"
    if "malformed" in text or "not a database" in text or "corrupt" in text:
        return (f"job store {path!r} is damaged ({text}); move it aside (a new one is made) "
                "or restore it from a copy")
    return f"job store {path!r}: {text}"


def _check(value: str, allowed: tuple, what: str) -> None:
    if value not in allowed:
        raise ValueError(f"{what} {value!r} is not one of {', '.join(allowed)}")


class Store:
    """The job store in the SQLite file ``path`` (made, with its directory, if missing)."""

    def __init__(self, path: str | os.PathLike, busy_timeout: float = 30.0):
        self.path = os.fspath(path)
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._migrate(self._conn())

    # -- connections and schema -----------------------------------------------------------
    @contextlib.contextmanager
    def _guard(self):
        """SQLite's errors (locked, read-only, damaged, ...) as one-line StoreErrors."""
        try:
            yield
        except sqlite3.Error as e:
            raise StoreError(_problem(self.path, e, self.busy_timeout)) from None

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            with self._guard():
                conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None,
                                       check_same_thread=False)
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if mode.lower() != "wal":
                    raise StoreError(f"job store {self.path!r} cannot use WAL mode (got {mode!r}); "
                                     "put it on a local file system, not NFS")
                conn.execute("PRAGMA foreign_keys=ON")
                conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        def upgrade():
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(f"job store {self.path!r} has schema version {version}; this tfsync "
                                 f"reads up to {SCHEMA_VERSION}; upgrade tfsync")
            while version < SCHEMA_VERSION:
                for statement in filter(str.strip, _MIGRATIONS[version].split(";")):
                    conn.execute(statement)
                version += 1
                conn.execute(f"PRAGMA user_version={version}")
                logger.info("job store %s: schema now at version %d", self.path, version)

        self._transaction(conn, upgrade)

    def _transaction(self, conn: sqlite3.Connection, body) -> None:
        with self._guard():
            conn.execute("BEGIN IMMEDIATE")
            try:
                body()
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def _write(self, sql: str, params=()) -> sqlite3.Cursor:
        with self._guard():
            return self._conn().execute(sql, params)

    def _write_many(self, sql: str, rows: list) -> None:
        conn = self._conn()
        self._transaction(conn, lambda: conn.executemany(sql, rows))

    def _rows(self, sql: str, params=()) -> list[tuple]:
        with self._guard():
            return self._conn().execute(sql, params).fetchall()

    def pragma(self, name: str):
        return self._rows(f"PRAGMA {name}")[0][0]

    def close(self) -> None:
        """Close every thread's connection; the store must not be used afterwards."""
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- jobs and runs --------------------------------------------------------------------
    def create_job(self, name: str, signature: str, config: dict, *, run_dir: str = "",
                   token_path: str = "", job_id: str | None = None) -> Job:
        """Add a job in state "submitted". With a ``job_id`` already stored with the same
        name, signature and config (a retried submit), return that job unchanged."""
        job_id = job_id or uuid.uuid4().hex[:16]
        now = time.time()
        text = json.dumps(config, sort_keys=True)
        cur = self._write("INSERT OR IGNORE INTO jobs VALUES (?, ?, ?, ?, 'submitted', ?, ?, ?, ?)",
                          (job_id, name, signature, text, now, now, run_dir, token_path))
        job = self.job(job_id)
        if cur.rowcount == 0 and (job.name, job.signature, job.config) != (name, signature, json.loads(text)):
            raise StoreError(f"job id {job_id!r} exists with another name, signature or config; "
                             "submit under a new id (or none: the store makes one)")
        return job

    def job(self, job_id: str) -> Job:
        rows = self._rows("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            raise KeyError(f"no job {job_id!r} in {self.path}")
        r = rows[0]
        return Job(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], r[7], r[8])

    def jobs(self, state: str | None = None) -> list[Job]:
        if state is not None:
            _check(state, JOB_STATES, "job state")
        ids = self._rows("SELECT id FROM jobs WHERE ? IS NULL OR state = ? ORDER BY created, id", (state, state))
        return [self.job(i) for (i,) in ids]

    def set_job_state(self, job_id: str, state: str) -> None:
        _check(state, JOB_STATES, "job state")
        cur = self._write("UPDATE jobs SET state = ?, updated = ? WHERE id = ?", (state, time.time(), job_id))
        if cur.rowcount == 0:
            raise KeyError(f"no job {job_id!r} in {self.path}")

    def start_run(self, job_id: str, kind: str = "train", config: dict | None = None) -> Run:
        _check(kind, RUN_KINDS, "run kind")
        config = self.job(job_id).config if config is None else config
        now = time.time()
        cur = self._write("INSERT INTO runs (job_id, kind, config, started) VALUES (?, ?, ?, ?)",
                          (job_id, kind, json.dumps(config, sort_keys=True), now))
        return Run(cur.lastrowid, job_id, kind, config, now)

    def runs(self, job_id: str) -> list[Run]:
        rows = self._rows("SELECT id, job_id, kind, config, started FROM runs WHERE job_id = ? ORDER BY id", (job_id,))
        return [Run(r[0], r[1], r[2], json.loads(r[3]), r[4]) for r in rows]

    def runs_by_signature(self, signature: str) -> list[tuple[Run, dict]]:
        """Every run of every job with this signature, oldest first, with its results."""
        rows = self._rows("SELECT runs.id, job_id, kind, runs.config, started FROM runs JOIN jobs ON "
                          "jobs.id = runs.job_id WHERE signature = ? ORDER BY runs.id", (signature,))
        return [(Run(r[0], r[1], r[2], json.loads(r[3]), r[4]), self.results(r[0])) for r in rows]

    # -- what runs record -----------------------------------------------------------------
    def add_steps(self, steps: list[StepSummary]) -> None:
        """Insert step summaries in one transaction; a step stored before is replaced."""
        self._write_many("INSERT OR REPLACE INTO steps VALUES (?, ?, ?, ?, ?, ?, ?)",
                         [(s.run_id, s.step, s.time, s.samples, s.loss, s.protocol, json.dumps(list(s.batch_sizes)))
                          for s in steps])

    def steps(self, run_id: int, from_step: int = 0) -> list[StepSummary]:
        rows = self._rows("SELECT * FROM steps WHERE run_id = ? AND step >= ? ORDER BY step", (run_id, from_step))
        return [StepSummary(r[0], r[1], r[2], r[3], r[4], r[5], tuple(json.loads(r[6]))) for r in rows]

    def protocols_ran(self, job_id: str) -> list[str]:
        """The protocols the job's runs (not search trials) trained with, in order: each
        change of the steps' protocol, across its runs (a resume that carries on counts once)."""
        rows = self._rows("SELECT protocol FROM (SELECT s.protocol, LAG(s.protocol) OVER (ORDER BY s.run_id, s.step) "
                          "AS prev FROM steps s JOIN runs r ON r.id = s.run_id WHERE r.job_id = ? AND r.kind != "
                          "'trial') WHERE prev IS NULL OR prev != protocol", (job_id,))
        return [r[0] for r in rows]

    def last_step(self, run_id: int) -> StepSummary | None:
        """The run's newest step summary (None before its first), without reading the others."""
        rows = self._rows("SELECT * FROM steps WHERE run_id = ? ORDER BY step DESC LIMIT 1", (run_id,))
        return StepSummary(*rows[0][:6], tuple(json.loads(rows[0][6]))) if rows else None

    def add_event(self, run_id: int, kind: str, detail: dict | None = None, at: float | None = None) -> Event:
        _check(kind, EVENT_KINDS, "event kind")
        event = Event(run_id, kind, time.time() if at is None else at, detail or {})
        self._write("INSERT INTO events (run_id, kind, time, detail) VALUES (?, ?, ?, ?)",
                    (run_id, kind, event.time, json.dumps(event.detail)))
        return event

    def events(self, run_id: int, kind: str | None = None) -> list[Event]:
        rows = self._rows("SELECT run_id, kind, time, detail FROM events WHERE run_id = ? AND (? IS NULL OR kind = ?) "
                          "ORDER BY time, id", (run_id, kind, kind))
        return [Event(r[0], r[1], r[2], json.loads(r[3])) for r in rows]

    def set_result(self, run_id: int, key: str, value) -> None:
        self._write("INSERT OR REPLACE INTO results VALUES (?, ?, ?)", (run_id, key, json.dumps(value)))

    def results(self, run_id: int) -> dict:
        return {k: json.loads(v) for k, v in self._rows("SELECT key, value FROM results WHERE run_id = ?", (run_id,))}

    # -- switch points found by the search (schema 2) -------------------------------------
    def set_switch_point(self, signature: str, fraction: float, detail: dict | None = None) -> None:
        self._write("INSERT OR REPLACE INTO switch_points VALUES (?, ?, ?, ?)",
                    (signature, float(fraction), json.dumps(detail or {}), time.time()))

    def switch_point(self, signature: str) -> tuple[float, dict, float] | None:
        """(fraction, detail, time stored) for a recurring job, or None."""
        rows = self._rows("SELECT fraction, detail, updated FROM switch_points WHERE signature = ?", (signature,))
        return (rows[0][0], json.loads(rows[0][1]), rows[0][2]) if rows else None

    # -- node resources -------------------------------------------------------------------
    def add_resources(self, records: list[ResourceRecord]) -> None:
        self._write_many("INSERT INTO resources VALUES (?, ?, ?, ?, ?, ?)",
                         [(r.node, r.time, r.job_id, r.cpu_percent, r.memory_percent, json.dumps(list(r.processes)))
                          for r in records])

    def resources(self, node: str, since: float = 0.0) -> list[ResourceRecord]:
        rows = self._rows("SELECT * FROM resources WHERE node = ? AND time >= ? ORDER BY time", (node, since))
        return [ResourceRecord(r[0], r[1], r[2], r[3], r[4], tuple(json.loads(r[5]))) for r in rows]


class ManagerLock:
    """One manager per job store: an exclusive lock on ``STORE.manager`` held while the
    manager runs (released by the OS when its process ends, however it ends). The file
    names the holder, so a second manager is refused with a line that says who."""

    def __init__(self, store_path: str | os.PathLike):
        self.path = os.fspath(store_path) + ".manager"
        self._fd: int | None = None

    def acquire(self) -> "ManagerLock":
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 256).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise StoreError(f"job store {self.path[:-len('.manager')]!r} is served by another manager "
                             f"({holder}); talk to that one, or give this one its own --store") from None
        self._fd = fd
        self.note("")
        return self

    def note(self, address: str) -> None:
        """Record this manager (pid, and its address once bound) in the lock file."""
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"pid {os.getpid()}{' at ' + address if address else ''}".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
