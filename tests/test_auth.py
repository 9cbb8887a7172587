"""Tokens and TLS of the control plane, on a real gRPC server on loopback."""

import logging
import os
import shutil
import stat
import subprocess

import grpc
import pytest

from tfsync.api import auth, transport
from tfsync.api.v1 import manager_pb2, manager_pb2_grpc

pytestmark = pytest.mark.unit


class _Manager(manager_pb2_grpc.ManagerServicer):
    def GetStatus(self, request, context):
        return manager_pb2.JobStatus(job_id=request.job_id, name="echo")

    def StreamMetrics(self, request, context):
        for step in range(3):
            yield manager_pb2.StepRecord(job_id=request.job_id, step=step)


def _serve(token, tls=None, listen="127.0.0.1:0"):
    server, port = transport.make_server(listen, token=token, tls=tls, max_workers=4)
    manager_pb2_grpc.add_ManagerServicer_to_server(_Manager(), server)
    server.start()
    return server, port


@pytest.fixture
def server():
    token = auth.new_token()
    srv, port = _serve(token)
    try:
        yield token, port
    finally:
        srv.stop(grace=None).wait(5)


def _status(channel, timeout=5.0):
    return manager_pb2_grpc.ManagerStub(channel).GetStatus(manager_pb2.GetStatusRequest(job_id="j1"), timeout=timeout)


def test_right_token_is_served(server):
    token, port = server
    with transport.make_channel(f"127.0.0.1:{port}", token=token) as ch:
        assert _status(ch).job_id == "j1"
        steps = [r.step for r in manager_pb2_grpc.ManagerStub(ch).StreamMetrics(
            manager_pb2.StreamMetricsRequest(job_id="j1"), timeout=5)]
    assert steps == [0, 1, 2]


def test_no_token_is_refused(server, caplog):
    _, port = server
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch, caplog.at_level(logging.WARNING, "tfsync.api.auth"):
        with pytest.raises(grpc.RpcError) as e:
            _status(ch)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "no token" in e.value.details()
    assert any("GetStatus" in r.getMessage() and "no token" in r.getMessage() for r in caplog.records)


def test_wrong_token_is_refused_and_logged_without_the_token(server, caplog):
    token, port = server
    wrong = auth.new_token()
    with transport.make_channel(f"127.0.0.1:{port}", token=wrong) as ch, \
            caplog.at_level(logging.WARNING, "tfsync.api.auth"):
        with pytest.raises(grpc.RpcError) as e:
            _status(ch)
        for _ in range(20):  # a flood of refused calls
            with pytest.raises(grpc.RpcError) as e_stream:
                list(manager_pb2_grpc.ManagerStub(ch).StreamMetrics(manager_pb2.StreamMetricsRequest(), timeout=5))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert e_stream.value.code() == grpc.StatusCode.UNAUTHENTICATED
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1, refusals  # one warning for the first; the rest held back (RefusalLog)
    assert "wrong token" in refusals[0] and "127.0.0.1" in refusals[0] and "GetStatus" in refusals[0]
    assert all(token not in m and wrong not in m for m in refusals)


def test_refusal_warnings_are_rate_limited_and_count_what_they_held_back(caplog):
    now = [100.0]
    log = auth.RefusalLog(interval=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "tfsync.api.auth"):
        for k in range(30):   # 3 s of refusals, one every 0.1 s
            log.refused("/m/Call", "ipv4:127.0.0.1:1", "wrong token")
            now[0] += 0.1
        now[0] += 10.0
        log.refused("/m/Call", "ipv4:127.0.0.1:1", "no token")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "29 more refused calls" in lines[1] and "no token" in lines[1]


def test_token_file_is_0600_and_round_trips(tmp_path):
    path = tmp_path / "jobs" / "j1" / "token"
    token = auth.write_token(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert auth.read_token(path) == token and len(token) >= 43
    os.chmod(path, 0o644)  # rewriting an existing, too-open file tightens it again
    other = auth.new_token()
    assert auth.write_token(path, other) == other and stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_group_or_world_readable_token_file_is_refused(tmp_path):
    path = tmp_path / "token"
    path.write_text("secret\n")
    os.chmod(path, 0o644)
    with pytest.raises(auth.TokenFileError, match=r"mode 0644.*chmod 600"):
        auth.read_token(path)
    with pytest.raises(auth.TokenFileError, match="does not exist"):
        auth.read_token(tmp_path / "missing")


def test_non_loopback_bind_must_be_explicit():
    with pytest.raises(transport.TransportError, match="allow_remote"):
        transport.make_server("0.0.0.0:0", token="t")


def _self_signed(tmp_path):
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("TLS test needs the openssl binary (the cryptography package is not installed)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=30)
    return str(cert), str(key)


def test_tls_with_token_works_and_plaintext_cannot_talk_to_it(tmp_path):
    cert, key = _self_signed(tmp_path)
    token = auth.new_token()
    srv, port = _serve(token, tls=transport.TlsConfig(cert_file=cert, key_file=key))
    try:
        client_tls = transport.TlsConfig(ca_file=cert, server_name="localhost")
        with transport.make_channel(f"127.0.0.1:{port}", token=token, tls=client_tls) as ch:
            assert _status(ch).name == "echo"
        with transport.make_channel(f"127.0.0.1:{port}", token=auth.new_token(), tls=client_tls) as ch:
            with pytest.raises(grpc.RpcError) as wrong:
                _status(ch)
        assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with transport.make_channel(f"127.0.0.1:{port}", token=token) as plain:
            with pytest.raises(grpc.RpcError) as e:
                _status(plain, timeout=3)
        assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        srv.stop(grace=None).wait(5)


@pytest.mark.parametrize("token, why", [("x", "1 characters, fewer than 22"),
                                        ("Secret123", "9 characters, fewer than 22"),
                                        ("ab" * 20, "repeats 2 characters")])
def test_a_weak_token_is_refused_in_one_line(tmp_path, token, why):
    """A token file a hook or manager would serve with must hold 128 random bits or more:
    a one-character or repeated token is refused naming the file and why."""
    path = tmp_path / "token"
    path.write_text(token + "\n")
    os.chmod(path, 0o600)
    with pytest.raises(auth.TokenFileError, match=why) as e:
        auth.read_token(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="at least 22"):
        auth.write_token(tmp_path / "other", token)
