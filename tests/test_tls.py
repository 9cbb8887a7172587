"""TLS end to end: every TLS mistake is one line saying what is wrong, and a job submitted to a
manager that serves TLS only runs with the CLI, the manager, its coordinator and the node
hook all speaking TLS (issue 14, item 3)."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from helpers import DATA, interrupt, linear_job, tfsync, wait_for
from tfsync.api import auth, transport
from tfsync.cli.jobrun import hook_nodes
from tfsync.base.ports import free_ports
from tfsync.engine.launcher import HookLauncher, LaunchError
from tfsync.hooks.node import serve as serve_hook
from tfsync.job.config import JobConfig, load_job
from tfsync.job.errors import ConfigError
from tfsync.manager.store import Store

JOB = linear_job("ctl", "bsp", batch_size=16, epochs=1, checkpoint_every=0)


def make_cert(folder, name="server"):
    """A self-signed certificate and its key for localhost and 127.0.0.1 (PEM files)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("TLS tests need the openssl binary")
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=30)
    return str(cert), str(key)


def error_line(result) -> str:
    """The CLI's one-line error (``tfsync: error: ...``), checked to be the whole of stderr."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfsync: error: "), result.stderr
    return lines[0]


# -- servers: each TLS file mistake is named, before any port is bound ----------------------------

@pytest.mark.unit
@pytest.mark.parametrize("case, match", [
    ("no key", r"needs a private key \(--tls-key\)"),
    ("no cert", r"needs a certificate \(--tls-cert\)"),
    ("missing cert", r"cannot read TLS cert_file .*missing\.pem.*No such file"),
    ("unreadable key", r"cannot read TLS key_file .*server\.key"),
    ("cert not PEM", r"cert_file .*junk\.pem.* holds no PEM certificate"),
    ("key not PEM", r"key_file .*junk\.pem.* is not an unencrypted PEM private key"),
    ("key of another cert", r"key_file .*other\.key.* does not match cert_file .*server\.pem"),
    ("key others can read", r"key_file .*server\.key.* has mode 0644: group or others can read it.*chmod 600"),
])
def test_server_tls_mistakes_are_named_not_a_port_in_use(tmp_path, case, match):
    cert, key = make_cert(tmp_path)
    _, other_key = make_cert(tmp_path, "other")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a PEM file\n")
    junk.chmod(0o600)  # read as a key too: a key others can read is refused before it is parsed
    files = {"no key": (cert, None), "no cert": (None, key), "missing cert": (str(tmp_path / "missing.pem"), key),
             "unreadable key": (cert, key), "cert not PEM": (str(junk), key), "key not PEM": (cert, str(junk)),
             "key of another cert": (cert, other_key), "key others can read": (cert, key)}[case]
    if case == "key others can read":   # as a token file others can read is; the certificate stays 0644
        os.chmod(key, 0o644)
    if case == "unreadable key":
        if os.geteuid() == 0:
            os.unlink(key)  # root reads any file: a missing one stands for it
        else:
            os.chmod(key, 0)
    port = free_ports(1)[0]
    with pytest.raises(transport.TransportError, match=match) as e:
        transport.make_server(f"127.0.0.1:{port}", token="t", tls=transport.TlsConfig(*files))
    assert "port may be in use" not in str(e.value) and "\n" not in str(e.value)
    server, bound = transport.make_server(f"127.0.0.1:{port}", token="t")  # the port was never taken
    assert bound == port
    server.stop(None)


@pytest.mark.unit
def test_manager_with_a_mismatched_key_exits_2_with_one_line(tmp_path):
    cert, _ = make_cert(tmp_path)
    _, other_key = make_cert(tmp_path, "other")
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    r = tfsync("manager", "--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", other_key, env=env)
    assert r.returncode == 2 and "does not match" in error_line(r)


# -- clients: the CA file, and a TLS mismatch named as the likely cause ----------------------------

@pytest.mark.unit
def test_ca_file_unreadable_or_not_pem_is_one_line(tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("-----BEGIN NOTHING-----\n")
    for ca, match in ((str(tmp_path / "nope.pem"), r"cannot read TLS ca_file .*nope\.pem"),
                      (str(junk), r"ca_file .*junk\.pem.* holds no PEM certificate"),
                      (None, r"needs a CA certificate \(--ca\)")):
        with pytest.raises(transport.TransportError, match=match):
            transport.make_channel("127.0.0.1:1", token="t", tls=transport.TlsConfig(ca_file=ca))
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    auth.write_token(tmp_path / "home" / "manager.token")
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(run_dir=tmp_path / "run"))
    r = tfsync("submit", str(job), "--manager", "127.0.0.1:1", "--ca", str(junk), env=env)
    assert r.returncode == 2 and "holds no PEM certificate" in error_line(r)


@pytest.fixture
def tls_and_plain_servers(tmp_path):
    cert, key = make_cert(tmp_path)
    tls_server, tls_port = transport.make_server(token="t", tls=transport.TlsConfig(cert, key))
    plain_server, plain_port = transport.make_server(token="t")
    tls_server.start()
    plain_server.start()
    yield cert, f"127.0.0.1:{tls_port}", f"127.0.0.1:{plain_port}"
    tls_server.stop(None)
    plain_server.stop(None)


@pytest.mark.unit
def test_a_tls_mismatch_is_named_as_the_likely_cause(tmp_path, tls_and_plain_servers):
    cert, tls_address, plain_address = tls_and_plain_servers
    wrong_ca, _ = make_cert(tmp_path, "other")
    cases = [(tls_address, None, r"serves TLS and this client spoke plaintext.*pass --ca"),
             (tls_address, transport.TlsConfig(ca_file=wrong_ca), r"TLS certificate was refused.*check --ca"),
             (tls_address, transport.TlsConfig(ca_file=cert, server_name="elsewhere"),
              r"TLS certificate was refused.*elsewhere.*--server-name"),
             (plain_address, transport.TlsConfig(ca_file=cert), r"uses TLS \(--ca\) and the server does not")]
    for target, tls, match in cases:
        channel = transport.make_channel(target, token="t", tls=tls)
        with pytest.raises(transport.TransportError, match=match):
            transport.wait_ready(channel, 1.0, "the manager", target=target, tls=tls)
        channel.close()
    channel = transport.make_channel(tls_address, token="t", tls=transport.TlsConfig(ca_file=cert))
    transport.wait_ready(channel, 10.0, "the manager", target=tls_address)  # the right CA connects
    channel.close()


@pytest.mark.unit
def test_status_of_a_job_whose_manager_serves_tls_needs_ca(tmp_path, tls_and_plain_servers):
    """manager.json records that the job's manager serves TLS: one line saying to pass --ca,
    not a plaintext connection that times out."""
    cert, tls_address, _ = tls_and_plain_servers
    control = tmp_path / "run" / "control"
    control.mkdir(parents=True)
    auth.write_token(control / "token")
    (control / "manager.json").write_text(json.dumps({"address": tls_address, "job_id": "j1", "run_id": 1,
                                                      "tls": True, "ca": cert}))
    env = {k: v for k, v in os.environ.items() if k != "TFSYNC_CA"}
    r = tfsync("status", str(tmp_path / "run"), env=env)   # (a client that waits for ever: the call's timeout)
    assert r.returncode == 2 and re.search(r"serves TLS: pass --ca PATH .*TFSYNC_CA", error_line(r))


# -- coordinator <-> hooks: job-file settings ------------------------------------------------------

@pytest.mark.unit
def test_job_file_tls_settings_for_hooks(tmp_path):
    job = tmp_path / "job.toml"
    base = '[cluster]\nhooks = ["127.0.0.1:7070"]\ntoken_file = "hooks.token"\n'
    job.write_text(base + 'tls_ca = "certs/ca.pem"\ntls_server_name = "node1.example"\n')
    cfg = load_job(job)  # the CA path is relative to the job file
    assert cfg.cluster.tls_ca == str(tmp_path / "certs" / "ca.pem")
    assert cfg.cluster.tls_server_name == "node1.example"
    assert JobConfig.from_dict(cfg.to_dict()).cluster == cfg.cluster  # as the manager receives it
    for text, field in ((base + "tls_ca = 3\n", "cluster.tls_ca"),
                        (base + 'tls_server_name = "a b"\ntls_ca = "ca.pem"\n', "cluster.tls_server_name"),
                        (base + 'tls_server_name = "node1"\n', "cluster.tls_server_name"),
                        ('[cluster]\ntls_ca = "ca.pem"\n', "cluster.tls_ca")):
        job.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_job(job)
        assert e.value.field == field and field in str(e.value) and "\n" not in str(e.value)
    auth.write_token(tmp_path / "hooks.token")
    cfg = JobConfig.from_dict({"cluster": {"hooks": ["127.0.0.1:7070"], "token_file": str(tmp_path / "hooks.token"),
                                           "tls_ca": str(tmp_path / "missing.pem")}})
    with pytest.raises(ConfigError, match=r"cluster\.tls_ca: cannot read TLS ca_file"):
        hook_nodes(cfg)


@pytest.mark.unit
def test_hooks_over_tls_with_the_job_files_ca(tmp_path):
    cert, key = make_cert(tmp_path)
    token = auth.new_token()
    hook, port = serve_hook(token=token, tls=transport.TlsConfig(cert, key), log_dir=str(tmp_path / "logs"))
    try:
        auth.write_token(tmp_path / "hooks.token", token)
        cfg = JobConfig.from_dict({"cluster": {"hooks": [f"127.0.0.1:{port}"], "token_file": str(tmp_path / "hooks.token"),
                                               "tls_ca": cert}})
        nodes = hook_nodes(cfg)
        assert nodes.tls == transport.TlsConfig(ca_file=cert)
        launcher = HookLauncher(nodes.hooks, tls=nodes.tls)
        assert len(launcher.check_hooks()) == 1
        launcher.close()
        plain = HookLauncher(nodes.hooks)
        with pytest.raises(LaunchError, match=r"serves TLS and this client spoke plaintext.*cluster\.tls_ca"):
            plain.check_hooks()
        plain.close()
    finally:
        hook.stop()


# -- a submitted job over TLS only ----------------------------------------------------------------

def _start(cmd, out, env, ready):
    """A tfsync process writing to ``out``; returns it and the line that says it is ready."""
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "tfsync.cli", *cmd], stdout=f, stderr=subprocess.STDOUT,
                                env=env)
    line = wait_for(out.name, lambda: proc.poll() is not None or next(
        (x for x in out.read_text().splitlines() if ready in x), None), timeout=60)
    assert proc.poll() is None, out.read_text()
    return proc, line


@pytest.mark.cluster
def test_a_submitted_job_runs_over_tls_only(tmp_path):
    cert, key = make_cert(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "TFSYNC_CA"}
    env["TFSYNC_HOME"] = str(tmp_path / "home")
    token_file = tmp_path / "hooks.token"
    auth.write_token(token_file)
    procs = []
    try:
        hook_port = free_ports(1)[0]
        procs.append(_start(["hook", "--listen", f"127.0.0.1:{hook_port}", "--token-file", str(token_file),
                             "--log-dir", str(tmp_path / "node"), "--tls-cert", cert, "--tls-key", key],
                            tmp_path / "hook.out", env, "listening")[0])
        manager, line = _start(["manager", "--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key],
                               tmp_path / "manager.out", env, "listening on")
        procs.append(manager)
        address = re.search(r"listening on (\S+)", line).group(1)
        job = tmp_path / "job.toml"  # tasks on the TLS hook; its CA named relative to the job file
        job.write_text((JOB + f'[cluster]\nhooks = ["127.0.0.1:{hook_port}"]\ntoken_file = "{token_file}"\n'
                                    f'tls_ca = "{os.path.basename(cert)}"\n').format(run_dir=tmp_path / "run"))

        r = tfsync("submit", str(job), "--manager", address, "--data", DATA, "--ca", cert, "--json", env=env)
        assert r.returncode == 0, r.stderr
        job_id = json.loads(r.stdout)["job_id"]

        def status(*extra):
            s = tfsync("status", str(job), "--json", *extra, env=env)
            return json.loads(s.stdout) if s.returncode == 0 else None

        running = wait_for("steps over TLS", lambda: (s := status("--ca", cert)) and int(s.get("step", 0)) > 0 and s,
                           timeout=150)
        assert running["job_id"] == job_id
        plain = tfsync("status", str(job), env=env)  # no --ca: one line that says to pass it
        assert plain.returncode == 2 and "pass --ca" in error_line(plain)
        with Store(str(tmp_path / "home" / "jobs.db")) as store:
            wait_for("the job to finish", lambda: store.job(job_id).state not in ("submitted", "running"),
                     timeout=300)
            assert store.job(job_id).state == "done", (tmp_path / "home" / "jobs" / job_id / "coordinator.log").read_text()
            (run,) = store.runs(job_id)
            assert store.results(run.id)["samples"] >= 6000  # the whole workload
        assert os.listdir(tmp_path / "node")  # the tasks ran on the TLS hook (their logs)
    finally:
        for p in reversed(procs):
            interrupt(p)
