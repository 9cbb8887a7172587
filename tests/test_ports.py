"""Free ports for TF tasks: distinct, free, and never one this process handed out lately."""

import socket

import pytest

from tfsync.base import ports

pytestmark = pytest.mark.unit


def test_ports_are_distinct_and_free_to_bind():
    chosen = ports.free_ports(5)
    assert len(set(chosen)) == 5
    for port in chosen:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_handed_out_before_is_not_handed_out_again_when_the_kernel_offers_it(monkeypatch):
    """A restarted generation must not get the previous generation's port (a connection
    still open to the old task would reach the new one). The kernel's choice is played
    by a fake socket here: it offers a port again, as a real kernel may after a release."""
    offers = iter([41001, 41002, 41001, 41002, 41003, 41004])

    class Offered:
        def __init__(self, *args):
            self.port = None

        def bind(self, address):
            self.port = next(offers)

        def getsockname(self):
            return ("127.0.0.1", self.port)

        def close(self):
            pass

    monkeypatch.setattr(ports, "_recent", ports.collections.deque(maxlen=ports.REMEMBERED))
    monkeypatch.setattr(ports.socket, "socket", Offered)
    assert ports.free_ports(2) == [41001, 41002]
    assert ports.free_ports(2) == [41003, 41004]
