"""What the tests share: the bundled MNIST sample, `tfsync` run as a user runs it, job
files on the built-in linear model, and what a run (or a simulated one) leaves. Test
modules import from here, never from one another."""

import collections
import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tfsync", "datasets", "mnist_sample.npz")


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def linear_job(name: str, *protocols, extra: str = "", **train) -> str:
    """A job file on the linear model of the MNIST sample, for ``str.format``: ``run_dir``
    is left as ``{run_dir}`` (``tfsync_run`` fills it). ``train`` adds to or replaces
    batch_size = 32 and learning_rate = 0.05; one [[protocol]] per entry of ``protocols``
    (a name, or a dict of its options); ``extra``: more sections, as text."""
    lines = ["[job]", f"name = {_toml(name)}", 'run_dir = "{run_dir}"', "[model]", 'name = "linear"', "[train]"]
    lines += [f"{k} = {_toml(v)}" for k, v in {"batch_size": 32, "learning_rate": 0.05, **train}.items()]
    for p in protocols:
        lines += ["[[protocol]]"] + [f"{k} = {_toml(v)}" for k, v in ({"name": p} if isinstance(p, str) else p).items()]
    return "\n".join(lines) + "\n" + extra


# BSP then ASP with a checkpoint every 10 updates: the job that is killed and resumed
CHECKPOINTED_JOB = linear_job("res", {"name": "bsp", "until": 0.66}, "asp", epochs=1.5, checkpoint_every=10)
PER_UPDATE = 2 * 32  # samples in one of its BSP updates: 2 workers x batch 32


# -- tfsync as a user runs it ---------------------------------------------------------------
def tfsync(*args, env=None, timeout=60, **kw):
    return subprocess.run([sys.executable, "-m", "tfsync.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, **kw)


@contextlib.contextmanager
def tfsync_run(tmp_path, job_text: str, env=None, output=subprocess.PIPE, args=()):
    """`tfsync run JOB --json` (and ``args``) in its own process, JOB written to
    tmp_path/job.toml from ``job_text`` with ``{run_dir}`` = tmp_path/run; yields (process,
    run_dir, job). The process is killed on the way out if it still runs, also when the
    test failed."""
    run_dir, job = tmp_path / "run", tmp_path / "job.toml"
    job.write_text(job_text.format(run_dir=run_dir))
    run = subprocess.Popen([sys.executable, "-m", "tfsync.cli", "run", str(job), "--json", "--data", DATA, *args],
                           stdout=output, stderr=output, text=True, env=env)
    try:
        yield run, run_dir, job
    finally:
        kill_if_running(run)


def kill_if_running(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def interrupt(proc: subprocess.Popen, timeout: float = 90) -> None:
    """Stop a tfsync process as Ctrl-C does (it stops its jobs or tasks), or kill it after ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()


def default_sigint():
    """Ctrl-C reaches the child even when the tests run in a background shell (which
    starts its commands with SIGINT ignored, and Python keeps an ignored SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(what, check, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def kill_worker(run_pid, index):
    """SIGKILL the task process of worker ``index`` under the `tfsync run` process ``run_pid``."""
    for pid, name in tasks_under(run_pid).items():
        if name == f"tfsync-worker{index}":
            os.kill(pid, signal.SIGKILL)
            return pid
    raise AssertionError(f"no task process for worker {index}")


# -- what a run leaves ------------------------------------------------------------------------
def records(run_dir):
    """The lines of run_dir/metrics.jsonl so far (none before the run starts)."""
    out = []
    if not (run_dir / "metrics.jsonl").exists():
        return out
    with open(run_dir / "metrics.jsonl") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:  # the line a kill cut short
                pass
    return out


def wait_for_checkpoints(run_dir, count: int = 2, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "metrics.jsonl").exists() and \
                sum(r.get("event") == "checkpoint" for r in records(run_dir)) >= count:
            return
        time.sleep(0.2)
    pytest.fail(f"fewer than {count} checkpoints within {timeout:.0f} s")


def check_counted_once(run_dir, summary, why: str) -> None:
    """metrics.jsonl holds each counted push once, numbered 1..pushes as summary.json says;
    what was trained again after going back to a checkpoint is in metrics.discarded.jsonl."""
    recs = records(run_dir)
    assert [r["pushes"] for r in recs if "worker" in r] == list(range(1, summary["pushes"] + 1))
    (rewind,) = [r for r in recs if r.get("event") == "rewind"]
    path = run_dir / "metrics.discarded.jsonl"  # none when nothing ran after the checkpoint
    discarded = [json.loads(line) for line in open(path)] if path.exists() else []
    assert rewind["why"] == why and rewind["discarded"] == len(discarded)
    assert all(d["discarded"] == why and d["pushes"] > rewind["pushes"] for d in discarded)


def check_ps_recovered(run, out, err, run_dir) -> dict:
    """A CHECKPOINTED_JOB run finished after one PS recovery that lost at most a checkpoint
    interval; returns the recovery."""
    assert run.returncode == 0, err[-2000:]
    summary = json.loads(out)
    (rec,) = summary["recoveries"]
    assert rec["task"] == "ps:0" and rec["exit_code"] == -signal.SIGKILL
    assert 0 <= rec["samples_lost"] <= (10 + 1) * PER_UPDATE  # checkpoint_every = 10 updates
    assert summary["samples"] >= summary["workload_samples"] and summary["test_accuracy"] > 0.8
    assert any(r.get("event") == "task_restarted" for r in records(run_dir))
    check_counted_once(run_dir, summary, "ps_lost")
    return rec


def round_sizes(result):
    """``[{worker: batch size}]`` of each round of a simulated run, in round order."""
    rounds = collections.defaultdict(dict)
    for p in result.log:
        rounds[p.round][p.worker] = p.batch_size
    return [rounds[r] for r in sorted(rounds)]


def check_imports_no_tensorflow(*modules: str) -> None:
    """Importing ``modules`` in a fresh interpreter loads neither TensorFlow, tf_keras nor statsmodels."""
    code = (f"import sys; import {', '.join(modules)}; "
            "bad = [m for m in ('tensorflow', 'tf_keras', 'statsmodels') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# -- node hooks -----------------------------------------------------------------------------
def start_hook(tmp_path, name, token_file, port, args=()):
    """`tfsync hook` on 127.0.0.1:port (and ``args``), its output in tmp_path/name.out,
    once it listens."""
    log = open(tmp_path / f"{name}.out", "w")
    proc = subprocess.Popen([sys.executable, "-m", "tfsync.cli", "hook", "--listen", f"127.0.0.1:{port}",
                             "--token-file", str(token_file), "--log-dir", str(tmp_path / name), *args],
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    log.close()
    deadline = time.monotonic() + 60
    while "listening" not in (tmp_path / f"{name}.out").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / f"{name}.out").read_text()
        time.sleep(0.1)
    return proc


def tasks_under(pid: int) -> dict[int, str]:
    """``{pid: name}`` of the TF task processes below process ``pid`` (forked by its fork
    server or started by it): ``ps`` shows each as ``tfsync-ps0``, ``tfsync-worker1``, ..."""
    out = {}
    for p in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.name().startswith(("tfsync-ps", "tfsync-worker")):
                out[p.pid] = p.name()
    return out


def task_children(hook):
    """``{pid: name}`` of the TF task processes a hook process runs."""
    return tasks_under(hook.pid)


# -- managers -------------------------------------------------------------------------------
@contextlib.contextmanager
def job_manager(folder, workers: int = 2):
    """A job manager as `tfsync run` embeds one, on loopback, with no coordinator: it serves
    the running job "live" (``workers`` workers) and the ended job "done"; commands are
    answered "queued" at once. Yields (service, stub, {job id: its run directory}); each run
    directory holds the control files `tfsync status | batch-sizes | metrics ...` read."""
    from tfsync.api import auth, transport
    from tfsync.api.v1 import manager_pb2_grpc
    from tfsync.manager.service import ManagerService
    from tfsync.manager.store import Store

    store = Store(str(folder / "jobs.db"))
    service = ManagerService(store, command_wait_s=0.01)
    token = auth.new_token()
    server, port = transport.make_server("127.0.0.1:0", token=token)
    manager_pb2_grpc.add_ManagerServicer_to_server(service, server)
    server.start()
    runs = {}
    for job_id in ("live", "done"):
        service.register(job_id, job_id).workers = workers
        runs[job_id] = folder / job_id
        (runs[job_id] / "control").mkdir(parents=True)
        auth.write_token(runs[job_id] / "control" / "token", token)
        (runs[job_id] / "control" / "manager.json").write_text(
            json.dumps({"address": f"127.0.0.1:{port}", "job_id": job_id}))
    service.end("done")
    channel = transport.make_channel(f"127.0.0.1:{port}", token=token)
    try:
        yield service, manager_pb2_grpc.ManagerStub(channel), runs
    finally:
        channel.close()
        server.stop(None).wait(5)
        store.close()


# -- a disk that fills up -----------------------------------------------------------------
@contextlib.contextmanager
def small_disk(path, size: str):
    """A tmpfs of ``size`` (e.g. "64m") mounted at ``path``, unmounted on the way out; the
    test skips, saying why, where it cannot be mounted (not root, no mount permission)."""
    if os.geteuid() != 0:
        pytest.skip("a small disk is a tmpfs mount, which needs root")
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill_disk(folder, leave: int = 0):
    """Fill the file system of ``folder`` with the file ``folder/filler`` until ``leave``
    bytes (rounded to its pages) are left free; returns the filler's path."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    block = b"\0" * 2**20
    try:
        while True:  # a write that does not fit writes what does; the next one fails
            try:
                os.write(fd, block)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)
    return filler


def run_here(capsys, *args) -> subprocess.CompletedProcess:
    """``tfsync ARGS`` in this process (``tfsync_here``), as a finished process: for a
    refusal, or a run whose outputs (not its process) are what is checked; its tasks are
    still processes of their own, from this process's fork server. A process of its own
    costs an interpreter, the isolation's re-exec and a TensorFlow import: about 5 s on a
    loaded machine."""
    code, out, err = tfsync_here(capsys, *args)
    tf = sys.modules.get("tensorflow")
    if tf is not None:   # (a run sets TF's global seed: the tests after it draw as they would have)
        tf.random.set_seed(None)
    return subprocess.CompletedProcess(["tfsync", *args], code, out, err)


def tfsync_here(capsys, *args) -> tuple[int, str, str]:
    """``tfsync ARGS`` in this process: (exit code, stdout, stderr); the SIGTERM handler
    main() installs and the umask a run sets (077: tfsync.base.rundir.private) put back
    afterwards (left at 077, the tests after one wrote files 0600: a k8s manifest test
    failed on it)."""
    from tfsync.base.safefile import umask
    from tfsync.cli import main
    saved_term, saved_umask = signal.getsignal(signal.SIGTERM), umask()
    try:
        code = main(list(args))
    finally:
        signal.signal(signal.SIGTERM, saved_term)
        os.umask(saved_umask)
    out, err = capsys.readouterr()
    return code, out, err
