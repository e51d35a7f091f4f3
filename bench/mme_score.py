"""Time to score the full MME set (2,374 questions) from a prediction file.

Why: the issue asks that scoring from a prediction file take well under a second. The
records come from the official question lists (no images needed) with seeded responses of
varied form (plain, punctuated, multi-line, hedged), written as one JSON prediction file;
each repeat runs the offline path of ``run_loader_eval`` (read the file, parse, aggregate,
format the table) without writing results. The official results folder is timed as well.

Usage: ``python bench/mme_score.py [--questions DIR] [--repeats 5] [--smoke]``

Prints: mme_score_seconds=<median seconds>
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reform_eval.build.mme import shipped_questions  # noqa: E402
from reform_eval.utils.errors import ReformError, input_error  # noqa: E402

logger = logging.getLogger(__name__)

RESPONSES = ["Yes", "No", "yes.", "No, there is not.", "  yes", "Yes\nThe image shows it.", "not sure",
             "The answer is yes", "", "I think no"]


def make_prediction_file(questions: str, workdir: str) -> str:
    """Our prediction file for all 2,374 questions, from the question lists."""
    from reform_eval.build.mme import read_question_lists
    from reform_eval.metrics.mme import read_official_results
    from reform_eval.utils.predictions import write_json_atomic
    rng = random.Random(0)
    res_dir = os.path.join(workdir, "official")
    os.makedirs(res_dir)
    lists = read_question_lists(questions)
    if not lists:
        raise input_error("no <subtask>.txt question lists", file=questions)
    for sub, rows in lists.items():
        with open(os.path.join(res_dir, f"{sub}.txt"), "w", encoding="utf-8") as f:
            f.write("".join(f"{img}\t{q}\t{gt}\tx\n" for _n, img, q, gt in rows))
    records = read_official_results(res_dir)
    for r in records:
        r["prediction"] = rng.choice(RESPONSES)
        r["image_ids"] = [f"{r['meta']['subtask']}/{r['meta']['image']}"]
    path = os.path.join(workdir, "MME_Generation_generation_bench.json")
    write_json_atomic(path, records)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", default=shipped_questions(),
                    help="folder of the official <subtask>.txt lists (default: the shipped configs/data/mme_questions)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="one repeat: checks that the bench runs (seconds), "
                    "measures little")
    args = ap.parse_args()
    if args.smoke:
        args.repeats = 1
    logging.basicConfig(level=logging.WARNING)
    from reform_eval.metrics.mme import write_official_results
    from reform_eval.run_loader_eval import loader_eval
    from reform_eval.utils.predictions import read_predictions

    with tempfile.TemporaryDirectory() as work:
        try:
            pred = make_prediction_file(args.questions, work)
        except ReformError as e:  # a --questions folder without the lists: one line, no traceback
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        official = os.path.join(work, "exported")
        loader_eval(pred, write=False, quiet=True)  # warm imports
        times, dir_times = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            res = loader_eval(pred, write=False, quiet=True)
            times.append(time.perf_counter() - t0)
        write_official_results(read_predictions(pred), official)
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            res2 = loader_eval(official, dataset_name="MME", write=False, quiet=True)
            dir_times.append(time.perf_counter() - t0)
        m, m2 = res["metrics"], res2["metrics"]
        assert m["num_records"] == 2374 and m2["num_records"] == 2374
        assert abs(m["perception_score"] - m2["perception_score"]) < 1e-9
        print(f"records={m['num_records']} perception={m['perception_score']:.2f} "
              f"cognition={m['cognition_score']:.2f} other={m['other_num']}")
        print(f"prediction file: median {statistics.median(times):.4f}s min {min(times):.4f}s "
              f"over {args.repeats} runs")
        print(f"official results folder: median {statistics.median(dir_times):.4f}s min {min(dir_times):.4f}s")
        print(f"mme_score_seconds={statistics.median(times):.4f}")


if __name__ == "__main__":
    main()
