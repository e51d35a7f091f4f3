"""The cluster-bootstrap primitives: draw counts per resample, weighted means, percentile
intervals. Here, below every other layer, so that metrics and reporting compute intervals one way
(evaluation/reporting/bootstrap.py builds the benchmark families on these).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

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


def interval(values: np.ndarray, enough_clusters: bool = True, n_clusters: Optional[int] = None,
             bounds: Optional[Tuple[float, float]] = None) -> Dict[str, Any]:
    """{"value", "low", "high"} from a (n_boot + 1,) array; no interval without enough clusters.

    When every resample gives the same number (all clusters agree) the percentile interval has
    zero width, which reads as certainty. Then, for a mean of per-cluster values within
    ``bounds`` that sits at a bound (all wrong, all right), the exact Clopper-Pearson 95%
    interval over the ``n_clusters`` clusters is given instead (``"method": "clopper-pearson"``:
    e.g. 0 of 100 gives [0, 0.036]); anywhere else no interval is shown (docs/metrics.md)."""
    def f(x: float) -> Optional[float]:
        return None if x is None or not np.isfinite(x) else float(x)
    value = f(values[0])
    boot = values[1:][np.isfinite(values[1:])]
    if boot.size == 0 or not enough_clusters or value is None:
        return {"value": value, "low": None, "high": None}
    lo, hi = np.percentile(boot, [2.5, 97.5])
    if hi - lo > 1e-12 * max(1.0, abs(value)):
        return {"value": value, "low": f(lo), "high": f(hi)}
    if bounds is None or not n_clusters:
        return {"value": value, "low": None, "high": None}
    low_b, high_b = bounds
    width = (high_b - low_b) * (1.0 - 0.025 ** (1.0 / n_clusters))  # exact: x = 0 (or n) of n
    if abs(value - low_b) <= 1e-12 * max(1.0, abs(low_b)):
        return {"value": value, "low": float(low_b), "high": float(low_b + width), "method": "clopper-pearson"}
    if abs(value - high_b) <= 1e-12 * max(1.0, abs(high_b)):
        return {"value": value, "low": float(high_b - width), "high": float(high_b), "method": "clopper-pearson"}
    return {"value": value, "low": None, "high": None}


def cluster_interval(values: Sequence[float], clusters: Sequence[str], n_boot: int = 1000, seed: int = 0,
                     key: str = "", bounds: Optional[Tuple[float, float]] = (0.0, 1.0)) -> Dict[str, Any]:
    """{"value", "low", "high"} of a plain mean, resampling whole clusters; no interval from
    fewer than MIN_CLUSTERS clusters."""
    W = cluster_weights(clusters, n_boot, seed, key)
    n = len(set(map(str, clusters)))
    return interval(wmean(W, values), n >= MIN_CLUSTERS, n, bounds)
