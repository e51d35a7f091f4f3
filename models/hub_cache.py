"""Checkpoints named by hub id (``--model_name org/model``): the snapshot they stand for.

Why: a hub id names whatever snapshot the local Hugging Face cache holds for it, and that
changes when new weights are downloaded under the same id. The files actually loaded are what
decide the outputs, so the id is resolved here, offline and the way ``from_pretrained(...,
local_files_only=True)`` resolves it (``huggingface_hub.snapshot_download``: ``refs/main`` ->
commit -> ``snapshots/<commit>/``); the run identity and the response-cache key fingerprint that
folder as a local checkpoint folder is fingerprinted, the model loads from it, and the revision
(the commit hash) is recorded with the run. Light on purpose: ``huggingface_hub`` is imported
only when a hub id is resolved.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Optional


@dataclass(frozen=True)
class HubSnapshot:
    """One resolved hub id: the id, the commit its ``revision`` pointed at, and its folder."""

    repo_id: str
    revision: str
    commit: str
    path: str

    def record(self) -> Dict[str, Any]:
        """What a run records about its checkpoint (run info ``checkpoint_source``)."""
        return {"hub_id": self.repo_id, "revision": self.revision, "commit": self.commit, "snapshot": self.path}


def is_path_like(name: str) -> bool:
    """A name the user meant as a filesystem path (not an ``org/model`` hub id)."""
    return (os.path.isabs(name) or name.startswith(("./", "../", "~", ".\\"))
            or name.count("/") > 1 or os.path.exists(name))


def hub_cache_dir() -> str:
    """The Hugging Face hub cache folder, read from the environment now, as ``huggingface_hub``
    resolves it: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return os.path.expanduser(explicit)
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def in_hub_cache(name: str) -> bool:
    """Whether the hub cache holds a snapshot of ``name`` (a look at one folder: no import of
    ``huggingface_hub``, so a model-name typo is told before anything heavy is loaded)."""
    snapshots = os.path.join(hub_cache_dir(), "models--" + str(name).replace("/", "--"), "snapshots")
    try:
        return any(os.path.isdir(os.path.join(snapshots, s)) for s in os.listdir(snapshots))
    except OSError:
        return False


def hub_snapshot(name: Optional[str], revision: str = "main") -> Optional[HubSnapshot]:
    """The snapshot of the local HF cache that hub id ``name`` resolves to offline, or None when
    ``name`` is a path, not a valid id, or not in the cache (the model's own load then says so).
    ``HF_HUB_CACHE`` is read now, not when the library was imported."""
    if not name or is_path_like(str(name)):
        return None
    try:
        from huggingface_hub import snapshot_download  # only for a hub id
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import validate_repo_id
    except ImportError:
        return None
    try:
        validate_repo_id(str(name))
    except HFValidationError:
        return None
    try:
        path = snapshot_download(str(name), revision=revision, local_files_only=True,
                                 cache_dir=os.environ.get("HF_HUB_CACHE") or None)
    except Exception:  # noqa: BLE001  (not cached, or a damaged cache entry: the load reports it)
        return None
    if not isinstance(path, str) or not os.path.isdir(path):
        return None
    return HubSnapshot(str(name), revision, os.path.basename(os.path.normpath(path)), path)
