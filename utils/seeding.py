"""Deterministic random generators derived from (seed, key...).

Every random choice in the project draws from a generator made here, never from global
random state, so the same arguments give byte-identical samples on every rank and run.
"""
from __future__ import annotations

import hashlib
import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (numpy is imported where a generator is made: not at every start)
    import numpy as np


def derive_seed(seed: int, *keys: Any) -> int:
    """A 63-bit integer seed that depends only on ``seed`` and ``keys`` (stable across runs)."""
    text = "\x1f".join([str(int(seed))] + [repr(k) for k in keys])
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") >> 1


def rng_for(seed: int, *keys: Any) -> random.Random:
    """A ``random.Random`` seeded from (seed, keys)."""
    return random.Random(derive_seed(seed, *keys))


def np_rng_for(seed: int, *keys: Any) -> np.random.Generator:
    """A numpy Generator seeded from (seed, keys) (numpy imported here: not at every start)."""
    import numpy as np

    return np.random.default_rng(derive_seed(seed, *keys))
