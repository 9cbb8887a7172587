"""The hook's firewall (tfsync.hooks.firewall): the nft text it builds, and, in a network
namespace of the test's own, that it lets the cluster's addresses reach a task port and
drops every other, and that its table goes with its tasks and with a dead hook.
The real half needs root, iproute2 and nftables: skipped, saying why, without them."""

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tfsync.hooks import firewall
from tfsync.hooks.firewall import Guard, ruleset

pytestmark = pytest.mark.unit

NS = f"tfsynctest-fw-{os.getpid()}"
REASON = firewall.unavailable_reason() or (None if shutil.which("ip") else "iproute2's `ip` is not installed")


def test_the_ruleset_drops_all_but_the_cluster_and_loopback_on_the_jobs_ports_only():
    text = ruleset("tfsync_hook_7070_42", [
        Guard("job-g1", (20001, 20000, 20001), ("198.18.1.11", "198.18.1.12", "fd00::7")),
        Guard("other", (20005,), ())])
    assert text == textwrap.dedent("""\
        table inet tfsync_hook_7070_42 {}
        delete table inet tfsync_hook_7070_42
        table inet tfsync_hook_7070_42 {
        \tchain input {
        \t\ttype filter hook input priority filter; policy accept;
        \t\ttcp dport { 20000, 20001 } ip saddr != { 127.0.0.0/8, 198.18.1.11/32, 198.18.1.12/32 } drop comment "job-g1"
        \t\ttcp dport { 20000, 20001 } ip6 saddr != { ::1/128, fd00::7/128 } drop comment "job-g1"
        \t\ttcp dport { 20005 } ip saddr != { 127.0.0.0/8 } drop comment "other"
        \t\ttcp dport { 20005 } ip6 saddr != { ::1/128 } drop comment "other"
        \t}
        }
        """)
    # no guard: the table is deleted (made first, so deleting never fails)
    assert ruleset("tfsync_hook_7070_42", []) == ("table inet tfsync_hook_7070_42 {}\n"
                                                  "delete table inet tfsync_hook_7070_42\n")
    # nothing from a request reaches nft's text unchecked
    for bad in [Guard("a b", (1,), ()), Guard("x", (0,), ()), Guard("x", (), ()),
                Guard("x", (1,), ("1.2.3.4; flush",)), Guard('x"', (1,), ())]:
        with pytest.raises(ValueError):
            ruleset("tfsync_hook_1_1", [bad])
    with pytest.raises(ValueError):
        ruleset("filter", [])


def test_without_root_or_nft_no_firewall_is_claimed(monkeypatch):
    monkeypatch.setenv("TFSYNC_NO_FIREWALL", "1")
    assert firewall.open_firewall(7070) == (None, "TFSYNC_NO_FIREWALL is set")
    monkeypatch.delenv("TFSYNC_NO_FIREWALL")
    monkeypatch.setattr(firewall.nft.shutil, "which", lambda name: None)
    if os.geteuid() == 0:
        assert firewall.open_firewall(7070) == (None, "`nft` is not installed (apt-get install nftables)")
    from tfsync.hooks.tasks import TaskSupervisor
    sup = TaskSupervisor("/nonexistent", open_reason="`nft` is not installed (apt-get install nftables)")
    assert sup.protection([]) == "every interface, unprotected: `nft` is not installed (apt-get install nftables)"


def test_a_hook_without_a_firewall_warns_when_a_task_listens_unprotected_not_before(tmp_path, caplog):
    """Issue 32 case 7: `tfsync run`'s own hook puts its tasks in a private namespace, so it
    raises no alarm at the start; a task started outside one without a firewall does, once."""
    from tfsync.hooks.tasks import TaskSupervisor
    from tfsync.base.ports import free_ports

    spec = json.dumps({"ps": [f"127.0.0.1:{p}" for p in free_ports(2)]})
    with caplog.at_level(logging.WARNING):
        sup = TaskSupervisor(str(tmp_path / "logs"), task_command=[sys.executable, "-c", "import time; time.sleep(30)"],
                             open_reason="`nft` is not installed", warn_open=True)
        assert not caplog.records
        try:
            for index in (0, 1):
                sup.start("job", spec, [("ps", index)], {})
        finally:
            sup.stop("job", [("ps", 0), ("ps", 1)])
    assert [r.getMessage() for r in caplog.records] == [
        "tfsync hook: TF task ports of this node listen on every interface, unprotected (no firewall): "
        "`nft` is not installed"]


# Run inside the test's namespace: a task port on every interface, the hook's firewall
# around it, connections from an allowed and a foreign address of the namespace.
IN_NS = textwrap.dedent("""
    import json, os, socket, subprocess, sys
    from tfsync.hooks import firewall
    from tfsync.hooks.firewall import Guard
    dead = int(sys.argv[1])
    def connects(source, port=23456):
        with socket.socket() as s:
            s.settimeout(0.5)
            s.bind((source, 0))
            return s.connect_ex(("198.18.254.1", port)) == 0
    def tables():
        return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    # a table of a hook that was killed, and one of a live hook (this test's parent)
    subprocess.run(["nft", "-f", "-"], check=True, text=True, input=
                   f"table inet tfsync_hook_9_{dead} {{}}\\ntable inet tfsync_hook_8_{os.getppid()} {{}}\\n")
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 23456)); srv.listen(8)
    out = {"before": [connects("198.18.254.1"), connects("198.18.254.2")]}
    fw, why = firewall.open_firewall(7070, allow=["198.18.254.3"])
    out["why"] = why
    out["stale"] = tables()
    fw.sync([Guard("job-g1", (23456,), ("198.18.254.1",))])
    out["guarded"] = [connects("198.18.254.1"), connects("198.18.254.2"), connects("198.18.254.3"),
                      connects("127.0.0.1")]
    fw.sync([])
    out["after"] = [connects("198.18.254.2"), fw.table in tables()]
    fw.sync([Guard("job-g1", (23456,), ("198.18.254.1",))])
    fw.close()
    out["closed"] = [connects("198.18.254.2"), fw.table in tables()]
    print(json.dumps(out))
""")


@pytest.mark.skipif(REASON is not None, reason=f"no firewall here: {REASON}")
def test_the_firewall_drops_foreign_sources_and_goes_with_its_tasks(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    script = tmp_path / "in_ns.py"
    script.write_text(IN_NS)
    try:
        subprocess.run(["ip", "netns", "add", NS], check=True)
        subprocess.run(["ip", "-n", NS, "link", "set", "lo", "up"], check=True)
        for a in ("198.18.254.1", "198.18.254.2", "198.18.254.3"):
            subprocess.run(["ip", "-n", NS, "addr", "add", f"{a}/32", "dev", "lo"], check=True)
        r = subprocess.run(["ip", "netns", "exec", NS, sys.executable, str(script), str(dead.pid)],
                           capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["why"] is None
    assert out["before"] == [True, True]
    assert f"tfsync_hook_9_{dead.pid}" not in out["stale"]          # a dead hook's table: removed
    assert f"tfsync_hook_8_{os.getpid()}" in out["stale"]           # a live hook's: kept
    # the cluster's address, an address the hook was told to allow, loopback: in; another: dropped
    assert out["guarded"] == [True, False, True, True]
    assert out["after"] == [True, False]                            # no tasks: no table
    assert out["closed"] == [True, False]                           # the hook exits: no table
