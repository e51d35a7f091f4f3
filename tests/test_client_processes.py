"""The endpoint's window over several client processes (issue 24): what two processes record
is what one records, under the same run identity; a kill -9 of the run leaves no process behind
and loses at most the requests in flight; a failing process stops the others after their calls
in flight are recorded; SIGTERM stops every process with one line and the run resumes.

The runs are separate processes (the command line, as users start it): the client forks, and a
test process full of threads is no place to fork from."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import List

import pytest

from reform_eval.evaluation.client_processes import shares, split_by_group
from tests.conftest import prediction_files
from reform_eval.models.interfaces.openai_api_interface import OpenAIAPIInterface
from tests.test_request_window import ROOT, args, dataset, ok_body, question_of, saved, serve  # noqa: F401


def _run(argv: List[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "run_eval.py"), *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, **kw)


def _alive_with(text: str) -> List[int]:
    """PIDs of processes whose command line holds ``text`` (the run's output folder)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            found.append(int(pid))
    return found


def _files(out) -> List[str]:
    return sorted(f for f in os.listdir(out) if f.startswith("custom_") and f.count(".") == 1)


def _started_midway(serve, out, tmp_path):  # noqa: F811
    """(server, out, argv, process) of a 200-sample run in two client processes, 40 answered."""
    server = serve(lambda body, n: (0.1, 200, {}, ok_body()))
    argv = args(server, dataset(tmp_path, 200), out, "--model_option", "max_concurrency=8",
                "--model_option", "client_processes=2")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "run_eval.py"), *argv], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(server.answered) < 40 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    return server, out, argv, proc


def test_split_keeps_groups_whole_and_shares_differ_by_one():
    order = [0, 1, 2, 3, 4, 5, 6]
    group = {0: "a", 1: "a", 2: "b", 3: "c", 4: "b", 5: "d", 6: "a"}
    assert split_by_group(order, group.get, 2) == [[0, 1, 3, 6], [2, 4, 5]]
    assert split_by_group(order, group.get, 9) == [[0, 1, 6], [2, 4], [3], [5]]
    assert shares(32, 3) == [11, 11, 10] and shares(5, 2) == [3, 2]


def test_auto_takes_one_process_per_16_in_flight_and_never_under_a_budget(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(threading, "active_count", lambda: 1)

    def make(**options):
        return OpenAIAPIInterface({"model_name": "m", "base_url": "http://127.0.0.1:9/v1", **options})
    assert make(max_concurrency=32).client_processes(1000) == 2
    assert make(max_concurrency=256).client_processes(1000) == 4  # at most the cores
    assert make(max_concurrency=15).client_processes(1000) == 1
    assert make(max_concurrency=32).client_processes(63) == 1
    assert make(max_concurrency=64, max_total_tokens=10_000).client_processes(1000) == 1
    assert make(max_concurrency=4, client_processes=3).client_processes(10) == 3  # asked for: given
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert make(max_concurrency=32).client_processes(1000) == 1  # a caller's threads: never forked unasked
    iface = make(max_concurrency=9, max_total_tokens=1001)
    iface.process_share(1, 2)
    assert iface.limiter.maximum == 4 and iface.budget.limit == 500
    with pytest.raises(Exception, match="client_processes: must be auto or a whole number >= 1"):
        make(client_processes=0)


def test_two_processes_record_what_one_records(serve, tmp_path):  # noqa: F811
    server = serve(lambda body, n: (0.01, 200, {}, ok_body(f"colour {question_of(body)}",
                                                           {"prompt_tokens": 7, "completion_tokens": 2})))
    cfg = dataset(tmp_path, 90)
    one, two = tmp_path / "one", tmp_path / "two"
    done = _run(args(server, cfg, one, "--model_option", "max_concurrency=8", "--model_option", "client_processes=1"))
    assert done.returncode == 0, done.stderr
    done = _run(args(server, cfg, two, "--model_option", "max_concurrency=8", "--model_option", "client_processes=2"))
    assert done.returncode == 0, done.stderr
    assert "spread over 2 client processes" in (two / "log.txt").read_text()
    assert "spread over" not in (one / "log.txt").read_text()
    assert _files(one) == _files(two)  # one run identity: the number of processes is placement
    a, b = (json.loads((d / _files(d)[0]).read_text()) for d in (one, two))
    assert len(a) == len(b) == 90 and a == b
    assert [r["prediction"] for r in b] == [f"colour {i}" for i in range(90)]
    # the run's counts gather every process's
    info = json.loads(next((two / f).read_text() for f in os.listdir(two) if f.endswith(".run.json")))
    assert info["timing"]["generated_tokens"] == 180
    assert info["provenance"]["endpoint"]["served_model"] == "served-x"


@pytest.mark.slow  # (the quick subset keeps the SIGTERM test of the same stop)
def test_kill_9_of_the_run_leaves_no_process_and_loses_only_calls_in_flight(serve, tmp_path):  # noqa: F811
    server, out, argv, proc = _started_midway(serve, tmp_path / "killed", tmp_path)
    assert len(_alive_with(str(out))) == 2, "the run did not fork its client process"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _alive_with(str(out)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive_with(str(out)), "a client process outlived the run"
    time.sleep(0.3)  # (a reply the server sent as the child died is not an answer anyone kept)
    answered = len(server.answered)
    recs = saved(out)
    assert 40 <= answered < 200
    assert len(recs) >= answered - 8 - 2, (len(recs), answered)  # at most the 8 in flight (and a write)
    assert _run(argv).returncode == 0
    assert len(saved(out)) == 200
    assert len(server.bodies) - answered <= 200 - len(recs) + 8  # a kept answer is never asked again


def test_a_failing_process_stops_the_others_and_no_answer_is_lost(serve, tmp_path):  # noqa: F811
    # sample 7 is in the child's part (every other sample); it is refused for good
    server = serve(lambda body, n: (0.0, 400, {}, b'{"error": {"message": "no such thing"}}')
                   if question_of(body) == "7" else (0.05, 200, {}, ok_body()))
    cfg = dataset(tmp_path, 300)
    out = tmp_path / "out"
    done = _run(args(server, cfg, out, "--model_option", "max_concurrency=4", "--model_option", "client_processes=2"))
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "sample q7 " in last and "HTTP 400" in last, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert len(server.answered) < 250  # the parent stopped starting samples too
    assert len(saved(out)) == len(server.answered)  # every answer given was recorded


def test_sigterm_stops_every_process_in_one_line_and_the_run_resumes(serve, tmp_path):  # noqa: F811
    server, out, argv, proc = _started_midway(serve, tmp_path / "out", tmp_path)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "interrupted (SIGTERM)" in lines[0] and "resumes" in lines[0], err
    kept = len(saved(out))
    assert f"{kept} of 200 samples are saved" in lines[0], (kept, lines[0])
    assert not _alive_with(str(out))
    assert _run(argv).returncode == 0
    assert len(saved(out)) == 200


@pytest.mark.slow  # (the quick subset keeps the SIGTERM test of the same stop)
def test_a_client_process_killed_for_memory_is_one_line_and_the_run_resumes(serve, tmp_path):  # noqa: F811
    server, out, argv, proc = _started_midway(serve, tmp_path / "out", tmp_path)
    child = [pid for pid in _alive_with(str(out)) if pid != proc.pid]
    assert len(child) == 1, child
    os.kill(child[0], signal.SIGKILL)  # as the out-of-memory killer does
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "client process 1 of 2 died (SIGKILL: killed, most often by the out-of-memory " \
        "killer)" in lines[0] and "resumes" in lines[0], err
    answered, kept = len(server.answered), len(saved(out))
    assert answered - 8 <= kept <= answered  # the killed process's calls in flight, at most
    assert _run(argv).returncode == 0
    assert len(saved(out)) == 200


def test_auto_shares_the_cores_among_the_ranks_of_a_node(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    iface = OpenAIAPIInterface({"model_name": "m", "base_url": "http://127.0.0.1:9/v1", "max_concurrency": 128})
    assert iface.client_processes(1000) == 2


# -- reproducers of the adversarial review of client processes (each failed before its fix) --
#: run_eval with the response cache's disk full, in the parent only or in client process 1 only
_FULL_CACHE = '''
import errno, os, sys
sys.path.insert(0, {root!r})
import reform_eval.evaluation.cache as cache_module
import reform_eval.evaluation.client_processes as cp
from reform_eval import run_eval

class FullDiskOS:
    writes = 0
    def __getattr__(self, name):
        return getattr(os, name)
    def write(self, fd, data):
        FullDiskOS.writes += 1
        if FullDiskOS.writes <= {room}:
            return os.write(fd, data)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

original = cp._child
def child(index, *a, **k):
    cache_module.os = FullDiskOS() if {where!r} == "child" else os
    return original(index, *a, **k)
cp._child = child
if {where!r} == "parent":
    cache_module.os = FullDiskOS()
sys.exit(run_eval.main(sys.argv[1:]))
'''


def _with_full_cache(tmp_path, where: str, room: int, argv):
    script = tmp_path / "full_cache.py"
    script.write_text(_FULL_CACHE.format(root=ROOT, where=where, room=room))
    env = dict(os.environ)
    env.pop("REFORM_NO_CACHE", None)
    return subprocess.run([sys.executable, str(script), *argv, "--cache_dir", str(tmp_path / "cache")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def _odd(sample: str) -> bool:
    """Part 1 (the child) holds the odd samples: group j goes to part j mod 2."""
    return int(sample) % 2 == 1


def test_resume_under_a_token_budget_with_two_processes_uses_what_is_left(serve, tmp_path):  # noqa: F811
    """Review reproducer: it was that ``process_share`` halves ``budget.limit`` but each process keeps the WHOLE spend of
    the answers saved earlier (``charge_recorded`` ran before the fork), so each process holds
    used=2415 against a share of 3000 and the run stops at once, though 3585 of 6000 tokens are
    left and the 17 samples to go need about 1800. One process completes the same resume."""
    usage = {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}
    server = serve(lambda body, n: (0.01, 200, {}, ok_body("red", usage)))
    cfg = dataset(tmp_path, 40)
    out = tmp_path / "out"
    argv = args(server, cfg, out, "--model_option", "max_concurrency=4", "--model_option", "max_total_tokens=3000",
                "--model_option", "client_processes=1")
    first = _run(argv)
    assert first.returncode == 2 and "token budget" in first.stderr, first.stderr
    kept = len(saved(out))
    assert 15 <= kept < 40
    argv[argv.index("max_total_tokens=3000")] = "max_total_tokens=6000"
    argv[argv.index("client_processes=1")] = "client_processes=2"
    again = _run(argv)
    assert again.returncode == 0, again.stderr
    assert len(saved(out)) == 40


def test_an_interrupt_after_the_parents_part_is_done_counts_every_process(serve, tmp_path):  # noqa: F811
    """Review reproducer: it was that once the parent's own part is done it waits for its children in ``_finish``
    OUTSIDE the try block of ``run_window_processes``; Ctrl-C (or SIGTERM) there skips the
    collection of the children's keys, so the line says "50 of 100 samples are saved" while 62
    are (the child's 12 are not counted). The line is what the user reads to judge the run."""
    server = serve(lambda body, n: (0.2 if _odd(question_of(body)) else 0.0, 200, {}, ok_body()))
    cfg = dataset(tmp_path, 100)
    out = tmp_path / "out"
    argv = args(server, cfg, out, "--model_option", "max_concurrency=8", "--model_option", "client_processes=2")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "run_eval.py"), *argv], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None and (
            sum(not _odd(a) for a in server.answered) < 50 or sum(_odd(a) for a in server.answered) < 12):
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before the signal"
    time.sleep(0.1)  # (the parent's last records are written: it now waits for its child)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole process group
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, err
    found = re.search(r"(\d+) of 100 samples are saved", err)
    assert found, err
    assert int(found.group(1)) == len(saved(out)), err


def test_a_full_cache_disk_in_a_client_process_is_the_worlds_one_line(serve, tmp_path):  # noqa: F811
    """Review reproducer: it was that the child classifies its own failures by type only; an OSError (the response
    cache's full disk) becomes "internal error in client process 1 of 2: OSError: ..." with exit
    1 (a defect of ours), while the same full disk in one process is the world's one line naming
    the file and --cache_dir, exit 2 (utils.world.world_error; tests/test_world.py)."""
    server = serve(lambda body, n: (0.01, 200, {}, ok_body()))
    cfg = dataset(tmp_path, 100)
    done = _with_full_cache(tmp_path, "child", 0, args(server, cfg, tmp_path / "out", "--model_option",
                                                       "max_concurrency=8", "--model_option", "client_processes=2"))
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert done.returncode == 2, done.stderr
    assert "internal error" not in lines[0] and "No space left on device" in lines[0] and "--cache_dir" in lines[0], \
        lines[0]


def test_the_parents_full_disk_lets_the_children_record_their_calls_in_flight(serve, tmp_path):  # noqa: F811
    """Review reproducer: it was that ``run_window_processes`` takes every failure of the parent that is not a
    ReformError for an interrupt (``interrupted = not isinstance(e, ReformError)``): a full cache
    disk (OSError) SIGTERMs the children, which drop their calls in flight, answered and paid
    for (docs/reliability.md: "a failing process stops the others after their calls in flight
    are recorded"; "No paid reply is thrown away"). Here the child's 4 requests are sent and
    answered by the server; none is recorded."""
    server = serve(lambda body, n: (0.3 if _odd(question_of(body)) else 0.0, 200, {}, ok_body()))
    cfg = dataset(tmp_path, 100)
    out = tmp_path / "out"
    done = _with_full_cache(tmp_path, "parent", 6, args(server, cfg, out, "--model_option", "max_concurrency=8",
                                                        "--model_option", "client_processes=2"))
    assert done.returncode == 2 and "No space left on device" in done.stderr, done.stderr
    time.sleep(0.5)  # (the server's replies to the child are all sent)
    sent = sum(_odd(question_of(b)) for b in server.bodies)
    recorded = sum(_odd(r["sample_id"][1:]) for r in saved(out))
    assert sent >= 1
    assert recorded == sent, (recorded, sent)


def test_more_client_processes_than_max_concurrency_never_pass_it(serve, tmp_path):  # noqa: F811
    """Review reproducer: it was that ``process_share`` gives every process at least one call in flight
    (``max(1, share)``) and ``run_rank`` takes ``client_processes`` as asked, so
    ``max_concurrency=2`` with ``client_processes=4`` has 4 requests in flight at the server.
    ``max_concurrency`` is the limit a user sets for a rate-limited endpoint; the number of
    processes is placement and must never raise it (cap the processes at ``max_in_flight``)."""
    state = {"now": 0, "peak": 0}
    lock = threading.Lock()

    def respond(body, n):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.1)
        with lock:
            state["now"] -= 1
        return (0.0, 200, {}, ok_body())
    server = serve(respond)
    cfg = dataset(tmp_path, 40)
    done = _run(args(server, cfg, tmp_path / "out", "--model_option", "max_concurrency=2",
                     "--model_option", "client_processes=4"))
    assert done.returncode == 0, done.stderr
    assert len(saved(tmp_path / "out")) == 40
    assert state["peak"] <= 2, state


def test_after_a_full_cache_disk_the_calls_in_flight_are_still_saved_in_the_shard(serve, tmp_path):  # noqa: F811
    """Review reproducer (older than client processes, in ``evaluation.window._Writer``): it was that once a write
    raised (the response cache's full disk, raised by ``cache.raise_failure`` AFTER the shard
    write succeeded), the writer drops every later batch (``if records and self.error is
    None``), so the calls in flight, answered and paid for, never reach the shard although the
    shard's disk is fine (docs/reliability.md: "No paid reply is thrown away"). One process."""
    server = serve(lambda body, n: (0.05, 200, {}, ok_body()))
    cfg = dataset(tmp_path, 100)
    out = tmp_path / "out"
    done = _with_full_cache(tmp_path, "parent", 3, args(server, cfg, out, "--model_option", "max_concurrency=8",
                                                        "--model_option", "client_processes=1"))
    assert done.returncode == 2 and "No space left on device" in done.stderr, done.stderr
    time.sleep(0.3)
    assert len(saved(out)) == len(server.answered), (len(saved(out)), len(server.answered))


# -- reproducers of the second review (of the fixes above) --
def _popen(argv, **kw):
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "run_eval.py"), *argv], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)


def test_sigterm_is_heard_while_the_parents_failure_waits_for_its_children(serve, tmp_path):  # noqa: F811
    """Review reproducer: it was that the parent's own failure (a call refused for good) drains its children with NO time limit
    (``_finish(..., None)``) inside ``_signals_held()``: SIGINT/SIGTERM to the run are ignored
    for as long as a child's calls in flight take (up to the request timeout times its retries).
    ``kill PID`` (a scheduler's SIGTERM, ``timeout``) does nothing; one process stops at once."""
    server = serve(lambda body, n: (0.0, 400, {}, b'{"error": {"message": "no such thing"}}')
                   if question_of(body) == "0" else (12.0 if _odd(question_of(body)) else 0.0, 200, {}, ok_body()))
    cfg = dataset(tmp_path, 100)
    proc = _popen(args(server, cfg, tmp_path / "out", "--model_option", "max_concurrency=8",
                       "--model_option", "client_processes=2"))
    deadline = time.monotonic() + 30
    while len(server.bodies) < 5 and time.monotonic() < deadline:  # sample 0 refused, the child's 4 sent
        time.sleep(0.01)
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=60)[1]
    took = time.monotonic() - t0
    assert took < 5, f"SIGTERM to the run took {took:.1f} s to stop it: {err}"


@pytest.mark.slow  # (waits out STOP_WAIT_S, 10 s)
def test_an_interrupt_with_a_stopped_child_counts_what_the_child_saved(serve, tmp_path):  # noqa: F811
    """Review reproducer: a child that does not answer the interrupt within STOP_WAIT_S (stopped: SIGSTOP, a
    debugger, a frozen NFS write) is SIGKILLed and its message never comes; ``_finish`` then
    adds none of its keys to ``done``, so the one line says far fewer samples are saved than its
    shard file holds (the line is what the user reads to judge the run; the previous review's
    reproducer pinned the same promise for an interrupt while waiting)."""
    server, out, argv, proc = _started_midway(serve, tmp_path / "out", tmp_path)
    child = [pid for pid in _alive_with(str(out)) if pid != proc.pid]
    assert len(child) == 1, child
    os.kill(child[0], signal.SIGSTOP)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, err
    found = re.search(r"(\d+) of 200 samples are saved", err)
    assert found, err
    assert int(found.group(1)) == len(saved(out)), err


#: run_eval whose rank shard's writes take 0.4 s each in the parent only (a slow disk: NFS)
_SLOW_SHARD = '''
import os, sys, time
sys.path.insert(0, {root!r})
import reform_eval.utils.predictions as predictions
from reform_eval import run_eval

parent = os.getpid()
original = predictions.ShardWriter.write
def write(self, records):
    if os.getpid() == parent:
        time.sleep(0.4)
    return original(self, records)
predictions.ShardWriter.write = write
sys.exit(run_eval.main(sys.argv[1:]))
'''


def test_a_second_ctrl_c_while_the_parent_drains_its_writer_keeps_the_count_true(serve, tmp_path):  # noqa: F811
    """Review reproducer: ``_signals_held`` began only in ``run_window_processes``' except block; the first Ctrl-C
    reaches the parent in ``run_window``, whose except block first drains the window's writer
    (``writer.close()``: a join on the writer thread). A second Ctrl-C there cuts that join: the
    records already in ``done`` (``_Schedule.finish`` adds a key when its record is QUEUED) are
    never written (the writer is a daemon thread, gone at exit), yet the one line counts them as
    saved. Pressing Ctrl-C twice is what a user does when the first one seems slow."""
    server = serve(lambda body, n: (0.02, 200, {}, ok_body()))
    script = tmp_path / "slow_shard.py"
    script.write_text(_SLOW_SHARD.format(root=ROOT))
    out = tmp_path / "out"
    argv = args(server, dataset(tmp_path, 400), out, "--model_option", "max_concurrency=8",
                "--model_option", "client_processes=2")
    proc = subprocess.Popen([sys.executable, str(script), *argv], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(server.answered) < 60 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before the signal"
    proc.send_signal(signal.SIGINT)
    time.sleep(0.15)
    proc.send_signal(signal.SIGINT)  # the second Ctrl-C, while the first one's drain is under way
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, err
    found = re.search(r"(\d+) of 400 samples are saved", err)
    assert found, err
    assert int(found.group(1)) == len(saved(out)), err


#: run_eval whose first rank-shard write fails with a full disk (ENOSPC), the later ones succeed
_SHARD_FULL_ONCE = '''
import errno, os, sys
sys.path.insert(0, {root!r})
import reform_eval.utils.predictions as predictions
from reform_eval import run_eval

class FullOnceOS:
    writes = 0
    def __getattr__(self, name):
        return getattr(os, name)
    def write(self, fd, data):
        FullOnceOS.writes += 1
        if FullOnceOS.writes == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)
predictions.os = FullOnceOS()
sys.exit(run_eval.main(sys.argv[1:]))
'''


def test_after_a_failed_shard_write_no_later_turn_is_saved_without_the_turn_it_read(serve, tmp_path):  # noqa: F811
    """Review reproducer: 90c0d85 made ``window._Writer`` write every batch after a failed one. But a chat's next turn
    starts as soon as the turn it reads is QUEUED for the writer (``_Schedule.finish`` marks it
    done), so when that turn's batch fails on a full shard disk, its successor's batch is still
    written: the shard holds turn 2 (whose history is turn 1's answer) without turn 1. The
    resume asks turn 1 again, and the prediction file's turn-1 prediction differs from the answer
    turn 2's history shows (docs/reliability.md: a turn starts only after the turns its history
    needs are recorded). Before 90c0d85 the later batch was dropped and turn 2 was redone."""
    from tests.test_mmmt_if_run import write_mmdu
    server = serve(lambda body, n: (0.05, 200, {}, ok_body(f"answer number {n}")))
    cfg = write_mmdu(str(tmp_path / "mmdu"))
    out = tmp_path / "out"
    argv = ["--model", "openai_api", "--model_name", "gpt-test", "--dataset_name", "MMMT-IF", "--dataset_config",
            cfg, "--history", "model", "--max_new_tokens", "5", "--output_dir", str(out),
            "--model_option", f"base_url={server.url}", "--model_option", "max_retries=0",
            "--model_option", "max_concurrency=8", "--model_option", "client_processes=1"]
    script = tmp_path / "shard_full_once.py"
    script.write_text(_SHARD_FULL_ONCE.format(root=ROOT))
    first = subprocess.run([sys.executable, str(script), *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert first.returncode == 2 and "No space left on device" in first.stderr, first.stderr
    again = subprocess.run([sys.executable, os.path.join(ROOT, "run_eval.py"), *argv], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    records = json.load(open(prediction_files(out)[0]))
    by_id = {r["sample_id"]: r for r in records}
    assert len(by_id) == 30
    wrong = [(r["sample_id"], t["value"], by_id[t["source_sample_id"]]["prediction"])
             for r in records for t in r.get("history", []) if "source_sample_id" in t
             and t["value"] != by_id[t["source_sample_id"]]["prediction"]]
    assert not wrong, wrong[:3]
