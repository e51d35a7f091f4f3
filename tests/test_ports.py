"""reform_eval.utils.ports: a port for a server another process binds, never one the kernel hands out."""
from __future__ import annotations

import socket

import pytest

from reform_eval.utils import ports


def test_reads_the_kernels_range_and_falls_back(tmp_path):
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ports.ephemeral_range(str(f)) == (40000, 50000)
    f.write_text("garbage\n")
    assert ports.ephemeral_range(str(f)) == (32768, 60999)
    assert ports.ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)


def test_never_in_the_ephemeral_range_nor_a_well_known_port():
    first, last = ports.ephemeral_range()
    for _ in range(50):
        port = ports.unused_port()
        assert not first <= port <= last and port >= 1024 and port not in (29500, 29533)


def test_a_held_port_is_skipped(monkeypatch):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    free = ports.unused_port()
    draws = iter([taken, free])

    class Fixed:
        def choice(self, spans):
            return spans[0]

        def randint(self, lo, hi):
            return next(draws)

    monkeypatch.setattr(ports.random, "SystemRandom", Fixed)
    try:
        assert ports.unused_port() == free
    finally:
        held.close()


def test_gives_up_in_one_line(monkeypatch):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    taken = held.getsockname()[1]

    class Always:
        def choice(self, spans):
            return spans[0]

        def randint(self, lo, hi):
            return taken

    monkeypatch.setattr(ports.random, "SystemRandom", Always)
    try:
        with pytest.raises(OSError, match="no free port on 127.0.0.1 after 5 tries"):
            ports.unused_port(tries=5)
    finally:
        held.close()
