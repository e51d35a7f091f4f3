"""Cheap integrity checks of checkpoint files, before any weights are read.

Why: a truncated or half-copied ``model.safetensors`` (an interrupted download or copy, a
cache built by a process that was killed) otherwise fails deep inside the loader with a
Rust traceback, or is trusted by a cache marker. A safetensors file states its own size:
8 bytes of header length, a JSON header, then the tensor data whose last ``data_offsets``
end must be the end of the file. Checking that costs one small read per file.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Dict, List

from ..utils.errors import ReformError

#: a safetensors header is small; anything larger is not a safetensors file
_MAX_HEADER = 100 * 1024 * 1024


def check_safetensors(path: str) -> int:
    """Raise ``ReformError`` (one line naming ``path``) unless ``path`` is a complete
    safetensors file; returns its number of tensors."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ReformError(f"{path}: truncated safetensors file ({size} bytes, no header); "
                                  "re-download or re-copy it")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise ReformError(f"{path}: truncated or corrupt safetensors file (header of {n} bytes, file "
                                  f"of {size} bytes); re-download or re-copy it")
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        raise ReformError(f"{path}: cannot read checkpoint file ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ReformError(f"{path}: corrupt safetensors file (unreadable header); re-download or re-copy it") from None
    if not isinstance(header, dict):
        raise ReformError(f"{path}: corrupt safetensors file (header is not a JSON object)")
    end = 0
    count = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, IndexError, TypeError, ValueError):
            raise ReformError(f"{path}: corrupt safetensors file (tensor '{name}' has no data_offsets)") from None
        count += 1
    expected = 8 + n + end
    if size != expected:
        raise ReformError(f"{path}: truncated safetensors file ({size} bytes, its header says {expected}); "
                          "re-download or re-copy it")
    return count


def weight_files(directory: str) -> List[str]:
    """The ``*.safetensors`` files of a checkpoint directory (sorted)."""
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".safetensors"))


def check_checkpoint_dir(directory: str) -> None:
    """Every safetensors file of ``directory`` is complete (a no-op for other formats)."""
    for path in weight_files(directory):
        check_safetensors(path)


def file_manifest(directory: str) -> Dict[str, int]:
    """``{relative file name: size}`` of every regular file under ``directory``."""
    out: Dict[str, int] = {}
    for root, _, files in os.walk(directory):
        for name in files:
            full = os.path.join(root, name)
            out[os.path.relpath(full, directory)] = os.path.getsize(full)
    return out
