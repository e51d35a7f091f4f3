"""CPU threads of a rank that runs a model on the CPU: the cores it may use and that are idle.

Intra-op threads synchronise after every operation: a thread that shares its core with another
program makes every other thread wait for it, so two threads beside one busy program ran five to
seven times slower than one (issue 30; bench/threads.py). The default therefore counts the cores
this process may use (its affinity, not the machine's count) that are idle *now*, measured over a
short window of the kernel's per-CPU counters, and shares them among the node's ranks.
"""
from __future__ import annotations

import os
import re
import time
from typing import Callable, Dict, List, Optional, Tuple

from .errors import ReformError

#: how long the idle cores are measured (once per rank, before the model loads)
WINDOW_S = 0.25


def usable_cpus() -> List[int]:
    """The CPUs this process may run on (taskset's or a cpuset's limit, not the machine's)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def cpu_quota(root: str = "/sys/fs/cgroup") -> Optional[int]:
    """The CPUs a container's quota allows (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us``), rounded up; None without a quota. Affinity still lists every host
    CPU in such a container, and /proc/stat shows the host's idle cores."""
    import math

    def read(name: str) -> Optional[str]:
        try:
            with open(os.path.join(root, name), encoding="ascii") as f:
                return f.read().strip()
        except (OSError, ValueError):
            return None

    v2 = read("cpu.max")
    if v2:
        quota, _, period = v2.partition(" ")
        if quota != "max" and quota.isdigit() and period.isdigit() and int(period) > 0:
            return max(1, math.ceil(int(quota) / int(period)))
        return None
    quota_v1, period_v1 = read("cpu/cpu.cfs_quota_us") or read("cpu.cfs_quota_us"), \
        read("cpu/cpu.cfs_period_us") or read("cpu.cfs_period_us")
    if quota_v1 and period_v1 and quota_v1.isdigit() and period_v1.isdigit() and int(period_v1) > 0:
        return max(1, math.ceil(int(quota_v1) / int(period_v1)))
    return None


def _whole(name: str) -> Optional[int]:
    """An environment variable that must be a whole number >= 1 (digits only), else None."""
    value = os.environ.get(name, "")
    return int(value) if re.fullmatch(r"[0-9]+", value) and int(value) >= 1 else None


def read_cpu_times(path: str = "/proc/stat") -> Dict[int, Tuple[int, int]]:
    """cpu index -> (idle ticks, total ticks) from the kernel's counters; {} where unreadable."""
    out: Dict[int, Tuple[int, int]] = {}
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                name, *fields = line.split()
                if not (name.startswith("cpu") and name[3:].isdigit()):
                    continue
                ticks = [int(x) for x in fields[:8]]
                idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
                out[int(name[3:])] = (idle, sum(ticks))
    except (OSError, ValueError):
        return {}
    return out


def idle_cpus(cpus: List[int], window_s: float = WINDOW_S,
              read: Callable[[], Dict[int, Tuple[int, int]]] = read_cpu_times,
              sleep: Callable[[float], None] = time.sleep) -> Optional[float]:
    """How many of ``cpus`` were idle over ``window_s`` (0.0 .. len(cpus)); None where unknown."""
    before = read()
    sleep(window_s)
    after = read()
    idle = 0.0
    for c in cpus:
        if c not in before or c not in after:
            return None
        d_idle, d_total = after[c][0] - before[c][0], after[c][1] - before[c][1]
        if d_total <= 0:
            return None
        idle += min(1.0, max(0.0, d_idle / d_total))
    return idle


def cpu_threads(measure: Callable[[List[int]], Optional[float]] = idle_cpus) -> int:
    """Intra-op threads of this process: ``REFORM_CPU_THREADS`` when set; the user's
    ``OMP_NUM_THREADS`` when set (torchrun sets 1 per rank); else this node's share of the usable
    cores (affinity, capped by a container's CPU quota; ``LOCAL_WORLD_SIZE`` ranks), less the
    cores other programs keep busy, at least one."""
    value = os.environ.get("REFORM_CPU_THREADS")
    if value:
        if not re.fullmatch(r"[0-9]+", value) or int(value) < 1:
            raise ReformError(f"REFORM_CPU_THREADS must be a whole number >= 1, got {value!r}")
        return int(value)
    omp = _whole("OMP_NUM_THREADS")
    if omp is not None:
        return omp
    cpus = usable_cpus()
    ranks_here = _whole("LOCAL_WORLD_SIZE") or 1
    quota = cpu_quota()
    share = max(1, min(len(cpus), quota or len(cpus)) // ranks_here)
    if share == 1:
        return 1
    idle = measure(cpus)
    if idle is None:  # no counters (not Linux): the share, as torch would
        return share
    # the node's ranks are idle while they measure (before their models load): what is busy is
    # other work, and this rank's part of the idle cores is its share of them
    return max(1, min(share, int(idle / ranks_here + 0.5)))


def configure_cpu_threads() -> int:
    """Apply ``cpu_threads()`` to torch; returns the count."""
    import torch  # heavy: asked only by a family that runs on the CPU

    n = cpu_threads()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
