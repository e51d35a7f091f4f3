"""What the known-skill model (``--model_name tiny-trained``, evaluation/training.py) can do, on
held-out trials (the shipped configs' seed 0; training used other seeds), through the harness
as a user runs it (``evaluation.evaluate``, the same records and scorers).

Measures: SingleChoice likelihood accuracy on single-frame category and location identification
(chance 1/8 and 1/4); generation format hit rate and accuracy on the same trials; single-frame
true/false against a named category or location (likelihood, chance 1/2); MME-style acc and acc+
on the synthetic yes/no set; accuracy at the three iWISDM levels (likelihood).

The known-skill targets (issue 26), each 1 when the measured values reach it:
``target_yesno`` (acc >= 0.8 and acc+ >= 0.6), ``target_single_frame`` (category and location
true/false each >= 0.75, chance 0.5), ``target_levels`` (acc_low > acc_medium > acc_high and
acc_low >= 0.6, chance 0.5); ``targets_met`` counts them.

Usage: ``python bench/known_skill.py [--trials 200] [--model_name tiny-trained] [--smoke]``
(``--model_name`` may also be a checkpoint folder, e.g. an earlier round's weights.)

Prints: category_lik_acc=... location_lik_acc=... gen_format_hit_rate=... gen_acc=...
sf_category_acc=... sf_location_acc=... yesno_acc=... yesno_acc_plus=... acc_low=... acc_medium=...
acc_high=... target_yesno=... target_single_frame=... target_levels=... targets_met=...
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any, Dict, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from reform_eval.build.mme_synthetic import write_yesno_release  # noqa: E402
from reform_eval.evaluation import (DatasetConfig, GenerationConfig, ModelConfig, OutputConfig, RunConfig,  # noqa: E402
                        ScoringConfig, evaluate)


def run(model_name: str, out: str, dataset: str, config: Optional[str], method: str, formulation: str,
        options: Optional[Dict[str, Any]] = None, subsample: Optional[int] = None) -> Dict[str, Any]:
    """One evaluation's headline metrics."""
    cfg = RunConfig(model=ModelConfig("llava", model_name),
                    dataset=DatasetConfig(dataset, formulation=formulation, config=config, options=options or {},
                                          subsample=subsample),
                    generation=GenerationConfig(infer_method=method, batch_size=8, max_new_tokens=6),
                    scoring=ScoringConfig(do_eval=True),
                    output=OutputConfig(output_dir=out, use_cache=False, overwrite=True))
    return evaluate(cfg).metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=200, help="held-out trials per iWISDM task")
    ap.add_argument("--yesno_images", type=int, default=100, help="images per yes/no subtask (2 questions each)")
    ap.add_argument("--model_name", default="tiny-trained")
    ap.add_argument("--smoke", action="store_true", help="8 trials and 4 yes/no images: checks that the bench "
                    "runs (seconds), measures nothing")
    args = ap.parse_args()
    if args.smoke:
        args.trials, args.yesno_images = 8, 4
    n = {"n_trials": args.trials}
    line: Dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        for feat in ("category", "location"):
            m = run(args.model_name, out, "iWISDM", f"iwisdm_identify_{feat}", "likelihood", "SingleChoice", n)
            line[f"{feat}_lik_acc"] = m["accuracy"]
            print(f"identify_{feat:9s} likelihood accuracy {m['accuracy']:.3f}")
        hits = acc = total = 0.0
        for feat in ("category", "location"):
            m = run(args.model_name, out, "iWISDM", f"iwisdm_identify_{feat}", "generation", "SingleChoice", n)
            print(f"identify_{feat:9s} generation accuracy {m['accuracy']:.3f} format hit rate {m['format_hit_rate']:.3f}")
            hits += m["format_hit_rate"] * args.trials
            acc += m["accuracy"] * args.trials
            total += args.trials
        line["gen_format_hit_rate"], line["gen_acc"] = hits / total, acc / total
        for feat in ("category", "location"):
            m = run(args.model_name, out, "iWISDM", f"iwisdm_single_frame_{feat}", "likelihood", "SingleChoice", n)
            line[f"sf_{feat}_acc"] = m["accuracy"]
            print(f"single_frame_{feat:9s} true/false likelihood accuracy {m['accuracy']:.3f}")
        yesno = write_yesno_release(os.path.join(tmp, "yesno"), n_images=args.yesno_images, seed=1)
        m = run(args.model_name, out, "MME", "mme_synthetic", "likelihood", "Generation", {"root": yesno})
        subs = m["subtasks"].values()  # acc+ over all images: both questions of an image right
        line["yesno_acc"] = m["accuracy"]
        line["yesno_acc_plus"] = sum(s["acc_plus"] * s["num_images"] for s in subs) / sum(s["num_images"] for s in subs)
        print(f"yes/no (MME-style)   likelihood acc {line['yesno_acc']:.3f} acc+ {line['yesno_acc_plus']:.3f}")
        for level in ("low", "medium", "high"):
            m = run(args.model_name, out, "iWISDM", f"iwisdm_{level}", "likelihood", "SingleChoice", n)
            line[f"acc_{level}"] = m["accuracy"]
            print(f"iWISDM {level:6s}        likelihood accuracy {m['accuracy']:.3f}")
    line.update(targets(line))
    print(" ".join(f"{k}={line[k]:.3f}" for k in ("category_lik_acc", "location_lik_acc", "gen_format_hit_rate",
                                                   "gen_acc", "sf_category_acc", "sf_location_acc", "yesno_acc",
                                                   "yesno_acc_plus", "acc_low", "acc_medium", "acc_high"))
          + " " + " ".join(f"{k}={line[k]}" for k in ("target_yesno", "target_single_frame", "target_levels",
                                                       "targets_met")))


def targets(line: Dict[str, float]) -> Dict[str, int]:
    """Which of issue 26's known-skill targets the measured ``line`` reaches (1 or 0), and how many."""
    met = {"target_yesno": int(line["yesno_acc"] >= 0.8 and line["yesno_acc_plus"] >= 0.6),
           "target_single_frame": int(line["sf_category_acc"] >= 0.75 and line["sf_location_acc"] >= 0.75),
           "target_levels": int(line["acc_low"] > line["acc_medium"] > line["acc_high"] and line["acc_low"] >= 0.6)}
    met["targets_met"] = sum(met.values())
    return met


if __name__ == "__main__":
    main()
