"""Per-family throughput of the model zoo on random checkpoints of each real architecture.

For each family: samples/s at batch sizes 1, 4 and 8 for generation (greedy, 8 new tokens)
and likelihood (K=4 candidates), each sample with 2 images; and the prefix-sharing ratio
(naive full-sequence scoring time / prefix-cached scoring time) at K=2 and K=14 candidates.

Usage: ``python bench/models.py [--families llava_next qwen2_vl] [--size bench|tiny]
[--reps 2] [--threads N] [--smoke]``. ``--size bench`` builds ~tens-of-millions-parameter models
(once, cached under $REFORM_CACHE); ``tiny`` is the test size (fast, shape-only numbers).

Prints: families=<n> min_prefix_ratio_K2=<r> min_prefix_ratio_K14=<r> prefix_ratio_K14_<family>=<r>
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_inputs import CANDIDATE_WORDS, bench_sample  # noqa: E402

logger = logging.getLogger(__name__)

FAMILIES = ["llava", "llava_next", "llava_onevision", "qwen2_vl", "idefics3", "internvl",
            "blip2", "instructblip", "paligemma", "mllama"]


def _best(fn: Callable[[], None], reps: int) -> float:
    """Best wall time of ``reps`` runs after one warm-up (best-of damps a shared machine's noise)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_family(family: str, size: str, reps: int, n: int = 8) -> Dict[str, float]:
    from reform_eval.models import get_model
    interface, pre = get_model(family, {"model_name": "tiny", "tiny_size": size, "device": "cpu"})
    n_params = sum(p.numel() for p in interface.model.parameters()) / 1e6
    samples = [bench_sample(i) for i in range(n)]
    prompts = [pre(s) for s in samples]
    images = [s["images"] for s in samples]
    out: Dict[str, float] = {"params_M": n_params}
    for bs in (1, 4, 8):
        def gen() -> None:
            for start in range(0, n, bs):
                interface.raw_batch_generate(images[start:start + bs], prompts[start:start + bs], max_new_tokens=8)
        out[f"gen_bs{bs}"] = n / _best(gen, reps)

        def lik() -> None:
            for start in range(0, n, bs):
                interface.raw_batch_predict(images[start:start + bs], prompts[start:start + bs],
                                            [CANDIDATE_WORDS[:4]] * len(prompts[start:start + bs]))
        out[f"lik_bs{bs}"] = n / _best(lik, reps)
    for k in (2, 14):
        cands = CANDIDATE_WORDS[:k]
        naive = _best(lambda: interface.score_full_sequence(images[0], prompts[0], cands), reps)
        prefix = _best(lambda: interface.raw_predict(images[0], prompts[0], cands), reps)
        out[f"prefix_ratio_K{k}"] = naive / prefix
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="*", default=FAMILIES)
    ap.add_argument("--size", default="bench", choices=["tiny", "bench"])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--samples", type=int, default=8, help="samples per measurement")
    ap.add_argument("--smoke", action="store_true", help="the tiny LLaVA only, 2 samples, one repetition: checks "
                    "that the bench runs (seconds), measures nothing")
    args = ap.parse_args()
    if args.smoke:
        args.families, args.size, args.reps, args.samples = ["llava"], "tiny", 1, 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    cols = ["params_M", "gen_bs1", "gen_bs4", "gen_bs8", "lik_bs1", "lik_bs4", "lik_bs8",
            "prefix_ratio_K2", "prefix_ratio_K14"]
    print(f"size={args.size} threads={torch.get_num_threads()} (generation/likelihood in samples/s; "
          "prefix ratio = naive time / prefix-cached time)")
    print("family".ljust(16) + "".join(c.rjust(17) for c in cols))
    rows: List[str] = []
    results: Dict[str, Dict[str, float]] = {}
    for fam in args.families:
        res = bench_family(fam, args.size, args.reps, args.samples)
        results[fam] = res
        row = fam.ljust(16) + "".join(f"{res[c]:17.2f}" for c in cols)
        rows.append(row)
        print(row, flush=True)
    k14 = " ".join(f"prefix_ratio_K14_{f}={r['prefix_ratio_K14']:.2f}" for f, r in results.items())
    print(f"families={len(results)} min_prefix_ratio_K2={min(r['prefix_ratio_K2'] for r in results.values()):.2f} "
          f"min_prefix_ratio_K14={min(r['prefix_ratio_K14'] for r in results.values()):.2f} {k14}")


if __name__ == "__main__":
    main()
