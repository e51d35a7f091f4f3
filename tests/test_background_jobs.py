"""The suite's background jobs (tests/background_jobs.py): started once per session whatever
the number of processes that collect, waited for from any of them, killed with the session's
owner, and stopped at the session's end."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests import background_jobs


def _gone(pgid: int, within: float = 60.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_a_job_starts_once_and_any_process_reads_its_result(tmp_path):
    args = (sys.executable, "-c", "import os, sys; print(sorted(os.listdir(sys.argv[1]))); print('x', file=sys.stderr)",
            "{tmp}")
    assert background_jobs.start(str(tmp_path), args, os.getpid()) is True
    assert background_jobs.start(str(tmp_path), args, os.getpid()) is False  # a second collector: no second job
    rc, out, err, work = background_jobs.wait(str(tmp_path), args, timeout=120)
    assert (rc, out, err) == (0, "[]\n", "x\n")
    assert work == os.path.join(background_jobs.job_dir(str(tmp_path), args), "work")


def _started_group(tmp_path, args) -> int:
    """The process group of a started job, once it has written it (within 60 s)."""
    pgid_file = os.path.join(background_jobs.job_dir(str(tmp_path), args), "job.pgid")
    deadline = time.monotonic() + 60
    while not os.path.exists(pgid_file):
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.2)
    return int(open(pgid_file).read())


def test_a_job_dies_with_the_session_owner(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    args = (sys.executable, "-c", "import time; time.sleep(300)")
    try:
        background_jobs.start(str(tmp_path), args, owner.pid)
        pgid = _started_group(tmp_path, args)
        assert not _gone(pgid, within=0.5)
    finally:
        owner.kill()
        owner.wait()
    assert _gone(pgid), "the job outlived the session's owner"
    with pytest.raises(TimeoutError):
        background_jobs.wait(str(tmp_path), args, timeout=1)  # no result: it never finished


def test_stop_all_kills_what_still_runs(tmp_path):
    args = (sys.executable, "-c", "import time; time.sleep(300)")
    background_jobs.start(str(tmp_path), args, os.getpid())
    pgid = _started_group(tmp_path, args)
    background_jobs.stop_all(str(tmp_path))
    assert _gone(pgid)
