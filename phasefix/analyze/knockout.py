"""Head knockout by phase (science.md §5): for each layer and KV head, replace the outputs of the query heads that
read it, at the query (final) position, by their mean over a disjoint calibration set, and measure the relative
change in accuracy per residue (and per phase t mod S).

The attention output enters `o_proj` as [B, T, H*D] with query head h in columns h*D..(h+1)*D, and query head h
reads KV head h // (H/HKV); a forward pre-hook on `o_proj` swaps those columns at each prompt's query position.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch
from torch.utils.data import DataLoader

from phasefix.analyze import RunContext, accuracy_by, eval_set, fmt, log_results, nanmean, relative_change
from phasefix.predict import Outcome, predict


def query_heads(config, kv_head: int) -> range:
    """The query heads that read KV head `kv_head` (grouped-query attention)."""
    group = config.num_heads // config.num_kv_heads
    return range(kv_head * group, (kv_head + 1) * group)


@torch.no_grad()
def calibration_means(model, dataset, batch_size: int = 128) -> list[torch.Tensor]:
    """Per layer, the mean over the calibration prompts of the attention output (o_proj input) at the query
    position: [H*D] each."""
    layers = model.layers
    sums = [None] * len(layers)
    count = 0
    current: dict = {}

    def make_hook(i):
        def hook(mod, args):
            x = args[0]  # [B, T, H*D]
            rows = torch.arange(x.shape[0], device=x.device)
            s = x[rows, current["pos"]].double().sum(0)
            sums[i] = s if sums[i] is None else sums[i] + s
        return hook

    handles = [blk.attn.o_proj.register_forward_pre_hook(make_hook(i)) for i, blk in enumerate(layers)]
    try:
        device = next(model.parameters()).device
        for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
            current["pos"] = batch["query_pos"].to(device)
            model(batch["input_ids"].to(device))
            count += batch["input_ids"].shape[0]
    finally:
        for h in handles:
            h.remove()
    return [(s / count).float() for s in sums]


@contextmanager
def knocked_out(model, layer: int, kv_head: int, mean: torch.Tensor, query_pos: dict):
    """Within the block, the outputs of the query heads reading (layer, kv_head) at `query_pos["pos"]` ([B],
    set per batch by the caller; None: the last position) are replaced by `mean` ([H*D], their calibration mean)."""
    cfg = model.config
    D = cfg.head_dim
    cols = torch.cat([torch.arange(h * D, (h + 1) * D) for h in query_heads(cfg, kv_head)])

    def hook(mod, args):
        x = args[0].clone()
        B, T = x.shape[:2]
        pos = query_pos.get("pos")
        pos = torch.full((B,), T - 1, device=x.device) if pos is None else pos.to(x.device)
        rows = torch.arange(B, device=x.device)
        c = cols.to(x.device)
        x[rows[:, None], pos[:, None], c[None, :]] = mean.to(x)[c][None, :]
        return (x, *args[1:])

    handle = model.layers[layer].attn.o_proj.register_forward_pre_hook(hook)
    try:
        yield model
    finally:
        handle.remove()


def predict_with_knockout(model, dataset, layer: int, kv_head: int, mean: torch.Tensor,
                          batch_size: int = 128) -> Outcome:
    state: dict = {}
    with knocked_out(model, layer, kv_head, mean, state):
        return predict(model, dataset, batch_size, on_batch=lambda batch: state.update(pos=batch["query_pos"]))


def knockout(model, dataset, calibration, period: int, stride: int, batch_size: int = 128) -> dict:
    """Baseline and per-(layer, KV head) knockout accuracy by residue and by phase.

    Returns {"base": [period], "base_phase": [S], "acc": [L, HKV, period], "acc_phase": [L, HKV, S],
    "rel": [L, HKV, period], "rel_phase": [L, HKV, S]} (numpy; rel = (knockout - base) / base, nan where
    base is 0)."""
    cfg = model.config
    L, HKV = cfg.num_layers, cfg.num_kv_heads
    base = predict(model, dataset, batch_size)
    means = calibration_means(model, calibration, batch_size)
    acc = np.zeros((L, HKV, period))
    acc_phase = np.zeros((L, HKV, stride))
    for layer in range(L):
        for g in range(HKV):
            out = predict_with_knockout(model, dataset, layer, g, means[layer], batch_size)
            acc[layer, g] = accuracy_by(out.correct, out.residue, period)
            acc_phase[layer, g] = accuracy_by(out.correct, out.residue % stride, stride)
    b = accuracy_by(base.correct, base.residue, period)
    bp = accuracy_by(base.correct, base.residue % stride, stride)
    return {"base": b, "base_phase": bp, "acc": acc, "acc_phase": acc_phase,
            "rel": relative_change(acc, b), "rel_phase": relative_change(acc_phase, bp)}


def table(res: dict, stride: int) -> str:
    L, HKV, _ = res["rel"].shape
    lines = [f"{'head':<10}" + "".join(f"{'ph' + str(p):>8}" for p in range(stride)) + f"{'mean':>8}  hit phases",
             f"{'base acc':<10}" + "".join(fmt(a, 8) for a in res["base_phase"]) + fmt(nanmean(res["base"]), 8)]
    for layer in range(L):
        for g in range(HKV):
            rel = res["rel_phase"][layer, g]
            lines.append(f"{f'L{layer} kv{g}':<10}" + "".join(fmt(x, 8) for x in rel)
                         + fmt(nanmean(res["rel"][layer, g]), 8) + "  " + ",".join(map(str, hit_phases(rel))))
    return "\n".join(lines)


def hit_phases(rel_phase: np.ndarray, threshold: float = -0.2) -> list[int]:
    """Phases a knockout costs more than 20% of their accuracy, worst first."""
    order = np.argsort(np.nan_to_num(rel_phase, nan=0.0))
    return [int(p) for p in order if rel_phase[p] <= threshold]


def run(ctx: RunContext, opts: dict) -> dict:
    from phasefix import plots

    seed = ctx.eval_seed if opts["seed"] is None else opts["seed"]
    calib_seed = seed + 2 if opts["calib_seed"] is None else opts["calib_seed"]
    if calib_seed == seed:
        from phasefix.errors import ConfigError

        raise ConfigError(f"calib_seed={calib_seed} is invalid: must differ from the evaluation seed ({seed})")
    results = {}
    for pad in ctx.paddings(opts["padding"]):
        ds = eval_set(ctx, pad, opts["per_residue"], seed)
        calib = eval_set(ctx, pad, opts["per_residue"], calib_seed)
        res = knockout(ctx.model, ds, calib, ctx.period, ctx.stride, opts["batch_size"])
        print(f"\nknockout ({pad} padding, {len(ds)} prompts, calibration seed {calib_seed}): relative accuracy "
              f"change per phase (t mod {ctx.stride})")
        print(table(res, ctx.stride))
        scalars, curves = {"base_acc_mean": float(nanmean(res["base"]))}, {"base": res["base"]}
        L, HKV, _ = res["rel"].shape
        for layer in range(L):
            for g in range(HKV):
                key = f"L{layer}/kv{g}"
                curves[f"{key}/rel_change"] = res["rel"][layer, g]
                scalars[f"{key}/mean_rel_change"] = float(nanmean(res["rel"][layer, g]))
                scalars[f"{key}/acc_mean"] = float(nanmean(res["acc"][layer, g]))
                for p in range(ctx.stride):
                    scalars[f"{key}/phase{p}/rel_change"] = float(res["rel_phase"][layer, g, p])
        fig = plots.knockout_heatmap(res, ctx.stride, title=f"knockout by residue ({pad} padding, run "
                                                            f"{(ctx.run_id or '')[:8]})")
        print(log_results(ctx, "knockout", pad, scalars, curves, fig, opts))
        results[pad] = res
    return results
