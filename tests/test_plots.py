"""The figures of the mechanism probes, the audit and the flip probe (phasefix.plots) render from hand-built
results, and plots stays a leaf: it imports nothing from phasefix.analyze or phasefix.evaluate."""
import subprocess
import sys

import numpy as np
import torch

from phasefix import plots
from phasefix.analyze.cycle import predicted_change
from phasefix.analyze.period import PERIOD_TOL, shift_profile, typical_difference

S, P = 4, 8
RNG = np.random.default_rng(0)


def _saved(fig, tmp_path, name):
    fig.savefig(tmp_path / name)
    assert (tmp_path / name).stat().st_size > 0
    return fig


def test_flip_curve(tmp_path):
    res = {"filler_lengths": list(range(3, 30)), "logp_diff": list(RNG.normal(size=27)), "period": 4,
           "completions": (" yes", " no"), "period_detected": 4, "period_fft": 4.1}
    fig = _saved(plots.flip_curve(res, "probe"), tmp_path, "flip.png")
    assert fig.axes[0].get_xlabel() == "filler length (tokens)"
    assert "period detected 4" in fig.axes[0].get_title()


def test_knockout_heatmap(tmp_path):
    rel = RNG.uniform(-1, 1, size=(2, 2, P))
    rel[0, 0, 3] = np.nan
    fig = _saved(plots.knockout_heatmap({"rel": rel, "base": RNG.uniform(size=P)}, S), tmp_path, "knockout.png")
    heat = next(ax for ax in fig.axes if ax.images)
    assert [t.get_text() for t in heat.get_yticklabels()] == ["L0 kv0", "L0 kv1", "L1 kv0", "L1 kv1"]


def test_gate_stats_heatmap_labels_rows_with_both_effective_numbers(tmp_path):
    stats = []
    for _ in range(2):
        branches = {}
        for b in ("key", "value"):
            p = torch.softmax(torch.randn(2, S), -1)
            branches[b] = {"static": p, "static_eff": torch.tensor([1.5, 2.0]), "window_eff": torch.tensor([1.0, 3.0])}
        stats.append(branches)
    fig = _saved(plots.gate_stats_heatmap(stats), tmp_path, "gates.png")
    heats = [ax for ax in fig.axes if ax.images]
    assert len(heats) == 4  # 2 layers x (key, value)
    assert [t.get_text() for t in heats[0].get_yticklabels()] == ["h0 (1.5/1.0)", "h1 (2.0/3.0)"]


def test_cycle_prediction(tmp_path):
    shifts = [-1, 1, 2]
    phase = {d: RNG.uniform(size=S) for d in [0, *shifts]}
    res = {"shifts": shifts, "phase": phase, "r2": 0.5, "r2_ci": (0.2, 0.7)}
    predicted = {d: predicted_change(phase[0], d) for d in shifts}
    fig = _saved(plots.cycle_prediction(res, predicted, S), tmp_path, "cycle.png")
    assert fig.axes[0].get_title().startswith("R^2 = 0.50 [0.20, 0.70]")


def test_period_curve(tmp_path):
    curve = RNG.uniform(size=P)
    res = {"per_residue": curve, "acc_mean": curve.mean(), "acc_gap": np.ptp(curve), "wilson_low": curve - 0.1,
           "wilson_high": curve + 0.1, "fold_stride": 4, "folded": curve[:4], "period_detected": 4}
    fig = _saved(plots.period_curve(res, S, shift_profile(curve), PERIOD_TOL * typical_difference(curve), PERIOD_TOL),
                 tmp_path, "period.png")
    assert len(fig.axes[1].patches) == P  # one bar per shift


def test_audit_phase_heatmap(tmp_path):
    rows = [(f"c{i}", RNG.dirichlet(np.ones(P))) for i in range(3)]
    fig = _saved(plots.audit_phase_heatmap(rows, P), tmp_path, "audit.png")
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["c0", "c1", "c2"]
    with_curve = _saved(plots.audit_phase_heatmap(rows, P, measured=RNG.uniform(size=P)), tmp_path, "audit2.png")
    assert len(with_curve.axes) == len(fig.axes) + 2  # the accuracy panel and its twin


def test_plots_imports_no_analyze_or_evaluate():
    code = ("import sys, phasefix.plots; "
            "print(sorted(m for m in sys.modules if m.startswith(('phasefix.analyze', 'phasefix.evaluate'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_study_pareto_labels_do_not_overlap_and_the_baseline_is_marked(tmp_path):
    """Trials at the same values share one label; a label of a nearby point steps down; more than four numbers are
    cut to four and a count; the unmitigated baseline is a star in the legend."""
    from types import SimpleNamespace

    from phasefix.plots.study import _point_labels

    labels = _point_labels({(1.0, 1.0): [14, 5, 13], (0.99, 0.98): [8], (0.5, 0.3): [2, 7, 1, 9, 4, 3]})
    assert labels == [(1.0, 1.0, "5, 13, 14", (-5, -9), "right"), (0.99, 0.98, "8", (-5, -18), "right"),
                      (0.5, 0.3, "1, 2, 3, 4 +2", (4, 3), "left")]
    spec = SimpleNamespace(name="s", metric_names=["final/prefix/acc_mean", "final/prefix/acc_worst"],
                           objectives=[1, 2], directions=["maximize", "maximize"])
    trials = [SimpleNamespace(number=n, values=v) for n, v in
              [(5, [1.0, 1.0]), (13, [1.0, 1.0]), (8, [0.99, 0.98]), (2, [0.6, 0.1])]]
    fig = _saved(plots.study_pareto(spec, trials, trials[:3], baseline=(0.8, 0.3, 3)), tmp_path, "pareto.png")
    ax = fig.axes[0]
    assert sorted(t.get_text() for t in ax.texts) == ["5, 13", "8"]
    assert "unmitigated (mean of 3 seeds)" in [t.get_text() for t in ax.get_legend().get_texts()]
