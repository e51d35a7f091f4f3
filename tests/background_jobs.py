"""Background jobs of the test suite (the ``background`` marker, tests/conftest.py).

Why: one long, independent command (the known-skill model's retraining) should run on the CPU
the suite leaves idle instead of adding its minutes to the suite's. The command starts right
after collection and its test, which runs last, only waits for it.

Under pytest-xdist every worker collects every test, so the first process to get here starts the
job (a ``mkdir`` decides, atomically) and any worker may run the test that waits: the job cannot
belong to one worker (a worker leaves when its own share is done). So the job is run by a small
runner (this file, run as a script) in a session of its own: it starts the command at the given
priority in its own process group, writes ``stdout``, ``stderr`` and, last, ``rc`` into the job's
folder, and kills the command when the session's owner (pytest, or the xdist controller) is gone.
The owner stops every job still running when the session ends (``stop_all``).
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import List, Optional, Tuple

from reform_eval.utils.runlock import pid_alive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def job_dir(root: str, args: Tuple[str, ...]) -> str:
    """The folder of the job for these marker arguments under the session's jobs folder."""
    return os.path.join(root, hashlib.sha256(json.dumps(list(args)).encode()).hexdigest()[:16])


def start(root: str, args: Tuple[str, ...], owner: int, nice: int = 19) -> bool:
    """Start the job unless another process of this session did; True when this one did.
    ``nice``: its niceness (19: it takes only the CPU the suite leaves idle)."""
    where = job_dir(root, args)
    try:
        os.mkdir(where)
    except FileExistsError:
        return False
    work = os.path.join(where, "work")
    os.mkdir(work)
    with open(os.path.join(where, "cmd.json"), "w", encoding="utf-8") as f:
        json.dump([a.replace("{tmp}", work) for a in args], f)
    subprocess.Popen([sys.executable, os.path.abspath(__file__), where, str(owner), str(nice)], cwd=ROOT,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    return True


def wait(root: str, args: Tuple[str, ...], timeout: float) -> Tuple[int, str, str, str]:
    """(return code, stdout, stderr, work folder) of the job, waiting for it to end."""
    where = job_dir(root, args)
    deadline = time.monotonic() + timeout
    rc_file = os.path.join(where, "rc")
    while not os.path.exists(rc_file):
        if time.monotonic() > deadline:
            raise TimeoutError(f"background job {list(args)} still running after {timeout:.0f} s")
        time.sleep(0.5)
    with open(rc_file, encoding="utf-8") as f:
        rc = int(f.read())
    texts = []
    for name in ("stdout", "stderr"):
        with open(os.path.join(where, name), encoding="utf-8", errors="replace") as f:
            texts.append(f.read())
    return rc, texts[0], texts[1], os.path.join(where, "work")


def stop_all(root: str) -> None:
    """Kill every job of the session still running (its process group) and its runner."""
    if not os.path.isdir(root):
        return
    for name in os.listdir(root):
        for pid_file in ("job.pgid", "runner.pid"):
            path = os.path.join(root, name, pid_file)
            try:
                with open(path, encoding="utf-8") as f:
                    pid = int(f.read())
                os.killpg(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def run(where: str, owner: int, nice: int = 19) -> int:
    """The runner: the job's command, its outputs and exit code; killed with the owner."""
    _write(os.path.join(where, "runner.pid"), str(os.getpgid(0)))
    with open(os.path.join(where, "cmd.json"), encoding="utf-8") as f:
        cmd: List[str] = json.load(f)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rc: Optional[int] = None
    with open(os.path.join(where, "stdout"), "w") as out, open(os.path.join(where, "stderr"), "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                start_new_session=True, preexec_fn=lambda: os.nice(nice))
        _write(os.path.join(where, "job.pgid"), str(proc.pid))
        while rc is None:
            try:
                rc = proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                if not pid_alive(owner):
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return 1
    _write(os.path.join(where, "rc"), str(rc))
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
