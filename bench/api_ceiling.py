"""The ``openai_api`` client against the loopback limit: ``run_eval`` versus a plain client.

Why: researchers send benchmarks to vLLM / SGLang servers; the harness must never be what
limits such a run. A loopback OpenAI-compatible server (a child process, asyncio, HTTP/1.1
keep-alive) answers in one of two modes: ``zero`` (at once) and ``varied`` (90% of replies
after 10 ms, 10% after 300 ms, as replies of different lengths are). The same N requests (one
32x32 PNG and a question each) are sent two ways, side by side in one run:

* a plain client: a continuous pool of C threads, each with one keep-alive ``http.client``
  connection, serialising the next request (the image encoded once beforehand) as soon as
  its reply is read, and parsing each reply's JSON;
* ``run_eval --model openai_api --model_option max_concurrency=C --per_gpu_eval_batch_size 64``
  (no response cache; ``client_processes`` at its default, ``auto``): requests/s of its
  inference phase (the run's ``timing.inference_s``), and the whole command's wall and CPU time
  (start-up, data, scoring and its client processes included).

At C = 32 and 128, in both modes; each pair is measured ``--repeats`` times, interleaved, and the
best of each side is kept (on a shared machine a run can only be slowed, never sped up, by its
neighbours). Targets (issue 24): ratio >= 0.8 at 32 and >= 0.7 at 128.

Usage: python bench/api_ceiling.py [--requests 2000] [--concurrency 32 128] [--modes zero varied]
       python bench/api_ceiling.py --smoke      (tiny sizes, seconds)
Prints: plain_rps=... harness_rps=... ratio=... whole_command_s=... cpu_ms_per_request=... min_ratio_c32=... min_ratio_c128=...
one_process_ratio_zero=...
(the first five for the varied mode at the first concurrency; min_ratio_c<C> over both modes;
the last: the zero-latency ratio at the first concurrency in one client process, the ceiling
of one interpreter lock, which the default client processes lift)
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import io
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPLY = {"id": "x", "object": "chat.completion", "model": "bench",
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "A"}, "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21}}


# -- the server (a child process) ------------------------------------------------------------
def serve(mode: str, lifetime: float) -> None:
    """Chat completions on 127.0.0.1 (port printed on stdout) until killed or ``lifetime`` ends."""
    body = json.dumps(REPLY).encode()
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n")
    rng = random.Random(0)
    count = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                headers = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in headers.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                if length:
                    await reader.readexactly(length)
                count[0] += 1
                if mode == "varied":
                    await asyncio.sleep(0.3 if rng.random() < 0.1 else 0.01)
                writer.write(head + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024, limit=1 << 22)
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.sleep(lifetime)

    asyncio.run(main())


class Server:
    """The child server process, stopped by PID."""

    def __init__(self, mode: str, lifetime: float) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", mode,
                                      "--lifetime", str(lifetime)], stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=10)


# -- the data and the two clients -------------------------------------------------------------
def png_32() -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 40, 40)).save(buf, format="PNG")
    return buf.getvalue()


def write_dataset(directory: str, n: int) -> str:
    """n items, each one 32x32 PNG of its own and a question (custom format, Generation)."""
    os.makedirs(directory, exist_ok=True)
    png = png_32()
    with open(os.path.join(directory, "items.jsonl"), "w") as f:
        for i in range(n):
            name = f"img{i}.png"
            with open(os.path.join(directory, name), "wb") as g:
                g.write(png)
            f.write(json.dumps({"sample_id": f"q{i}", "images": [name], "question": f"What colour is image {i}?",
                                "answer": "red"}) + "\n")
    with open(os.path.join(directory, "custom.yaml"), "w") as f:
        f.write("data_file: items.jsonl\n")
    return os.path.join(directory, "custom.yaml")


def plain_client(port: int, n: int, concurrency: int) -> float:
    """Requests/s of a continuous pool of keep-alive http.client threads over n requests."""
    url = "data:image/png;base64," + base64.b64encode(png_32()).decode()  # encoded once, as the harness does

    def body(i: int) -> bytes:  # each request serialised when it is sent, as any client does
        return json.dumps({"model": "bench", "max_tokens": 8, "temperature": 0.0, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": f"What colour is image {i}?"}]}]}).encode()
    nxt = iter(range(n))
    lock = threading.Lock()
    errors: List[str] = []

    def work() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                break
            try:
                conn.request("POST", "/v1/chat/completions", body=body(i),
                             headers={"Content-Type": "application/json"})
                json.loads(conn.getresponse().read())
            except (OSError, http.client.HTTPException) as e:
                errors.append(str(e))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.close()

    threads = [threading.Thread(target=work) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"plain client: {len(errors)} failed requests (first: {errors[0]})")
    return n / elapsed


def harness(url: str, cfg: str, out: str, concurrency: int, n: int, processes: str = "auto") -> Tuple[float, float, float]:
    """(inference requests/s, whole command s, CPU ms per request, its client processes included)
    of one cold run_eval."""
    argv = [sys.executable, os.path.join(ROOT, "run_eval.py"), "--model", "openai_api", "--model_name", "bench",
            "--model_option", f"base_url={url}", "--model_option", f"max_concurrency={concurrency}",
            "--model_option", f"client_processes={processes}",
            "--model_option", "max_retries=0", "--per_gpu_eval_batch_size", "64", "--dataset_name", "custom",
            "--formulation", "Generation", "--dataset_config", cfg, "--output_dir", out, "--no_cache",
            "--max_new_tokens", "8"]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    whole = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"run_eval failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    info = [f for f in os.listdir(out) if f.endswith(".run.json")]
    with open(os.path.join(out, info[0]), encoding="utf-8") as f:
        timing = json.load(f)["timing"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return n / timing["inference_s"], whole, 1000.0 * cpu / n


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="Last line: plain_rps harness_rps ratio whole_command_s cpu_ms_per_request "
                                       "min_ratio_c<C> (see the module docstring)")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3, help="measurements of each side (the best is kept)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[32, 128])
    p.add_argument("--modes", nargs="+", default=["zero", "varied"], choices=["zero", "varied"])
    p.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): checks the bench runs")
    p.add_argument("--serve", choices=["zero", "varied"], help=argparse.SUPPRESS)
    p.add_argument("--lifetime", type=float, default=600.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve, args.lifetime)
        return 0
    if args.smoke:
        args.requests, args.concurrency, args.repeats = 60, [4, 8], 1
    n = args.requests
    results: Dict[Tuple[str, int], Dict[str, float]] = {}
    one_process = float("nan")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = write_dataset(os.path.join(tmp, "data"), n)
        # warm the bytecode and the file-hash memo once, so both clients meet the same machine
        for mode in args.modes:
            server = Server(mode, lifetime=900)
            try:
                # a warm-up run (not timed): bytecode and the file-hash memo, as a second run of a user has
                harness(server.url, cfg, os.path.join(tmp, f"warm-{mode}"), args.concurrency[0], n)
                for c in args.concurrency:
                    plain = rps = 0.0
                    for rep in range(args.repeats):
                        plain = max(plain, plain_client(server.port, n, c))
                        got = harness(server.url, cfg, os.path.join(tmp, f"{mode}-{c}-{rep}"), c, n)
                        if got[0] > rps:
                            rps, whole, cpu_ms = got
                    results[(mode, c)] = {"plain": plain, "harness": rps, "ratio": rps / plain, "whole": whole,
                                          "cpu_ms": cpu_ms}
                    print(f"{mode:6s} c={c:<4d} plain {plain:8.1f} rps  run_eval {rps:8.1f} rps  ratio {rps / plain:.2f}"
                          f"  whole command {whole:.2f} s  {cpu_ms:.2f} CPU ms/request", flush=True)
                    if mode == "zero" and c == args.concurrency[0]:  # the same, in one client process
                        one = max(harness(server.url, cfg, os.path.join(tmp, f"{mode}-{c}-one-{rep}"), c, n, "1")[0]
                                  for rep in range(args.repeats))
                        one_process = one / plain
                        print(f"{mode:6s} c={c:<4d} run_eval in one client process {one:8.1f} rps  ratio "
                              f"{one_process:.2f}", flush=True)
            finally:
                server.stop()
    head = results.get(("varied", args.concurrency[0])) or results[(args.modes[0], args.concurrency[0])]
    mins = " ".join(f"min_ratio_c{c}={min(results[(m, c)]['ratio'] for m in args.modes):.2f}" for c in args.concurrency)
    if args.smoke:  # the keys the docstring names, whatever the smoke concurrencies are
        mins = f"min_ratio_c32={min(r['ratio'] for r in results.values()):.2f} " \
               f"min_ratio_c128={min(r['ratio'] for r in results.values()):.2f}"
    extra = f" one_process_ratio_zero={one_process:.2f}" if "zero" in args.modes else ""
    print(f"plain_rps={head['plain']:.1f} harness_rps={head['harness']:.1f} ratio={head['ratio']:.2f} "
          f"whole_command_s={head['whole']:.2f} cpu_ms_per_request={head['cpu_ms']:.2f} {mins}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
