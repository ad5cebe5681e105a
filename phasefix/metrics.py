"""Phase metrics: accuracy grouped by residue (target position mod period), with intervals and periodicity.

``PhaseAccuracy.compute()`` returns a dict of float64 tensors (counts and periods as int64):

    per_residue [period]       accuracy per residue group (nan where a group is empty)
    count [period]             samples per residue group
    acc_mean                   mean of per_residue over non-empty groups
    acc_worst, acc_best        min and max of per_residue
    acc_gap                    best - worst
    wilson_low, wilson_high    [period] Wilson score interval per group (level ``ci``), nan where empty
    worst_ci, gap_ci           [2] cluster-bootstrap percentile interval (level ``ci``) of worst and gap
    period_detected            smallest divisor p >= 2 of period with shift_difference(p) <= period_tol times
                               the mean |A(r) - A(s)| over pairs r != s (period if none, 1 if flat); see
                               detect_period
    fold_stride                S = the fold_stride given, else period_detected
    folded [S]                 accuracy pooled over residues congruent mod S (sum correct / sum count)
    periodicity                shift_difference(S) = mean over r of |A(r) - A((r + S) mod period)|
    periodicity_ratio          periodicity / gap (small: the curve repeats with period S; nan when the gap is 0;
                               trivially 0 when S = period, i.e. when no shorter period was found)
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from statistics import NormalDist

import numpy as np
import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from phasefix.errors import ConfigError, check


def wilson_interval(k, n, z: float = 1.96) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval for k successes in n trials (arrays broadcast; nan where n == 0)."""
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with _quiet_nan_warnings():
        p = k / n
        denom = 1 + z * z / n
        center = (p + z * z / (2 * n)) / denom
        half = z / denom * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return np.clip(center - half, 0, 1), np.clip(center + half, 0, 1)  # clip float round-off at 0 and 1


def _group_counts(correct, residue, cluster, period: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster, per-residue correct counts and totals, [clusters, period]; cluster None: each sample its own."""
    correct, residue = np.asarray(correct, dtype=np.float64), np.asarray(residue, dtype=np.int64)
    if cluster is None:
        ids, size = np.arange(residue.size), residue.size
    else:
        _, ids = np.unique(np.asarray(cluster), return_inverse=True)
        size = int(ids.max()) + 1 if ids.size else 0
    flat = ids * period + residue
    k = np.bincount(flat, weights=correct, minlength=size * period).reshape(size, period)
    n = np.bincount(flat, minlength=size * period).reshape(size, period).astype(np.float64)
    return k, n


def cluster_bootstrap_curves(correct, residue, cluster=None, *, period: int, n_boot: int = 2000,
                             seed: int = 0) -> np.ndarray:
    """Bootstrap replicates [n_boot, period] of the per-residue accuracy curve, resampling clusters.

    Replicate b draws ``rng.integers(0, C, C)`` (C clusters, numbered in sorted order of their ids; without ids,
    every sample is its own cluster, in order) from ``np.random.default_rng(seed)``, one replicate after another.
    """
    k, n = _group_counts(correct, residue, cluster, period)
    num = k.shape[0]
    rng = np.random.default_rng(seed)
    curves = np.empty((n_boot, period))
    chunk = max(1, 2_000_000 // max(num, 1))  # bounds the [chunk, C] weight matrix
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        draws = rng.integers(0, num, (b, num))  # the same stream as b successive draws of size C
        weights = np.bincount((draws + num * np.arange(b)[:, None]).ravel(), minlength=b * num).reshape(b, num)
        with _quiet_nan_warnings():
            curves[start:start + b] = (weights @ k) / (weights @ n)
    return curves


def curve_summary(curves: np.ndarray) -> dict[str, np.ndarray]:
    """mean, worst, best, gap of accuracy curves [..., period], ignoring empty (nan) residues."""
    with _quiet_nan_warnings():
        worst, best = np.nanmin(curves, axis=-1), np.nanmax(curves, axis=-1)
        return {"mean": np.nanmean(curves, axis=-1), "worst": worst, "best": best, "gap": best - worst}


def cluster_bootstrap(correct, residue, cluster=None, *, period: int, n_boot: int = 2000, ci: float = 0.95,
                      seed: int = 0) -> dict[str, tuple[float, float]]:
    """Percentile intervals (level ci) of mean, worst, best and gap under the cluster bootstrap."""
    stats = curve_summary(cluster_bootstrap_curves(correct, residue, cluster, period=period, n_boot=n_boot, seed=seed))
    alpha = (1 - ci) / 2
    with _quiet_nan_warnings():
        return {name: tuple(float(q) for q in np.nanquantile(values, [alpha, 1 - alpha]))
                for name, values in stats.items()}


def shift_difference(curve: np.ndarray, shift: int) -> float:
    """mean over r of |A(r) - A((r + shift) mod period)|, over pairs where both residues have data."""
    diff = np.abs(curve - np.roll(curve, -shift))
    with _quiet_nan_warnings():
        return float(np.nanmean(diff))


def detect_period(curve: np.ndarray, tol: float = 0.5) -> int:
    """The dominant period of an accuracy curve over residues 0..period-1.

    The smallest divisor p >= 2 of period whose shift difference is at most ``tol`` times the curve's mean
    absolute difference between any two residues (what a shift by a non-period gives on average); period itself
    if no divisor qualifies; 1 if the curve is flat. Divisors only: a pattern of period p measured modulo period
    repeats exactly only when p divides period, and multiples of the fundamental period qualify too. Comparing
    against the mean pairwise difference rather than the gap keeps a single weak phase from passing as period 2.
    """
    period = curve.size
    with _quiet_nan_warnings():
        if not np.nanmax(curve) - np.nanmin(curve) > 0:
            return 1
        pairwise = np.abs(curve[:, None] - curve[None, :])[~np.eye(period, dtype=bool)]
        typical = np.nanmean(pairwise)
    for p in range(2, period):
        if period % p == 0 and shift_difference(curve, p) <= tol * typical:
            return p
    return period


def phase_axes(correct, residue, end_residue, cluster, *, phase_of: str, period: int, fold_stride: int | None = None,
               n_boot: int = 2000, seed: int = 0) -> dict:
    """`PhaseAccuracy` by the phase of the fact (``residue``: the target's position mod period), of the prompt's end
    (``end_residue``: its length mod period) or both: {"fact": result, "end": result} as asked, and for ``both`` also
    "grid": {"accuracy" [period, period] (row: fact residue, column: end residue), "count"} (nan where empty)."""
    axes = {"fact": residue, "end": end_residue}
    out = {}
    for axis in (("fact", "end") if phase_of == "both" else (phase_of,)):
        metric = PhaseAccuracy(period, fold_stride=fold_stride, n_boot=n_boot, seed=seed)
        metric.update(torch.as_tensor(np.asarray(correct)), torch.as_tensor(np.asarray(axes[axis])),
                      torch.as_tensor(np.asarray(cluster)))
        out[axis] = metric.compute()
    if phase_of == "both":
        cell = np.asarray(residue) * period + np.asarray(end_residue)
        k = np.bincount(cell, weights=np.asarray(correct, dtype=np.float64), minlength=period * period)
        n = np.bincount(cell, minlength=period * period)
        with _quiet_nan_warnings():
            out["grid"] = {"accuracy": (k / n).reshape(period, period), "count": n.reshape(period, period)}
    return out


def fft_period(curve: np.ndarray) -> float:
    """The period (in samples) of the strongest Fourier component of a curve after removing its linear trend (a
    drift over filler lengths is not a period); nan if nothing is left."""
    x = np.asarray(curve, dtype=np.float64)
    t = np.arange(x.size)
    x = x - np.polyval(np.polyfit(t, x, 1), t) if x.size >= 2 else x - x.mean()
    if x.size < 4 or not np.any(np.abs(x) > 1e-12):
        return float("nan")
    power = np.abs(np.fft.rfft(x))[1:]
    k = int(np.argmax(power)) + 1
    return float(x.size / k)


@contextmanager
def _quiet_nan_warnings():
    """All-nan slices are expected (empty residues); numpy's RuntimeWarnings about them are noise here."""
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _cat(state) -> np.ndarray:
    """A list state (before sync) or tensor state (after sync) as one numpy array."""
    if isinstance(state, list) and not state:
        return np.zeros(0)
    return dim_zero_cat(state).cpu().numpy()


class PhaseAccuracy(Metric):
    """Accuracy per residue group with Wilson and cluster-bootstrap intervals and a periodicity figure.

    update(correct [N] bool, residue [N] int in [0, period), cluster [N] int or None). States are concatenated
    across processes under DDP; samples without a cluster id count as their own cluster.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, period: int, fold_stride: int | None = None, n_boot: int = 2000, ci: float = 0.95,
                 seed: int = 0, period_tol: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        check(isinstance(period, int) and period >= 1, "metric.period", period, "must be an integer >= 1")
        check(fold_stride is None or (isinstance(fold_stride, int) and fold_stride >= 1 and period % fold_stride == 0),
              "metric.fold_stride", fold_stride, f"must be null or a divisor of period={period}")
        check(isinstance(n_boot, int) and n_boot >= 1, "metric.n_boot", n_boot, "must be an integer >= 1")
        check(0 < ci < 1, "metric.ci", ci, "must be in (0, 1)")
        self.period, self.fold_stride, self.n_boot, self.ci, self.seed = period, fold_stride, n_boot, ci, seed
        self.period_tol = period_tol
        self.add_state("correct", default=[], dist_reduce_fx="cat")
        self.add_state("residue", default=[], dist_reduce_fx="cat")
        self.add_state("cluster", default=[], dist_reduce_fx="cat")

    def update(self, correct: torch.Tensor, residue: torch.Tensor, cluster: torch.Tensor | None = None) -> None:
        correct, residue = torch.as_tensor(correct).reshape(-1), torch.as_tensor(residue).reshape(-1)
        cluster = None if cluster is None else torch.as_tensor(cluster).reshape(-1)
        lengths = [t.numel() for t in (correct, residue, cluster) if t is not None]
        if len(set(lengths)) > 1:
            raise ConfigError(f"PhaseAccuracy.update: correct, residue and cluster must have the same length "
                              f"(got {', '.join(map(str, lengths))})")
        if residue.numel() and (residue.min() < 0 or residue.max() >= self.period):
            raise ConfigError(f"residue={residue.min().item()}..{residue.max().item()} is invalid: "
                              f"must be in [0, {self.period})")
        if cluster is not None:
            if cluster.numel() and cluster.min() < 0:
                raise ConfigError(f"cluster={cluster.min().item()} is invalid: cluster ids must be >= 0")
        else:
            cluster = torch.full_like(residue, -1)  # marks singletons, numbered in compute()
        self.correct.append(correct.to(self.device, torch.float64))
        self.residue.append(residue.to(self.device, torch.int64))
        self.cluster.append(cluster.to(self.device, torch.int64))

    def compute(self) -> dict[str, torch.Tensor]:
        correct = _cat(self.correct)
        residue, cluster = _cat(self.residue).astype(np.int64), _cat(self.cluster).astype(np.int64)
        # Samples without a cluster id become singleton clusters, numbered after the given ids.
        missing = cluster < 0
        cluster[missing] = (cluster.max(initial=-1) + 1) + np.arange(missing.sum())
        P = self.period
        k = np.bincount(residue, weights=correct, minlength=P)
        n = np.bincount(residue, minlength=P)
        with _quiet_nan_warnings():
            curve = k / n
        summary = curve_summary(curve)
        z = NormalDist().inv_cdf(1 - (1 - self.ci) / 2)
        low, high = wilson_interval(k, n, z)
        boot = cluster_bootstrap(correct, residue, cluster, period=P, n_boot=self.n_boot, ci=self.ci, seed=self.seed)
        detected = detect_period(curve, self.period_tol)
        stride = self.fold_stride or detected
        with _quiet_nan_warnings():
            folded = k.reshape(-1, stride).sum(0) / n.reshape(-1, stride).sum(0)
            periodicity = shift_difference(curve, stride)
            ratio = periodicity / summary["gap"] if summary["gap"] > 0 else np.nan

        def f64(x) -> torch.Tensor:
            return torch.as_tensor(np.asarray(x, dtype=np.float64))

        return {
            "per_residue": f64(curve), "count": torch.as_tensor(n, dtype=torch.int64),
            "acc_mean": f64(summary["mean"]), "acc_worst": f64(summary["worst"]), "acc_best": f64(summary["best"]),
            "acc_gap": f64(summary["gap"]), "wilson_low": f64(low), "wilson_high": f64(high),
            "worst_ci": f64(boot["worst"]), "gap_ci": f64(boot["gap"]),
            "period_detected": torch.tensor(detected, dtype=torch.int64),
            "fold_stride": torch.tensor(stride, dtype=torch.int64), "folded": f64(folded),
            "periodicity": f64(periodicity), "periodicity_ratio": f64(ratio),
        }
