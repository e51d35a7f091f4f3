"""What a start costs: CPU seconds of ``--help`` and of a small endpoint run, whole commands.

Why: a typo in a flag must be told at once, and a baseline, an endpoint run or offline scoring
must not pay for torch and transformers they never use (issue 24: ``run_eval.py --help`` cost
about 7 CPU seconds, a 2,000-request endpoint run 8.8). Each command runs in a fresh
interpreter with bytecode caching on (a user's second run), and its CPU time (user + system,
children included) is read from the operating system. The endpoint run sends ``--requests``
requests to a loopback server (``bench/api_ceiling.py``'s, in a child process).

Usage: python bench/startup.py [--requests 200] [--repeats 3]
       python bench/startup.py --smoke      (tiny sizes, seconds)
Prints: help_cpu_s=... loader_help_cpu_s=... api_run_cpu_s=... api_run_s=...
Target (issue 24): help_cpu_s < 1.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from api_ceiling import Server, write_dataset  # noqa: E402  (the same server and data as the ceiling bench)


def cpu_of(argv: List[str]) -> Tuple[float, float]:
    """(CPU seconds, wall seconds) of one command in a fresh interpreter."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:2])} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def best(argv: List[str], repeats: int) -> Tuple[float, float]:
    """The cheapest of ``repeats`` runs (a shared machine only ever adds to a run's cost)."""
    runs = [cpu_of(argv) for _ in range(repeats)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="Last line: help_cpu_s loader_help_cpu_s api_run_cpu_s api_run_s")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): checks the bench runs")
    args = p.parse_args(argv)
    if args.smoke:
        args.requests, args.repeats = 10, 1
    cpu_of([os.path.join(ROOT, "run_eval.py"), "--help"])  # writes the bytecode once, as any first run does
    help_cpu, _ = best([os.path.join(ROOT, "run_eval.py"), "--help"], args.repeats)
    loader_cpu, _ = best([os.path.join(ROOT, "run_loader_eval.py"), "--help"], args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = write_dataset(os.path.join(tmp, "data"), args.requests)
        server = Server("zero", lifetime=600)
        try:
            runs = []
            for k in range(args.repeats):
                runs.append(cpu_of([os.path.join(ROOT, "run_eval.py"), "--model", "openai_api", "--model_name", "bench",
                                    "--model_option", f"base_url={server.url}", "--dataset_name", "custom",
                                    "--formulation", "Generation", "--dataset_config", cfg,
                                    "--output_dir", os.path.join(tmp, f"out{k}"), "--no_cache", "--do_eval"]))
        finally:
            server.stop()
    api_cpu, api_wall = min(r[0] for r in runs), min(r[1] for r in runs)
    print(f"run_eval --help {help_cpu:.2f} CPU s; run_loader_eval --help {loader_cpu:.2f} CPU s; "
          f"an endpoint run of {args.requests} requests with --do_eval: {api_cpu:.2f} CPU s, {api_wall:.2f} s")
    print(f"help_cpu_s={help_cpu:.2f} loader_help_cpu_s={loader_cpu:.2f} api_run_cpu_s={api_cpu:.2f} "
          f"api_run_s={api_wall:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
