"""Goodput of the ``openai_api`` client against a rate-limited endpoint: adaptive concurrency
versus fixed concurrency 1 and fixed concurrency 16.

Why: shared endpoints rate-limit; a client that sends one request at a time wastes the rate
it is allowed, and one that sends 16 at a time is answered 429 for most of them and retries.
The adaptive client (AIMD on the requests in flight, ``Retry-After`` honoured) should get near
the limit with few rejections.

The server is a loopback ``http.server`` that answers a request after ``--latency`` seconds
while a token bucket of ``--rate`` requests/s (burst ``--burst``) has a token, and answers
429 with ``Retry-After`` (the seconds until the next token) otherwise. Each mode sends the
same ``--requests`` requests as one batch through ``OpenAIAPIInterface.raw_batch_generate``.
Goodput = answered requests / wall seconds. Bounded: each mode stops its server after
``--mode_timeout`` s (the client then gives up), and the whole bench takes well under 60 s.

Usage: python bench/api_concurrency.py [--rate 40] [--latency 0.05] [--requests 120] [--smoke]

Prints: adaptive_rps=... fixed1_rps=... fixed16_rps=... adaptive_vs_fixed1=...
adaptive_vs_fixed16=... adaptive_429=... fixed16_429=...
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reform_eval.models import get_model  # noqa: E402
from reform_eval.utils.errors import ReformError  # noqa: E402


class RateLimitedServer:
    """Chat-completions on 127.0.0.1 behind a token bucket; counts answers and 429s."""

    def __init__(self, rate: float, burst: float, latency: float) -> None:
        self.rate, self.burst, self.latency = rate, burst, latency
        self.tokens, self.stamp = burst, time.monotonic()
        self.answered = self.rejected = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                wait = outer.take()
                if wait:
                    self._reply(429, {"error": {"message": "rate limit"}}, {"Retry-After": f"{wait:.3f}"})
                    return
                time.sleep(outer.latency)
                self._reply(200, {"choices": [{"message": {"content": "ok"}}],
                                  "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})

            def _reply(self, code: int, obj: Dict[str, Any], headers: Dict[str, str] = None) -> None:
                payload = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        class Httpd(ThreadingHTTPServer):
            request_queue_size = 128
            daemon_threads = True

        self.httpd = Httpd(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def take(self) -> float:
        """0 when a token was taken (the request is answered), else the seconds to the next token."""
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= 1:
                self.tokens -= 1
                self.answered += 1
                return 0.0
            self.rejected += 1
            return max(0.001, (1 - self.tokens) / self.rate)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def run_mode(args: argparse.Namespace, concurrency: int, adaptive: bool) -> Tuple[float, int, int]:
    """(goodput requests/s, requests answered, 429s) of one client mode on a fresh server."""
    srv = RateLimitedServer(args.rate, args.burst, args.latency)
    timer = threading.Timer(args.mode_timeout, srv.close)  # a stuck mode ends: the client gives up
    timer.start()
    try:
        model, _ = get_model("openai_api", {
            "model_name": "bench", "base_url": srv.url, "max_concurrency": concurrency,
            "adaptive_concurrency": adaptive, "max_retries": 100, "backoff_base": 0.01, "backoff_max": 1.0,
            "timeout": 5.0})
        prompts = [f"q{i}" for i in range(args.requests)]
        t0 = time.perf_counter()
        try:
            out = model.raw_batch_generate([[] for _ in prompts], prompts)
            done = len(out)
        except ReformError as e:
            print(f"  gave up: {e}", file=sys.stderr)
            done = 0
        seconds = time.perf_counter() - t0
        return done / seconds, srv.answered, srv.rejected
    finally:
        timer.cancel()
        srv.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=40.0, help="requests/s the server allows")
    ap.add_argument("--burst", type=float, default=4.0, help="token-bucket capacity")
    ap.add_argument("--latency", type=float, default=0.05, help="seconds per answered request")
    ap.add_argument("--requests", type=int, default=120, help="requests per mode")
    ap.add_argument("--mode_timeout", type=float, default=15.0, help="seconds before a mode is cut off")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (12 requests), seconds: checks that the "
                    "bench runs, measures nothing")
    args = ap.parse_args()
    if args.smoke:
        args.requests, args.mode_timeout = 12, 10.0
    logging.basicConfig(level=logging.ERROR)  # the client's per-retry warnings would flood the output
    results = {}
    for name, conc, adaptive in (("adaptive", 16, True), ("fixed1", 1, False), ("fixed16", 16, False)):
        rps, answered, rejected = run_mode(args, conc, adaptive)
        results[name] = (rps, rejected)
        print(f"{name}: {rps:.1f} answered requests/s, {rejected} rejected (429) "
              f"[rate limit {args.rate:g}/s, latency {args.latency * 1000:g} ms]", flush=True)
    a, f1, f16 = (results[k][0] for k in ("adaptive", "fixed1", "fixed16"))
    print(f"adaptive_rps={a:.1f} fixed1_rps={f1:.1f} fixed16_rps={f16:.1f} "
          f"adaptive_vs_fixed1={a / f1:.2f} adaptive_vs_fixed16={a / f16:.2f} "
          f"adaptive_429={results['adaptive'][1]} fixed16_429={results['fixed16'][1]}")


if __name__ == "__main__":
    main()
