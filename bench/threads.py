"""CPU threads and ranks: samples/s of one run_eval at 1, 2 and the default ("auto") threads,
and of torchrun with 2 ranks, on the bench-size LLaVA (identical predictions checked).

Each configuration is a whole ``run_eval`` command (model load included, as a user runs it),
run in turn, best of ``--reps``; the prediction files must be identical across configurations.
A warm-up run comes first (it builds the bench-size checkpoint on first use: minutes), and a line
is printed as each run ends, so a long bench shows where it is.

Usage: ``python bench/threads.py [--samples 40] [--reps 2] [--size bench|tiny] [--smoke]``

Prints: threads1_sps=... threads2_sps=... auto_sps=... ranks2_sps=... ranks2_vs_threads1=...
same_predictions=1 max_logprob_diff=...
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from reform_eval.evaluation.reporting.scoring import prediction_files  # noqa: E402


def run(argv: List[str], out: str, threads: Optional[int], ranks: int = 1) -> float:
    env = dict(os.environ, REFORM_NO_CACHE="1")
    env.pop("OMP_NUM_THREADS", None)
    env.pop("REFORM_CPU_THREADS", None)
    if threads is not None:
        env["REFORM_CPU_THREADS"] = str(threads)
    if ranks == 1:
        cmd = [sys.executable, os.path.join(ROOT, "run_eval.py"), *argv]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               os.path.join(ROOT, "run_eval.py"), *argv]
    t0 = time.perf_counter()
    done = subprocess.run([*cmd, "--output_dir", out, "--overwrite"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--size", default="bench", choices=["tiny", "bench"], help="random LLaVA size (tiny: the test size)")
    ap.add_argument("--smoke", action="store_true", help="the tiny LLaVA, 4 samples, one repetition, no warm-up: "
                    "checks that the bench runs, measures nothing")
    args = ap.parse_args()
    if args.smoke:
        args.samples, args.reps, args.size = 4, 1, "tiny"
    argv = ["--model", "llava", "--model_name", "tiny", "--model_option", f"tiny_size={args.size}",
            "--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low", "--dataset_subsample", str(args.samples),
            "--infer_method", "likelihood", "--per_gpu_eval_batch_size", "4"]
    configs: Dict[str, Dict[str, Optional[int]]] = {
        "threads1": {"threads": 1, "ranks": 1}, "threads2": {"threads": 2, "ranks": 1},
        "auto": {"threads": None, "ranks": 1}, "ranks2": {"threads": None, "ranks": 2}}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.smoke:
            print(f"warm-up run (builds the {args.size} checkpoint on first use) ...", flush=True)
            t = run(argv, os.path.join(tmp, "warm"), 1)
            print(f"warm-up    {t:7.1f} s", flush=True)
        best: Dict[str, float] = {}
        files: Dict[str, bytes] = {}
        for rep in range(args.reps):
            for name, c in configs.items():
                out = os.path.join(tmp, name)
                t = run(argv, out, c["threads"], int(c["ranks"] or 1))
                print(f"{name:10s} {t:7.1f} s  (repetition {rep + 1} of {args.reps})", flush=True)
                best[name] = min(best.get(name, t), t)
                (pred,) = prediction_files(out)
                with open(pred, "rb") as f:
                    files[name] = f.read()
    sps = {k: args.samples / v for k, v in best.items()}
    for k, v in best.items():
        print(f"{k:10s} {v:7.1f} s  {sps[k]:6.2f} samples/s")
    recs = {k: json.loads(v) for k, v in files.items()}
    ref = recs["threads1"]
    # thread count changes the order of float reductions: the chosen answers must agree, the stored
    # log-probabilities agree to float rounding
    identical = int(all([r["prediction"] for r in v] == [r["prediction"] for r in ref] for v in recs.values()))
    max_diff = max(abs(a - b) for v in recs.values() for r, q in zip(v, ref)
                   for a, b in zip(r.get("candidate_logprobs", []), q.get("candidate_logprobs", [])))
    print(f"threads1_sps={sps['threads1']:.2f} threads2_sps={sps['threads2']:.2f} auto_sps={sps['auto']:.2f} "
          f"ranks2_sps={sps['ranks2']:.2f} ranks2_vs_threads1={sps['ranks2'] / sps['threads1']:.2f} "
          f"same_predictions={identical} max_logprob_diff={max_diff:.2e}")


if __name__ == "__main__":
    main()
