"""Image loading with errors that name the file."""
from __future__ import annotations

from typing import Tuple

from PIL import Image, UnidentifiedImageError

from utils.errors import input_error


def open_image(path: str) -> Image.Image:
    """Open an image as RGB, fully decoded; a clear error names a missing or corrupt file."""
    try:
        with Image.open(path) as im:
            return im.convert("RGB")
    except FileNotFoundError:
        raise input_error("image file not found", file=path) from None
    except (UnidentifiedImageError, OSError) as e:
        raise input_error(f"image cannot be decoded ({e})", file=path) from None


def noise_image(seed: int, size: Tuple[int, int] = (40, 30)) -> Image.Image:
    """A uniform-noise RGB image of ``size`` (width, height) that depends only on ``seed``:
    the stand-in input of the model tests and benchmarks."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray((torch.rand(size[1], size[0], 3, generator=g) * 255).to(torch.uint8).numpy())
