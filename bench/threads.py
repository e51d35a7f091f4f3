"""CPU threads: one run_eval at 1 thread, 2 threads and the default ("auto"), quiet and beside
one CPU hog (a busy loop on one core), on the bench-size LLaVA (identical predictions checked).

Each configuration is a whole ``run_eval`` command (model load included, as a user runs it),
run in turn, best of ``--reps``; the prediction files must be identical across configurations.
The quiet rounds also run torchrun with 2 ranks. A warm-up run comes first (it builds the
bench-size checkpoint on first use: minutes), and a line is printed as each run ends.

Usage: ``python bench/threads.py [--samples 40] [--reps 2] [--size bench|tiny] [--smoke]``

Prints: quiet_threads1_s=... quiet_threads2_s=... quiet_auto_s=... quiet_auto_threads=...
hog_threads1_s=... hog_threads2_s=... hog_auto_s=... hog_auto_threads=... ranks2_s=...
quiet_auto_vs_best=... hog_auto_vs_threads1=... same_predictions=1 max_logprob_diff=...
(targets, issue 30: hog_auto_vs_threads1 <= 1.2, quiet_auto_vs_best <= 1.1; wall seconds)
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


def hog(smoke: bool = False) -> subprocess.Popen:
    """One busy loop on one core: another program on a shared machine. A smoke run's hog sleeps
    (started and stopped as the real one, but it takes no core from the programs beside the smoke
    run, such as the other tests of the suite)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)" if smoke else "while True: pass"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--size", default="bench", choices=["tiny", "bench"], help="random LLaVA size (tiny: the test size)")
    ap.add_argument("--smoke", action="store_true", help="the tiny LLaVA, 4 samples, one repetition, no warm-up, a hog that "
                    "sleeps: checks that the bench runs, measures nothing")
    args = ap.parse_args()
    if args.smoke:
        args.samples, args.reps, args.size = 4, 1, "tiny"
    argv = ["--model", "llava", "--model_name", "tiny", "--model_option", f"tiny_size={args.size}",
            "--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low", "--dataset_subsample", str(args.samples),
            "--infer_method", "likelihood", "--per_gpu_eval_batch_size", "4"]
    configs: Dict[str, Dict[str, Optional[int]]] = {
        "threads1": {"threads": 1, "ranks": 1}, "threads2": {"threads": 2, "ranks": 1},
        "auto": {"threads": None, "ranks": 1}}
    best: Dict[str, float] = {}
    chosen: Dict[str, int] = {}
    files: Dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.smoke:
            print(f"warm-up run (builds the {args.size} checkpoint on first use) ...", flush=True)
            t = run(argv, os.path.join(tmp, "warm"), 1)
            print(f"warm-up    {t:7.1f} s", flush=True)
        for rep in range(args.reps):
            for cond in ("quiet", "hog"):
                busy = hog(args.smoke) if cond == "hog" else None
                try:
                    todo = dict(configs, **({"ranks2": {"threads": None, "ranks": 2}} if cond == "quiet" else {}))
                    for name, c in todo.items():
                        key = name if name == "ranks2" else f"{cond}_{name}"
                        out = os.path.join(tmp, key)
                        t = run(argv, out, c["threads"], int(c["ranks"] or 1))
                        print(f"{key:16s} {t:7.1f} s  (repetition {rep + 1} of {args.reps})", flush=True)
                        best[key] = min(best.get(key, t), t)
                        (pred,) = prediction_files(out)
                        with open(pred, "rb") as f:
                            files[key] = f.read()
                        with open(pred[:-len(".json")] + ".run.json", encoding="utf-8") as f:
                            chosen[key] = json.load(f).get("timing", {}).get("cpu_threads", 0)
                finally:
                    if busy is not None:
                        busy.kill()
                        busy.wait()
    recs = {k: json.loads(v) for k, v in files.items()}
    ref = recs["quiet_threads1"]
    # thread count changes the order of float reductions: the chosen answers must agree, the stored
    # log-probabilities agree to float rounding
    identical = int(all([r["prediction"] for r in v] == [r["prediction"] for r in ref] for v in recs.values()))
    max_diff = max(abs(a - b) for v in recs.values() for r, q in zip(v, ref)
                   for a, b in zip(r.get("candidate_logprobs", []), q.get("candidate_logprobs", [])))
    quiet_best = min(best[f"quiet_{n}"] for n in configs)
    print(" ".join(f"{k}_s={v:.1f}" for k, v in best.items()) +
          f" quiet_auto_threads={chosen['quiet_auto']} hog_auto_threads={chosen['hog_auto']}"
          f" quiet_auto_vs_best={best['quiet_auto'] / quiet_best:.2f}"
          f" hog_auto_vs_threads1={best['hog_auto'] / best['hog_threads1']:.2f}"
          f" same_predictions={identical} max_logprob_diff={max_diff:.2e}")


if __name__ == "__main__":
    main()
