"""Several ``run_eval`` command lines in one torchrun process group, one after another.

Why: each torchrun launch starts a launcher and its ranks, imports torch and transformers in
each and forms a process group; tests that compare many cells under two ranks
(tests/test_invariance.py) pay that once for all of them. The group is started here and left
up between the runs (``utils.distributed``: ``evaluate`` leaves a group it did not start), so the
ranks of one cell finish together before the next begins.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/torchrun_cells.py CELLS.json

CELLS.json is a list of argv lists. The first run that fails ends this process with its exit
code (torchrun then stops the other ranks); its index is printed on stderr.
"""
from __future__ import annotations

import datetime
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(path: str) -> int:
    import torch.distributed as dist

    from reform_eval import run_eval
    with open(path, encoding="utf-8") as f:
        cells = json.load(f)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=900))
    for i, argv in enumerate(cells):
        rc = run_eval.main(argv)
        if rc != 0:
            print(f"cell {i} failed with exit code {rc}: {' '.join(argv)}", file=sys.stderr, flush=True)
            return rc
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
