"""The cluster-bootstrap primitives: draw counts per resample, weighted means, percentile
intervals. Here, below every other layer, so that metrics and reporting compute intervals one way
(evaluation/reporting/bootstrap.py builds the benchmark families on these).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np

from utils.seeding import np_rng_for


def cluster_weights(clusters: Sequence[str], n_boot: int, seed: int, key: str,
                    strata: Optional[Sequence[Any]] = None) -> np.ndarray:
    """(n_boot + 1, n_entries) draw counts; row 0 is the data itself (all ones)."""
    uniq, inv = np.unique(np.asarray([str(c) for c in clusters]), return_inverse=True)
    n_c = len(uniq)
    counts = np.ones((n_boot + 1, n_c))
    if n_boot and n_c:
        rng = np_rng_for(seed, "bootstrap", key)
        stratum_of = np.zeros(n_c, dtype=int)
        if strata is not None:
            s_uniq, s_inv = np.unique(np.asarray([str(s) for s in strata]), return_inverse=True)
            stratum_of[inv] = s_inv
        boot = np.zeros((n_boot, n_c))
        for s in np.unique(stratum_of):
            members = np.flatnonzero(stratum_of == s)
            m = len(members)
            draws = rng.integers(0, m, size=(n_boot, m))
            flat = (draws + (np.arange(n_boot) * m)[:, None]).ravel()
            boot[:, members] = np.bincount(flat, minlength=n_boot * m).reshape(n_boot, m)
        counts[1:] = boot
    return counts[:, inv]


def wmean(W: np.ndarray, x: Sequence[float], mask: Optional[np.ndarray] = None) -> np.ndarray:
    """Weighted mean per resample (NaN where a resample holds no entry)."""
    xv = np.asarray(x, dtype=float)
    if mask is not None:
        W, xv = W[:, mask], xv[mask]
    tot = W.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tot > 0, (W @ xv) / np.where(tot > 0, tot, 1), np.nan)


#: a group whose entries come from fewer clusters shows no interval (docs/metrics.md): with 1 or 2
#: clusters the percentile bootstrap has almost nothing to resample and collapses to zero width
MIN_CLUSTERS = 5


def interval(values: np.ndarray, enough_clusters: bool = True) -> Dict[str, Optional[float]]:
    """{"value", "low", "high"} from a (n_boot + 1,) array; no interval without enough clusters."""
    def f(x: float) -> Optional[float]:
        return None if x is None or not np.isfinite(x) else float(x)
    boot = values[1:][np.isfinite(values[1:])]
    if boot.size == 0 or not enough_clusters:
        return {"value": f(values[0]), "low": None, "high": None}
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"value": f(values[0]), "low": f(lo), "high": f(hi)}


def cluster_interval(values: Sequence[float], clusters: Sequence[str], n_boot: int = 1000, seed: int = 0,
                     key: str = "") -> Dict[str, Optional[float]]:
    """{"value", "low", "high"} of a plain mean, resampling whole clusters; no interval from
    fewer than MIN_CLUSTERS clusters."""
    W = cluster_weights(clusters, n_boot, seed, key)
    return interval(wmean(W, values), len(set(map(str, clusters))) >= MIN_CLUSTERS)
