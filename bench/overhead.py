"""Share of run_eval wall time spent outside model forward calls, on a fixed workload.

Workload: the 'bench' size random LLaVA (built offline once, before timing) on 64 generated
iWISDM 'low' trials, SingleChoice, generation with 8 new tokens, batch size 4, one process.
run_eval records ``forward_s`` (time inside ``interface.forward``, which includes the
processor's image/text encoding), ``model_load_s`` and ``total_s`` in the run's results file.

    overhead_share = (total_s - model_load_s - forward_s) / (total_s - model_load_s)

Model loading is reported separately: it is a one-off cost of the checkpoint, not of the
harness. The last line is ``overhead_share=<fraction>``.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("REFORM_CACHE", os.path.join(ROOT, ".cache", "reform_eval"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    import run_eval
    from models.tiny import tiny_model_path
    tiny_model_path("llava", "bench")  # build outside the timed run
    rows = []
    for infer, extra in (("generation", ["--max_new_tokens", "8"]), ("likelihood", [])):
        with tempfile.TemporaryDirectory() as out:
            args = ["--model", "llava", "--model_name", "tiny", "--model_option", "tiny_size=bench",
                    "--dataset_name", "iWISDM", "--dataset_config", os.path.join(ROOT, "configs/datasets/iwisdm_low.yaml"),
                    "--formulation", "SingleChoice", "--infer_method", infer, "--dataset_subsample", "64",
                    "--per_gpu_eval_batch_size", "4", "--output_dir", out, "--do_eval", *extra]
            assert run_eval.main(args) == 0
            from evaluation.reporting.scoring import results_paths
            pred = [f for f in os.listdir(out) if f.startswith("iWISDM_") and f.count(".") == 1][0]
            t = json.load(open(results_paths(os.path.join(out, pred))["json"]))["timing"]
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
