"""A model's read of an image file at its turn: the file as the run fingerprinted it.

Why: the run's identity and every cache key name an image by the content the run hashed when it
started (``utils.file_hashes``); a file replaced during the run would otherwise be sent to the
model and its answer stored under the old picture's key. Every reader that gives a file to a
model (the loaders, the endpoint client) reads it once here and decodes those same bytes.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

from PIL import Image

from .errors import input_error
from .file_hashes import ChangedSinceFingerprint, MemoWasWrong, bytes_as_fingerprinted, \
    verify_fingerprint
from .images import _where, decode_image, unreadable


def read_run_image(path: str, record: Optional[Any] = None) -> Tuple[bytes, str]:
    """The bytes and content hash of image file ``path``, which must be the content the run
    fingerprinted when it started; a file replaced during the run is refused in one line."""
    return _as_fingerprinted(bytes_as_fingerprinted, path, record)


def verify_run_images(images: Any, record: Optional[Any] = None) -> None:
    """Every image file of a sample checked against the run's fingerprint before its cached
    answer is used (read once per run where the fingerprint was the image memo's word)."""
    for image in images or ():
        if isinstance(image, str):
            _as_fingerprinted(verify_fingerprint, image, record)


def _as_fingerprinted(read: Any, path: str, record: Optional[Any]) -> Any:
    """``read(path)``, its disagreements with the fingerprint as one line naming the file."""
    where = _where(path, record)
    try:
        return read(path)
    except MemoWasWrong as e:
        raise input_error(f"the image memo named another content for this file ({e.args[0][:12]}; the file holds "
                          f"{e.args[1][:12]}), so this run's identity and cache keys were wrong; the memo's entry "
                          "is corrected: run the command again, which uses the right one", **where) from None
    except ChangedSinceFingerprint as e:
        raise input_error(f"image file changed during the run (content {e.args[0][:12]} when the run started, "
                          f"{e.args[1][:12]} now): an answer about the new picture would be cached under the "
                          "old one's key; restore the file, or re-run to evaluate the new picture", **where) from None
    except OSError as e:
        raise unreadable(path, record, e) from None


def open_run_image(path: str, record: Optional[Any] = None) -> Image.Image:
    """``utils.images.open_image`` for a model's turn: the file as the run fingerprinted it."""
    return decode_image(read_run_image(path, record)[0], path, record)
