"""tfsync.engine.cut: the coordinator shuts down its own connections to tasks behind a
partition (TF would wait on them without end), and bounds how long TF redials them."""

import socket

import pytest

pytestmark = pytest.mark.unit

from tfsync.engine import cut


@pytest.fixture
def servers():
    made = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::")):
        s = socket.socket(family)
        s.bind((host, 0))
        s.listen()
        made.append(s)
    yield made
    for s in made:
        s.close()


def test_cut_ends_this_process_connections_to_the_lost_address_only(servers):
    v4, v6 = servers
    lost = socket.create_connection(("127.0.0.1", v4.getsockname()[1]))
    mapped = socket.socket(socket.AF_INET6)   # as gRPC dials: an IPv6 socket, an IPv4-mapped peer
    mapped.connect(("::ffff:127.0.0.1", v6.getsockname()[1]))
    kept = socket.create_connection(("::1", v6.getsockname()[1]))
    accepted = [v6.accept()[0] for _ in range(2)]
    peer_kept = next(a for a in accepted if a.getpeername()[1] == kept.getsockname()[1])
    with lost, mapped, kept, peer_kept:
        assert cut.cut([f"127.0.0.1:{v4.getsockname()[1]}", f"127.0.0.1:{v6.getsockname()[1]}"]) == 2
        lost.settimeout(1)
        mapped.settimeout(1)
        assert lost.recv(1) == b"" and mapped.recv(1) == b""   # shut down: end of stream at once
        kept.sendall(b"x")                                      # the connection to ::1 is another peer
        assert peer_kept.recv(1) == b"x"
    assert cut.cut([]) == 0 and cut.cut(["127.0.0.1:9"]) == 0


def test_redials_are_bounded_and_a_users_grpc_options_are_kept(monkeypatch):
    monkeypatch.delenv("TF_GRPC_DEFAULT_OPTIONS", raising=False)
    cut.bound_redials()
    assert cut.os.environ["TF_GRPC_DEFAULT_OPTIONS"] == f"grpc.min_reconnect_backoff_ms={cut.CONNECT_TIMEOUT_MS}"
    monkeypatch.setenv("TF_GRPC_DEFAULT_OPTIONS", "grpc.keepalive_time_ms=60000")
    cut.bound_redials()
    assert cut.os.environ["TF_GRPC_DEFAULT_OPTIONS"] == \
        f"grpc.keepalive_time_ms=60000,grpc.min_reconnect_backoff_ms={cut.CONNECT_TIMEOUT_MS}"
    monkeypatch.setenv("TF_GRPC_DEFAULT_OPTIONS", "grpc.min_reconnect_backoff_ms=1000")
    cut.bound_redials()
    assert cut.os.environ["TF_GRPC_DEFAULT_OPTIONS"] == "grpc.min_reconnect_backoff_ms=1000"
