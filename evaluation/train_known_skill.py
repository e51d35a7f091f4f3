"""``python -m evaluation.train_known_skill --out DIR [--ship]``: train the known-skill LLaVA
(``--model_name tiny-trained``; recipe in ``evaluation/training.py``, docs/models.md) into DIR.

Why its own module: ``evaluation`` imports ``evaluation.training`` to register the builder, so
running that module with ``-m`` would make Python warn that it was imported twice.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import List, Optional

from evaluation.training import SHIPPED_NAME, build_trained_llava, ship
from models.tiny import SHIPPED_DIR, SHIPPED_MANIFEST
from utils.errors import ReformError


def main(argv: Optional[List[str]] = None) -> int:
    """Train into ``--out`` (a new or empty folder); ``--ship`` records its hashes in the manifest."""
    ap = argparse.ArgumentParser(prog="python -m evaluation.train_known_skill", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="new or empty folder to write the checkpoint to")
    ap.add_argument("--ship", action="store_true",
                    help="record the folder's hashes in models/checkpoints/manifest.json (the folder must be "
                         f"models/checkpoints/{SHIPPED_NAME})")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
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
        build_trained_llava(args.out)
    except ReformError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"trained in {time.perf_counter() - t0:.0f}s: {args.out}")
    if args.ship:
        entry = ship(os.path.abspath(args.out))
        print(f"manifest: {SHIPPED_MANIFEST} ({len(entry['sha256'])} files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
