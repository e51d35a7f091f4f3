"""Throughput of the 13 MMMT-IF checkers on synthetic responses of 100-200 words.

Why: checking all 13 instructions must keep up with at least 10,000 responses/s on one
core (issue 18), and stay linear on degenerate replies (issue 16). The responses are
generated from a fixed seed (varied sentence lengths, markdown lists, numbers,
abbreviations, quotes) so runs are comparable. With ``--pysbd`` (needs ``pip install
pysbd``) our sentence splitter and pySBD are measured side by side: agreement with the 48
English Golden Rules (tests/data/golden_rules_en.json) and seconds to split 12 KB.
Usage: python bench/pif.py [--n 100000] [--pysbd] [--degenerate] [--smoke]. The result is
computed from this process's CPU time (wall time is printed beside it); ``--degenerate`` adds a
line ``worst_record_seconds=<s>`` before it, the slowest 1 MB degenerate reply scored by the
``pif`` metric (all 13 instructions, strict, loose, reasons).

Prints: pif_responses_per_s=<n>
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reform_eval.metrics.pif import INSTRUCTION_IDS, check_instructions, pif_metric, split_sentences  # noqa: E402
from reform_eval.utils.seeding import rng_for  # noqa: E402

_WORDS = ("the image shows a small red bird sitting on a branch near the water while an old stone "
          "building with an ancient style rises behind it and bright light casts long shadows over "
          "people who walk through the busy street market where colourful flowers are sold in baskets "
          "this scene suggests a warm afternoon in a coastal town known for its traditional festivals "
          "architecture itself like per se detailed texture pattern overall composition visible").split()
#: rarer tokens that stress the parser: numbers, abbreviations, hyphens, quotes, markup
_RARE = ("e.g.", "Mr.", "well-known", "Smith's", "1,024", "8th", "COVID-19", "Image2", "3.5", "12", "7",
         "\"quoted\"", "**bold**", "(about", "20)", "U.S.", "etc.")
_STARTS = ("Sure,", "Both", "Some", "Because", "\"Seen", "**Style**:", "- Bright", "1. Small", "The", "In")


def make_responses(n: int, seed: int = 0) -> List[str]:
    """``n`` responses of 100-200 words in sentences of 6-28 words, some as markdown lists.

    About 5% of the words are rare tokens (numbers, abbreviations, hyphenation, markup).
    A pool of 2,000 distinct responses is cycled (with whitespace variation) to reach ``n``.
    """
    rng = rng_for(seed, "bench_pif")
    pool: List[str] = []
    for _ in range(min(n, 2000)):
        target = rng.randint(100, 200)
        words, sentences = 0, []
        while words < target:
            k = min(rng.randint(6, 28), target - words + 1)
            body = " ".join(rng.choice(_RARE) if rng.random() < 0.05 else rng.choice(_WORDS)
                            for _ in range(k - 1))
            sentences.append(f"{rng.choice(_STARTS)} {body}{rng.choice('.!?.')}")
            words += k
        sep = "\n" if rng.random() < 0.3 else " "
        pool.append(sep.join(sentences))
    return [pool[i % len(pool)] + (" " * (i // len(pool) % 2)) for i in range(n)]


GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data",
                      "golden_rules_en.json")


def compare_pysbd(responses: List[str]) -> None:
    """Our splitter beside pySBD: Golden Rules agreement (sentence count) and split speed."""
    import pysbd  # optional: only this comparison needs it
    with open(GOLDEN, encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    seg = pysbd.Segmenter(language="en", clean=False)

    def theirs(text: str) -> List[str]:
        return [s for s in seg.segment(text) if s.strip()]
    text = " ".join(responses)[:12_000]
    sample = responses[:500]
    for name, split in (("ours", split_sentences), ("pysbd", theirs)):
        agree = sum(len(split(c["text"])) == len(c["sentences"]) for c in cases)
        c0 = time.process_time()
        n = len(split(text))
        dt = time.process_time() - c0
        c0 = time.process_time()
        for r in sample:
            split(r)
        per_s = len(sample) / (time.process_time() - c0)
        print(f"splitter={name} golden_rules={agree}/{len(cases)} split_12kb_s={dt:.4f} sentences={n} "
              f"split_responses_per_s={per_s:.0f}")


#: 1 MB degenerate replies (the classes of issue 16, item 7)
DEGENERATE: Dict[str, Callable[[int], str]] = {
    "dots": lambda n: "." * n, "spaces": lambda n: "A" + " " * n, "dot_space": lambda n: ". " * (n // 2),
    "initials": lambda n: "A. " * (n // 3), "list_markers": lambda n: "1. " * (n // 3),
    "repeated_marks": lambda n: "(A) " * (n // 4), "one_long_word": lambda n: "a" * n,
    "one_long_number": lambda n: "9" * n, "short_lines": lambda n: "A.\n" * (n // 3),
}


def worst_degenerate(n: int = 1_000_000) -> None:
    worst, which = 0.0, ""
    for name, make in DEGENERATE.items():
        rec = {"sample_id": "x-t01", "prediction": make(n),
               "meta": {"chat_id": "x", "turn": 1, "instructions": list(INSTRUCTION_IDS)}}
        c0 = time.process_time()
        pif_metric([rec])
        dt = time.process_time() - c0
        if dt > worst:
            worst, which = dt, name
    print(f"worst_record_seconds={worst:.2f} worst_record={which} reply_chars={n}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--loose", action="store_true", help="also time the loose variant")
    ap.add_argument("--pysbd", action="store_true", help="measure pySBD beside our splitter")
    ap.add_argument("--degenerate", action="store_true", help="score 1 MB degenerate replies")
    ap.add_argument("--smoke", action="store_true", help="500 responses: checks that the bench runs (seconds), "
                    "measures nothing")
    args = ap.parse_args()
    if args.smoke:
        args.n = 500
    responses = make_responses(args.n)
    if args.pysbd:
        compare_pysbd(responses)
    if args.degenerate:
        worst_degenerate()
    ids = list(INSTRUCTION_IDS)
    words = sum(len(r.split()) for r in responses) / len(responses)
    t0, c0 = time.perf_counter(), time.process_time()
    followed = 0
    for r in responses:
        followed += sum(check_instructions(r, ids))
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"responses={args.n} mean_words={words:.1f} instructions={len(ids)} wall_s={dt:.2f} "
          f"cpu_s={cpu:.2f} followed_total={followed}")
    if args.loose:
        t1 = time.perf_counter()
        for r in responses[:10_000]:
            check_instructions(r, ids, loose=True)
        print(f"loose_responses_per_s={10_000 / (time.perf_counter() - t1):.0f}")
    # CPU time of this process: on a shared machine wall time also counts other jobs' slices
    print(f"pif_responses_per_s={args.n / cpu:.0f}")


if __name__ == "__main__":
    main()
