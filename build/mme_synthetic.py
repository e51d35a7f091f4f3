"""A synthetic yes/no set in MME's form: generated images of one coloured shape, two questions each.

Why: the known-skill model (docs/models.md) is trained and measured on MME-style questions
("Is there a red square in the image? Please answer yes or no."), and MME's own images cannot
be shipped. The set is laid out as an official-release folder (subtasks ``existence`` and
``color``; each image with one "Yes" and one "No" question, as MME pairs them), so the MME
builder reads it and the MME scorer gives acc and acc+ exactly as for the real benchmark.

``python -m reform_eval.build.mme_synthetic --out DIR [--images N] [--seed S]`` writes it and prints DIR.
Deterministic: the same seed writes the same files.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
from typing import List, Optional, Sequence, Tuple

from PIL import Image, ImageDraw

from ..utils.errors import ReformError

#: colour words and their RGB values (saturated, far apart)
COLOURS: Tuple[Tuple[str, Tuple[int, int, int]], ...] = (
    ("red", (225, 40, 40)), ("green", (40, 190, 60)), ("blue", (50, 90, 235)), ("yellow", (240, 220, 40)))
SHAPES: Tuple[str, ...] = ("square", "circle", "triangle")
SUBTASKS: Tuple[str, ...] = ("existence", "color")
SIZE = 224


def draw_shape(shape: str, colour: Tuple[int, int, int], rng: random.Random, size: int = SIZE) -> Image.Image:
    """One shape of ``colour`` at a random place and scale on a dark grey canvas."""
    img = Image.new("RGB", (size, size), (30, 30, 30))
    d = ImageDraw.Draw(img)
    r = rng.randint(size // 6, size // 3)
    cx, cy = rng.randint(r, size - r), rng.randint(r, size - r)
    if shape == "square":
        d.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "circle":
        d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "triangle":
        d.polygon(((cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)), fill=colour)
    else:
        raise ReformError(f"unknown shape '{shape}'; valid: {', '.join(SHAPES)}")
    return img


def questions(subtask: str, shape: str, colour: str, rng: random.Random) -> List[Tuple[str, str]]:
    """The image's (question, answer) pair: one true statement, one false, in random order."""
    other_colour = rng.choice([c for c, _ in COLOURS if c != colour])
    if subtask == "existence":
        if rng.random() < 0.5:
            wrong = f"{other_colour} {shape}"
        else:
            wrong = f"{colour} {rng.choice([s for s in SHAPES if s != shape])}"
        pair = [(f"Is there a {colour} {shape} in the image?", "Yes"), (f"Is there a {wrong} in the image?", "No")]
    elif subtask == "color":
        pair = [(f"Is the {shape} in the image {colour}?", "Yes"), (f"Is the {shape} in the image {other_colour}?", "No")]
    else:
        raise ReformError(f"unknown synthetic subtask '{subtask}'; valid: {', '.join(SUBTASKS)}")
    rng.shuffle(pair)
    return [(q + " Please answer yes or no.", a) for q, a in pair]


def write_yesno_release(out_dir: str, n_images: int = 40, seed: int = 0,
                        subtasks: Sequence[str] = SUBTASKS) -> str:
    """Write ``n_images`` images per subtask with their question files; returns ``out_dir``.

    Read it with ``--dataset_name MME --dataset_option root=OUT --dataset_option subtasks=existence,color``
    (``configs/datasets/mme_synthetic.yaml``)."""
    if n_images < 1:
        raise ReformError(f"n_images must be >= 1, got {n_images}")
    for sub in subtasks:
        rng = random.Random(f"{seed}/{sub}")
        folder = os.path.join(out_dir, sub)
        os.makedirs(folder, exist_ok=True)
        for i in range(n_images):
            shape = SHAPES[i % len(SHAPES)]
            name, rgb = COLOURS[(i // len(SHAPES)) % len(COLOURS)]
            stem = f"{sub}_{seed}_{i:04d}"
            draw_shape(shape, rgb, rng).save(os.path.join(folder, stem + ".png"))
            with open(os.path.join(folder, stem + ".txt"), "w", encoding="utf-8") as f:
                f.write("".join(f"{q}\t{a}\n" for q, a in questions(sub, shape, name, rng)))
    return out_dir


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reform_eval.build.mme_synthetic", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="release folder to create")
    ap.add_argument("--images", type=int, default=40, help="images per subtask (two questions each)")
    ap.add_argument("--seed", type=int, default=0, help="generation seed (the same seed writes the same files)")
    args = ap.parse_args(argv)
    if os.path.isdir(args.out) and os.listdir(args.out):  # a second set would mix into the first
        print(f"error: {args.out}: folder is not empty (the set is written into a new or empty folder)", file=sys.stderr)
        return 2
    try:
        write_yesno_release(args.out, args.images, args.seed)
    except ReformError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
