"""The endpoint's window over several client processes (issue 24): what two processes record
is what one records, under the same run identity; a kill -9 of the run leaves no process behind
and loses at most the requests in flight; a failing process stops the others after their calls
in flight are recorded; SIGTERM stops every process with one line and the run resumes.

The runs are separate processes (the command line, as users start it): the client forks, and a
test process full of threads is no place to fork from."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import List

import pytest

from evaluation.client_processes import shares, split_by_group
from models.interfaces.openai_api_interface import OpenAIAPIInterface
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
