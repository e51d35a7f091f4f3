"""``python -m reform_eval.evaluation.train_known_skill --out DIR [--ship]``: train the known-skill LLaVA
(``--model_name tiny-trained``; recipe in ``evaluation/training.py``, docs/models.md) into DIR.
``python -m reform_eval.evaluation.train_known_skill --check``: the cheap reproducibility check.

``--check`` verifies the shipped files against the manifest's hashes, then reruns the recipe's
first part (the data, the tower's pretraining and ``CHECK_STEPS`` language-model steps, about 2
CPU minutes instead of the whole recipe) and compares the hash of the data and of the weights at
each of those points with the ones the shipping run recorded in the manifest. The rest of the run
is the same deterministic code on the same platform, so a match at every point, with the files
whose hashes the same run recorded, is the evidence that the shipped weights are what the recipe
makes; the full retraining (``--out``) stays the complete proof.

Why its own module: ``evaluation`` imports ``evaluation.training`` to register the builder, so
running that module with ``-m`` would make Python warn that it was imported twice.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from typing import List, Optional

from .training import SHIPPED_NAME, build_trained_llava, ship
from ..models.tiny import SHIPPED_DIR, SHIPPED_MANIFEST, read_shipped_manifest, shipped_checkpoint
from ..utils.errors import ReformError


def main(argv: Optional[List[str]] = None) -> int:
    """Train into ``--out`` (a new or empty folder); ``--ship`` records its hashes in the manifest."""
    ap = argparse.ArgumentParser(prog="python -m reform_eval.evaluation.train_known_skill", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="new or empty folder to write the checkpoint to")
    ap.add_argument("--check", action="store_true",
                    help="verify the shipped checkpoint: its files' hashes, then the recipe's first part retrained "
                         "(about 2 CPU minutes) against the hashes the manifest recorded")
    ap.add_argument("--ship", action="store_true",
                    help="record the folder's hashes in models/checkpoints/manifest.json (the folder must be "
                         f"models/checkpoints/{SHIPPED_NAME})")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.check == bool(args.out):
        print("error: give either --out DIR or --check", file=sys.stderr)
        return 2
    if args.check:
        return check()
    shipped = os.path.join(SHIPPED_DIR, SHIPPED_NAME)
    if args.ship and os.path.realpath(args.out) != os.path.realpath(shipped):
        print(f"error: --ship records the shipped checkpoint: --out must be {shipped}", file=sys.stderr)
        return 2
    if os.path.isdir(args.out) and os.listdir(args.out):
        print(f"error: {args.out}: folder is not empty", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    try:
        records = build_trained_llava(args.out)
    except ReformError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"trained in {time.perf_counter() - t0:.0f}s: {args.out}")
    if args.ship:
        entry = ship(os.path.abspath(args.out), records)
        print(f"manifest: {SHIPPED_MANIFEST} ({len(entry['sha256'])} files)")
    return 0


def check() -> int:
    """The cheap check (module docstring): 0 when everything matches, 1 naming the first difference."""
    entry = read_shipped_manifest().get("llava/trained") or {}
    if shipped_checkpoint("llava", "trained") is None:
        print(f"error: the shipped checkpoint does not match {SHIPPED_MANIFEST} (warning above)", file=sys.stderr)
        return 1
    recorded = [r for r in entry.get("stages") or [] if r.get("name") in ("data", "vision", "check")]
    if [r.get("name") for r in recorded] != ["data", "vision", "check"]:
        print(f"error: {SHIPPED_MANIFEST}: llava/trained has no 'stages' record of data, vision and check; "
              "ship it again (--out models/checkpoints/llava-tiny-trained --ship)", file=sys.stderr)
        return 1
    print(f"shipped files match {SHIPPED_MANIFEST} ({len(entry['sha256'])} files)")
    t0 = time.process_time()
    with tempfile.TemporaryDirectory(prefix="reform-check-") as tmp:
        got = build_trained_llava(tmp, stop_after="check")
    for want, have in zip(recorded, got):
        if want != have:
            print(f"error: stage {want['name']}: retrained {have} differs from the manifest's {want}; the recipe "
                  f"or the platform changed since shipping", file=sys.stderr)
            return 1
        print(f"stage {want['name']}: {want['sha256'][:16]}... matches")
    print(f"reproducible: data, tower and {recorded[-1]['steps']} language-model steps match ({time.process_time() - t0:.0f} "
          "CPU s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
