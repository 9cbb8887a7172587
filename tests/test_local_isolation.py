"""A local run's TF task ports reach no other local user, with or without nftables, started
by root or by an ordinary user (tfsync.base.isolation: the whole run in a network
namespace of its own, holding loopback only). Checked as an attacker would: while a real
`tfsync run` trains, another local user connects (IPv4 and IPv6, every address of the
job's namespace and of this machine) to every port the job's processes listen on, and
runs a TensorFlow operation on each; every attempt must fail. Where no namespace can be
had (an ordinary user, user namespaces off) the run is refused in one line.

The users are uids with no passwd entry (setpriv switches to a number). The venv may
live in root's home (0700, as on CI): a process acting as another user runs in a mount
namespace of its own where /root is a 0755 tmpfs holding binds of what it held, each
keeping its own mode (``AS_USER``). Root and util-linux (setpriv, nsenter, mount) are
needed; without them these tests skip, saying so."""

import functools
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from helpers import DATA, kill_if_running, linear_job, wait_for

pytestmark = pytest.mark.cluster

ATTACKER, JOB_USER = 65533, 65532
REASON = ("needs root and util-linux's setpriv, nsenter and mount"
          if os.geteuid() != 0 or not all(shutil.which(t) for t in ("setpriv", "nsenter", "mount")) else None)

# argv: UID MODE CMD... -> CMD as UID. MODE "block-userns": in a user namespace of the test's
# where no further one may be made (as where unprivileged user namespaces are off).
AS_USER = r'''
import ctypes, os, subprocess, sys, tempfile
uid, mode, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
libc = ctypes.CDLL(None, use_errno=True)
def check(ok, what):
    if not ok:
        raise OSError(ctypes.get_errno(), what)
check(libc.unshare(0x20000) == 0, "unshare(CLONE_NEWNS)")
subprocess.run(["mount", "--make-rprivate", "/"], check=True)
orig = tempfile.mkdtemp()
subprocess.run(["mount", "--bind", "/root", orig], check=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/root"], check=True)
for name in os.listdir(orig):
    src, dst = os.path.join(orig, name), os.path.join("/root", name)
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        continue
    os.mkdir(dst) if os.path.isdir(src) else open(dst, "w").close()
    subprocess.run(["mount", "--bind", src, dst], check=True)
if mode == "block-userns":
    ready, mapped = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        check(libc.unshare(0x10000000) == 0, "unshare(CLONE_NEWUSER)")
        os.write(ready[1], b"x")
        os.read(mapped[0], 1)
        with open("/proc/sys/user/max_user_namespaces", "w") as f:
            f.write("0")
    else:
        os.read(ready[0], 1)
        for kind in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{kind}", "w") as f:
                f.write(f"0 0 1\n{uid} {uid} 1\n")
        os.write(mapped[1], b"x")
        sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
os.execvp(argv[0], argv)
'''

# argv: PORT... with the addresses to try in $TARGETS; prints what answered
CONNECT = r'''
import os, socket, sys
for port in map(int, sys.argv[1:]):
    for host in os.environ["TARGETS"].split():
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            if s.connect_ex((host, port)) == 0:
                print(f"{host} {port}")
'''

TF_CALL = r'''
import sys, threading
import tensorflow as tf
def call(port):   # every port at once: each attempt waits out its own timeout
    try:
        with tf.Graph().as_default(), tf.compat.v1.Session(f"grpc://127.0.0.1:{port}", config=tf.compat.v1.ConfigProto(
                operation_timeout_in_ms=3000)) as s:
            print(port, s.run(tf.constant(7)), flush=True)
    except Exception as e:
        pass
calls = [threading.Thread(target=call, args=(port,)) for port in sys.argv[1:]]
for t in calls:
    t.start()
for t in calls:
    t.join()
'''


def as_user(uid, argv, mode="plain", **kw):
    return [sys.executable, "-c", AS_USER, str(uid), mode, *argv]


@functools.lru_cache(maxsize=None)
def skip_reason() -> str | None:
    """Why these tests cannot run here: no root or util-linux, or another uid cannot run
    this Python and tfsync even with /root opened (a checkout under another closed folder)."""
    if REASON:
        return REASON
    r = subprocess.run(as_user(JOB_USER, [sys.executable, "-c", "import tfsync.base.isolation"]), cwd="/",
                       capture_output=True, text=True, timeout=120)
    return None if r.returncode == 0 else (f"uid {JOB_USER} cannot run {sys.executable} with tfsync here: "
                                           f"{(r.stderr.strip().splitlines() or ['?'])[-1]}")


def listening_ports(pid: int) -> set[int]:
    """TCP ports listening in process ``pid``'s network namespace (its /proc/net view)."""
    ports = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A":
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def addresses(*nsenter) -> list[str]:
    """Every IP address of a network namespace (``nsenter`` arguments to enter it; none: this one)."""
    out = subprocess.run([*nsenter, "ip", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return sorted({line.split()[3].split("/")[0] for line in out.splitlines() if line.split()[2] in ("inet", "inet6")}
                  - {"fe80::1"})


@pytest.fixture
def job_files(tmp_path):
    """``make(owner=None)``: a job on the linear model long enough to be probed while it
    trains, in a folder ``owner`` (who runs it) owns, outside root's 0700 test folders;
    returns the folder and the job file. Removed after the test."""
    made = []

    def make(owner: int | None = None):
        folder = pathlib.Path(tempfile.mkdtemp(prefix="tfsync-iso-test-"))
        made.append(folder)
        job = folder / "job.toml"
        job.write_text(linear_job("iso", "bsp", epochs=200.0).format(run_dir=folder / "run"))
        shutil.copy(DATA, folder / "data.npz")
        if owner is not None:
            for path in (folder, job, folder / "data.npz"):
                os.chown(path, owner, owner)
        return folder, job

    yield make
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


def hide_nft(tmp_path) -> dict:
    """An environment whose PATH has every tool of /usr/sbin and /sbin but nft."""
    bin_dir = tmp_path / "bin-without-nft"
    bin_dir.mkdir()
    for d in ("/usr/local/sbin", "/usr/sbin", "/sbin"):
        for name in os.listdir(d) if os.path.isdir(d) else ():
            if name != "nft" and not (bin_dir / name).exists():
                (bin_dir / name).symlink_to(os.path.join(d, name))
    path = [str(bin_dir)] + [p for p in os.environ["PATH"].split(":") if p not in ("/usr/local/sbin", "/usr/sbin", "/sbin")]
    env = {**os.environ, "PATH": ":".join(path)}
    assert shutil.which("nft", path=env["PATH"]) is None
    return env


def probe_running_job(proc, folder, env, tf_call: bool = False) -> dict:
    """While the job trains: the ports its processes listen on, what the attacker reaches
    (by TCP; with ``tf_call`` by TensorFlow too, which needs a connection first)."""
    manager = folder / "run" / "control" / "manager.json"
    wait_for("the job's manager", lambda: manager.exists() or proc.poll() is not None, timeout=120)
    assert proc.poll() is None, proc.communicate()
    pid = json.loads(manager.read_text())["pid"]
    wait_for("training", lambda: any(p.name().startswith("tfsync-worker")
                                     for p in psutil.Process(pid).children(recursive=True)) or proc.poll() is not None,
             timeout=120)
    time.sleep(2)   # the workers' ports open; the coordinator connects
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    nets = {os.readlink(f"/proc/{p.pid}/ns/net"): p.pid for p in procs}   # one process of each namespace
    ports = {port for p in nets.values() for port in listening_ports(p)}
    inside = addresses("nsenter", f"--net=/proc/{pid}/ns/net")
    seen_inside = {a for p in nets.values() for a in addresses("nsenter", f"--net=/proc/{p}/ns/net")}
    targets = " ".join(sorted({*seen_inside, *addresses(), "127.0.0.1", "::1"}))
    reached = subprocess.run(as_user(ATTACKER, ["/usr/bin/python3", "-c", CONNECT, *map(str, ports)]),
                             capture_output=True, text=True, timeout=120, env={**env, "TARGETS": targets})
    tf_calls = subprocess.run(as_user(ATTACKER, [sys.executable, "-c", TF_CALL, *map(str, ports)] if tf_call
                                      else ["true"]), capture_output=True, text=True, timeout=300, env=env)
    uids = {p.uids().real for p in procs}
    own_net = os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    return {"ports": ports, "inside": inside, "reached": reached, "tf": tf_calls, "uids": uids, "own_net": own_net,
            "still_running": proc.poll() is None}


def check_unreachable(seen):
    assert seen["still_running"]
    assert len(seen["ports"]) >= 4, seen["ports"]   # chief, PS, 2 workers (and the run's own hook)
    assert seen["reached"].returncode == 0, seen["reached"].stderr
    assert seen["reached"].stdout == "", f"another local user reached: {seen['reached'].stdout}"
    assert seen["tf"].returncode == 0, seen["tf"].stderr[-2000:]
    assert seen["tf"].stdout == "", f"another local user ran a TF operation on: {seen['tf'].stdout}"
    assert seen["own_net"] and seen["inside"] in (["127.0.0.1", "::1"], ["127.0.0.1"]), seen["inside"]


@pytest.mark.parametrize("nft", ["without nft", "with nft"])
def test_no_other_local_user_reaches_a_root_jobs_task_ports(tmp_path, job_files, nft):
    if skip_reason():
        pytest.skip(skip_reason())
    if nft == "with nft" and shutil.which("nft") is None:
        pytest.skip("nftables is not installed here")
    env = hide_nft(tmp_path) if nft == "without nft" else dict(os.environ)
    folder, job = job_files()
    proc = subprocess.Popen([sys.executable, "-m", "tfsync.cli", "run", str(job), "--json", "--data",
                             str(folder / "data.npz")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        seen = probe_running_job(proc, folder, env, tf_call=nft == "without nft")
        stopped = subprocess.run([sys.executable, "-m", "tfsync.cli", "stop", str(job)], capture_output=True,
                                 text=True, timeout=60, env=env)
        out, err = proc.communicate(timeout=120)
    finally:
        kill_if_running(proc)
    check_unreachable(seen)
    assert seen["uids"] == {0}
    assert stopped.returncode == 0, stopped.stderr   # the manager answers through its socket
    assert proc.returncode == 0, err
    assert json.loads(out)["task_ports"].startswith("private network namespace of this process"), out


@pytest.mark.parametrize("how", ["an ordinary user", "sudo"])
def test_a_job_of_another_user_is_kept_from_the_others_and_runs_as_that_user(tmp_path, job_files, how):
    """An ordinary user's run makes a user namespace with its network namespace; under sudo
    root makes the namespace and the coordinator and every task become the sudo user. No
    other user reaches the ports either way, and the run's files are the user's own."""
    if skip_reason():
        pytest.skip(skip_reason())
    folder, job = job_files(owner=JOB_USER)
    env = {**os.environ, "HOME": str(folder), "TFSYNC_HOME": str(folder / ".tfsync")}
    run = [sys.executable, "-m", "tfsync.cli", "run", str(job), "--json", "--data", str(folder / "data.npz")]
    if how == "sudo":   # root, in a mount namespace where the venv is readable by others
        env.update(SUDO_UID=str(JOB_USER), SUDO_GID=str(JOB_USER))
    proc = subprocess.Popen(as_user(0 if how == "sudo" else JOB_USER, run), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=folder)
    try:
        seen = probe_running_job(proc, folder, env)
    finally:
        kill_if_running(proc)
        proc.communicate()
    check_unreachable(seen)
    assert seen["uids"] == {JOB_USER}
    assert {os.stat(p).st_uid for p in (folder / "run").rglob("*")} == {JOB_USER}


def test_without_user_namespaces_an_ordinary_users_run_is_refused(tmp_path, job_files):
    """No namespace to be had: one line naming the fix and the option that accepts the risk,
    exit 1, nothing started; with --open-ports the run goes ahead, saying so."""
    if skip_reason():
        pytest.skip(skip_reason())
    folder, job = job_files(owner=JOB_USER)
    env = {**os.environ, "HOME": str(folder), "TFSYNC_HOME": str(folder / ".tfsync")}
    run = [sys.executable, "-m", "tfsync.cli", "run", str(job), "--json", "--data", str(folder / "data.npz")]
    refused = subprocess.run(as_user(JOB_USER, run, mode="block-userns"), capture_output=True, text=True,
                             timeout=120, env=env, cwd=folder)
    assert refused.returncode == 1, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfsync: error: no private network for the task ports"), lines
    assert "unprivileged_userns_clone=1" in lines[0] and "--open-ports" in lines[0]
    assert not (folder / "run").exists()
    short = job.read_text().replace("epochs = 200.0", "epochs = 0.05")
    job.write_text(short)
    accepted = subprocess.run(as_user(JOB_USER, [*run, "--open-ports"], mode="block-userns"), capture_output=True,
                              text=True, timeout=300, env=env, cwd=folder)
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    assert "TF task ports open to every local user" in accepted.stderr
    assert "every interface, unprotected" in json.dumps(json.loads(accepted.stdout)["task_ports"])


def test_a_program_whose_cluster_cannot_be_guarded_is_refused(tmp_path):
    """The Python API in a process of its own network-less kind (no nft: the namespace's
    link cannot be guarded): refused in one line naming `tfsync isolate`; accepted with
    TFSYNC_OPEN_PORTS=1; inside `tfsync isolate` the cluster is on the private loopback."""
    if skip_reason():
        pytest.skip(skip_reason())
    env = hide_nft(tmp_path)
    code = ("from tfsync.engine.cluster import LocalCluster\n"
            "from tfsync.base.exits import TfsyncError\n"
            "try:\n    c = LocalCluster(workers=1)\nexcept TfsyncError as e:\n    print('refused:', e)\n"
            "else:\n    print('spec:', c.spec['ps'][0])\n")
    refused = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert refused.stdout.startswith("refused: this process cannot keep a local cluster's task ports private"), \
        refused.stdout + refused.stderr
    assert "tfsync isolate -- python" in refused.stdout and "TFSYNC_OPEN_PORTS=1" in refused.stdout
    accepted = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                              env={**env, "TFSYNC_OPEN_PORTS": "1"})
    assert accepted.stdout.startswith("spec:"), accepted.stdout + accepted.stderr
    isolated = subprocess.run([sys.executable, "-m", "tfsync.cli", "isolate", "--", sys.executable, "-c", code],
                              capture_output=True, text=True, timeout=60, env=env)
    assert isolated.stdout == "spec: 127.0.0.1:" + isolated.stdout.rsplit(":", 1)[-1], isolated.stdout + isolated.stderr


def test_a_hook_in_the_runs_own_network_raises_no_alarm(caplog, monkeypatch):
    """The run's own hook reports its tasks' ports as a private network's: no warning that
    they are open (a `tfsync run` printed one for every local run)."""
    from tfsync.base import isolation, netns
    from tfsync.engine import launcher

    monkeypatch.setattr(isolation, "active", lambda: True)
    launcher._warn_open("127.0.0.1:1", netns.describe(None))
    assert "listen on" not in caplog.text
    launcher._warn_open("127.0.0.1:2", "every interface, unprotected: no firewall")
    assert "127.0.0.1:2 listen on every interface" in caplog.text
