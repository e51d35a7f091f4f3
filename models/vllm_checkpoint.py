"""A checkpoint as vLLM loads it: transformers 5.x names of the vision tower, renamed in a cached copy.

Why: vLLM's LLaVA-family models build their CLIP / SigLIP tower as ``vision_tower.vision_model.*``
(the layout of transformers 4.x checkpoints, e.g. the llava-hf releases), while transformers 5.x
saves a LLaVA's tower without that level (``vision_tower.embeddings...``, or
``model.vision_tower.embeddings...``), so vLLM 0.32 refuses the checkpoints transformers 5.x writes
(ours among them: ``tiny-trained``). ``vllm_checkpoint(path)`` returns ``path`` itself when nothing
needs renaming, else a copy whose weight names have the ``vision_model.`` level inserted:

* the copy lives in ``$REFORM_CACHE/vllm-checkpoints/<sha256 of the checkpoint's files>[:16]``, so
  a new checkpoint under the same path (a retrained ``tiny-trained``) is a new copy and an
  unchanged one is converted once per machine (a ``source.json`` beside it remembers the source's
  file sizes and times, so an unchanged source is not hashed again);
* safetensors files are rewritten by streaming: a new header with the renamed keys, then the
  tensor bytes copied unchanged (no tensor is loaded; a 14 GB checkpoint costs a copy, once);
  ``model.safetensors.index.json`` gets the same renames; every other file is copied;
* it is built in a temporary sibling under a lock and renamed into place, so a killed build or
  concurrent ranks never leave a half copy.

Which keys: those under a ``vision_tower.`` prefix whose next name is not ``vision_model.``, in a
checkpoint whose ``vision_config.model_type`` is a CLIP or SigLIP vision model (the towers vLLM
wraps in ``vision_model``). Command line (a server needs the path too)::

    python -m reform_eval.models.vllm_checkpoint <checkpoint dir | tiny-trained>   # prints the directory to hand to vLLM
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import sys
import tempfile
from typing import Dict, List, Optional

from .checkpoint_files import check_safetensors
from .hf_loading import builtin_checkpoint
from .tiny import cache_root, sha256_file
from ..utils.errors import ReformError
from ..utils.runlock import FileLock

#: vision towers vLLM builds with a ``vision_model`` level (vllm/model_executor/models/clip.py, siglip.py)
WRAPPED_TOWERS = ("clip_vision_model", "siglip_vision_model")
#: a tower key without the ``vision_model.`` level (optionally under transformers 5's ``model.``)
_TOWER_KEY = re.compile(r"^((?:model\.)?vision_tower\.)(?!vision_model\.)")
_CHUNK = 1 << 24


def renamed_key(key: str) -> str:
    """``key`` as vLLM's tower expects it (``vision_tower.X`` -> ``vision_tower.vision_model.X``)."""
    return _TOWER_KEY.sub(r"\1vision_model.", key)


def _read_header(path: str) -> Dict[str, object]:
    check_safetensors(path)  # a truncated file: one line naming it
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n).decode("utf-8"))


def _needs_renaming(directory: str) -> bool:
    """Whether the checkpoint has a wrapped tower and any tower key without ``vision_model.``."""
    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ReformError(f"{directory}: no readable config.json ({e})") from None
    tower = (cfg.get("vision_config") or {}).get("model_type")
    if tower not in WRAPPED_TOWERS:
        return False
    return any(renamed_key(k) != k for path in _weight_files(directory) for k in _read_header(path)
               if k != "__metadata__")


def _weight_files(directory: str) -> List[str]:
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".safetensors"))


def _files(directory: str) -> List[str]:
    return sorted(n for n in os.listdir(directory) if os.path.isfile(os.path.join(directory, n)))


def _stats(directory: str) -> Dict[str, List[int]]:
    out = {}
    for n in _files(directory):
        st = os.stat(os.path.join(directory, n))
        out[n] = [st.st_size, st.st_mtime_ns]
    return out


def content_hash(directory: str) -> str:
    """SHA-256 over the checkpoint's files (names and contents), hex."""
    h = hashlib.sha256()
    for n in _files(directory):
        h.update(f"{n}\0{sha256_file(os.path.join(directory, n))}\0".encode("utf-8"))
    return h.hexdigest()


def _copy_renamed(src: str, dst: str) -> None:
    """Stream ``src`` (safetensors) to ``dst`` with renamed keys: new header, same tensor bytes."""
    header = _read_header(src)
    new = {("__metadata__" if k == "__metadata__" else renamed_key(k)): v for k, v in header.items()}
    blob = json.dumps(new, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # the format pads the header to 8 bytes with spaces
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        (n,) = struct.unpack("<Q", fin.read(8))
        fin.seek(8 + n)
        fout.write(struct.pack("<Q", len(blob)))
        fout.write(blob)
        shutil.copyfileobj(fin, fout, _CHUNK)


def _build(src: str, dst: str) -> None:
    for n in _files(src):
        path = os.path.join(src, n)
        if n.endswith(".safetensors"):
            _copy_renamed(path, os.path.join(dst, n))
        elif n == "model.safetensors.index.json":
            with open(path, encoding="utf-8") as f:
                index = json.load(f)
            index["weight_map"] = {renamed_key(k): v for k, v in (index.get("weight_map") or {}).items()}
            with open(os.path.join(dst, n), "w", encoding="utf-8") as f:
                json.dump(index, f, indent=2)
        else:
            shutil.copy2(path, os.path.join(dst, n))


def _known_copy(root: str, src: str, stats: Dict[str, List[int]]) -> Optional[str]:
    """A finished copy made from ``src`` while its files had exactly these sizes and times."""
    if not os.path.isdir(root):
        return None
    for name in sorted(os.listdir(root)):
        try:
            with open(os.path.join(root, name, "source.json"), encoding="utf-8") as f:
                seen = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue
        if seen.get("path") == src and seen.get("stats") == stats:
            return os.path.join(root, name)
    return None


def vllm_checkpoint(path: str) -> str:
    """``path`` when vLLM loads it as it is, else the cached renamed copy (see the module docstring)."""
    src = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(src) or not _needs_renaming(src):
        return path
    root = os.path.join(cache_root(), "vllm-checkpoints")
    stats = _stats(src)
    known = _known_copy(root, src, stats)
    if known:
        return known
    final = os.path.join(root, content_hash(src)[:16])
    os.makedirs(root, exist_ok=True)
    with FileLock(final + ".lock", "the vLLM checkpoint copy", wait_s=1800.0):
        if not os.path.isfile(os.path.join(final, "source.json")):
            tmp = tempfile.mkdtemp(prefix=os.path.basename(final) + ".tmp-", dir=root)
            try:
                _build(src, tmp)
                with open(os.path.join(tmp, "source.json"), "w", encoding="utf-8") as f:
                    json.dump({"path": src, "stats": stats, "renamed": "vision_tower.* -> vision_tower.vision_model.*"}, f)
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        else:  # the same content under another path (or times): remember this source too
            with open(os.path.join(final, "source.json"), "w", encoding="utf-8") as f:
                json.dump({"path": src, "stats": stats, "renamed": "vision_tower.* -> vision_tower.vision_model.*"}, f)
    return final


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m reform_eval.models.vllm_checkpoint <checkpoint dir | tiny-trained>  (prints the directory "
              "vLLM should load)", file=sys.stderr)
        return 2
    try:
        # a built-in name (tiny-trained: the known-skill LLaVA) stands for its directory
        path = args[0] if os.path.isdir(args[0]) else (builtin_checkpoint("llava", args[0], {}) or args[0])
        if not os.path.isdir(path):
            raise ReformError(f"{args[0]}: not a checkpoint directory")
        print(vllm_checkpoint(path))
    except ReformError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
