"""Gate cycling (science.md §5; W = S only): shift every compressor's slot-specific gate parameters by d slots,
Z_i <- Z_{(i-d) mod W} and b_i <- b_{(i-d) mod W} (also the fixed slot priors, part of the same gate logit),
keeping the payload maps C_i. If the gates alone decide which phase is read, the accuracy curve moves with them:

    A_d(r) = A_0((r - d) mod S)      (r the phase t mod S)

We compare the predicted change A_0((r-d) mod S) - A_0(r) with the observed A_d(r) - A_0(r), pooled over the
distinct nonzero shifts (d mod W) and the phases except the boundary phase S-1, by
    R^2 = 1 - sum (obs - pred)^2 / sum (obs - mean obs)^2,
with a percentile interval from a cluster bootstrap (the same resampled clusters for every shift).
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from phasefix.analyze import RunContext, accuracy_by, eval_set, fmt, log_results, nanmean, parse_shifts
from phasefix.analyze.gates import check_gated
from phasefix.errors import ConfigError
from phasefix.metrics import cluster_bootstrap_curves
from phasefix.predict import predict

GATE_PARAMS = ("gate", "gate_bias", "slot_prior")  # per branch: {branch}_{name}, slot along dim 0


def check_cyclable(config) -> None:
    check_gated(config)
    if config.layer_compression or config.boundary_bridge:
        raise ConfigError(f"analyze cycle needs one W = S grid in every layer (got model.layer_compression="
                          f"{config.layer_compression}, model.boundary_bridge={config.boundary_bridge}): a cycle "
                          "shifts every layer's gates by the same phases")
    if config.window != config.stride:
        raise ConfigError(f"analyze cycle needs model.window == model.stride (got window={config.window}, "
                          f"stride={config.stride}): with overlapping windows a slot is not a phase, so shifting "
                          "gates has no phase prediction")


def gate_tensors(model) -> list[torch.Tensor]:
    """Every slot-specific gate tensor (parameters and slot-prior buffers) of every compressor."""
    out = []
    for comp in model.compressors():
        for b in comp.branches:
            for name in GATE_PARAMS:
                t = getattr(comp, f"{b}_{name}", None)
                if t is not None:
                    out.append(t)
    return out


@contextmanager
def cycled(model, d: int):
    """Within the block the gates are shifted by d slots: new[i] = old[(i - d) mod W] (`torch.roll` by d along
    the slot dim); restored exactly on exit."""
    tensors = gate_tensors(model)
    saved = [t.detach().clone() for t in tensors]
    try:
        with torch.no_grad():
            for t in tensors:
                t.copy_(torch.roll(t.detach().clone(), shifts=d, dims=0))
        yield model
    finally:
        with torch.no_grad():
            for t, s in zip(tensors, saved):
                t.copy_(s)


def predicted_change(base_phase: np.ndarray, d: int) -> np.ndarray:
    """A_0((r - d) mod S) - A_0(r) for every phase r."""
    return np.roll(base_phase, d) - base_phase


def r_squared(observed: np.ndarray, predicted: np.ndarray) -> float:
    """1 - SS_res / SS_tot of `predicted` as a prediction of `observed` (flattened; nan entries dropped; nan when
    the observed values do not vary)."""
    o, p = np.asarray(observed, dtype=np.float64).ravel(), np.asarray(predicted, dtype=np.float64).ravel()
    keep = ~(np.isnan(o) | np.isnan(p))
    o, p = o[keep], p[keep]
    ss_tot = float(((o - o.mean()) ** 2).sum()) if o.size else 0.0
    if ss_tot == 0.0:
        return float("nan")
    return 1.0 - float(((o - p) ** 2).sum()) / ss_tot


def pooled_r2(base_phase: np.ndarray, shifted: dict[int, np.ndarray], exclude=(-1,)) -> float:
    """R^2 over the shifts in `shifted` (d -> A_d per phase) and the phases not in `exclude` (default: the
    boundary phase S-1)."""
    S = base_phase.shape[-1]
    keep = np.ones(S, dtype=bool)
    keep[[e % S for e in exclude]] = False
    obs = np.stack([shifted[d] - base_phase for d in shifted])[..., keep]
    pred = np.stack([predicted_change(base_phase, d) for d in shifted])[..., keep]
    return r_squared(obs, pred)


def _bootstrap_r2(outcomes: dict, stride: int, n_boot: int, seed: int = 0, exclude=(-1,)) -> np.ndarray:
    """R^2 per cluster-bootstrap replicate (paired: every shift resamples the same clusters)."""
    curves = {d: cluster_bootstrap_curves(o.correct, o.residue % stride, o.cluster, period=stride, n_boot=n_boot,
                                          seed=seed) for d, o in outcomes.items()}
    base = curves.pop(0)
    return np.array([pooled_r2(base[b], {d: c[b] for d, c in curves.items()}, exclude) for b in range(n_boot)])


def cycle(model, dataset, shifts, stride: int, period: int, n_boot: int = 500, batch_size: int = 128,
          seed: int = 0) -> dict:
    """Evaluate every distinct shift (d mod W) once. Returns {"shifts", "phase": {d: A_d [S]},
    "residue": {d: [period]}, "r2", "r2_ci", "r2_by_shift": {d: R^2}} (d as given in `shifts`)."""
    W = model.config.window
    distinct = sorted({d % W for d in shifts} | {0})
    outcomes = {}
    for dm in distinct:
        with cycled(model, dm):
            outcomes[dm] = predict(model, dataset, batch_size)
    phase = {dm: accuracy_by(o.correct, o.residue % stride, stride) for dm, o in outcomes.items()}
    residue = {dm: accuracy_by(o.correct, o.residue, period) for dm, o in outcomes.items()}
    nonzero = {dm: phase[dm] for dm in distinct if dm != 0}
    r2 = pooled_r2(phase[0], nonzero) if nonzero else float("nan")
    boot = _bootstrap_r2(outcomes, stride, n_boot, seed) if nonzero else np.array([np.nan])
    with np.errstate(invalid="ignore"):
        ci = tuple(float(q) for q in np.nanquantile(boot, [0.025, 0.975])) if np.isfinite(boot).any() \
            else (float("nan"), float("nan"))
    return {"shifts": list(shifts), "phase": {d: phase[d % W] for d in shifts} | {0: phase[0]},
            "residue": {d: residue[d % W] for d in shifts} | {0: residue[0]}, "r2": r2, "r2_ci": ci,
            "r2_by_shift": {d: (pooled_r2(phase[0], {d % W: phase[d % W]}) if d % W else float("nan"))
                            for d in shifts},
            "mae_by_shift": {d: mean_abs_error(phase[0], phase[d % W], d) for d in shifts}}


def mean_abs_error(base_phase: np.ndarray, shifted: np.ndarray, d: int) -> float:
    """mean over the non-boundary phases of |observed - predicted change| (= |A_d(r) - A_0((r-d) mod S)|)."""
    err = np.abs((shifted - base_phase) - predicted_change(base_phase, d))[:-1]
    return nanmean(err)


def table(res: dict, stride: int) -> str:
    lines = [f"{'shift':<7}" + "".join(f"{'ph' + str(p):>7}" for p in range(stride)) + f"{'MAE':>8}{'R^2':>9}"]
    for d in sorted(set(res["shifts"]) | {0}):
        extra = (fmt(res["mae_by_shift"][d], 8) + f"{float(res['r2_by_shift'][d]):>9.2f}"
                 if d in res["r2_by_shift"] else "")
        lines.append(f"{'d=' + str(d):<7}" + "".join(fmt(a) for a in res["phase"][d]) + extra)
    lo, hi = res["r2_ci"]
    lines.append("MAE: mean |observed - predicted| over phases 0..S-2; per-shift R^2 over S-1 points is unstable "
                 "when the observed changes hardly vary")
    lines.append(f"pooled R^2 (distinct nonzero shifts mod W, boundary phase {stride - 1} excluded): "
                 f"{res['r2']:.3f}  95% cluster-bootstrap interval [{lo:.3f}, {hi:.3f}]")
    return "\n".join(lines)


def run(ctx: RunContext, opts: dict) -> dict:
    from phasefix import plots

    check_cyclable(ctx.config)
    shifts = parse_shifts(opts["shifts"])
    seed = ctx.eval_seed if opts["seed"] is None else opts["seed"]
    results = {}
    for pad in ctx.paddings(opts["padding"]):
        ds = eval_set(ctx, pad, opts["per_residue"], seed)
        res = cycle(ctx.model, ds, shifts, ctx.stride, ctx.period, opts["n_boot"], opts["batch_size"])
        print(f"\ncycle ({pad} padding, {len(ds)} prompts): accuracy by phase under gate shift d "
              f"(prediction A_d(r) = A_0((r-d) mod {ctx.stride}))")
        print(table(res, ctx.stride))
        lo, hi = res["r2_ci"]
        scalars = {"r2": res["r2"], "r2_low": lo, "r2_high": hi}
        curves = {}
        for d in sorted(set(shifts) | {0}):
            curves[f"d{d}/acc_phase"] = res["phase"][d]
            scalars[f"d{d}/acc_mean"] = float(nanmean(res["residue"][d]))
            if d in res["r2_by_shift"]:
                scalars[f"d{d}/r2"] = res["r2_by_shift"][d]
                scalars[f"d{d}/mae"] = res["mae_by_shift"][d]
        predicted = {d: predicted_change(res["phase"][0], d) for d in res["shifts"]}
        fig = plots.cycle_prediction(res, predicted, ctx.stride,
                                     title=f"gate cycling ({pad} padding, run {(ctx.run_id or '')[:8]})")
        print(log_results(ctx, "cycle", pad, scalars, curves, fig, opts))
        results[pad] = res
    return results


__all__ = ["check_cyclable", "cycle", "cycled", "gate_tensors", "pooled_r2", "predicted_change",
           "r_squared", "run", "table"]
