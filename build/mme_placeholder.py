"""``python -m reform_eval.build.mme_placeholder --questions DIR --out DIR [--parquet FILE]``: a release-shaped
MME folder with 8x8 placeholder images, from the official question lists, for smoke runs and tests.

Why its own module: ``build`` imports ``build.mme`` to register the builder, so running that
module with ``-m`` makes Python warn that it was imported twice; nothing imports this one.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .mme import write_placeholder_parquet, write_placeholder_release
from ..utils.errors import ReformError


def main(argv: Optional[List[str]] = None) -> int:
    """Write the placeholder release (and optionally its parquet layout); print its folder."""
    ap = argparse.ArgumentParser(prog="python -m reform_eval.build.mme_placeholder", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", nargs="?", choices=["placeholder"], help=argparse.SUPPRESS)  # the old spelling
    ap.add_argument("--questions", required=True, help="folder with the official <subtask>.txt question lists "
                    "(shipped: configs/data/mme_questions)")
    ap.add_argument("--out", required=True, help="release folder to create")
    ap.add_argument("--parquet", default=None, help="also write the HF parquet layout to this file")
    args = ap.parse_args(argv)
    try:
        write_placeholder_release(args.questions, args.out)
        if args.parquet:
            write_placeholder_parquet(args.out, args.parquet)
    except ReformError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
