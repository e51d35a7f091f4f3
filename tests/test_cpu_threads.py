"""The default CPU thread count: the usable cores that are idle, shared among the node's ranks
(utils/cpu_threads.py). Decided on recorded kernel counters, never on this machine's load."""
from __future__ import annotations

import pytest

from reform_eval.utils import cpu_threads as ct
from reform_eval.utils.errors import ReformError


def _counters(*snapshots):
    """read() returning the given per-CPU (idle, total) snapshots in turn."""
    it = iter(snapshots)
    return lambda: next(it)


@pytest.fixture
def env(monkeypatch):
    for name in ("REFORM_CPU_THREADS", "OMP_NUM_THREADS", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(ct, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(ct, "cpu_quota", lambda: None)
    return monkeypatch


def test_idle_cpus_counts_each_usable_cores_idle_share():
    before = {0: (100, 1000), 1: (100, 1000), 2: (0, 1000)}
    after = {0: (200, 1100), 1: (110, 1100), 2: (0, 1100)}  # cpu0 idle, cpu1 busy (10%), cpu2 not ours
    got = ct.idle_cpus([0, 1], read=_counters(before, after), sleep=lambda s: None)
    assert got == pytest.approx(1.1)
    assert ct.idle_cpus([0, 3], read=_counters(before, after), sleep=lambda s: None) is None


def test_read_cpu_times_parses_the_kernels_lines(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  9 9 9 9 9 0 0 0 0 0\ncpu0 10 0 5 80 5 0 0 0 0 0\ncpu1 50 0 0 50 0 0 0 0\nintr 1 2\n")
    assert ct.read_cpu_times(str(stat)) == {0: (85, 100), 1: (50, 100)}
    assert ct.read_cpu_times(str(tmp_path / "missing")) == {}


@pytest.mark.parametrize("idle,ranks,want", [(2.0, 1, 2), (1.9, 1, 2), (1.0, 1, 1), (1.2, 1, 1), (0.1, 1, 1),
                                             (None, 1, 2), (2.0, 2, 1)])
def test_the_default_is_the_idle_share_of_the_usable_cores(env, idle, ranks, want):
    """Quiet: every usable core; one busy core beside the run (a hog): one thread less."""
    env.setenv("LOCAL_WORLD_SIZE", str(ranks))
    assert ct.cpu_threads(measure=lambda cpus: idle) == want


def test_four_cores_two_ranks_one_busy(env):
    env.setattr(ct, "usable_cpus", lambda: [0, 1, 2, 3])
    env.setenv("LOCAL_WORLD_SIZE", "2")
    assert ct.cpu_threads(measure=lambda cpus: 3.0) == 2  # share 2, 1.5 idle each -> 2
    assert ct.cpu_threads(measure=lambda cpus: 2.0) == 1


def test_the_users_settings_win_and_are_checked(env):
    env.setenv("OMP_NUM_THREADS", "3")
    assert ct.cpu_threads(measure=lambda cpus: 0.0) == 3
    env.setenv("REFORM_CPU_THREADS", "2")
    assert ct.cpu_threads(measure=lambda cpus: 0.0) == 2
    env.setenv("REFORM_CPU_THREADS", "two")
    with pytest.raises(ReformError, match="REFORM_CPU_THREADS must be a whole number"):
        ct.cpu_threads()


def test_one_usable_core_is_one_thread_without_measuring(env):
    env.setattr(ct, "usable_cpus", lambda: [3])
    assert ct.cpu_threads(measure=lambda cpus: pytest.fail("measured")) == 1


def test_a_containers_cpu_quota_caps_the_share(env):
    """A 2-CPU quota on a host whose 64 cores are idle: two threads, not 64 (affinity and
    /proc/stat both show the host)."""
    env.setattr(ct, "usable_cpus", lambda: list(range(64)))
    env.setattr(ct, "cpu_quota", lambda: 2)
    assert ct.cpu_threads(measure=lambda cpus: 64.0) == 2


def test_cpu_quota_reads_cgroup_v2_and_v1(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert ct.cpu_quota(str(v2)) == 2
    (v2 / "cpu.max").write_text("max 100000\n")
    assert ct.cpu_quota(str(v2)) is None
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert ct.cpu_quota(str(tmp_path / "v1")) == 3
    assert ct.cpu_quota(str(tmp_path / "none")) is None


@pytest.mark.parametrize("omp,lws,want", [("²", "1", 2), ("4,2", "1", 2), ("abc", "abc", 2), ("0", "x", 2)])
def test_odd_thread_variables_are_ignored_not_a_crash(env, omp, lws, want):
    env.setattr(ct, "cpu_quota", lambda: None)
    env.setenv("OMP_NUM_THREADS", omp)
    env.setenv("LOCAL_WORLD_SIZE", lws)
    assert ct.cpu_threads(measure=lambda cpus: 2.0) == want
