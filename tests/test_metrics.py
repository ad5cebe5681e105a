"""phasefix.metrics against hand-computed values, plain loops, and a 2-process gloo run."""
import math
import os
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from phasefix.errors import ConfigError
from phasefix.metrics import (PhaseAccuracy, cluster_bootstrap, cluster_bootstrap_curves, detect_period,
                              wilson_interval)


# ---------------------------------------------------------------- Wilson
@pytest.mark.parametrize("k,n,low,high", [
    # By hand: p = k/n, d = 1 + z^2/n, centre = (p + z^2/2n)/d, half = z/d * sqrt(p(1-p)/n + z^2/4n^2), z = 1.96.
    (8, 10, 0.49016, 0.94332),    # centre 0.99208/1.38416 = 0.716738, half 0.226581
    (0, 10, 0.0, 0.27754),        # centre 0.19208/1.38416 = 0.138770, half = centre
    (10, 10, 0.72246, 1.0),
    (50, 100, 0.40383, 0.59617),  # centre 0.5, half 1.96 * 0.0509902 / 1.038416 = 0.096172
    (1, 1, 0.20654, 1.0),
])
def test_wilson_hand_values(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=5e-5) and hi == pytest.approx(high, abs=5e-5)


def test_wilson_vectorised_and_empty():
    lo, hi = wilson_interval(np.array([8, 0]), np.array([10, 0]))
    assert lo[0] == pytest.approx(0.49016, abs=5e-5) and math.isnan(lo[1]) and math.isnan(hi[1])


# ---------------------------------------------------------------- bootstrap
def _loop_bootstrap(correct, residue, cluster, period, n_boot, seed):
    """The cluster bootstrap written out: draw clusters with replacement, pool their samples, per-residue accuracy."""
    ids = sorted(set(cluster))
    members = {c: [i for i in range(len(cluster)) if cluster[i] == c] for c in ids}
    rng = np.random.default_rng(seed)
    worst, gap = [], []
    for _ in range(n_boot):
        picks = rng.integers(0, len(ids), len(ids))
        k, n = [0.0] * period, [0] * period
        for j in picks:
            for i in members[ids[j]]:
                k[residue[i]] += correct[i]
                n[residue[i]] += 1
        acc = [k[r] / n[r] for r in range(period) if n[r] > 0]
        worst.append(min(acc))
        gap.append(max(acc) - min(acc))
    return np.array(worst), np.array(gap)


def test_bootstrap_matches_a_plain_loop():
    rng = np.random.default_rng(0)
    period, clusters = 6, 15
    cluster = [c * 7 + 3 for c in range(clusters) for _ in range(period)]  # ids need not be contiguous
    residue = [r for _ in range(clusters) for r in range(period)]
    correct = [float(v) for v in rng.random(len(residue)) < 0.3 + 0.1 * np.array(residue)]
    worst, gap = _loop_bootstrap(correct, residue, cluster, period, 300, seed=7)
    curves = cluster_bootstrap_curves(correct, residue, cluster, period=period, n_boot=300, seed=7)
    assert np.allclose(curves.min(axis=1), worst) and np.allclose(curves.max(axis=1) - curves.min(axis=1), gap)
    ci = cluster_bootstrap(correct, residue, cluster, period=period, n_boot=300, ci=0.9, seed=7)
    assert ci["worst"] == pytest.approx(tuple(np.quantile(worst, [0.05, 0.95])))
    assert ci["gap"] == pytest.approx(tuple(np.quantile(gap, [0.05, 0.95])))


def test_bootstrap_without_clusters_resamples_samples():
    correct = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    residue = [0, 1, 0, 1, 0, 1, 0, 1]
    worst, _ = _loop_bootstrap(correct, residue, list(range(8)), 2, 200, seed=3)
    curves = cluster_bootstrap_curves(correct, residue, None, period=2, n_boot=200, seed=3)
    assert np.allclose(np.nanmin(curves, axis=1), worst)


# ---------------------------------------------------------------- PhaseAccuracy
def _data(seed=0, period=8, clusters=40):
    """Accuracy 0.9 except residues 2 and 6 (period-4 weak phases)."""
    g = torch.Generator().manual_seed(seed)
    residue = torch.arange(period).repeat(clusters)
    cluster = torch.arange(clusters).repeat_interleave(period)
    p = torch.tensor([0.9, 0.9, 0.2, 0.9] * (period // 4))[residue]
    return torch.rand(residue.numel(), generator=g) < p, residue, cluster


def test_phase_accuracy_summary_against_numpy():
    correct, residue, cluster = _data()
    m = PhaseAccuracy(8, n_boot=200)
    m.update(correct[:100], residue[:100], cluster[:100])
    m.update(correct[100:], residue[100:], cluster[100:])
    out = m.compute()
    c, r = correct.numpy().astype(float), residue.numpy()
    acc = np.array([c[r == i].mean() for i in range(8)])
    assert np.allclose(out["per_residue"].numpy(), acc)
    assert out["count"].tolist() == [40] * 8
    assert out["acc_mean"].item() == pytest.approx(acc.mean())
    assert out["acc_worst"].item() == pytest.approx(acc.min()) and out["acc_best"].item() == pytest.approx(acc.max())
    assert out["acc_gap"].item() == pytest.approx(acc.max() - acc.min())
    k = np.array([c[r == i].sum() for i in range(8)])
    lo, hi = wilson_interval(k, 40, z=1.959964)
    assert np.allclose(out["wilson_low"].numpy(), lo, atol=1e-6)
    assert np.allclose(out["wilson_high"].numpy(), hi, atol=1e-6)
    assert out["worst_ci"][0] <= out["acc_worst"] + 0.05 and out["gap_ci"][1] >= out["acc_gap"] - 0.05
    # The weak phases repeat every 4: detected, folded and periodicity all follow.
    assert out["period_detected"].item() == 4 and out["fold_stride"].item() == 4
    assert np.allclose(out["folded"].numpy(), [(k[i] + k[i + 4]) / 80 for i in range(4)])
    diffs = np.mean([abs(acc[i] - acc[(i + 4) % 8]) for i in range(8)])
    assert out["periodicity"].item() == pytest.approx(diffs)
    assert out["periodicity_ratio"].item() == pytest.approx(diffs / (acc.max() - acc.min()))


def test_fold_stride_and_empty_residues():
    m = PhaseAccuracy(6, fold_stride=3, n_boot=50)
    m.update(torch.tensor([True, False, True]), torch.tensor([0, 3, 1]))  # residues 2, 4, 5 empty
    out = m.compute()
    assert out["count"].tolist() == [1, 1, 0, 1, 0, 0]
    per = out["per_residue"].numpy()
    assert per[0] == 1 and per[1] == 1 and per[3] == 0 and np.isnan(per[[2, 4, 5]]).all()
    assert out["acc_worst"].item() == 0 and out["acc_mean"].item() == pytest.approx(2 / 3)
    assert np.isnan(out["wilson_low"][2])
    folded = out["folded"].numpy()
    assert folded[0] == 0.5 and folded[1] == 1 and np.isnan(folded[2]) and out["fold_stride"].item() == 3


def test_detect_period():
    assert detect_period(np.array([0.1, 1, 1, 0.1, 1, 1, 0.1, 1, 1, 0.1, 1, 1])) == 3
    assert detect_period(np.array([0.0, 1, 1, 1, 1, 1, 1, 1])) == 8
    assert detect_period(np.full(8, 0.7)) == 1


def test_update_validation():
    m = PhaseAccuracy(4)
    with pytest.raises(ConfigError, match="residue"):
        m.update(torch.tensor([True]), torch.tensor([4]))
    with pytest.raises(ConfigError, match="residue"):
        m.update(torch.tensor([True]), torch.tensor([-1]))
    with pytest.raises(ConfigError, match="same length"):
        m.update(torch.tensor([True, False]), torch.tensor([1]))
    with pytest.raises(ConfigError, match=r"same length \(got 2, 2, 1\)"):
        m.update(torch.tensor([True, False]), torch.tensor([1, 2]), cluster=torch.tensor([0]))
    with pytest.raises(ConfigError, match="metric.fold_stride"):
        PhaseAccuracy(8, fold_stride=3)
    with pytest.raises(ConfigError, match="metric.period"):
        PhaseAccuracy(0)


# ---------------------------------------------------------------- DDP
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank, world, port, parts, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        m = PhaseAccuracy(8, n_boot=300, seed=1)
        for correct, residue, cluster in parts[rank]:
            m.update(correct, residue, cluster)
        torch.save(m.compute(), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_state_syncs_across_two_gloo_processes(tmp_path):
    correct, residue, cluster = _data(seed=2)
    half = correct.numel() // 2 + 4  # uneven shards
    # Rank 1 has samples without cluster ids (singletons) and rank 0 with: both paths must survive the gather.
    parts = [[(correct[:half], residue[:half], cluster[:half])],
             [(correct[half:], residue[half:], None)]]
    reference = PhaseAccuracy(8, n_boot=300, seed=1)
    for part in parts[0] + parts[1]:
        reference.update(*part)
    expected = reference.compute()
    mp.start_processes(_ddp_worker, args=(2, _free_port(), parts, str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got.keys() == expected.keys()
        for key in expected:
            assert torch.allclose(got[key], expected[key], equal_nan=True), (rank, key)
