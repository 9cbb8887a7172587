"""Bad input and a broken environment as a careless user meets them (issue 14, items 4, 6
and 7): one line on stderr naming the problem, a non-zero exit, nothing half-made,
never a traceback or a hang. None of these starts a TF task."""

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import job_manager, run_here
from tfsync.api import auth
from tfsync.job.config import JobConfig
from tfsync.job.errors import ConfigError
from tfsync.job.limits import check_job
from tfsync.manager.store import Store, StoreError

pytestmark = pytest.mark.unit

JOB = str(Path(__file__).resolve().parents[1] / "jobs" / "mnist.toml")
GIB = 2**30
TF_NATIVE_LOG = re.compile(r"WARNING: All log messages before absl|[IWE]\d{4} ")  # TF's C++ start-up lines


def tfsync(*args, env=None, user=None, timeout=120):
    cmd = [sys.executable, "-m", "tfsync.cli", *args]
    if user is not None:  # run as another user (root ignores file modes)
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd="/")


def one_line(r, *words, code=None):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not TF_NATIVE_LOG.match(ln)]
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1 and lines[0].startswith("tfsync: error:"), r.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert r.returncode == (code if code is not None else r.returncode) and r.returncode != 0
    return lines[0]


# -- the job store (item 7) -----------------------------------------------------------------
def test_a_damaged_or_truncated_store_is_one_line(tmp_path):
    bad = tmp_path / "garbage.db"
    bad.write_text("not a database\n")
    one_line(tfsync("search", JOB, "--show", "--store", str(bad)), "damaged", str(bad), code=1)
    good = tmp_path / "jobs.db"
    with Store(good) as store:
        for i in range(200):
            store.create_job(f"j{i}", "sig", {"x": "y" * 500})
    cut = tmp_path / "cut.db"
    cut.write_bytes(good.read_bytes()[:8192])
    r = tfsync("search", JOB, "--show", "--store", str(cut))
    one_line(r, str(cut), code=1)


def test_a_store_locked_by_a_writer_is_a_store_error_naming_the_lock(tmp_path):
    path = tmp_path / "jobs.db"
    Store(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match=r"locked by another process \(waited 0 s\)"):
            Store(path, busy_timeout=0.3)   # (a wait for ever would meet pytest's timeout)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@pytest.mark.skipif(os.geteuid() == 0 and not shutil.which("setpriv"), reason="needs setpriv to drop root")
def test_a_read_only_store_is_one_line():
    if os.geteuid() == 0:  # root ignores file modes: the command runs as nobody, who must reach tfsync
        probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                                "-c", "import tfsync.cli"], capture_output=True, text=True, timeout=60, cwd="/")
        if probe.returncode != 0:
            pytest.skip("user nobody cannot import tfsync from this Python (a virtualenv inside root's home?): "
                        + (probe.stderr.strip().splitlines() or ["?"])[-1])
    folder = Path(tempfile.mkdtemp(prefix="tfsync-ro-"))  # its parents must be open to the other user
    try:
        path = folder / "jobs.db"
        Store(path).close()
        folder.chmod(0o755)
        path.chmod(0o444)
        r = tfsync("search", JOB, "--show", "--store", str(path), user=65534 if os.geteuid() == 0 else None,
                   env={"TFSYNC_HOME": str(folder / "home")})
        one_line(r, "read-only", str(path), code=1)
    finally:
        shutil.rmtree(folder)


def test_the_manager_and_the_store_commands_start_without_tensorflow():
    """A standalone manager, `tfsync jobs|runs|status` and the CLI's parser never import
    TensorFlow (seconds of start-up and hundreds of MB for a process that trains nothing;
    a manager that took 7 s to start and over a second to exit)."""
    code = ("import sys, tfsync.cli, tfsync.cli.manager, tfsync.manager.daemon, tfsync.cli.jobs; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tf_keras')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_second_manager_on_one_store_is_refused_naming_the_first(tmp_path):
    store = tmp_path / "jobs.db"
    env = {"TFSYNC_HOME": str(tmp_path)}
    first = subprocess.Popen([sys.executable, "-m", "tfsync.cli", "manager", "--listen", "127.0.0.1:0",
                              "--store", str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, **env})
    try:
        banner = first.stdout.readline()
        assert "listening on" in banner, first.stderr.read() if first.poll() is not None else banner
        address = banner.split("listening on ")[1].split()[0]
        line = one_line(tfsync("manager", "--listen", "127.0.0.1:0", "--store", str(store), env=env),
                        "served by another manager", f"pid {first.pid} at {address}", code=1)
        assert str(store) in line
        assert first.poll() is None  # the first one is undisturbed
    finally:
        first.terminate()
        first.wait(timeout=60)
    # once the first has gone, a new manager may serve the store
    again = subprocess.Popen([sys.executable, "-m", "tfsync.cli", "manager", "--listen", "127.0.0.1:0",
                              "--store", str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, **env})
    try:
        assert "listening on" in again.stdout.readline()
    finally:
        again.terminate()
        again.wait(timeout=60)


# -- control files (item 7) -----------------------------------------------------------------
@pytest.fixture
def run_dir(tmp_path):
    control = tmp_path / "run" / "control"
    control.mkdir(parents=True)
    (control / "manager.json").write_text(json.dumps({"address": "127.0.0.1:9", "job_id": "j1"}))
    auth.write_token(control / "token")
    return tmp_path / "run"


def test_a_token_file_others_can_read_is_one_line(run_dir):
    (run_dir / "control" / "token").chmod(0o644)
    one_line(tfsync("status", str(run_dir)), "mode 0644", "chmod 600", code=2)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"job_id": "j1"}'])
def test_a_damaged_manager_json_is_one_line(run_dir, text):
    (run_dir / "control" / "manager.json").write_text(text)
    one_line(tfsync("status", str(run_dir)), "manager.json is damaged", code=2)


# -- the run directory and the job's name (item 4) ------------------------------------------
def test_an_unusable_run_dir_is_one_line_fast_and_leaves_no_running_job(tmp_path):
    home = tmp_path / "home"
    (tmp_path / "file").write_text("")
    t0 = time.monotonic()
    r = tfsync("run", JOB, "--run-dir", str(tmp_path / "file" / "run"), env={"TFSYNC_HOME": str(home)}, timeout=90)
    one_line(r, str(tmp_path / "file"), "Not a directory", code=1)
    assert time.monotonic() - t0 < 60  # no hang at exit
    if (home / "jobs.db").exists():
        with Store(home / "jobs.db") as store:
            assert not store.jobs("running")


def test_a_run_dir_through_a_link_or_in_a_system_directory_is_refused_writing_nothing(tmp_path):
    """Issue 31 case 3: a run directory that is a link (to /etc), passes through one, or
    lies in a system directory ("../../etc" from the working directory) is one line
    naming job.run_dir, exit 2, and nothing is written there."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "etc").symlink_to("/etc")
    from tfsync.base.rundir import RunDirError, resolve
    before = sorted(os.listdir("/etc"))
    r = tfsync("run", JOB, "--set", f"job.run_dir={tmp_path / 'etc'}", timeout=90)
    one_line(r, "job.run_dir", f"{tmp_path / 'etc'} is a symbolic link (to /etc)", code=2)
    for run_dir, words in ((tmp_path / "link", f"{tmp_path / 'link'} is a symbolic link (to {target})"),
                           (tmp_path / "link" / "run", f"{tmp_path / 'link'} is a symbolic link"),
                           ("../../../../../../etc", "/etc is a system directory"),
                           ("/usr/local/runs", "/usr/local/runs is a system directory or inside one"),
                           ("/", "/ is a system directory")):
        with pytest.raises(RunDirError, match=re.escape(words)):
            resolve(str(run_dir))
    assert resolve(str(target / "a" / ".." / "run")) == str(target / "run")
    assert os.listdir(target) == [] and sorted(os.listdir("/etc")) == before


def test_a_second_run_on_a_run_dir_in_use_is_refused_naming_the_first(tmp_path):
    """Issue 31 case 4: while a run holds its directory, a second `tfsync run`, `resume`
    or `search` on it is refused in one line naming the first (pid, start time), exit 1,
    and moves nothing of the first run aside."""
    from tfsync.base import rundir
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("{}\n")
    with rundir.RunLock(str(run_dir), "tfsync run"):
        for cmd in (["run", JOB], ["resume", JOB], ["search", JOB, "--runs", "1", "--settings", "1"]):
            r = tfsync(*cmd, "--set", f"job.run_dir={run_dir}", env={"TFSYNC_HOME": str(tmp_path / "home")})
            one_line(r, f"{run_dir} is in use by tfsync run (pid {os.getpid()}, started ", code=1)
        assert (run_dir / "metrics.jsonl").exists() and not (run_dir / "previous").exists()
    with rundir.RunLock(str(run_dir), "again"):   # released with the holder
        pass


def test_a_long_or_unsafe_job_name_is_refused_naming_the_field():
    for name in ("x" * 5000, "../etc", "a b", ""):
        with pytest.raises(ConfigError, match=r"job\.name.*1 to 64 letters"):
            JobConfig.from_dict({"job": {"name": name}})
    assert JobConfig.from_dict({"job": {"name": "x" * 64}}).job.name == "x" * 64


# -- bounds (item 6) ------------------------------------------------------------------------
def test_a_batch_that_cannot_fit_in_memory_is_refused_naming_the_batch_size():
    per_example = 28 * 28 * 4 + 8
    check_job(2, 1, 4096, per_example, local_tasks=True, available=16 * GIB, fd_limit=1024)
    with pytest.raises(ConfigError, match=r"train\.batch_size: a worker's batches of up to 1000000000 examples"):
        check_job(2, 1, 10**9, per_example, local_tasks=True, available=16 * GIB, fd_limit=1024)


def test_workers_beyond_memory_or_open_files_are_refused_naming_the_worker_count():
    with pytest.raises(ConfigError, match=r"cluster\.workers: 10000 workers \+ 1 PS on this machine"):
        check_job(10_000, 1, 64, 3144, local_tasks=True, available=16 * GIB, fd_limit=1_000_000)
    check_job(10_000, 1, 64, 3144, local_tasks=False, available=16 * GIB, fd_limit=1_000_000)  # on other nodes
    with pytest.raises(ConfigError, match=r"cluster\.workers: 10001 tasks .*ulimit -n"):
        check_job(10_000, 1, 64, 3144, local_tasks=False, available=16 * GIB, fd_limit=1024)


def test_a_huge_batch_size_from_the_command_line_is_refused_before_any_task(tmp_path, capsys, monkeypatch):
    job = tmp_path / "job.toml"
    job.write_text(Path(JOB).read_text().replace("batch_size = 64 ", "batch_size = 1000000000 "))
    monkeypatch.setenv("TFSYNC_HOME", str(tmp_path / "home"))
    r = run_here(capsys, "run", str(job), "--run-dir", str(tmp_path / "run"), "-q")
    one_line(r, "train.batch_size", "larger than the training set (60,000 examples)", code=2)
    assert not list((tmp_path / "run").glob("logs/*/*.log"))  # no task was started


# -- special files (issue 31, item 8) -------------------------------------------------------
def test_a_job_file_that_is_a_fifo_a_device_a_directory_or_huge_is_refused_before_it_is_read(tmp_path):
    """A FIFO job file used to block `tfsync run` forever, /dev/zero to fill the memory."""
    fifo = tmp_path / "job.toml"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.toml"
    huge.write_text("# " + "x" * 2**20 + "\n")
    for path, words in ((fifo, "is a FIFO"), ("/dev/zero", "is a character device"), (tmp_path, "is a directory"),
                        (huge, "larger than 1 MiB, the limit for a job file")):
        one_line(tfsync("run", str(path), timeout=60), str(path), words, code=2)   # a read that blocks: timeout


@pytest.mark.timeout(60)  # the signal timeout interrupts a read that blocks
def test_a_data_path_or_code_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    from tfsync.base import data, usercode
    fifo = tmp_path / "mnist.npz"
    os.mkfifo(fifo)
    with pytest.raises(data.DataError, match=rf"{re.escape(str(fifo))} is a FIFO \(named pipe\), not a regular file"):
        data.load("mnist", fifo)
    os.mkfifo(tmp_path / "model.py")
    with pytest.raises(usercode.UserCodeError, match=r"model\.fn: .*model\.py is a FIFO"):
        usercode.resolve(f"{tmp_path / 'model.py'}:build", "model.fn")


# -- one line, not a traceback (issue 31, item 9) -------------------------------------------
def test_a_token_file_of_non_ascii_bytes_is_one_line(run_dir):
    token = run_dir / "control" / "token"
    token.write_bytes("tök€n\n".encode())
    one_line(tfsync("status", str(run_dir)), str(token), "non-ASCII", code=2)


def test_batch_sizes_beyond_the_api_range_are_one_line_naming_them(tmp_path):
    with job_manager(tmp_path) as (service, stub, runs):
        for size in ("99999999999", "2147483648", "-2147483649"):   # beyond what the API carries
            one_line(tfsync("batch-sizes", str(runs["live"]), size, "16"), f"batch size {size}", code=2)
        for size in ("0", "-1"):   # carried, and refused where the engine would refuse it
            one_line(tfsync("batch-sizes", str(runs["live"]), size, "16"), f"batch sizes [{size}, 16]: expected 2",
                     code=2)
        r = tfsync("batch-sizes", str(runs["live"]), "2147483647", "16")   # the largest the API carries
        assert r.returncode == 0 and "queued" in r.stdout, r.stderr


def test_the_manager_of_a_run_answers_submit_and_resume_with_a_status_not_a_traceback(tmp_path, caplog, capfd):
    """`tfsync run`'s manager trains one job: SubmitJob and Resume are refused in one line,
    and nothing is printed into the running job's output."""
    import grpc

    from tfsync.api.v1 import manager_pb2
    answers = []
    with job_manager(tmp_path) as (service, stub, runs):
        for call in (lambda: stub.SubmitJob(manager_pb2.SubmitJobRequest(config_json="{}"), timeout=5),
                     lambda: stub.Resume(manager_pb2.ResumeRequest(job_id="live"), timeout=5)):
            with pytest.raises(grpc.RpcError) as e:
                call()
            answers.append((e.value.code(), e.value.details()))
    printed = [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not printed and "Traceback" not in capfd.readouterr().err, printed
    assert [code for code, _ in answers] == [grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.FAILED_PRECONDITION]
    assert all("\n" not in text and "`tfsync run`" in text for _, text in answers), answers


def test_hook_init_token_writes_nothing_for_a_bad_argument(tmp_path):
    token = tmp_path / "hook.token"
    for args, words in ((["--listen", "nonsense"], "--listen"), (["--listen", "0.0.0.0:7000"], "not a loopback"),
                        (["--task-allow", "nowhere"], "--task-allow"), (["--tls-cert", str(tmp_path / "no.pem")],
                                                                        "TLS")):
        r = tfsync("hook", "--token-file", str(token), "--init-token", *args)
        assert not token.exists(), f"{args}: a token was written before the arguments were checked"
        one_line(r, words, code=2)


def test_a_learning_rate_factor_that_can_only_diverge_is_refused_where_the_command_is_checked():
    """Issue 31 case 5: `lr_scale` 1e6 by a switch turned the loss to NaN; a factor above
    MAX_LR_SCALE (BSP's n x eta for a thousand workers) is refused, naming the bound."""
    from tfsync.engine.commands import Command, check
    from tfsync.policy.base import MAX_LR_SCALE
    with pytest.raises(ValueError, match=r"lr_scale 1000000.0; expected a finite number > 0 \(and at most 1000\)"):
        check(Command("c1", "switch", protocol="asp", lr_scale=1e6), 2)
    check(Command("c2", "switch", protocol="asp", lr_scale=MAX_LR_SCALE), 2)
