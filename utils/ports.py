"""A loopback port for a server that another process will bind: torchrun's rendezvous store,
``transformers serve``, ``vllm serve`` (tests and benches start them).

Why not the port a probe socket got from ``bind(0)``: the kernel hands such ports out of its
ephemeral range, and between closing the probe and the server binding the number (seconds: the
server first imports torch) any process may get the same number for its own ``bind(0)`` or
outgoing connection. CI failed that way: a two-node test's rendezvous store met a concurrent
two-rank run's gloo sockets on one port, and both runs died ("Failed to recv", SIGABRT). A port
below the ephemeral range is never handed out by the kernel; drawn at random among thousands
and checked free, two concurrent draws meet only by chance, and never a kernel-chosen socket.
"""
from __future__ import annotations

import random
import socket
from typing import Tuple

#: ports below the ephemeral range that well-known tools take by default (torchrun's 29500,
#: TensorBoard's 6006 is below the range searched anyway) or that docs/ snippets use
_TAKEN = frozenset({29500, 29533})
_LOWEST = 20000


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> Tuple[int, int]:
    """(first, last) port the kernel hands out by itself; Linux's default where unreadable."""
    try:
        with open(path, encoding="ascii") as f:
            first, last = (int(x) for x in f.read().split()[:2])
        if 0 < first <= last <= 65535:
            return first, last
    except (OSError, ValueError):
        pass
    return 32768, 60999


def unused_port(host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port on ``host`` that nothing holds now and the kernel never picks by itself."""
    first, last = ephemeral_range()
    spans = [(lo, hi) for lo, hi in ((_LOWEST, first - 1), (last + 1, 65535)) if hi - lo >= 1000]
    if not spans:  # an ephemeral range covering nearly everything: the whole range, checked
        spans = [(1024, 65535)]
    rng = random.SystemRandom()
    for _ in range(tries):
        lo, hi = rng.choice(spans)
        port = rng.randint(lo, hi)
        if port in _TAKEN:
            continue
        with socket.socket() as s:  # no SO_REUSEADDR: a port in TIME_WAIT counts as held
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    raise OSError(f"no free port on {host} after {tries} tries")
