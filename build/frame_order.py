"""A two-frame set whose answer depends on the order of the frames, in the ``custom`` format.

Why: every iWISDM task a small model can learn quickly is either one frame or symmetric in its
frames (a delayed match asks whether two objects agree, whichever comes first), so feeding a
trial's frames in reverse order cannot change its answer, and no test on them could see that
bug. Here each item shows two iWISDM frames holding objects of different categories and asks for
the category of the object in the second frame: reversed frames give the other object's
category. (One fixed question on purpose: asking for "the first or the second" would make the
answer an interaction of a word and a position, which a tiny model learns far more slowly.) The known-skill model learns it (evaluation/training.py) and
tests/test_known_skill.py reverses the frames.

``write_frame_order_set(out_dir, n, seed)`` writes ``items.jsonl``, the PNG frames and
``frame_order.yaml`` (read with ``--dataset_name custom --dataset_config OUT/frame_order.yaml``)
and returns the YAML path. Deterministic: the same seed writes the same files.
"""
from __future__ import annotations

import json
import os
import random
from typing import Optional

from .iwisdm.stimuli import LOCATIONS, StimulusSet, procedural_set

QUESTION = "First frame: <image>\nSecond frame: <image>\nWhat is the category of the object in the second frame?"


def write_frame_order_set(out_dir: str, n: int = 100, seed: int = 0, stim: Optional[StimulusSet] = None) -> str:
    """``n`` two-frame items (SingleChoice: the categories as options); returns the config path."""
    stim = stim or procedural_set()
    rng = random.Random(f"frame-order/{seed}")
    os.makedirs(out_dir, exist_ok=True)
    lines = []
    for i in range(n):
        cats = rng.sample(list(stim.categories), 2)
        names = []
        for k, cat in enumerate(cats):
            obj = {"category": cat, "identity": rng.randrange(stim.n_identities), "view": rng.randrange(stim.n_views),
                   "location": rng.choice(LOCATIONS)}
            name = f"fo{seed}_{i:04d}_{k}.png"
            stim.compose([obj]).save(os.path.join(out_dir, name))
            names.append(name)
        options = list(stim.categories)
        lines.append(json.dumps({"sample_id": f"frame_order_{i:04d}", "images": names, "question": QUESTION,
                                 "answer_options": options, "answer": options.index(cats[1]),
                                 "meta": {"categories": cats}}))
    with open(os.path.join(out_dir, "items.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    config = os.path.join(out_dir, "frame_order.yaml")
    with open(config, "w", encoding="utf-8") as f:
        f.write("data_file: items.jsonl\n")
    return config
