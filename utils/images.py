"""Image loading with errors that name the record and the file.

Only regular files are opened (a FIFO or device given as an image would block forever), and
an image over the pixel limit (a decompression bomb) is refused with the limit and how to
raise it, instead of exhausting memory.
"""
from __future__ import annotations

import os
import stat
import warnings
from typing import Any, Optional, Tuple

from PIL import Image, UnidentifiedImageError

from utils.errors import input_error

#: default pixel limit (PIL's own default, about 89 megapixels); REFORM_MAX_IMAGE_PIXELS raises it
DEFAULT_MAX_PIXELS = 89_478_485


def max_image_pixels() -> int:
    """The pixel limit in force: ``REFORM_MAX_IMAGE_PIXELS`` or the default."""
    raw = os.environ.get("REFORM_MAX_IMAGE_PIXELS")
    try:
        return int(raw) if raw else DEFAULT_MAX_PIXELS
    except ValueError:
        raise input_error(f"must be a whole number of pixels, got {raw!r}",
                          field="REFORM_MAX_IMAGE_PIXELS") from None


def open_image(path: str, record: Optional[Any] = None) -> Image.Image:
    """Open an image as RGB, fully decoded; errors name the sample (``record``) and the file."""
    where = {"file": path if record is None else f"sample {record}: {path}"}
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise input_error("image file not found", **where) from None
    except (OSError, ValueError) as e:
        raise input_error(f"image cannot be read ({getattr(e, 'strerror', None) or e})", **where) from None
    if not stat.S_ISREG(mode):
        raise input_error("is not a regular file (a directory, FIFO or device cannot be an image)", **where)
    limit = max_image_pixels()
    old = Image.MAX_IMAGE_PIXELS
    try:
        Image.MAX_IMAGE_PIXELS = limit
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                return im.convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise input_error(f"image is too large ({' '.join(str(e).split())[:120]}); the limit is {limit} pixels, "
                          "raise it with REFORM_MAX_IMAGE_PIXELS=<pixels> if the image is trusted", **where) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise input_error(f"image cannot be decoded ({e})", **where) from None
    finally:
        Image.MAX_IMAGE_PIXELS = old


def noise_image(seed: int, size: Tuple[int, int] = (40, 30)) -> Image.Image:
    """A uniform-noise RGB image of ``size`` (width, height) that depends only on ``seed``:
    the stand-in input of the model tests and benchmarks."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray((torch.rand(size[1], size[0], 3, generator=g) * 255).to(torch.uint8).numpy())
