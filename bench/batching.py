"""Batch-size speedup of sampled generation and likelihood, with batch invariance checked.

On the bench-size random checkpoints (tens of millions of parameters; built once, cached)
and the samples of ``bench/models.py`` (2 images each), per family, timed side by side in
one run (batch 1 and batch 8 interleaved, best of ``--reps`` after a warm-up, so machine
load hits both alike):

* sampled generation, run_eval's way: N=4 passes over 8 samples at temperature 1 with
  per-row seeds ``derive_seed(seed, sample_id, 0, j)``, ``--max_new_tokens`` new tokens;
  samples/s at batch 8 over batch 1, and whether all 32 outputs are identical;
* likelihood, K=4 candidates (1-13 tokens) per sample: samples/s at batch 8 over batch 1
  and the largest score difference between the two.

Usage: ``python bench/batching.py [--families llava qwen2_vl] [--size bench|tiny] [--reps 2]
[--threads N] [--smoke]``

Prints: sampled_b8_speedup=<min over llava, qwen2_vl> likelihood_b8_speedup=<min>
max_abs_diff=<max over families> batch_invariant=<1 if every family's outputs were identical>
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_inputs import CANDIDATE_WORDS, bench_sample  # noqa: E402
from reform_eval.utils.seeding import derive_seed  # noqa: E402

logger = logging.getLogger(__name__)

HEADLINE = ("llava", "qwen2_vl")
N_SAMPLES, N_RESPONSES, K = 8, 4, 4


def _timed(fn: Callable[[], Any]) -> Tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _sampled(interface: Any, prompts: List[Any], images: List[Any], bs: int, max_new: int) -> List[List[str]]:
    outs: List[List[str]] = [[] for _ in prompts]
    for j in range(N_RESPONSES):
        for start in range(0, len(prompts), bs):
            idx = list(range(start, min(start + bs, len(prompts))))
            seeds = [derive_seed(0, f"b{i}", 0, j) for i in idx]
            got = interface.raw_batch_generate([images[i] for i in idx], [prompts[i] for i in idx],
                                               temperature=1.0, max_new_tokens=max_new, seeds=seeds)
            for i, g in zip(idx, got):
                outs[i].append(g)
    return outs


def _likelihood(interface: Any, prompts: List[Any], images: List[Any], cands: List[List[str]], bs: int) -> List[float]:
    scores: List[float] = []
    for start in range(0, len(prompts), bs):
        got = interface.raw_batch_predict(images[start:start + bs], prompts[start:start + bs], cands[start:start + bs])
        scores.extend(c.logprob for s in got for c in s)
    return scores


def bench_family(family: str, size: str, reps: int, max_new: int) -> Dict[str, float]:
    from reform_eval.models import get_model
    interface, pre = get_model(family, {"model_name": "tiny", "tiny_size": size, "device": "cpu"})
    samples = [bench_sample(i) for i in range(N_SAMPLES)]
    prompts, images = [pre(s) for s in samples], [s["images"] for s in samples]
    cands = [[CANDIDATE_WORDS[(i + 3 * j) % len(CANDIDATE_WORDS)] for j in range(K)] for i in range(N_SAMPLES)]
    times: Dict[str, List[float]] = {k: [] for k in ("gen1", "gen8", "lik1", "lik8")}
    gen: Dict[int, Any] = {}
    lik: Dict[int, Any] = {}
    for rep in range(reps + 1):  # rep 0 warms up; batch 1 and 8 alternate so load hits both alike
        for bs in (1, 8):
            t, gen[bs] = _timed(lambda: _sampled(interface, prompts, images, bs, max_new))
            if rep:
                times[f"gen{bs}"].append(t)
            t, lik[bs] = _timed(lambda: _likelihood(interface, prompts, images, cands, bs))
            if rep:
                times[f"lik{bs}"].append(t)
    best = {k: min(v) for k, v in times.items()}
    return {"params_M": sum(p.numel() for p in interface.model.parameters()) / 1e6,
            "gen_bs1": N_SAMPLES / best["gen1"], "gen_bs8": N_SAMPLES / best["gen8"],
            "gen_speedup": best["gen1"] / best["gen8"],
            "gen_identical": float(gen[1] == gen[8]),
            "gen_distinct": float(all(len(set(r)) > 1 for r in gen[1])),
            "lik_bs1": N_SAMPLES / best["lik1"], "lik_bs8": N_SAMPLES / best["lik8"],
            "lik_speedup": best["lik1"] / best["lik8"],
            "lik_max_diff": max(abs(a - b) for a, b in zip(lik[1], lik[8]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="*", default=list(HEADLINE))
    ap.add_argument("--size", default="bench", choices=["tiny", "bench"])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max_new_tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--smoke", action="store_true", help="the tiny LLaVA, one repetition, 2 new tokens: checks "
                    "that the bench runs (seconds), measures nothing")
    args = ap.parse_args()
    if args.smoke:
        args.families, args.size, args.reps, args.max_new_tokens = ["llava"], "tiny", 1, 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    cols = ["params_M", "gen_bs1", "gen_bs8", "gen_speedup", "gen_identical", "gen_distinct",
            "lik_bs1", "lik_bs8", "lik_speedup", "lik_max_diff"]
    print(f"size={args.size} threads={torch.get_num_threads()} samples={N_SAMPLES} (2 images each) "
          f"sampled: N={N_RESPONSES} T=1 max_new_tokens={args.max_new_tokens}; likelihood: K={K}; "
          f"throughput in samples/s, best of {args.reps}")
    print("family".ljust(16) + "".join(c.rjust(14) for c in cols))
    results: Dict[str, Dict[str, float]] = {}
    for fam in args.families:
        res = bench_family(fam, args.size, args.reps, args.max_new_tokens)
        results[fam] = res
        print(fam.ljust(16) + "".join((f"{res[c]:14.2e}" if c == "lik_max_diff" else f"{res[c]:14.2f}")
                                      for c in cols), flush=True)
    head = [f for f in HEADLINE if f in results] or list(results)
    invariant = all(r["gen_identical"] == 1.0 and r["lik_max_diff"] <= 1e-4 for r in results.values())
    print(f"sampled_b8_speedup={min(results[f]['gen_speedup'] for f in head):.2f} "
          f"likelihood_b8_speedup={min(results[f]['lik_speedup'] for f in head):.2f} "
          f"max_abs_diff={max(r['lik_max_diff'] for r in results.values()):.2e} "
          f"batch_invariant={int(invariant)}")


if __name__ == "__main__":
    main()
