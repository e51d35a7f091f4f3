"""Likelihood scoring: naive (one full forward per candidate, images included, as ReForm-Eval
does) versus prefix-shared (images + prompt once, candidates from the shared KV cache).

Builds (once, cached) a ~50M-parameter random LLaVA-1.5 (CLIP vision tower + Llama) and
scores samples with 9 images and K=14 candidates of varied lengths, timing both methods side
by side on the same samples (interleaved, so machine load hits both alike).

Usage: ``python bench/likelihood.py [--samples 3] [--images 9] [--candidates 14] [--threads N]
[--size bench|tiny] [--smoke]``

Prints: likelihood_speedup=<naive/prefix time ratio> max_abs_diff=<max |score difference|>
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_inputs import CANDIDATE_WORDS  # noqa: E402
from reform_eval.utils.images import noise_image  # noqa: E402

logger = logging.getLogger(__name__)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=3, help="timed samples (after one warm-up)")
    ap.add_argument("--images", type=int, default=9)
    ap.add_argument("--candidates", type=int, default=14)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--size", default="bench", choices=["tiny", "bench"], help="random LLaVA size (tiny: the test size)")
    ap.add_argument("--smoke", action="store_true", help="the tiny LLaVA, 1 sample of 2 images, 3 candidates: checks "
                    "that the bench runs (seconds), measures nothing")
    args = ap.parse_args()
    if args.smoke:
        args.size, args.samples, args.images, args.candidates = "tiny", 1, 2, 3
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)

    from reform_eval.models import get_model
    interface, pre = get_model("llava", {"model_name": "tiny", "tiny_size": args.size, "device": args.device})
    n_params = sum(p.numel() for p in interface.model.parameters())
    cands = [CANDIDATE_WORDS[i % len(CANDIDATE_WORDS)] for i in range(args.candidates)]
    print(f"model: random LLaVA, {n_params / 1e6:.1f}M params, device {interface.device}; "
          f"{args.images} images/prompt, K={len(cands)} candidates "
          f"({min(len(interface.candidate_ids('x:', c)) for c in cands)}-"
          f"{max(len(interface.candidate_ids('x:', c)) for c in cands)} tokens)")

    naive_t, prefix_t, max_diff = [], [], 0.0
    for k in range(args.samples + 1):
        s = {"sample_id": f"bench{k}", "formulation": "SingleChoice", "inference_method": "likelihood",
             "images": [noise_image(10 * k + i, (128, 96)) for i in range(args.images)],
             "instruct": "Look at the images and choose the best answer.",
             "question": f"Question {k}: which image shows the red object left of the triangle?", "history": []}
        prompt = pre(s)
        t0 = time.perf_counter()
        naive = interface.score_full_sequence(s["images"], prompt, cands)
        t1 = time.perf_counter()
        fast = interface.raw_predict(s["images"], prompt, cands)
        t2 = time.perf_counter()
        diff = max(abs(a.logprob - b.logprob) for a, b in zip(naive, fast))
        assert [a.num_tokens for a in naive] == [b.num_tokens for b in fast]
        if k == 0:
            print(f"warm-up: naive {t1 - t0:.3f}s prefix {t2 - t1:.3f}s")
            continue
        naive_t.append(t1 - t0)
        prefix_t.append(t2 - t1)
        max_diff = max(max_diff, diff)
        print(f"sample {k}: naive {t1 - t0:.3f}s  prefix-shared {t2 - t1:.3f}s  "
              f"ratio {(t1 - t0) / (t2 - t1):.2f}  max|diff| {diff:.2e}")
    n, p = statistics.mean(naive_t), statistics.mean(prefix_t)
    print(f"time per sample: naive {n:.3f}s  prefix-shared {p:.3f}s")
    print(f"likelihood_speedup={n / p:.2f} max_abs_diff={max_diff:.2e}")


if __name__ == "__main__":
    main()
