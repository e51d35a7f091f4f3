"""Inputs shared by the model benchmarks: candidate answers of 1-13 tokens and seeded images."""
from __future__ import annotations

from typing import Tuple

import torch
from PIL import Image

#: candidate answers of varied token lengths (short marks to a full sentence)
CANDIDATE_WORDS = ["yes", "no", "red", "green", "blue square", "a yellow circle on the left", "(A)", "(B) two",
                   "three cats and a dog", "the second image", "none of the above options", "purple star",
                   "left of the triangle", "it is the same colour as the first object in the scene"]


def random_image(seed: int, size: Tuple[int, int] = (128, 96)) -> Image.Image:
    """A noise image (width, height) that depends only on ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray((torch.rand(size[1], size[0], 3, generator=g) * 255).to(torch.uint8).numpy())
