"""Every figure phasefix draws (nothing here talks to MLflow; `phasefix.tracking.log_figure` logs them):

- a run's phase curves (`phase_curves`) and static gates (`gate_heatmap`): fit and evaluate; the flip probe's
  log-probability difference by filler length (`flip_curve`): evaluate task=flip;
- one run's mechanism probes (phasefix.analyze): knockout by residue (`knockout_heatmap`), gate statistics
  (`gate_stats_heatmap`), gate cycling (`cycle_prediction`), the dominant period (`period_curve`); the weights-only
  phase audit's predicted phase mass (`audit_phase_heatmap`). These take the probes' results and draw them; plots
  imports nothing from phasefix.analyze or phasefix.evaluate (they import plots);
- several runs (`phasefix.report.collect`'s rows and curves, `phasefix.comparison.run_facts` per run): overlaid
  phase curves, the Pareto front of study members, the decisive comparison's small multiples (`phase_grid`),
  worst-vs-mean scatter and training losses;
- a study's trials and Pareto front (`study_pareto`); the idealised induction model (`theory_gates`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from phasefix.comparison import BASELINE_ARM, GOAL_RATIO, boundary_residues  # noqa: E402
from phasefix.data.layout import PADDINGS  # noqa: E402


def save(fig, path: str | Path) -> None:
    """The figure as a PNG at 110 dpi (every figure file phasefix writes), then closed; cropped to what is drawn, so
    a legend placed outside the axes is never cut off."""
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.08)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ one run
def phase_curves(curves: Mapping[str, Mapping], stride: int | None, title: str = ""):
    """One run's phase curves (fit, evaluate) with Wilson intervals and the stride grid. curves: label ->
    PhaseAccuracy.compute() (lists or tensors)."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for label, res in curves.items():
        acc = list(res["per_residue"])
        r = list(range(len(acc)))
        line, = ax.plot(r, acc, marker="o", ms=3, label=f"{label} (mean {res['acc_mean']:.2f}, gap {res['acc_gap']:.2f})")
        if "wilson_low" in res:
            ax.fill_between(r, list(res["wilson_low"]), list(res["wilson_high"]), color=line.get_color(), alpha=0.15)
    if stride:
        for x in range(0, len(acc), stride):
            ax.axvline(x - 0.5, color="grey", lw=0.5, ls=":")
    ax.set_xlabel("residue of the target key position")
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
    ax.set_xlabel("residue of the target key position")
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


# ------------------------------------------------------------------------------------------------ several runs
def runs_phase_curves(rows: Sequence[Mapping], curves: Mapping):
    """Several runs' phase curves overlaid (phasefix.report), one panel per padding; the stride grid when all runs
    share one stride. rows/curves: `phasefix.report.collect`'s."""
    pads = [p for p in PADDINGS if any(r["padding"] == p for r in rows)]
    fig, axes = plt.subplots(len(pads), 1, figsize=(8, 3.0 * len(pads)), squeeze=False)
    strides = {r["stride"] for r in rows if str(r["stride"]).isdigit()}
    for ax, pad in zip(axes[:, 0], pads):
        for r in (r for r in rows if r["padding"] == pad):
            curve = curves.get((r["run_id"], pad)) or []
            ax.plot(range(len(curve)), curve, marker="o", ms=2.5, lw=1,
                    label=f"{r['run_name']} ({r['run_id'][:6]}): mean {r['acc_mean']:.2f}, worst {r['acc_worst']:.2f}")
        if len(strides) == 1:
            s = int(next(iter(strides)))
            n = max((len(curves.get((r["run_id"], pad)) or []) for r in rows), default=0)
            for x in range(0, n, s):
                ax.axvline(x - 0.5, color="grey", lw=0.5, ls=":")
        ax.set_title(f"{pad} padding", fontsize=9)
        ax.set_xlabel("residue of the target key position")
        ax.set_ylabel("accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # beside the curves
    fig.tight_layout()
    return fig


def runs_pareto(prows: Sequence[Mapping]):
    """Study members' mean against worst residue per padding, one colour per study, the front joined and labelled
    (`phasefix.report.pareto_rows`)."""
    pads = [p for p in PADDINGS if any(r["padding"] == p for r in prows)]
    fig, axes = plt.subplots(1, len(pads), figsize=(4.2 * len(pads), 3.8), squeeze=False)
    for ax, pad in zip(axes[0], pads):
        for i, parent in enumerate(dict.fromkeys(r["parent"] for r in prows)):
            pts = [r for r in prows if r["padding"] == pad and r["parent"] == parent]
            color = f"C{i % 10}"
            ax.scatter([r["acc_mean"] for r in pts], [r["acc_worst"] for r in pts], s=14, color=color, alpha=0.45,
                       label=f"study {parent[:8]}")
            front = sorted((r for r in pts if r["on_front"]), key=lambda r: r["acc_mean"])
            ax.plot([r["acc_mean"] for r in front], [r["acc_worst"] for r in front], color=color, marker="o", ms=5,
                    lw=1.2)
            for r in front:
                ax.annotate(r["run_name"][:18], (r["acc_mean"], r["acc_worst"]), fontsize=5, xytext=(3, 3),
                            textcoords="offset points")
        ax.set_xlabel("mean accuracy")
        ax.set_ylabel("worst-residue accuracy")
        ax.set_title(f"Pareto front, {pad} padding", fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def _arms(rows, facts) -> list[str]:
    arms = list(dict.fromkeys(facts[r["run_id"]]["arm"] or BASELINE_ARM for r in rows))
    return sorted(arms, key=lambda a: (a != BASELINE_ARM, a))


def phase_grid(rows: Sequence[Mapping], curves: Mapping, facts: Mapping[str, Mapping], padding: str = "prefix"):
    """One panel per (regime, arm): each seed's curve faint, the mean over learned seeds bold with a min-max band,
    dotted lines at every window start and the boundary residues (phase S-1) shaded."""
    rows = [r for r in rows if r["padding"] == padding and facts.get(r["run_id"], {}).get("regime")]
    regimes = list(dict.fromkeys(facts[r["run_id"]]["regime"] for r in rows))
    arms = _arms(rows, facts)
    fig, axes = plt.subplots(len(regimes), len(arms), figsize=(2.3 * len(arms) + 0.6, 1.9 * len(regimes) + 0.6),
                             squeeze=False, sharex=True, sharey=True)
    for i, regime in enumerate(regimes):
        for j, arm in enumerate(arms):
            ax = axes[i, j]
            members = [r for r in rows if facts[r["run_id"]]["regime"] == regime
                       and (facts[r["run_id"]]["arm"] or BASELINE_ARM) == arm]
            seeds = [(curves.get((r["run_id"], padding)) or [], facts[r["run_id"]]["learned"]) for r in members]
            seeds = [(c, ok) for c, ok in seeds if c]
            ax.tick_params(labelsize=6)
            if i == 0:
                ax.set_title(arm, fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{regime}\naccuracy", fontsize=7)
            if not seeds:
                ax.text(0.5, 0.5, "no runs", ha="center", va="center", fontsize=7, color="grey",
                        transform=ax.transAxes)
                continue
            n = len(seeds[0][0])
            stride = facts[members[0]["run_id"]].get("stride") or int(members[0]["stride"] or n)
            for r0 in boundary_residues(n, stride):
                ax.axvspan(r0 - 0.5, r0 + 0.5, color="tab:red", alpha=0.08, lw=0)
            for x in range(0, n + 1, stride):
                ax.axvline(x - 0.5, color="grey", lw=0.4, ls=":")
            for c, ok in seeds:
                ax.plot(range(len(c)), c, color="tab:blue" if ok else "tab:grey", lw=0.6, alpha=0.35,
                        ls="-" if ok else "--")
            learned = [c for c, ok in seeds if ok and len(c) == n]
            if learned:
                mean = [sum(v) / len(v) for v in zip(*learned)]
                lo, hi = [min(v) for v in zip(*learned)], [max(v) for v in zip(*learned)]
                ax.fill_between(range(n), lo, hi, color="tab:blue", alpha=0.15, lw=0)
                ax.plot(range(n), mean, color="tab:blue", lw=1.4)
            ax.text(0.98, 0.04, f"{len(learned)}/{len(seeds)} learned", ha="right", va="bottom", fontsize=6,
                    transform=ax.transAxes)
            ax.set_ylim(-0.03, 1.03)
    for ax in axes[-1]:
        ax.set_xlabel("residue of the target key", fontsize=7)
    handles = [plt.Line2D([], [], color="tab:blue", lw=1.4, label="mean over learned seeds"),
               plt.matplotlib.patches.Patch(color="tab:blue", alpha=0.15, label="min-max over learned seeds"),
               plt.Line2D([], [], color="tab:blue", lw=0.6, alpha=0.5, label="one seed"),
               plt.Line2D([], [], color="tab:grey", lw=0.6, ls="--", label="one seed, not learned"),
               plt.matplotlib.patches.Patch(color="tab:red", alpha=0.15, label="boundary phase S-1"),
               plt.Line2D([], [], color="grey", lw=0.6, ls=":", label="window start")]
    fig.legend(handles=handles, loc="upper center", ncol=6, fontsize=7, frameon=False, bbox_to_anchor=(0.5, 1.0))
    fig.suptitle(f"{padding} padding", fontsize=9, x=0.01, y=0.995, ha="left", va="top")  # beside the legend row
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def worst_vs_mean(rows: Sequence[Mapping], facts: Mapping[str, Mapping], padding: str = "prefix"):
    """Every run as a point (worst residue against mean), coloured by arm, one marker per regime, with the goal
    line worst = 0.9 x mean; runs that did not learn are hollow."""
    rows = [r for r in rows if r["padding"] == padding and facts.get(r["run_id"], {}).get("regime")]
    arms = _arms(rows, facts)
    regimes = list(dict.fromkeys(facts[r["run_id"]]["regime"] for r in rows))
    markers = "osD^v<>PX*"
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    ax.plot([0, 1], [0, GOAL_RATIO], color="black", lw=0.8, ls="--", label=f"goal: worst = {GOAL_RATIO} x mean")
    for r in rows:
        f = facts[r["run_id"]]
        color = f"C{arms.index(f['arm'] or BASELINE_ARM) % 10}"
        marker = markers[regimes.index(f["regime"]) % len(markers)]
        if math.isnan(r["acc_mean"]):
            continue
        ax.scatter(r["acc_mean"], r["acc_worst"], s=28, marker=marker, edgecolors=color,
                   facecolors=color if f["learned"] else "none", alpha=0.8, lw=1)
    arm_handles = [plt.Line2D([], [], ls="", marker="o", color=f"C{i % 10}", label=a) for i, a in enumerate(arms)]
    regime_handles = [plt.Line2D([], [], ls="", marker=markers[i % len(markers)], color="grey", label=g)
                      for i, g in enumerate(regimes)]
    goal = ax.get_legend_handles_labels()[0]
    ax.legend(handles=goal + arm_handles + regime_handles, loc="upper left", bbox_to_anchor=(1.02, 1.0),
              fontsize=7, frameon=False, title="hollow: not learned", title_fontsize=7)
    ax.set_xlim(0, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("mean accuracy over residues")
    ax.set_ylabel("worst-residue accuracy")
    ax.set_title(f"worst against mean, one point per run ({padding} padding)", fontsize=9)
    fig.tight_layout()
    return fig


def loss_curves(losses: Mapping[str, Sequence[float]], facts: Mapping[str, Mapping]):
    """Training loss against step, one panel per regime, one colour per arm (each seed its own line): shows
    whether a budget let the loss go flat, and which arms left the plateau later. `losses`: {run_id: loss by step,
    nan where not logged}."""
    runs = [rid for rid in losses if facts.get(rid, {}).get("regime") and losses[rid]]
    regimes = list(dict.fromkeys(facts[rid]["regime"] for rid in runs))
    arms = sorted(dict.fromkeys(facts[rid]["arm"] or BASELINE_ARM for rid in runs),
                  key=lambda a: (a != BASELINE_ARM, a))
    fig, axes = plt.subplots(1, max(len(regimes), 1), figsize=(3.6 * max(len(regimes), 1) + 1.8, 3.0), squeeze=False)
    for ax, regime in zip(axes[0], regimes):
        for rid in (r for r in runs if facts[r]["regime"] == regime):
            arm = facts[rid]["arm"] or BASELINE_ARM
            pts = [(s, v) for s, v in enumerate(losses[rid]) if not math.isnan(v)]
            ax.plot([s for s, _ in pts], [v for _, v in pts], lw=0.8, alpha=0.8, color=f"C{arms.index(arm) % 10}")
        ax.set_title(regime, fontsize=8)
        ax.set_xlabel("step", fontsize=7)
        ax.tick_params(labelsize=6)
    axes[0, 0].set_ylabel("training loss", fontsize=7)
    fig.legend(handles=[plt.Line2D([], [], color=f"C{i % 10}", label=a) for i, a in enumerate(arms)],
               loc="center left", bbox_to_anchor=(0.86, 0.5), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    return fig


# ------------------------------------------------------------------------------------------------ studies, theory
def _point_labels(points: dict[tuple[float, float], list[int]], near: float = 0.04,
                  right: float = 0.8) -> list[tuple]:
    """One label per distinct point (trials at the same values share it: "5, 13, 14"; more than four: "5, 13, 14
    +2"), with text offsets (points) that step down for labels of points within `near` of an earlier one, so that
    no two labels are drawn on top of each other, and to the left of points with x >= `right` (inside the axes).
    [(x, y, text, (dx, dy), horizontal alignment)]."""
    out, placed = [], []
    for (x, y), numbers in sorted(points.items(), key=lambda kv: (-kv[0][1], kv[0][0])):
        numbers = sorted(numbers)
        text = ", ".join(map(str, numbers[:4])) + (f" +{len(numbers) - 4}" if len(numbers) > 4 else "")
        crowd = sum(abs(x - px) < near and abs(y - py) < near for px, py in placed)
        left = x >= right
        out.append((x, y, text, (-5 if left else 4, -9 - 9 * crowd if left else 3 - 9 * crowd),
                    "right" if left else "left"))
        placed.append((x, y))
    return out


def study_pareto(spec, trials, front, baseline: tuple[float, float, int] | None = None):
    """A study's complete trials in objective space, the Pareto front (Optuna's `best_trials`) joined and labelled
    with trial numbers (trials at the same values share one label), the goal line worst = 0.9 x mean when the
    objectives are a padding's acc_mean and acc_worst, and `baseline` (mean, worst, seeds: the unmitigated model's
    mean over its confirm runs) as a star."""
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    mx, my = spec.metric_names[0], spec.metric_names[1] if len(spec.objectives) > 1 else None
    done = [t for t in trials if t.values]
    front_ids = {t.number for t in front}
    others = [t for t in done if t.number not in front_ids]
    if my is None:  # one objective: value per trial
        ax.scatter([t.number for t in done], [t.values[0] for t in done], c="grey", s=14)
        ax.set_xlabel("trial")
        ax.set_ylabel(mx)
    else:
        if others:
            ax.scatter([t.values[0] for t in others], [t.values[1] for t in others], c="lightgrey",
                       edgecolors="grey", s=18, label="trials")
        if front:
            xs, ys = [t.values[0] for t in front], [t.values[1] for t in front]
            order = sorted(range(len(front)), key=lambda i: xs[i])
            ax.plot([xs[i] for i in order], [ys[i] for i in order], "-o", color="C3", ms=5, label="Pareto front")
            points: dict[tuple[float, float], list[int]] = {}
            for t in front:
                points.setdefault((round(t.values[0], 3), round(t.values[1], 3)), []).append(t.number)
            for x, y, text, offset, ha in _point_labels(points):
                ax.annotate(text, (x, y), fontsize=7, xytext=offset, textcoords="offset points", ha=ha)
        goal = {mx.split("/")[-1], my.split("/")[-1]} == {"acc_mean", "acc_worst"}
        if goal:  # the goal worst >= 0.9 mean
            lo = min([t.values[0] for t in done] + [0.0])
            line = [lo, 1.0]
            if mx.endswith("acc_mean"):
                ax.plot(line, [0.9 * v for v in line], ":", color="C2", lw=1, label="worst = 0.9 x mean")
            else:
                ax.plot([0.9 * v for v in line], line, ":", color="C2", lw=1, label="worst = 0.9 x mean")
        if baseline is not None and goal:
            bm, bw, n = baseline
            x, y = (bm, bw) if mx.endswith("acc_mean") else (bw, bm)
            ax.scatter([x], [y], marker="*", s=120, color="C0", edgecolors="k", zorder=5,
                       label=f"unmitigated (mean of {n} seeds)")
        if goal:  # accuracies: the whole square, so that the corner (1, 1) is not on the frame
            ax.set_xlim(-0.03, 1.05)
            ax.set_ylim(-0.03, 1.05)
        ax.set_xlabel(f"{mx} ({spec.directions[0][:3]})")
        ax.set_ylabel(f"{my} ({spec.directions[1][:3]})")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    ax.set_title(f"study {spec.name}: {len(done)} complete trials, {len(front)} on the front", fontsize=9)
    fig.tight_layout()
    return fig


def theory_gates(runs: dict[str, list[dict]], cfg):
    """The idealised induction model (phasefix.theory). Row per condition: key and value gate heatmaps of one seed (the first whose heads collide without
    coordination, else the first), accuracy by phase (all seeds), training loss (all seeds)."""
    conds = list(runs)
    fig = Figure(figsize=(15, 3.2 * len(conds)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(conds), 4, squeeze=False)
    S = cfg.stride
    show = next((i for i, r in enumerate(runs[conds[0]]) if r["collisions"] > 0), 0)
    for row, cond in enumerate(conds):
        first = runs[cond][show]
        for col, (name, P) in enumerate((("key", first["key_static"]), ("value", first["value_static"]))):
            ax = axes[row, col]
            ax.imshow(P, vmin=0, vmax=1, cmap="viridis", aspect="auto")
            eff = first[f"{name}_static_eff"]
            ax.set_yticks(range(P.shape[0]), [f"h{h} ({e:.1f})" for h, e in enumerate(eff)])
            ax.set_xticks(range(S))
            ax.set_xlabel("slot (= phase)")
            ax.set_title(f"{cond}: {name} gate E[a], seed {cfg.seed + show} (eff. slots)", fontsize=8)
            for h in range(P.shape[0]):
                for i in range(S):
                    ax.text(i, h, f"{P[h, i]:.2f}", ha="center", va="center", fontsize=6,
                            color="black" if P[h, i] > 0.6 else "white")
        ax = axes[row, 2]
        accs = np.stack([r["acc_phase"] for r in runs[cond]])
        for a in accs:
            ax.plot(range(S), a, color="C0", alpha=0.25, lw=0.8)
        ax.plot(range(S), accs.mean(0), color="C0", marker="o", lw=2, label="mean over seeds")
        ax.axvline(S - 1.5, color="grey", ls=":", lw=0.8)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xticks(range(S))
        ax.set_xlabel("query phase (S-1: boundary)")
        ax.set_ylabel("accuracy")
        cov = np.mean([r["coverage"] for r in runs[cond]])
        ax.set_title(f"{cond}: accuracy by phase, mean coverage {cov:.2f}", fontsize=8)
        ax = axes[row, 3]
        for r in runs[cond]:
            ax.plot(np.convolve(r["losses"], np.ones(10) / 10, mode="valid"), lw=0.8)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (10-step mean)")
        ax.set_title(f"{cond}: training loss, {len(runs[cond])} seeds", fontsize=8)
    fig.suptitle(f"idealised induction model: m={cfg.heads} heads, S={cfg.stride}, L={cfg.chunks}, N={cfg.vocab}; "
                 "only the gates trained", fontsize=10)
    return fig
