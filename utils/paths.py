"""Where the harness keeps what it builds and remembers: one cache root for everything.

``$REFORM_CACHE`` when set, else ``~/.cache/reform_eval``: tiny models, the response cache, the
file-hash memo and extracted MME images all live under it, so one variable moves them all.
"""
from __future__ import annotations

import os


def cache_root() -> str:
    """Root of the reform cache (env ``REFORM_CACHE`` or ``~/.cache/reform_eval``)."""
    return os.path.expanduser(os.environ.get("REFORM_CACHE") or os.path.join("~", ".cache", "reform_eval"))
