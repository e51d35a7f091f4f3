"""The endpoint client at the limit (issue 24) and the numbers it takes from outside (issue 25).

A loopback HTTP/1.1 keep-alive server whose reply to each request is decided by a function of
the request: how long it waits, its status, headers and body. Each test pins one promise of
docs/reliability.md: the window never waits for its slowest reply, every answered request is
recorded before the run stops, a kill loses at most the requests in flight, a reply's
``Retry-After`` and ``usage`` are clamped where they enter, hostile replies end in one line.
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Tuple

import pytest

from reform_eval import run_eval
from reform_eval.models.http_transport import Retryable
from reform_eval.models.interfaces.openai_api_interface import OpenAIAPIInterface
from tests.conftest import prediction_files, write_custom_dataset
from reform_eval.utils.errors import ReformError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

Reply = Tuple[float, int, Dict[str, str], bytes]  # (delay s, status, headers, body)


def ok_body(text: str = "red", usage: Any = None) -> bytes:
    reply: Dict[str, Any] = {"model": "served-x", "choices": [{"message": {"role": "assistant", "content": text}}]}
    if usage is not None:
        reply["usage"] = usage
    return json.dumps(reply).encode()


def question_of(body: Dict[str, Any]) -> str:
    """The sample's number: item i asks "Which colour fills image i?"."""
    last = body["messages"][-1]["content"]
    text = " ".join(p["text"] for p in last if p.get("type") == "text") if isinstance(last, list) else last
    found = re.search(r"fills image (\d+)\?", text)
    return found.group(1) if found else text


class Server:
    """HTTP/1.1 (keep-alive) chat completions; ``respond(body, n) -> Reply`` decides each reply."""

    def __init__(self, respond: Callable[[Dict[str, Any], int], Reply]) -> None:
        self.respond = respond
        self.bodies: List[Dict[str, Any]] = []
        self.answered: List[str] = []  # the sample id's image number of each 200 reply, in order
        self.peers: set = set()
        self.lock = threading.Lock()
        self.busy = 0  # requests being handled (read, waited on, answered, counted)
        self.quiet = threading.Condition(self.lock)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # the headers and the body are two writes: with Nagle's algorithm the body waits for
            # the client's delayed ACK of the headers, 40 ms a reply (as real servers, no Nagle)
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                with outer.lock:
                    outer.busy += 1
                try:
                    self._post()
                finally:
                    with outer.lock:
                        outer.busy -= 1
                        outer.quiet.notify_all()

            def _post(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    n = len(outer.bodies)
                    outer.bodies.append(body)
                    outer.peers.add(self.client_address)
                delay, status, headers, payload = outer.respond(body, n)
                time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if headers.get("Transfer-Encoding") != "chunked":
                    self.send_header("Content-Length", str(len(payload)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    if headers.get("Transfer-Encoding") == "chunked":
                        for i in range(0, len(payload), 7):
                            piece = payload[i:i + 7]
                            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                        self.wfile.write(b"0\r\n\r\n")
                    else:
                        self.wfile.write(payload)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return
                if status == 200:
                    with outer.lock:
                        outer.answered.append(question_of(body))
                        outer.quiet.notify_all()

        class Httpd(ThreadingHTTPServer):
            request_queue_size = 128
            daemon_threads = True

        self.httpd = Httpd(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def wait_answered(self, n: int, limit: float = 60.0) -> bool:
        """Wait until ``n`` replies were answered (False past ``limit`` seconds)."""
        with self.quiet:
            return self.quiet.wait_for(lambda: len(self.answered) >= n, limit)

    def settled(self, limit: float = 60.0) -> None:
        """Wait until no request is being handled (a client that has exited sends no more): then
        ``answered`` holds every reply the server gave, whatever the machine's load."""
        with self.quiet:
            assert self.quiet.wait_for(lambda: self.busy == 0, limit), f"{self.busy} requests still handled"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers: List[Server] = []

    def make(respond: Callable[[Dict[str, Any], int], Reply]) -> Server:
        servers.append(Server(respond))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def dataset(tmp_path, n: int) -> str:
    """n Generation items; item i asks "Which colour fills image i?" (its id is in the question)."""
    cfg = write_custom_dataset(str(tmp_path / "data"), n=n, formulation="Generation")
    path = tmp_path / "data" / "items.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for i, rec in enumerate(lines):
        rec["question"] = f"Which colour fills image {i}?"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return cfg


def args(server: Server, cfg: str, out, *extra: str, retries: int = 0) -> List[str]:
    return ["--model", "openai_api", "--model_name", "gpt-test", "--dataset_name", "custom", "--formulation",
            "Generation", "--dataset_config", cfg, "--output_dir", str(out), "--max_new_tokens", "5",
            "--model_option", f"base_url={server.url}", "--model_option", f"max_retries={retries}",
            "--model_option", "backoff_base=0.001", *extra]


def saved(out) -> List[Dict[str, Any]]:
    """Every record the run holds: the prediction file's, or its shards' lines."""
    recs: List[Dict[str, Any]] = []
    for root, _, files in os.walk(out):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".jsonl") and ".shards_" in root:
                recs += [json.loads(x) for x in open(path) if x.strip()]
            elif name.endswith(".json") and name.startswith("custom_") and name.count(".") == 1:
                recs += json.load(open(path))
    return recs


def test_a_slow_reply_holds_no_other_request(serve, tmp_path):
    """Sample 0's reply is held until the other 23 are answered; with 4 in flight they all are
    (a batch of 64 would have waited for it before sending anything more, and the held reply
    would then come after 60 s, before the rest). No clock decides: the reply waits for a count."""
    held: Dict[str, Server] = {}

    def respond(body, n):
        if question_of(body) == "0":
            held["server"].wait_answered(23)
        return 0.0, 200, {}, ok_body()
    server = held["server"] = serve(respond)
    cfg = dataset(tmp_path, 24)
    assert run_eval.main(args(server, cfg, tmp_path / "out", "--model_option", "max_concurrency=4",
                              "--per_gpu_eval_batch_size", "64")) == 0
    server.settled()  # (the server counts a reply after sending it: its last count may still be coming)
    assert len(server.answered) == 24
    assert server.answered.index("0") == 23, server.answered
    assert len(server.peers) <= 4 + 2  # keep-alive: about one connection per worker, reused


def test_chunked_replies_and_keep_alive(serve, tmp_path):
    server = serve(lambda body, n: (0.0, 200, {"Transfer-Encoding": "chunked"}, ok_body("blue")))
    cfg = dataset(tmp_path, 12)
    assert run_eval.main(args(server, cfg, tmp_path / "out", "--model_option", "max_concurrency=2")) == 0
    recs = saved(tmp_path / "out")
    assert len(recs) == 12 and all(r["prediction"] == "blue" for r in recs)
    assert len(server.peers) <= 3, server.peers


def test_every_answered_request_is_recorded_when_the_budget_stops_the_run(serve, tmp_path, capsys):
    """Issue 25 class 4: a budget crossed while 4 requests with images are in flight. The run
    stops with one line; every reply the server gave is in the shard (none paid for twice)."""
    usage = {"prompt_tokens": 400, "completion_tokens": 5, "total_tokens": 405}
    server = serve(lambda body, n: (0.05, 200, {}, ok_body("red", usage)))
    cfg = dataset(tmp_path, 40)
    # each request is estimated at 5 + 576 (a 32x32 image, conservatively) + its text: 4 fit at once
    argv = args(server, cfg, tmp_path / "out", "--model_option", "max_concurrency=4",
                "--model_option", "max_total_tokens=6000")
    assert run_eval.main(argv) == 2
    assert "token budget max_total_tokens=6000 reached" in capsys.readouterr().err
    server.settled()
    answered = len(server.answered)
    assert 4 <= answered < 40
    recs = saved(tmp_path / "out")
    assert len(recs) == answered  # no paid reply thrown away
    assert sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in recs) <= 6000
    argv[-1] = "max_total_tokens=1000000"
    assert run_eval.main(argv) == 0
    assert len(server.bodies) == 40  # the re-run sent only the requests never answered


def test_kill_9_loses_at_most_the_requests_in_flight(serve, tmp_path):
    """After 12 answers the server holds every request: the run then has its 4 requests in flight
    and every answer it got is recorded as it arrived (the shard holds them all, however slowly
    a loaded machine writes). kill -9 then loses exactly the requests in flight, and the re-run
    asks only what was never answered. (Counts and events decide, not a race with the clock.)"""
    holding, release = threading.Event(), threading.Event()
    holding.set()
    held = []

    def respond(body, n):
        if holding.is_set() and n >= 12:
            held.append(n)
            release.wait(120)
            return 0.0, 503, {}, b'{"error": {"message": "gone"}}'  # (to a killed client: never an answer)
        return 0.0, 200, {}, ok_body()
    server = serve(respond)
    cfg = dataset(tmp_path, 60)
    out = tmp_path / "out"
    cmd = [sys.executable, os.path.join(ROOT, "run_eval.py"), *args(server, cfg, out, "--model_option",
                                                                     "max_concurrency=4")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while (len(held) < 4 or len(server.answered) < 12 or len(saved(out)) < 12) and time.monotonic() < deadline \
                and proc.poll() is None:
            time.sleep(0.02)
        assert len(held) == 4 and len(server.answered) == 12, (len(held), len(server.answered))
        assert len(saved(out)) == 12  # every answer recorded while the run goes on
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        holding.clear()
        release.set()
    assert len(saved(out)) == 12  # kill -9 lost only the 4 requests in flight
    assert run_eval.main(args(server, cfg, out, "--model_option", "max_concurrency=4")) == 0
    assert len(saved(out)) == 60
    server.settled()
    assert len(server.answered) == 60  # a kept answer is never asked again


def test_retry_after_of_a_day_is_clamped_to_backoff_max(serve, tmp_path):
    """Issue 25 class 3: one 429 with Retry-After: 86400 paused every request for a day."""
    server = serve(lambda body, n: (0.0, 429, {"Retry-After": "86400"}, b'{"error": {"message": "slow down"}}')
                   if n == 0 else (0.0, 200, {}, ok_body()))
    cfg = dataset(tmp_path, 6)
    result: List[int] = []
    argv = args(server, cfg, tmp_path / "out", "--model_option", "max_concurrency=2", "--model_option",
                "backoff_max=0.2", retries=3)
    t = threading.Thread(target=lambda: result.append(run_eval.main(argv)), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(timeout=60)
    assert result == [0], "the run stalled on Retry-After"
    assert time.monotonic() - t0 < 30


def test_negative_or_absurd_usage_never_enters_totals_or_the_budget(serve, tmp_path):
    usage = {"prompt_tokens": -1000000, "completion_tokens": 1e300, "total_tokens": True}
    server = serve(lambda body, n: (0.0, 200, {}, ok_body("red", usage)))
    cfg = dataset(tmp_path, 6)
    argv = args(server, cfg, tmp_path / "out", "--model_option", "max_concurrency=1", "--model_option",
                "max_total_tokens=2000")
    # without usage each reply is charged its worst case (5 + 576 + text): the budget still bounds the run
    assert run_eval.main(argv) == 2
    recs = saved(tmp_path / "out")
    assert 1 <= len(recs) <= 3 and all("usage" not in r for r in recs)


def test_a_reply_nested_too_deep_is_a_malformed_reply(serve, tmp_path, capsys):
    deep = b'{"choices": [' + b"[" * 100000 + b"]" * 100000 + b"]}"
    server = serve(lambda body, n: (0.0, 200, {}, deep))
    cfg = dataset(tmp_path, 2)
    assert run_eval.main(args(server, cfg, tmp_path / "out", "--model_option", "max_concurrency=1")) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
    assert len(err) == 1 and "nested deeper than the parser follows" in err[0] and "internal error" not in err[0]


def test_a_lone_surrogate_in_a_reply_is_replaced_and_the_run_finishes(serve, tmp_path):
    server = serve(lambda body, n: (0.0, 200, {}, b'{"choices": [{"message": {"content": "ab\\ud800cd"}}]}'))
    cfg = dataset(tmp_path, 3)
    assert run_eval.main(args(server, cfg, tmp_path / "out", "--do_eval")) == 0
    recs = saved(tmp_path / "out")
    assert len(recs) == 3 and all(r["prediction"] == "ab\ufffdcd" for r in recs)


def test_endpoint_provenance_and_traces_are_recorded(serve, tmp_path):
    server = serve(lambda body, n: (0.0, 200, {"Server": "fake-vllm/0.32"}, ok_body("red")))
    cfg = dataset(tmp_path, 4)
    assert run_eval.main(args(server, cfg, tmp_path / "out")) == 0
    run_json = [f for f in os.listdir(tmp_path / "out") if f.endswith(".run.json")][0]
    prov = json.load(open(tmp_path / "out" / run_json))["provenance"]
    assert prov["engine"] == "openai_api"
    assert prov["endpoint"]["requested_model"] == "gpt-test" and prov["endpoint"]["served_model"] == "served-x"
    assert "fake-vllm/0.32" in prov["endpoint"]["server_version"]
    recs = saved(tmp_path / "out")
    traces = [r["trace"] for r in recs]
    # every image is the same colour file content only when colours match: image i has colour i % 4
    by_colour: Dict[str, set] = {}
    for r in recs:
        by_colour.setdefault(r["meta"]["colour"], set()).add(r["trace"]["image_sha"])
    # what the server made of the images is not visible from here: unknown, never guessed
    assert all(t["pixel_sha"] is None and t["bos"] is None for t in traces)
    assert all(len(v) == 1 for v in by_colour.values()) and len({next(iter(v)) for v in by_colour.values()}) == 4
    assert len({t["prompt_sha"] for t in traces}) == 4  # four questions, four prompts


# -- numbers and bytes from a hostile server end in one line or a retry, never an internal error


def _error_lines(capsys):
    err = capsys.readouterr().err
    return [ln for ln in err.splitlines() if ln.startswith("error")], err


def test_usage_integer_too_large_for_a_float(serve, tmp_path, capsys):
    """A JSON integer of 400 digits has no float: ``clean_usage`` once met it with
    ``math.isfinite`` (OverflowError, an internal error). Such a count is dropped (logged once)
    like any absurd count, and the run finishes."""
    big = b'{"choices": [{"message": {"content": "red"}}], "usage": {"prompt_tokens": 1' + b"0" * 400 + \
        b', "completion_tokens": 1}}'
    server = serve(lambda body, n: (0.0, 200, {}, big))
    cfg = dataset(tmp_path, 2)
    code = run_eval.main(args(server, cfg, tmp_path / "out", "--model_option", "max_concurrency=1"))
    lines, err = _error_lines(capsys)
    # expected: the count is dropped (logged once) as any absurd count is, and the run finishes
    assert code == 0, err[-600:]
    assert len(saved(tmp_path / "out")) == 2


def test_reply_with_an_integer_over_4300_digits(serve, tmp_path, capsys):
    """``json.loads`` raises a plain ValueError (Python's int-string limit), not JSONDecodeError:
    it escaped as an internal error; it is a malformed reply in one line."""
    body = b'{"choices": [{"message": {"content": "red"}}], "id": ' + b"7" * 5000 + b"}"
    server = serve(lambda body_, n: (0.0, 200, {}, body))
    cfg = dataset(tmp_path, 1)
    code = run_eval.main(args(server, cfg, tmp_path / "out", "--model_option", "max_concurrency=1"))
    lines, err = _error_lines(capsys)
    assert code == 2 and len(lines) == 1 and "internal error" not in err, err[-600:]


def test_error_reply_with_an_integer_over_4300_digits(serve, tmp_path, capsys):
    """The same ValueError on an error reply's body (``_error_detail``): the refusal is still
    one line naming the HTTP status."""
    body = b'{"error": {"code": ' + b"7" * 5000 + b"}}"
    server = serve(lambda body_, n: (0.0, 400, {}, body))
    cfg = dataset(tmp_path, 1)
    code = run_eval.main(args(server, cfg, tmp_path / "out", "--model_option", "max_concurrency=1"))
    lines, err = _error_lines(capsys)
    assert code == 2 and len(lines) == 1 and "refused the request" in lines[0], err[-600:]


def test_usage_count_as_float_string_or_nested(serve, tmp_path):
    """Strings, nested objects and floats with fractions are dropped; a whole float is kept
    (held before the review; pinned with the rest of ``clean_usage``)."""
    usage = {"prompt_tokens": "12", "completion_tokens": 3.0, "total_tokens": {"x": 1},
             "cached_tokens": 2.5}
    server = serve(lambda body, n: (0.0, 200, {}, ok_body("red", usage)))
    cfg = dataset(tmp_path, 2)
    assert run_eval.main(args(server, cfg, tmp_path / "out", "--model_option", "max_concurrency=1")) == 0
    recs = saved(tmp_path / "out")
    assert all(r["usage"] == {"completion_tokens": 3} for r in recs), [r.get("usage") for r in recs]


# 1101 attempts through run_eval: ~1 s (the test server sends without Nagle delays; was ~50 s)
def test_many_retries_end_in_one_line_not_an_overflow(serve, tmp_path, capsys, caplog):
    """``request``'s backoff was ``backoff_base * (2 ** attempt)``: from attempt 1024 on the int is
    too large for a float, so a user who sets max_retries high ('retry for as long as it takes')
    got an internal OverflowError after 1024 failed attempts instead of the 'gave up' line."""
    caplog.set_level(logging.ERROR)  # 1100 retry warnings
    logging.getLogger("reform_eval.models.interfaces.openai_api_interface").setLevel(logging.ERROR)
    server = serve(lambda body, n: (0.0, 503, {}, b'{"error": {"message": "busy"}}'))
    cfg = dataset(tmp_path, 1)
    argv = args(server, cfg, tmp_path / "out", "--model_option", "max_concurrency=1", "--model_option",
                "backoff_max=0", "--model_option", "adaptive_concurrency=false", retries=1100)
    argv[argv.index("backoff_base=0.001")] = "backoff_base=0"
    code = run_eval.main(argv)
    lines, err = _error_lines(capsys)
    assert code == 2 and len(lines) == 1 and "gave up after 1101 attempts" in lines[0], err[-400:]



def test_backoff_past_attempt_1024_does_not_overflow(monkeypatch):
    """The fast twin of the test above, at ``request`` itself: 1101 failed attempts end in the
    'gave up' line (``backoff_base * 2 ** 1024`` was an OverflowError)."""
    client = OpenAIAPIInterface({"model_name": "m", "base_url": "http://127.0.0.1:9/v1", "max_retries": 1100,
                                 "backoff_base": 0.0, "backoff_max": 0.0})

    def busy(payload: bytes) -> Any:
        raise Retryable("HTTP 503: busy")
    monkeypatch.setattr(client, "_post_once", busy)
    monkeypatch.setattr(logging.getLogger("reform_eval.models.interfaces.openai_api_interface"), "level", logging.ERROR)
    with pytest.raises(ReformError, match="gave up after 1101 attempts"):
        client.request({"messages": [], "max_tokens": 1})


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999/v1", "http://[::1/v1", "http://127.0.0.1:abc/v1"])
def test_a_malformed_base_url_is_one_line(tmp_path, capsys, url):
    """``urlsplit`` and ``.port`` raise ValueError for an out-of-range or non-numeric port and an
    unclosed IPv6 bracket: that was an internal error (exit 1); bad input is one line naming the
    option (exit 2)."""
    cfg = dataset(tmp_path, 1)
    code = run_eval.main(["--model", "openai_api", "--model_name", "m", "--dataset_name", "custom", "--formulation",
                          "Generation", "--dataset_config", cfg, "--output_dir", str(tmp_path / "out"),
                          "--model_option", f"base_url={url}"])
    lines, err = _error_lines(capsys)
    assert code == 2 and "internal error" not in err and "base_url" in lines[0], err[-300:]


def test_budget_is_not_reached_by_reservations_alone(serve, tmp_path, capsys):
    """Only what is spent stops the run: a request that does not fit beside the worst-case
    reservations of requests in flight waits for them to settle (``TokenBudget.reserve``). It
    used to raise BudgetExhausted at once: 5 of 12 samples, 525 of 3000 tokens spent."""
    usage = {"prompt_tokens": 100, "completion_tokens": 5}
    server = serve(lambda body, n: (0.2, 200, {}, ok_body("red", usage)))
    cfg = dataset(tmp_path, 12)
    # each request is reserved at ~600 tokens (5 + 576 for the image + text); 12 requests really
    # cost 12 * 105 = 1260 tokens, well inside 3000
    code = run_eval.main(args(server, cfg, tmp_path / "out", "--model_option", "max_concurrency=8",
                              "--model_option", "max_total_tokens=3000"))
    err = capsys.readouterr().err
    recs = saved(tmp_path / "out")
    spent = sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in recs)
    assert code == 0, f"stopped after {len(recs)} of 12 samples, {spent} of 3000 tokens spent: " + \
        [ln for ln in err.splitlines() if ln.startswith("error")][0][:300]
    assert len(recs) == 12 and spent == 1260


def test_client_processes_is_refused_like_any_unknown_option(tmp_path, capsys):
    """Issue 31: an endpoint run is one process per rank (torchrun gives a run more processes);
    the option of the forked client processes is gone and refused in one line, before any work."""
    cfg = dataset(tmp_path, 1)
    code = run_eval.main(["--model", "openai_api", "--model_name", "m", "--dataset_name", "custom", "--formulation",
                          "Generation", "--dataset_config", cfg, "--output_dir", str(tmp_path / "out"),
                          "--model_option", "base_url=http://127.0.0.1:9/v1", "--model_option", "client_processes=2"])
    lines, err = _error_lines(capsys)
    assert code == 2 and len([ln for ln in err.splitlines() if ln.strip()]) == 1, err
    assert "unknown option 'client_processes' for model 'openai_api'" in lines[0], lines[0]
    assert not (tmp_path / "out").exists() or not saved(tmp_path / "out")


# -- the window's writer under a full disk and a second Ctrl-C (each failed before its fix) --
def _script(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\n" + text
                    + "from reform_eval import run_eval\nsys.exit(run_eval.main(sys.argv[1:]))\n")
    return str(path)


#: the response cache's disk fills after ``room`` writes (the shard's disk is fine)
_FULL_CACHE = '''
import errno, os
import reform_eval.evaluation.cache as cache_module

class FullDiskOS:
    writes = 0
    def __getattr__(self, name):
        return getattr(os, name)
    def write(self, fd, data):
        FullDiskOS.writes += 1
        if FullDiskOS.writes <= {room}:
            return os.write(fd, data)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
cache_module.os = FullDiskOS()
'''


def test_after_a_full_cache_disk_the_calls_in_flight_are_still_saved_in_the_shard(serve, tmp_path):  # noqa: F811
    """Review reproducer (``evaluation.window._Writer``): it was that once a write raised (the
    response cache's full disk, raised by ``cache.raise_failure`` AFTER the shard write
    succeeded), the writer dropped every later batch, so the calls in flight, answered and paid
    for, never reached the shard although the shard's disk is fine (docs/reliability.md: "No
    paid reply is thrown away")."""
    server = serve(lambda body, n: (0.05, 200, {}, ok_body()))
    cfg = dataset(tmp_path, 100)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "REFORM_NO_CACHE"}
    done = subprocess.run([sys.executable, _script(tmp_path, "full_cache.py", _FULL_CACHE.format(room=3)),
                           *args(server, cfg, out, "--model_option", "max_concurrency=8"),
                           "--cache_dir", str(tmp_path / "cache")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and "No space left on device" in done.stderr, done.stderr
    server.settled()  # (every reply the server gave is counted)
    assert 3 < len(server.answered) < 100
    assert len(saved(out)) == len(server.answered), (len(saved(out)), len(server.answered))


#: the window's 3rd shard write sends the run Ctrl-C, waits until the run is draining its writer
#: (the handlers of the drain are in place), and sends the second Ctrl-C while this write is under way
_SECOND_CTRL_C = '''
import os, signal, time
import reform_eval.utils.predictions as predictions

# Ctrl-C as at a terminal: a suite started in the background (`cmd &`) hands its children SIGINT
# ignored, and the run then never sees the signals this test sends (it ended with exit 0)
signal.signal(signal.SIGINT, signal.default_int_handler)

original = predictions.ShardWriter.write
calls = []
def write(self, records):
    calls.append(len(records))
    if len(calls) == 3:
        first = signal.getsignal(signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 60  # (only reached when the drain sets no handler: the bug)
        while signal.getsignal(signal.SIGINT) is first and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
    return original(self, records)
predictions.ShardWriter.write = write
'''


def test_a_second_ctrl_c_while_the_window_drains_its_writer_keeps_the_count_true(serve, tmp_path):  # noqa: F811
    """Review reproducer: the first Ctrl-C reaches the run in ``run_window``, whose except block
    drains the window's writer (a join on the writer thread). A second Ctrl-C there cut that join:
    the records already in ``done`` (a key is added when its record is QUEUED) were never written
    (the writer is a daemon thread, gone at exit), yet the one line counted them as saved.
    Pressing Ctrl-C twice is what a user does when the first one seems slow. The signals come
    from the writer itself, at fixed points: no timing decides the test."""
    server = serve(lambda body, n: (0.01, 200, {}, ok_body()))
    out = tmp_path / "out"
    argv = args(server, dataset(tmp_path, 400), out, "--model_option", "max_concurrency=8")
    done = subprocess.run([sys.executable, _script(tmp_path, "second_ctrl_c.py", _SECOND_CTRL_C), *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 130, done.stderr
    found = re.search(r"(\d+) of 400 samples are saved", done.stderr)
    assert found, done.stderr
    assert 0 < int(found.group(1)) == len(saved(out)) < 400, done.stderr


#: the first rank-shard write fails with a full disk (ENOSPC), the later ones succeed
_SHARD_FULL_ONCE = '''
import errno, os
import reform_eval.utils.predictions as predictions

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
'''


def test_after_a_failed_shard_write_no_later_turn_is_saved_without_the_turn_it_read(serve, tmp_path):  # noqa: F811
    """Review reproducer: a chat's next turn starts as soon as the turn it reads is QUEUED for the
    writer, so when that turn's batch fails on a full shard disk, a writer that went on writing
    saved turn 2 (whose history is turn 1's answer) without turn 1; the resume asked turn 1
    again, and the prediction file's turn-1 prediction differed from the answer turn 2's history
    shows (docs/reliability.md). After a failed write nothing more is written."""
    from tests.test_mmmt_if_run import write_mmdu
    server = serve(lambda body, n: (0.05, 200, {}, ok_body(f"answer number {n}")))
    cfg = write_mmdu(str(tmp_path / "mmdu"))
    out = tmp_path / "out"
    argv = ["--model", "openai_api", "--model_name", "gpt-test", "--dataset_name", "MMMT-IF", "--dataset_config",
            cfg, "--history", "model", "--max_new_tokens", "5", "--output_dir", str(out),
            "--model_option", f"base_url={server.url}", "--model_option", "max_retries=0",
            "--model_option", "max_concurrency=8"]
    first = subprocess.run([sys.executable, _script(tmp_path, "shard_full_once.py", _SHARD_FULL_ONCE), *argv],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 2 and "No space left on device" in first.stderr, first.stderr
    assert run_eval.main(argv) == 0
    records = json.load(open(prediction_files(out)[0]))
    by_id = {r["sample_id"]: r for r in records}
    assert len(by_id) == 30
    wrong = [(r["sample_id"], t["value"], by_id[t["source_sample_id"]]["prediction"])
             for r in records for t in r.get("history", []) if "source_sample_id" in t
             and t["value"] != by_id[t["source_sample_id"]]["prediction"]]
    assert not wrong, wrong[:3]
