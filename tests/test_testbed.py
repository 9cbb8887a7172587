"""The testbed (tfsync.testbed): separate hosts on this machine as network namespaces on a
bridge, every connection through the latency relay, each node with a /tmp of its own.
A real job trains there with each task on its own node and no shared run directory.
Needs root and iproute2: skipped, saying why, without them."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tfsync.testbed import bed as testbed

REASON = testbed.unavailable_reason()
pytestmark = [pytest.mark.cluster, pytest.mark.skipif(REASON is not None, reason=f"no testbed here: {REASON}")]

ECHO = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(4); print("ready", flush=True)
    while True:
        c, _ = s.accept()
        while (d := c.recv(1)):
            c.sendall(d)
""")


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TFSYNC_HOME", str(tmp_path_factory.mktemp("home")))
    made = testbed.Testbed.up("test", nodes=3)
    try:
        yield made
    finally:
        made.down()
        mp.undo()
        assert not any(n.startswith(f"tfsb{made.slot}-") for n in os.listdir("/run/netns"))


def _rtt_ms(bed, host, port, tries=5) -> float:
    """The median round trip of one byte from the coordinator's node to host:port."""
    probe = ("import socket, sys, time\n"
             "c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
             "c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\nts = []\n"
             f"for _ in range({tries}):\n"
             "    t = time.perf_counter(); c.sendall(b'x'); c.recv(1); ts.append(time.perf_counter() - t)\n"
             "print(sorted(ts)[len(ts) // 2] * 1000)\n")
    out = subprocess.run(bed.command("c", [sys.executable, "-c", probe, host, str(port)]), capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return float(out.stdout)


def test_the_relay_adds_each_senders_latency_and_follows_changes_while_connections_run(bed, tmp_path):
    n1 = bed.node("n1")
    echo = tmp_path / "echo.py"
    echo.write_text(ECHO)
    server = subprocess.Popen(bed.command("n1", [sys.executable, str(echo), "20050"]), stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        base = _rtt_ms(bed, n1.advertised, 20050)
        assert base < 5, f"the relay alone costs {base:.2f} ms a round trip"
        bed.set("n1", latency_ms=30)          # replies from n1 wait 30 ms, requests from c none
        time.sleep(0.5)                       # the relay reads its config every 0.2 s
        slow = _rtt_ms(bed, n1.advertised, 20050)
        assert 30 <= slow < 30 + base + 15, slow
        bed.set("c", latency_ms=10)           # and now c's requests 10 ms
        time.sleep(0.5)
        assert 40 <= _rtt_ms(bed, n1.advertised, 20050) < 40 + base + 15
        bed.set("n1", up=False)               # a partition: nothing gets through
        with pytest.raises(AssertionError):
            _rtt_ms(bed, n1.advertised, 20050, tries=1)
    finally:
        bed.set("n1", latency_ms=0, up=True)
        bed.set("c", latency_ms=0)
        server.kill()
    with pytest.raises(testbed.TestbedInputError, match="no node 'n9'"):
        bed.set("n9", latency_ms=1)


def test_a_job_trains_with_each_task_on_its_own_node_and_no_shared_run_directory(bed, tmp_path):
    """PS on n1, workers on n2 and n3, the coordinator on c; the run directory is in this
    machine's /tmp, which no node sees: the hooks are sent the data (StageFile) and the
    coordinator writes the checkpoints. While it runs, n2's task port listens only in n2's
    namespace, whose only address is n2's."""
    run_dir = tmp_path / "run"
    job = tmp_path / "job.toml"
    job.write_text(textwrap.dedent(f"""
        [job]
        name = "testbed"
        run_dir = "{run_dir}"
        [data]
        name = "mnist"
        [model]
        name = "mlp"
        [train]
        epochs = 0.1
        checkpoint_every = 40
        [[protocol]]
        name = "bsp"
        """) + bed.cluster_toml() + "workers = 2\n")
    coordinator = subprocess.Popen(bed.command("c", [sys.executable, "-m", "tfsync.cli", "run", str(job),
                                                     "--no-report"]),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    listening, addresses = [], ""
    try:
        deadline = time.monotonic() + 120
        while not listening and time.monotonic() < deadline and coordinator.poll() is None:
            ss = subprocess.run(bed.command("n2", ["ss", "-Hltn"]), capture_output=True, text=True).stdout
            listening = [line.split()[3] for line in ss.splitlines() if ":200" in line.split()[3]]
            time.sleep(0.2)
        addresses = subprocess.run(bed.command("n2", ["ip", "-o", "-4", "addr"]), capture_output=True,
                                   text=True).stdout
        out, _ = coordinator.communicate(timeout=300)
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
    assert coordinator.returncode == 0, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.8
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.endswith(".index"))
    # the task port of n2 was open, in n2's namespace, whose only IPv4 addresses are lo's and n2's
    assert listening, "no task port seen listening on n2"
    assert sorted(line.split()[3] for line in addresses.splitlines()) == ["127.0.0.1/8",
                                                                           f"{bed.node('n2').address}/24"]
    # each worker node holds its own checked copy of the data; it never saw the run directory
    hook_root = f"/proc/{bed.node('n2').pid}/root"
    staged = [os.path.join(d, f) for d, _, fs in os.walk(f"{hook_root}/tmp/tfsync-hook/stage") for f in fs]
    assert sorted(os.path.basename(p) for p in staged) == ["train_x.bin", "train_y.bin"]
    for path in staged:
        with open(path, "rb") as a, open(run_dir / "data" / os.path.basename(path), "rb") as b:
            assert a.read() == b.read()
    assert not os.path.exists(f"{hook_root}{run_dir}")
