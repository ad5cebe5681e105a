"""One evaluation function: the full-vocabulary top-1 prediction at each prompt's query position, the accuracy of
science.md section 4. The Lightning module (validation), `phasefix.fit` (final evaluation), `phasefix.evaluate`
(phasefix runs and Hugging Face models) and `phasefix.analyze` all score through `predict`.
"""
from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch.utils.data import DataLoader

from phasefix.metrics import PhaseAccuracy


@dataclasses.dataclass
class Outcome:
    """Per-prompt results of one evaluation, in dataset order (numpy): correct [n] bool, pred [n] (the top-1 token),
    residue [n] (the target's), cluster [n], end_residue [n] (the prompt's length mod the period; None for sets
    without the column)."""

    correct: np.ndarray
    pred: np.ndarray
    residue: np.ndarray
    cluster: np.ndarray
    end_residue: np.ndarray | None = None


def query_predictions(model, input_ids: torch.Tensor, query_pos: torch.Tensor) -> torch.Tensor:
    """Top-1 token [B] at each prompt's query position; `model(input_ids [B, T]) -> logits [B, T, V]`."""
    logits = model(input_ids)  # [B, T, V]
    return logits[torch.arange(logits.shape[0], device=logits.device), query_pos].argmax(-1)


def logits_at(model, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Logits [B, K, V] of a Hugging Face causal LM at sequence positions [K] (the same for every row), computing
    the output head only there (`logits_to_keep`), so 128K-token prompts never materialise [B, T, V]."""
    try:
        return model(input_ids=input_ids, use_cache=False, logits_to_keep=positions).logits
    except TypeError:  # architectures without logits_to_keep
        return model(input_ids=input_ids, use_cache=False).logits[:, positions]


def progress_bar(iterable: Iterable, total: int | None, desc: str, enabled: bool):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)


@torch.no_grad()
def predict(model, dataset, batch_size: int = 128, *, progress: bool = False, desc: str = "evaluate",
            on_batch: Callable[[dict], None] | None = None) -> Outcome:
    """Top-1 at the query position of every prompt of `dataset`, in order.

    `dataset`: a torch-format set with columns input_ids, answer, query_pos, residue, cluster (`make_phase_eval`,
    `phasefix.data.eval_set`) scored by a phasefix model, or a `TextPhaseSet` (generated a batch at a time) scored by
    a Hugging Face model through `logits_at`. `on_batch(batch)` runs before each forward pass (knockout: its hook
    reads the query positions)."""
    from phasefix.data.text_prompts import TextPhaseSet

    device = next(model.parameters()).device
    out = {k: [] for k in ("correct", "pred", "residue", "cluster", "end_residue")}
    total = math.ceil(len(dataset) / batch_size)
    if isinstance(dataset, TextPhaseSet):
        batches = ({k: torch.from_numpy(np.asarray(v)) for k, v in b.items()} for b in dataset.batches(batch_size))
    else:
        batches = DataLoader(dataset, batch_size=batch_size, shuffle=False)
    for batch in progress_bar(batches, total, desc, progress):
        if on_batch is not None:
            on_batch(batch)
        ids = batch["input_ids"].to(device)
        if isinstance(dataset, TextPhaseSet):  # the head only at the batch's query positions (one without a tail)
            positions, which = torch.unique(batch["query_pos"], return_inverse=True)
            logits = logits_at(model, ids, positions.to(device))
            pred = logits[torch.arange(ids.shape[0], device=device), which.to(device)].argmax(-1).cpu()
        else:
            pred = query_predictions(model, ids, batch["query_pos"].to(device)).cpu()
        out["pred"].append(pred.numpy())
        out["correct"].append((pred == batch["answer"]).numpy())
        out["residue"].append(batch["residue"].numpy())
        out["cluster"].append(batch["cluster"].numpy())
        if "end_residue" in batch:
            out["end_residue"].append(batch["end_residue"].numpy())
    cat = {k: np.concatenate(v).astype(np.int64) if k != "correct" else np.concatenate(v) for k, v in out.items() if v}
    return Outcome(cat["correct"], cat["pred"], cat["residue"], cat["cluster"], cat.get("end_residue"))


def evaluate_phase(model, dataset, *, period: int, stride: int | None = None, n_boot: int = 2000,
                   batch_size: int = 256, seed: int = 0, progress: bool = False, desc: str = "evaluate") -> dict:
    """`predict`'s accuracy grouped by residue (PhaseAccuracy.compute() as a dict: curve, worst, gap, intervals)."""
    outcome = predict(model, dataset, batch_size, progress=progress, desc=desc)
    metric = PhaseAccuracy(period, fold_stride=stride, n_boot=n_boot, seed=seed)
    metric.update(torch.from_numpy(outcome.correct), torch.from_numpy(outcome.residue),
                  torch.from_numpy(outcome.cluster))
    return metric.compute()
