"""Phase-grouped evaluation: score prompts at their query position and aggregate accuracy by residue."""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from phasefix.metrics import PhaseAccuracy


@torch.no_grad()
def evaluate_phase(model, dataset, *, period: int, stride: int | None = None, n_boot: int = 2000,
                   batch_size: int = 256, seed: int = 0) -> dict:
    """Full-vocabulary top-1 accuracy at `query_pos` grouped by `residue` (PhaseAccuracy.compute() as a dict).

    `model(input_ids [B, T]) -> logits [B, T, V]`; `dataset` has columns input_ids, answer, query_pos, residue,
    cluster (as `make_phase_eval` writes them) in torch format.
    """
    metric = PhaseAccuracy(period, fold_stride=stride, n_boot=n_boot, seed=seed)
    device = next(model.parameters()).device
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        logits = model(batch["input_ids"].to(device))  # [B, T, V]
        at_query = logits[torch.arange(logits.shape[0], device=device), batch["query_pos"].to(device)]
        correct = (at_query.argmax(-1) == batch["answer"].to(device)).cpu()
        metric.update(correct, batch["residue"], batch["cluster"])
    return metric.compute()
