"""One run's figures: its phase curves, static gates, the flip probe, and its mechanism probes' results."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# ------------------------------------------------------------------------------------------------ one run
def phase_curves(curves: Mapping[str, Mapping], stride: int | None, title: str = ""):
    """One run's phase curves (fit, evaluate) with Wilson intervals and the stride grid. curves: label ->
    PhaseAccuracy.compute() (lists or tensors)."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for label, res in curves.items():
        acc = list(res["per_residue"])
        r = list(range(len(acc)))
        line, = ax.plot(r, acc, marker="o", ms=3,
                        label=f"{label} (mean {res['acc_mean']:.2f}, gap {res['acc_gap']:.2f})")
        if "wilson_low" in res:
            ax.fill_between(r, list(res["wilson_low"]), list(res["wilson_high"]), color=line.get_color(), alpha=0.15)
    if stride:
        for x in range(0, len(acc), stride):
            ax.axvline(x - 0.5, color="grey", lw=0.5, ls=":")
    ax.set_xlabel("residue of the target key position (labels ending _end: of the prompt's length)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def flip_curve(res: Mapping, title: str = ""):
    """The flip probe (`phasefix.evaluate.flip_curve`): log p(completion a) - log p(completion b) against filler
    length, the zero line and the period grid."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    x, y = res["filler_lengths"], res["logp_diff"]
    ax.plot(x, y, marker="o", ms=2.5, lw=1)
    ax.axhline(0, color="black", lw=0.6)
    for g in range(x[0], x[-1] + 1, res["period"]):
        ax.axvline(g - 0.5, color="grey", lw=0.5, ls=":")
    a, b = res["completions"]
    ax.set_xlabel("filler length (tokens)")
    ax.set_ylabel(f"log p({a.strip()!r}) - log p({b.strip()!r})", fontsize=8)
    ax.set_title(f"{title}  period detected {res['period_detected']}, FFT {res['period_fft']}", fontsize=9)
    fig.tight_layout()
    return fig


def gate_heatmap(static: list[dict], title: str | None = None):
    """One heatmap per layer and branch: KV heads x slots, the static gate weight in each cell, each head's
    effective number of slots in its row label. Returns a matplotlib Figure (Agg canvas, no pyplot state)."""
    from phasefix.mitigations.gates import effective_slots

    panels = [(layer, branch, p.detach().float().cpu()) for layer, branches in enumerate(static)
              for branch, p in branches.items()]
    branch_names = sorted({b for _, b, _ in panels}, key=lambda b: (b != "key", b))
    layers = sorted({layer for layer, _, _ in panels})
    nrows, ncols = max(1, len(layers)), max(1, len(branch_names))
    W = max((p.shape[1] for _, _, p in panels), default=1)
    H = max((p.shape[0] for _, _, p in panels), default=1)
    fig = Figure(figsize=(1.2 + 0.55 * W * ncols + 1.0 * ncols, 0.8 + (0.35 * H + 0.6) * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    image = None
    for ax in axes.flat:
        ax.set_axis_off()
    for layer, branch, p in panels:
        ax = axes[layers.index(layer), branch_names.index(branch)]
        ax.set_axis_on()
        image = ax.imshow(p.numpy(), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        eff = effective_slots(p)
        ax.set_yticks(range(p.shape[0]), [f"h{h} ({float(eff[h]):.1f})" for h in range(p.shape[0])])
        ax.set_xticks(range(p.shape[1]))
        ax.set_title(f"layer {layer} {branch}", fontsize=9)
        ax.set_xlabel("slot")
        for h in range(p.shape[0]):
            for i in range(p.shape[1]):
                v = float(p[h, i])
                ax.text(i, h, f"{v:.2f}", ha="center", va="center", fontsize=7,
                        color="black" if v > 0.6 else "white")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="E[a] (effective slots in row labels)")
    fig.suptitle(title or "static gate distribution per KV head")
    return fig


# ------------------------------------------------------------------------------------------------ one run's probes
def knockout_heatmap(res: Mapping, stride: int, title: str = ""):
    """Head knockout (`phasefix.analyze.knockout`): the base accuracy by residue over a heatmap with rows (layer,
    KV head), columns residue; colour = relative accuracy change (clipped to [-1, 1])."""
    rel = res["rel"]
    L, HKV, P = rel.shape
    fig = Figure(figsize=(2.0 + 0.32 * P, 1.6 + 0.32 * L * HKV + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax_base, ax = fig.subplots(2, 1, height_ratios=[1, max(1.5, 0.45 * L * HKV)], sharex=True)
    ax_base.bar(range(P), res["base"], color="grey")
    ax_base.set_ylim(0, 1)
    ax_base.set_ylabel("base acc")
    img = ax.imshow(np.nan_to_num(rel.reshape(L * HKV, P), nan=0.0), cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    ax.set_yticks(range(L * HKV), [f"L{layer} kv{g}" for layer in range(L) for g in range(HKV)])
    ax.set_xticks(range(P))
    ax.set_xlabel("residue of the target key position (labels ending _end: of the prompt's length)")
    for x in range(0, P, stride):
        ax.axvline(x - 0.5, color="k", lw=0.4, ls=":")
    for y in range(HKV, L * HKV, HKV):
        ax.axhline(y - 0.5, color="k", lw=0.8)
    fig.colorbar(img, ax=ax, shrink=0.9, label="(knockout - base) / base")
    fig.suptitle(title or "knockout by residue", fontsize=9)
    return fig


def gate_stats_heatmap(stats: list[dict], title: str = ""):
    """Gate statistics (`phasefix.analyze.gates.gate_statistics`): `gate_heatmap` of E[a], each row labelled with
    its static and per-window effective numbers of slots."""
    static = [{b: s["static"] for b, s in branches.items()} for branches in stats]
    fig = gate_heatmap(static, title=title or "static gate distribution E[a] (row: static / per-window eff. slots)")
    for ax in fig.axes:
        words = ax.get_title().split()
        if len(words) == 3 and words[0] == "layer":
            s = stats[int(words[1])][words[2]]
            ax.set_yticks(range(len(s["static_eff"])),
                          [f"h{h} ({float(e):.1f}/{float(w):.1f})"
                           for h, (e, w) in enumerate(zip(s["static_eff"], s["window_eff"]))])
    return fig


def cycle_prediction(res: Mapping, predicted: Mapping[int, np.ndarray], stride: int, title: str = ""):
    """Gate cycling (`phasefix.analyze.cycle`): observed against predicted change in accuracy by phase per shift d
    (the boundary phase S-1 marked x, the pooled R^2 in the title), and the accuracy by phase under each shift.
    `predicted`: d -> A_0((r-d) mod S) - A_0(r) for every phase r (`cycle.predicted_change`), for every shift."""
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax_s, ax_c = fig.subplots(1, 2)
    base = res["phase"][0]
    cmap = matplotlib.colormaps["coolwarm"]
    ds = [d for d in res["shifts"] if d % len(base) != 0]
    lim = 0.0
    for i, d in enumerate(ds):
        color = cmap(i / max(1, len(ds) - 1))
        obs, pred = res["phase"][d] - base, predicted[d]
        lim = max(lim, float(np.abs(np.nan_to_num(obs)).max()), float(np.abs(np.nan_to_num(pred)).max()))
        ax_s.scatter(pred[:-1], obs[:-1], color=color, s=18, label=f"d={d}")
        ax_s.scatter(pred[-1:], obs[-1:], color=color, s=30, marker="x")
        ax_c.plot(range(stride), res["phase"][d], marker="o", ms=3, color=color, lw=0.8, label=f"d={d}")
    ax_c.plot(range(stride), base, marker="o", color="k", lw=2, label="d=0")
    lim = max(lim, 0.05) * 1.1
    ax_s.plot([-lim, lim], [-lim, lim], color="grey", lw=0.6, ls="--")
    ax_s.set_xlim(-lim, lim)
    ax_s.set_ylim(-lim, lim)
    ax_s.set_xlabel("predicted change A_0((r-d) mod S) - A_0(r)")
    ax_s.set_ylabel("observed change A_d(r) - A_0(r)")
    lo, hi = res["r2_ci"]
    ax_s.set_title(f"R^2 = {res['r2']:.2f} [{lo:.2f}, {hi:.2f}] (x: boundary phase {stride - 1}, excluded)",
                   fontsize=8)
    ax_s.legend(fontsize=6, ncol=2)
    ax_c.set_xlabel("phase r = t mod S")
    ax_c.set_ylabel("accuracy")
    ax_c.set_ylim(-0.02, 1.02)
    ax_c.set_xticks(range(stride))
    ax_c.set_title("accuracy by phase under each gate shift d", fontsize=8)
    ax_c.legend(fontsize=6, ncol=2)
    fig.suptitle(title or "gate cycling", fontsize=9)
    return fig


def period_curve(res: Mapping, stride: int, profile: np.ndarray, threshold: float, tol: float, title: str = ""):
    """The dominant period (`phasefix.analyze.period`): the accuracy curve by residue (Wilson band, the folded curve,
    the stride grid) and the shift difference mean_r |A(r) - A(r+p)| of every shift p (`profile`) against the
    detection threshold (`threshold` = `tol` x the mean pairwise difference)."""
    curve = np.asarray(res["per_residue"], dtype=np.float64)
    P = curve.size
    detected = int(res["period_detected"])
    fig = Figure(figsize=(10, 3.4), layout="constrained")
    FigureCanvasAgg(fig)
    ax_a, ax_b = fig.subplots(1, 2, width_ratios=[3, 2])
    r = np.arange(P)
    ax_a.plot(r, curve, marker="o", ms=3, color="C0", label=f"accuracy (mean {float(res['acc_mean']):.2f}, "
                                                            f"gap {float(res['acc_gap']):.2f})")
    ax_a.fill_between(r, np.asarray(res["wilson_low"]), np.asarray(res["wilson_high"]), color="C0", alpha=0.15)
    if int(res["fold_stride"]) < P:
        ax_a.plot(r, np.tile(np.asarray(res["folded"]), P // len(res["folded"])), color="C1", lw=1, ls="--",
                  label=f"folded mod {int(res['fold_stride'])}")
    for x in range(0, P, stride):
        ax_a.axvline(x - 0.5, color="grey", lw=0.5, ls=":")
    ax_a.set_ylim(-0.02, 1.02)
    ax_a.set_xlabel("residue of the target key position")
    ax_a.set_ylabel("accuracy")
    ax_a.legend(fontsize=7, loc="lower left")
    divisors = [p for p in range(1, P) if P % p == 0]
    colors = ["C2" if p == detected else ("C0" if p in divisors else "lightgrey") for p in range(P)]
    ax_b.bar(range(P), profile, color=colors)
    ax_b.axhline(threshold, color="C3", lw=0.8, ls="--", label=f"threshold {tol} x mean pairwise difference")
    ax_b.set_xlabel("shift p (blue: divisors, green: detected)")
    ax_b.set_ylabel("mean_r |A(r) - A(r+p)|")
    ax_b.legend(fontsize=7)
    fig.suptitle(title or f"dominant period {detected}", fontsize=9)
    return fig


def phase_grid_heatmap(grids: Mapping[str, Mapping], title: str = ""):
    """Accuracy by fact phase x end phase (evaluate phase_of=both), one panel per padding: grids: padding ->
    {"accuracy" [P, P] (row: the target's residue, column: the prompt's length mod P), "count"}. A serving stack's
    tail bug is a column, a model's weak phase a row."""
    fig = Figure(figsize=(0.6 + 3.6 * len(grids), 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(grids), squeeze=False)[0]
    for ax, (pad, grid) in zip(axes, grids.items()):
        acc = np.asarray(grid["accuracy"], dtype=np.float64)
        im = ax.imshow(acc, cmap="viridis", vmin=0, vmax=1, origin="lower", interpolation="nearest")
        ax.set_xlabel("end: prompt length mod period")
        ax.set_ylabel("fact: target position mod period")
        ax.set_title(f"{pad} (n/cell {int(np.min(grid['count']))})", fontsize=8)
    fig.colorbar(im, ax=list(axes), label="accuracy", shrink=0.9)
    fig.suptitle(title, fontsize=9)
    return fig


def audit_phase_heatmap(rows: Sequence[tuple[str, np.ndarray]], period: int, title: str = "",
                        measured: np.ndarray | None = None):
    """The phase audit (`phasefix.analyze.audit`): phase mass by residue relative to uniform (P * m_P(r): 1 = no
    preference, 0 = starved), one row per compressor and the model's mean last; with `measured`, the accuracy
    curve under it."""
    data = np.array([r * period for _, r in rows])  # [n, P]
    n = len(rows)
    extra = measured is not None
    fig = Figure(figsize=(1.5 + 0.36 * period, 1.2 + 0.24 * n + (1.6 if extra else 0)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2 if extra else 1, 1, squeeze=False, height_ratios=[max(1, 0.24 * n), 1.4] if extra else None)
    ax = axes[0, 0]
    span = max(1e-6, float(np.nanmax(np.abs(data - 1))))
    im = ax.imshow(data, cmap="RdBu", vmin=1 - span, vmax=1 + span, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(n), [name for name, _ in rows], fontsize=7)
    ax.set_xticks(range(period))
    ax.set_xlabel(f"residue t mod {period}")
    fig.colorbar(im, ax=ax, label="phase mass x P (1 = uniform)", shrink=0.9)
    ax.set_title(title or "predicted phase mass (bias-only gate)", fontsize=9)
    if extra:
        ax2 = axes[1, 0]
        ax2.plot(range(period), measured, marker="o", ms=3, label="measured accuracy")
        ax2.set_ylabel("accuracy")
        ax2.set_xlim(-0.5, period - 0.5)
        ax2.set_xticks(range(period))
        twin = ax2.twinx()
        twin.plot(range(period), data[-1], color="tab:red", ls="--", marker="s", ms=2.5, label="predicted mass x P")
        twin.set_ylabel("predicted mass x P", color="tab:red")
        ax2.set_xlabel(f"residue t mod {period}")
    return fig


