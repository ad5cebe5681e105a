"""Gate concentration (science.md §5): per layer, branch and KV head, the static effective number of slots
exp(H(E[a])) (E over prompts and complete windows) against the per-window E[exp(H(a))], and the slot (and phase)
each head prefers.

A head that reads one fixed slot in every window has both near 1; a head whose choice depends on the content has a
small per-window number but a large static one; a head that averages has both near W.
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from phasefix.analyze import RunContext, eval_set, fmt, log_results
from phasefix.errors import ConfigError
from phasefix.mitigations.gates import effective_slots, empty_windows, head_slot_phases


def check_gated(config) -> None:
    if config.attention != "compressed":
        raise ConfigError(f"analyze gates/cycle is invalid with model.attention={config.attention!r}: the model "
                          "has no compressor gates")
    if config.gate == "uniform":
        raise ConfigError("analyze gates/cycle is invalid with model.gate='uniform': uniform averaging has no "
                          "learned gates")


@torch.no_grad()
def gate_statistics(model, dataset, batch_size: int = 128, max_prompts: int | None = None) -> list[dict]:
    """Per layer {branch: {"static": [HKV, W] E[a], "static_eff": [HKV] exp(H(E[a])),
    "window_eff": [HKV] E[exp(H(a))], "preferred_slot": [HKV], "preferred_phase": [HKV]}} (torch, cpu).
    Windows with slots before position 0 are left out (`empty_windows`), as in `static_gate_distribution`."""
    cfg = model.config
    device = next(model.parameters()).device
    sums: list[dict] = [{} for _ in model.layers]
    n = 0
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        ids = batch["input_ids"]
        if max_prompts is not None:
            ids = ids[: max(0, max_prompts - n)]
        if ids.shape[0] == 0:
            break
        model(ids.to(device), collect_gates=True)
        for layer, branches in enumerate(model.gates()):
            for b, a in (branches or {}).items():  # a: [B, N, W, HKV]
                skip = min(empty_windows(cfg, layer), a.shape[1] - 1)
                a = a[:, skip:].double()
                p_sum = a.sum(dim=0).mean(dim=0)  # [W, HKV]: sum over prompts of the per-prompt window mean
                e_sum = effective_slots(a.transpose(2, 3)).sum(dim=0).mean(dim=0)  # [HKV]
                s = sums[layer].setdefault(b, [0.0, 0.0])
                s[0], s[1] = s[0] + p_sum, s[1] + e_sum
        n += ids.shape[0]
    out = []
    for layer, branches in enumerate(sums):
        stats = {}
        for b, (p_sum, e_sum) in branches.items():
            P = (p_sum / n).transpose(0, 1).float().cpu()  # [HKV, W]
            slot = P.argmax(dim=1)
            phase = head_slot_phases(cfg, layer)[torch.arange(len(slot)), slot]  # per head: spread offsets differ
            stats[b] = {"static": P, "static_eff": effective_slots(P), "window_eff": (e_sum / n).float().cpu(),
                        "preferred_slot": slot, "preferred_phase": phase}
        out.append(stats)
    return out


def table(stats: list[dict]) -> str:
    lines = [f"{'layer':<6}{'branch':<7}{'head':<5}{'static':>8}{'window':>8}{'slot':>6}{'phase':>6}{'E[a]max':>8}"
             "  E[a] by slot"]
    for layer, branches in enumerate(stats):
        for b, s in branches.items():
            for h in range(len(s["static_eff"])):
                P = s["static"][h]
                lines.append(f"{layer:<6}{b:<7}{h:<5}{fmt(s['static_eff'][h], 8, 2)}{fmt(s['window_eff'][h], 8, 2)}"
                             f"{int(s['preferred_slot'][h]):>6}{int(s['preferred_phase'][h]):>6}"
                             f"{fmt(P.max(), 8, 2)}  " + " ".join(f"{float(x):.2f}" for x in P))
    return "\n".join(lines)


def run(ctx: RunContext, opts: dict) -> dict:
    from phasefix import plots

    check_gated(ctx.config)
    seed = ctx.eval_seed if opts["seed"] is None else opts["seed"]
    results = {}
    for pad in ctx.paddings(opts["padding"]):
        ds = eval_set(ctx, pad, opts["per_residue"], seed)
        stats = gate_statistics(ctx.model, ds, opts["batch_size"], opts["max_prompts"])
        print(f"\ngates ({pad} padding, {min(len(ds), opts['max_prompts'])} prompts): effective slots, static "
              f"exp(H(E[a])) vs per-window E[exp(H(a))] (W={ctx.config.window})")
        print(table(stats))
        scalars, curves = {}, {}
        for layer, branches in enumerate(stats):
            for b, s in branches.items():
                for h in range(len(s["static_eff"])):
                    key = f"L{layer}/{b}/h{h}"
                    scalars[f"{key}/static_eff"] = float(s["static_eff"][h])
                    scalars[f"{key}/window_eff"] = float(s["window_eff"][h])
                    scalars[f"{key}/preferred_slot"] = float(s["preferred_slot"][h])
                    curves[f"{key}/static"] = s["static"][h].tolist()
        fig = plots.gate_stats_heatmap(stats, title=f"E[a] ({pad}, run {(ctx.run_id or '')[:8]}); rows: "
                                                    "static/per-window eff. slots")
        print(log_results(ctx, "gates", pad, scalars, curves, fig, opts))
        results[pad] = stats
    return results


__all__ = ["check_gated", "gate_statistics", "run", "table"]
