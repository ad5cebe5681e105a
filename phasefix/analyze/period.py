"""The dominant period of the phase curve (science.md §4), from `PhaseAccuracy`: `detect_period` compares the
shift difference mean_r |A(r) - A(r+p)| of every divisor p of the eval period with the mean pairwise difference
between residues; the figure (`phasefix.plots.period_curve`) shows the curve and the shift difference of every
shift p."""
from __future__ import annotations

import numpy as np

from phasefix.analyze import RunContext, eval_set, log_results
from phasefix.predict import evaluate_phase
from phasefix.metrics import shift_difference

PERIOD_TOL = 0.5  # PhaseAccuracy's default period_tol


def shift_profile(curve: np.ndarray) -> np.ndarray:
    """shift_difference(curve, p) for p = 0..period-1."""
    return np.array([shift_difference(curve, p) for p in range(curve.size)])


def typical_difference(curve: np.ndarray) -> float:
    """Mean |A(r) - A(s)| over pairs r != s (what `detect_period` compares against)."""
    P = curve.size
    pairwise = np.abs(curve[:, None] - curve[None, :])[~np.eye(P, dtype=bool)]
    with np.errstate(invalid="ignore"):
        return float(np.nanmean(pairwise)) if np.isfinite(pairwise).any() else float("nan")


def table(res: dict, stride: int) -> str:
    curve = np.asarray(res["per_residue"], dtype=np.float64)
    prof = shift_profile(curve)
    P = curve.size
    lines = [f"dominant period {int(res['period_detected'])} (model stride S={stride}); periodicity "
             f"mean|A(r)-A(r+S)| = {float(res['periodicity']):.3f}, ratio to gap {float(res['periodicity_ratio']):.3f}",
             f"mean {float(res['acc_mean']):.3f}  worst {float(res['acc_worst']):.3f}  best "
             f"{float(res['acc_best']):.3f}  gap {float(res['acc_gap']):.3f}",
             "accuracy by residue: " + " ".join(f"{a:.2f}" for a in curve),
             f"folded mod {int(res['fold_stride'])}: " + " ".join(f"{a:.2f}" for a in np.asarray(res["folded"])),
             f"shift difference by divisor p of {P} (threshold {PERIOD_TOL * typical_difference(curve):.3f}): "
             + "  ".join(f"p={p}:{prof[p]:.3f}" for p in range(2, P) if P % p == 0)]
    return "\n".join(lines)


def run(ctx: RunContext, opts: dict) -> dict:
    from phasefix import plots

    seed = ctx.eval_seed if opts["seed"] is None else opts["seed"]
    results = {}
    for pad in ctx.paddings(opts["padding"]):
        ds = eval_set(ctx, pad, opts["per_residue"], seed)
        res = {k: v.numpy() if hasattr(v, "numpy") else v for k, v in
               evaluate_phase(ctx.model, ds, period=ctx.period, stride=ctx.stride, n_boot=opts["n_boot"],
                              batch_size=opts["batch_size"]).items()}
        print(f"\nperiod ({pad} padding, {len(ds)} prompts)")
        print(table(res, ctx.stride))
        curve = np.asarray(res["per_residue"], dtype=np.float64)
        scalars = {k: float(res[k]) for k in ("period_detected", "periodicity", "periodicity_ratio", "acc_mean",
                                              "acc_worst", "acc_gap")}
        scalars["detected_equals_stride"] = float(int(res["period_detected"]) == ctx.stride)
        curves = {"shift_difference": shift_profile(curve), "per_residue": curve}
        title = (f"periodicity ({pad} padding, run {(ctx.run_id or '')[:8]}): dominant period "
                 f"{int(res['period_detected'])}, stride {ctx.stride}")
        fig = plots.period_curve(res, ctx.stride, curves["shift_difference"], PERIOD_TOL * typical_difference(curve),
                                 PERIOD_TOL, title=title)
        print(log_results(ctx, "period", pad, scalars, curves, fig, opts))
        results[pad] = res
    return results


__all__ = ["run", "shift_profile", "table", "typical_difference"]
