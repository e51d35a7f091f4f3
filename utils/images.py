"""Image loading with errors that name the file."""
from __future__ import annotations

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
