"""The cluster-bootstrap primitives: draw counts per resample, weighted means, percentile
intervals. Here, below every other layer, so that metrics and reporting compute intervals one way
(evaluation/reporting/bootstrap.py builds the benchmark families on these).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple

from .seeding import np_rng_for

if TYPE_CHECKING:  # numpy is imported by the functions that compute: metrics import this module at
    import numpy as np  # every start of run_eval, and numpy with its BLAS threads costs 0.2 CPU s


#: resamples drawn (and summed) per block: memory is a block's draws, never all of them at once
BLOCK = 64


class Resamples:
    """The cluster bootstrap's draw counts, kept per CLUSTER in small integers
    ((n_boot + 1) x n_clusters bytes), never per entry as floats: at 50,000 samples and 1,000
    resamples a dense float matrix is 400 MB, this is 50 MB (issue 24: flat memory).

    Reads like the (n_boot + 1, n_entries) matrix it stands for: ``shape``; ``W[:, cols]`` is the
    same resamples over a subset of entries; any other index (``W[0]``, ``W[:, 3]``) or ``==``
    gives the dense values (tests); ``wmean`` sums block by block."""

    def __init__(self, counts: np.ndarray, inv: np.ndarray) -> None:
        self.counts = counts  # (n_boot + 1, n_clusters), row 0 all ones
        self.inv = inv        # entry -> its cluster's column

    @property
    def shape(self) -> Tuple[int, int]:
        return (self.counts.shape[0], len(self.inv))

    def dense(self) -> np.ndarray:
        return self.counts[:, self.inv].astype(float)

    def __getitem__(self, key: Any) -> Any:
        import numpy as np

        if isinstance(key, tuple) and len(key) == 2 and key[0] == slice(None) and \
                not isinstance(key[1], (int, np.integer)):
            return Resamples(self.counts, self.inv[key[1]])
        return self.dense()[key]

    def __eq__(self, other: Any) -> Any:
        return self.dense() == (other.dense() if isinstance(other, Resamples) else other)

    def sums(self, x: np.ndarray, mask: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
        """(sum of weight * x, sum of weight) per resample, over the entries under ``mask``:
        x is first added up per cluster, so the work is (n_boot + 1) x n_clusters."""
        import numpy as np

        inv, xv = (self.inv, x) if mask is None else (self.inv[mask], x[mask])
        n_c = self.counts.shape[1]
        per_x = np.bincount(inv, weights=xv, minlength=n_c)
        per_n = np.bincount(inv, minlength=n_c).astype(float)
        num = np.empty(self.counts.shape[0])
        tot = np.empty(self.counts.shape[0])
        for start in range(0, self.counts.shape[0], BLOCK):
            block = self.counts[start:start + BLOCK].astype(float)
            num[start:start + BLOCK] = block @ per_x
            tot[start:start + BLOCK] = block @ per_n
        return num, tot


def cluster_weights(clusters: Sequence[str], n_boot: int, seed: int, key: str,
                    strata: Optional[Sequence[Any]] = None) -> Resamples:
    """The draw counts of ``n_boot`` cluster resamples (row 0 is the data itself: all ones),
    whole clusters drawn within each stratum. The draws are made block by block from one
    generator, the same numbers one (n_boot, m) draw gives, in bounded memory."""
    import numpy as np

    uniq, inv = np.unique(np.asarray([str(c) for c in clusters]), return_inverse=True)
    n_c = len(uniq)
    counts = np.ones((n_boot + 1, n_c), dtype=np.uint8)
    if n_boot and n_c:
        rng = np_rng_for(seed, "bootstrap", key)
        stratum_of = np.zeros(n_c, dtype=int)
        if strata is not None:
            s_uniq, s_inv = np.unique(np.asarray([str(s) for s in strata]), return_inverse=True)
            stratum_of[inv] = s_inv
        for s in np.unique(stratum_of):
            members = np.flatnonzero(stratum_of == s)
            m = len(members)
            for start in range(0, n_boot, BLOCK):
                b = min(BLOCK, n_boot - start)
                draws = rng.integers(0, m, size=(b, m))
                flat = (draws + (np.arange(b) * m)[:, None]).ravel()
                got = np.bincount(flat, minlength=b * m).reshape(b, m)
                if got.max() > np.iinfo(counts.dtype).max:  # exact counts, whatever they are
                    counts = counts.astype(np.uint32)
                counts[1 + start:1 + start + b, members] = got
    return Resamples(counts, inv)


def wmean(W: Resamples, x: "np.typing.ArrayLike", mask: Optional[np.ndarray] = None) -> np.ndarray:
    """Weighted mean per resample (NaN where a resample holds no entry)."""
    import numpy as np

    xv = np.asarray(x, dtype=float)
    num, tot = W.sums(xv, mask)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tot > 0, num / np.where(tot > 0, tot, 1), np.nan)


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
    import numpy as np

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
