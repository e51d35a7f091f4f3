"""Share of run_eval wall time spent outside model forward calls, on a fixed workload.

Workload: the 'bench' size random LLaVA (built offline once, before timing) on 64 generated
iWISDM 'low' trials, SingleChoice, generation with 8 new tokens and likelihood, batch size 4,
one process. run_eval records ``forward_s`` (time inside ``interface.forward``, which includes
the processor's image/text encoding), ``model_load_s`` and ``total_s`` in the run's results file.

    overhead_share = (total_s - model_load_s - forward_s) / (total_s - model_load_s)

Model loading is reported separately: it is a one-off cost of the checkpoint, not of the
harness. ``overhead_share`` is the larger of the two methods'.

Usage: ``python bench/overhead.py [--samples 64] [--size bench|tiny] [--smoke]``

Prints: overhead_share=<fraction>
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=64, help="iWISDM 'low' trials per run")
    ap.add_argument("--size", default="bench", choices=["tiny", "bench"], help="random LLaVA size (tiny: the test size)")
    ap.add_argument("--smoke", action="store_true", help="the tiny LLaVA on 4 trials: checks that the bench runs "
                    "(seconds), measures nothing")
    args = ap.parse_args()
    if args.smoke:
        args.samples, args.size = 4, "tiny"
    from reform_eval import run_eval
    from reform_eval.evaluation.reporting.scoring import prediction_files, results_paths
    from reform_eval.models.tiny import tiny_model_path
    tiny_model_path("llava", args.size)  # build outside the timed run
    rows = []
    for infer, extra in (("generation", ["--max_new_tokens", "8"]), ("likelihood", [])):
        with tempfile.TemporaryDirectory() as out:
            argv = ["--model", "llava", "--model_name", "tiny", "--model_option", f"tiny_size={args.size}",
                    "--dataset_name", "iWISDM", "--dataset_config", os.path.join(ROOT, "configs/datasets/iwisdm_low.yaml"),
                    "--formulation", "SingleChoice", "--infer_method", infer, "--dataset_subsample", str(args.samples),
                    "--per_gpu_eval_batch_size", "4", "--output_dir", out, "--do_eval", *extra]
            if run_eval.main(argv) != 0:
                raise SystemExit(f"run_eval failed: {' '.join(argv)}")
            (pred,) = prediction_files(out)
            with open(results_paths(pred)["json"], encoding="utf-8") as f:
                t = json.load(f)["timing"]
        harness = t["total_s"] - t["model_load_s"]
        share = (harness - t["forward_s"]) / harness
        rows.append((infer, t["total_s"], t["model_load_s"], t["forward_s"], share))
    print(f"{'method':<11} {'total_s':>8} {'load_s':>7} {'forward_s':>9} {'overhead':>8}")
    for infer, total, load, fwd, share in rows:
        print(f"{infer:<11} {total:8.2f} {load:7.2f} {fwd:9.2f} {share:8.3f}")
    worst = max(r[4] for r in rows)
    print(f"overhead_share={worst:.4f}")


if __name__ == "__main__":
    main()
