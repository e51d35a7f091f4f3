"""Image loading with errors that name the record and the file.

Only regular files are opened (a FIFO or device given as an image would block forever), and
an image over the pixel limit (a decompression bomb) is refused with the limit and how to
raise it, instead of exhausting memory.
"""
from __future__ import annotations

import io
import os
import stat
import warnings
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional, Tuple, Union

from PIL import Image, UnidentifiedImageError

from .errors import input_error

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


def _where(path: Any, record: Optional[Any], name: Optional[str] = None) -> Dict[str, Any]:
    name = name or (path if isinstance(path, str) else "<image bytes>")
    return {"file": name if record is None else f"sample {record}: {name}"}


def _check_file(path: str, where: Dict[str, Any]) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise input_error("image file not found", **where) from None
    except (OSError, ValueError) as e:
        raise input_error(f"image cannot be read ({getattr(e, 'strerror', None) or e})", **where) from None
    if not stat.S_ISREG(mode):
        raise input_error("is not a regular file (a directory, FIFO or device cannot be an image)", **where)


def unreadable(path: str, record: Optional[Any], error: BaseException) -> Exception:
    """The one-line error for an image file that could not be read: what is wrong with the file
    (missing, not a regular file) where a look says so, else the system's reason."""
    where = _where(path, record)
    _check_file(path, where)
    return input_error(f"image cannot be read ({getattr(error, 'strerror', None) or error})", **where)


@contextmanager
def guarded_open(source: Union[str, bytes], record: Optional[Any] = None,
                 name: Optional[str] = None) -> Iterator[Image.Image]:
    """The one pixel guard: ``Image.open`` of a regular file (or bytes) whose header says at most
    ``max_image_pixels()``; nothing is decoded yet. Every reader of images (the loaders, the
    report's thumbnails, the builders' checks) opens through here. ``name``: the file that
    ``source`` bytes were read from, for error messages."""
    where = _where(source, record, name)
    if isinstance(source, str):
        _check_file(source, where)
    fp = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    limit = max_image_pixels()
    old = Image.MAX_IMAGE_PIXELS
    try:
        Image.MAX_IMAGE_PIXELS = limit
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(fp) as im:
                w, h = im.size
                if w * h > limit:
                    raise Image.DecompressionBombError(f"Image size ({w * h} pixels) exceeds limit")
                yield im
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise input_error(f"image is too large ({' '.join(str(e).split())[:120]}); the limit is {limit} pixels, "
                          "raise it with REFORM_MAX_IMAGE_PIXELS=<pixels> if the image is trusted", **where) from None
    except UnidentifiedImageError:  # (its message shows the stream object, not the file)
        raise input_error("image cannot be decoded (not an image format that can be read)", **where) from None
    except (OSError, SyntaxError, ValueError) as e:
        raise input_error(f"image cannot be decoded ({e})", **where) from None
    finally:
        Image.MAX_IMAGE_PIXELS = old


def open_image(path: str, record: Optional[Any] = None) -> Image.Image:
    """Open an image as RGB, fully decoded; errors name the sample (``record``) and the file."""
    with guarded_open(path, record) as im:
        return im.convert("RGB")


def decode_image(data: bytes, name: str, record: Optional[Any] = None) -> Image.Image:
    """``data`` (read from file ``name``) as RGB, fully decoded, through the pixel guard."""
    with guarded_open(data, record, name=name) as im:
        return im.convert("RGB")


def check_image(source: Union[str, bytes], record: Optional[Any] = None, name: Optional[str] = None) -> None:
    """Refuse (one line) an image that is missing, over the pixel limit or corrupt, without
    decoding its pixels (header and ``verify`` only)."""
    with guarded_open(source, record, name) as im:
        im.verify()


def thumbnail_jpeg(path: str, size: int, quality: int = 70) -> bytes:
    """A JPEG thumbnail of at most ``size`` x ``size``, through the same pixel guard."""
    with guarded_open(path) as im:
        im.draft("RGB", (size, size))
        im = im.convert("RGB")
        im.thumbnail((size, size))
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=quality)
        return buf.getvalue()


class SyntheticImage:
    """A stand-in image made only when it is loaded: a blank (black) or a seeded uniform-noise
    RGB image of ``size`` (width, height), for ``--image_ablation`` (``build.ablation``).

    Why not a PIL image: an ablated MME or MMMT-IF run replaces thousands of file images, and
    holding each as decoded pixels would take gigabytes, while (kind, size, seed) is a few
    bytes; the loaders (``build.ReformDataset``) make the pixels per item. It answers ``mode``,
    ``size`` and ``tobytes()`` as a PIL image does, so the run's fingerprint
    (``utils.fingerprint.image_token``) hashes the pixels it stands for."""

    KINDS = ("blank", "noise")
    mode = "RGB"
    __slots__ = ("kind", "size", "seed")

    def __init__(self, kind: str, size: Tuple[int, int], seed: Optional[int] = None) -> None:
        if kind not in self.KINDS or (kind == "noise") != (seed is not None):
            raise ValueError(f"SyntheticImage({kind!r}, seed={seed!r}): a blank has no seed, a noise image has one")
        self.kind, self.size, self.seed = kind, (int(size[0]), int(size[1])), seed

    def to_pil(self) -> Image.Image:
        w, h = self.size
        if self.kind == "blank":
            return Image.new("RGB", (w, h))
        import numpy as np  # (numpy and its BLAS threads: 0.2 CPU s at every start; only noise needs it)

        pixels = np.random.default_rng(self.seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        return Image.fromarray(pixels, "RGB")

    def tobytes(self) -> bytes:
        return bytes(3 * self.size[0] * self.size[1]) if self.kind == "blank" else self.to_pil().tobytes()

    def __repr__(self) -> str:
        seed = "" if self.seed is None else f", seed={self.seed}"
        return f"SyntheticImage({self.kind}, {self.size[0]}x{self.size[1]}{seed})"

    def __getstate__(self) -> Tuple[str, Tuple[int, int], Optional[int]]:  # (__slots__: DataLoader workers)
        return (self.kind, self.size, self.seed)

    def __setstate__(self, state: Tuple[str, Tuple[int, int], Optional[int]]) -> None:
        self.kind, self.size, self.seed = state


def image_size(image: Any, record: Optional[Any] = None) -> Tuple[int, int]:
    """(width, height) of a PIL image, a ``SyntheticImage`` or an image file; a file's is read from
    its header through the pixel guard, without decoding the pixels."""
    if isinstance(image, str):
        with guarded_open(image, record) as im:
            return im.size
    return tuple(image.size)


def noise_image(seed: int, size: Tuple[int, int] = (40, 30)) -> Image.Image:
    """A uniform-noise RGB image of ``size`` (width, height) that depends only on ``seed``:
    the stand-in input of the model tests and benchmarks."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray((torch.rand(size[1], size[0], 3, generator=g) * 255).to(torch.uint8).numpy())
