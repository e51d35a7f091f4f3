"""Chat-completions messages from our prompts: images as base64 ``data:`` URLs, in the order
their placeholders appear, each distinct image encoded once per run (``EncodedImages``).

Why inline ``data:`` URLs: gateways cannot reach local files. Why every image must be placed
exactly once: a prompt that names more or fewer images than it carries is an error, never a
silently dropped image.
"""
from __future__ import annotations

import base64
import hashlib
import io
import threading
from collections import OrderedDict
from typing import Any, Dict, List, Union

from PIL import Image

from ..utils.errors import ReformError
from ..utils.file_hashes import unchanged_digest
from ..utils.fingerprint import pixel_digest
from ..utils.images import decode_image
from ..utils.run_images import open_run_image, read_run_image
from ..utils.schema import IMAGE_TOKEN

#: ``image_format`` names (case-insensitive) -> PIL format names
IMAGE_FORMATS = {"PNG": "PNG", "JPEG": "JPEG", "JPG": "JPEG", "WEBP": "WEBP"}


def image_format(name: Any) -> str:
    """The PIL format for an ``image_format`` option (case-insensitive; JPG means JPEG)."""
    fmt = IMAGE_FORMATS.get(str(name).strip().upper())
    if fmt is None:
        raise ReformError(f"--model_option image_format: must be PNG, JPEG (or JPG) or WEBP, got {name!r}")
    return fmt


def encode_image(image: Union[Image.Image, str], fmt: str = "PNG") -> str:
    """A base64 ``data:`` URL for one image (paths are opened, with errors naming the file)."""
    if isinstance(image, str):
        image = open_run_image(image)
    if not isinstance(image, Image.Image):
        raise ReformError(f"openai_api: cannot send an image of type {type(image).__name__}")
    fmt = image_format(fmt)
    im = image.convert("RGB") if fmt == "JPEG" or image.mode not in ("RGB", "RGBA", "L") else image
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    mime = "jpeg" if fmt == "JPEG" else fmt.lower()
    return f"data:image/{mime};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_as_is(data: bytes) -> bool:
    """Whether a PNG file's own bytes carry exactly what ``encode_image(..., "PNG")`` sends for it
    (an 8-bit RGB image without a transparent colour: a file is read as RGB, and PNG is
    lossless), so the file goes out unchanged instead of decoded and encoded again per request.
    Read from the header by hand: the file passed the pixel guard when the run fingerprinted
    these very bytes."""
    if not (len(data) > 33 and data[:8] == _PNG_SIGNATURE and data[12:16] == b"IHDR"
            and data[24] == 8 and data[25] == 2):
        return False
    idat = data.find(b"IDAT")
    return idat > 0 and data.find(b"tRNS", 33, idat) < 0


class EncodedImages:
    """``encode_image`` with each distinct image encoded once per run: the images of a
    multi-turn chat go out again with every turn, and a benchmark may show one image to many
    questions (or the same picture under many names). Keyed by a file's content hash or, for an
    in-memory image, by its pixels; at most ``max_bytes`` of URLs are kept (the oldest go first).
    A file is encoded from the very bytes whose hash is its key, and those must be the content
    the run fingerprinted (``utils.images.read_run_image``): what is sent is what the run's
    cache keys name, even if the file is replaced during the run. Thread-safe: the request
    workers share it."""

    def __init__(self, fmt: str, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.fmt = image_format(fmt)
        self.max_bytes = max_bytes
        self._urls: "OrderedDict[Any, str]" = OrderedDict()
        self._digests: Dict[str, str] = {}  # url -> hash of its bytes, for the cached urls
        # path -> its key for this run: a path is looked up without a system call after its
        # first request
        self._by_path: Dict[str, Any] = {}
        self._size = 0
        self._lock = threading.Lock()

    def url(self, image: Any) -> str:
        is_path = isinstance(image, str)
        key = self._by_path.get(image) if is_path else None
        if key is not None:
            found = self._urls.get(key)
            if found is not None:
                return found
        if is_path:
            # another name for a picture already encoded: the fingerprint's hash of this file,
            # while its stat is unchanged, finds the URL made from the very bytes of that hash
            digest = unchanged_digest(image)
            if digest is not None:
                found = self._urls.get(("file", digest))
                if found is not None:
                    self._by_path[image] = ("file", digest)
                    return found
            data, digest = read_run_image(image)
            key = self._by_path[image] = ("file", digest)
            found = self._urls.get(key)  # the same picture under another name
            if found is not None:
                return found
            if self.fmt == "PNG" and png_as_is(data):
                url = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
            else:
                url = encode_image(decode_image(data, image), self.fmt)
        else:
            if isinstance(image, Image.Image):
                key = ("pixels", pixel_digest(image))
                found = self._urls.get(key)
                if found is not None:
                    return found
            url = encode_image(image, self.fmt)
        if key is not None and len(url) <= self.max_bytes:
            with self._lock:
                if key not in self._urls:
                    self._urls[key] = url
                    self._digests[url] = _digest(url)
                    self._size += len(url)
                    while self._size > self.max_bytes:  # the oldest go first
                        _, old = self._urls.popitem(last=False)
                        self._digests.pop(old, None)
                        self._size -= len(old)
        return url

    def digest(self, url: str) -> str:
        """A short hash of what the server receives for an image (computed once per cached url)."""
        found = self._digests.get(url)
        return found if found is not None else _digest(url)


def _digest(url: str) -> str:
    return hashlib.blake2b(url.encode("ascii", "replace"), digest_size=8).hexdigest()


def _text_to_parts(text: str, urls: List[str], cursor: List[int]) -> List[Dict[str, Any]]:
    """Split a string on ``IMAGE_TOKEN`` into text / image_url parts, consuming ``urls`` in order."""
    parts: List[Dict[str, Any]] = []
    for i, piece in enumerate(text.split(IMAGE_TOKEN)):
        if i > 0:
            parts.append(_image_part(urls, cursor))
        if piece.strip():
            parts.append({"type": "text", "text": piece.strip()})
    return parts


def _image_part(urls: List[str], cursor: List[int]) -> Dict[str, Any]:
    if cursor[0] >= len(urls):
        raise ReformError(f"openai_api: the prompt has more image placeholders than the "
                          f"{len(urls)} images given")
    part = {"type": "image_url", "image_url": {"url": urls[cursor[0]]}}
    cursor[0] += 1
    return part


def to_openai_messages(prompt: Any, image_urls: List[str]) -> List[Dict[str, Any]]:
    """Convert a preprocessor output into chat-completions ``messages`` with images in place.

    Accepts chat messages (``ChatTemplateProcessor`` output: ``{"type": "image"}`` parts) or a
    plain string with ``<image>`` placeholders (sent as one user message). Every image must
    be placed exactly once; a mismatch is an error rather than a silently dropped image.
    """
    cursor = [0]
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": _text_to_parts(prompt, image_urls, cursor)}]
    elif isinstance(prompt, (list, tuple)):
        messages = []
        for msg in prompt:
            content = msg.get("content", "")
            if isinstance(content, str):
                parts = _text_to_parts(content, image_urls, cursor)
            else:
                parts = []
                for part in content:
                    if part.get("type") == "image":
                        parts.append(_image_part(image_urls, cursor))
                    elif part.get("type") == "text":
                        parts.extend(_text_to_parts(part.get("text", ""), image_urls, cursor))
                    else:
                        parts.append(part)
            # assistant/system turns are plain strings: most servers reject parts there
            if msg["role"] != "user" and all(p.get("type") == "text" for p in parts):
                messages.append({"role": msg["role"], "content": "\n".join(p["text"] for p in parts)})
            else:
                messages.append({"role": msg["role"], "content": parts})
    else:
        raise ReformError(f"openai_api: unsupported prompt type {type(prompt).__name__}")
    if cursor[0] != len(image_urls):
        raise ReformError(f"openai_api: the prompt places {cursor[0]} images but {len(image_urls)} were given")
    return messages
