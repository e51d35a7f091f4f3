"""The response cache on an MME run with one edited item: requests made, and time against a cold run.

A placeholder MME release (every subtask, or ``--subtasks``) is evaluated three times with the
same cache directory: cold (every call runs the model), after editing one question (only that
call runs), and re-scored (nothing runs). The model is the tiny LLaVA (``--model_name tiny``)
generating ``--max_new_tokens`` tokens; requests made = cache misses as the results file
records them.

Usage: ``python bench/cache.py [--subtasks existence OCR] [--max_new_tokens 8] [--smoke]``

Prints: cold_requests=... edited_requests=... rescore_requests=... cold_s=... edited_s=... speedup=...
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time
from typing import List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from reform_eval import run_eval  # noqa: E402
from reform_eval.build.mme import shipped_questions, write_placeholder_release  # noqa: E402
from reform_eval.evaluation.reporting.scoring import prediction_files, results_paths  # noqa: E402


def run(argv: List[str], out: str) -> Tuple[float, dict]:
    t0 = time.perf_counter()
    assert run_eval.main([*argv, "--output_dir", out]) == 0
    took = time.perf_counter() - t0
    (pred,) = prediction_files(out)
    with open(results_paths(pred)["json"], encoding="utf-8") as f:
        return took, json.load(f).get("response_cache", {"hits": 0, "misses": 0})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--subtasks", nargs="*", default=None)
    ap.add_argument("--max_new_tokens", type=int, default=8)
    ap.add_argument("--smoke", action="store_true", help="one subtask (existence: 60 questions), 2 new tokens: "
                    "checks that the bench runs (seconds), measures nothing")
    args = ap.parse_args()
    if args.smoke:
        args.subtasks, args.max_new_tokens = ["existence"], 2
    os.environ.pop("REFORM_NO_CACHE", None)
    with tempfile.TemporaryDirectory() as tmp:
        release = write_placeholder_release(shipped_questions(),
                                            os.path.join(tmp, "release"), subtasks=args.subtasks)
        cfg = os.path.join(tmp, "mme.yaml")
        with open(cfg, "w", encoding="utf-8") as f:
            f.write("root: release\n" + (f"subtasks: [{', '.join(args.subtasks)}]\n" if args.subtasks else ""))
        argv = ["--model", "llava", "--model_name", "tiny", "--dataset_name", "MME", "--dataset_config", cfg,
                "--max_new_tokens", str(args.max_new_tokens), "--per_gpu_eval_batch_size", "8",
                "--cache_dir", os.path.join(tmp, "cache"), "--do_eval"]
        cold_s, cold = run(argv, os.path.join(tmp, "cold"))
        # edit one question of one image
        qfile = sorted(glob.glob(os.path.join(release, "existence", "*.txt")) or
                       glob.glob(os.path.join(release, "*", "*.txt")))[0]
        with open(qfile, encoding="utf-8") as f:
            lines = f.read().splitlines()
        lines[0] = lines[0].replace("?", " here?", 1)
        with open(qfile, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        edited_s, edited = run(argv, os.path.join(tmp, "edited"))
        _, rescored = run(argv, os.path.join(tmp, "edited"))  # the same command again: predictions reused
    rescore_requests = rescored.get("misses", 0)  # a reused prediction file asks nothing: no cache entry at all
    print(f"cold: {cold}  edited: {edited}")
    print(f"cold_requests={cold['misses']} edited_requests={edited['misses']} rescore_requests={rescore_requests} "
          f"cold_s={cold_s:.1f} edited_s={edited_s:.1f} speedup={cold_s / edited_s:.1f}")


if __name__ == "__main__":
    main()
