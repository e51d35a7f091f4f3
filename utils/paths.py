"""Where the harness keeps what it builds: one cache root for every entry point.

``$REFORM_CACHE`` when set, else ``~/.cache/reform_eval`` (a user cache, so an installed package
never writes into its own folder). The tiny models, the response cache, images extracted from
MME parquet files and the benches' data all live under it, whether ``run_eval`` is run directly,
through ``commands/*.sh`` or from Python; only the test suite points it into the repository
(tests/conftest.py), to keep its builds apart from a user's.
"""
from __future__ import annotations

import os


def cache_root() -> str:
    """The cache root (``$REFORM_CACHE``, else ``~/.cache/reform_eval``), user-expanded."""
    return os.path.expanduser(os.environ.get("REFORM_CACHE") or os.path.join("~", ".cache", "reform_eval"))
