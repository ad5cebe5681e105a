"""Where the wrong answers come from. For every wrongly answered prompt, the predicted token is sorted by where it
stands as another record's value (any record but the target):

  block   in the target key's stride block (positions p with p // S == target // S: the tokens one compressed entry
          pools when W = S)
  next    in the block after it (where the target's own value lies when the key is at the boundary phase S-1)
  record  elsewhere among the records
  other   no record's value

(first match in that order when the token is the value of several records). A model that finds the target's entry
but cannot tell the tokens pooled in it apart answers from `block` (or `next`); `chance` is each share expected if
the wrong answer were a uniformly drawn other record's value. Shares are reported by the target key's phase.
"""
from __future__ import annotations

import numpy as np

from phasefix.analyze import RunContext, eval_set, fmt, log_results
from phasefix.predict import predict

CATEGORIES = ("block", "next", "record", "other")


def classify(ids: np.ndarray, pred: np.ndarray, target_pos: np.ndarray, stride: int, num_records: int,
             vocab) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt (rows of ids [N, T]): the category index of `pred` (into CATEGORIES), and the chance of each
    category but `other` [N, 3] (the share of other records' values standing there). Records are the first
    `num_records` key tokens of a prompt, each followed by its value."""
    category = np.empty(len(ids), dtype=np.int64)
    chance = np.full((len(ids), len(CATEGORIES) - 1), np.nan)
    for i, (row, p, t) in enumerate(zip(ids, pred, target_pos)):
        keys = np.flatnonzero(vocab.is_key(row))[:num_records]
        where = keys[keys != t] + 1  # the other records' value positions
        offset = where // stride - t // stride
        region = np.where(offset == 0, 0, np.where(offset == 1, 1, 2))
        if where.size:
            chance[i] = np.bincount(region, minlength=3) / where.size
        hits = region[row[where] == p]
        category[i] = hits.min() if hits.size else 3
    return category, chance


def run(ctx: RunContext, opts: dict) -> dict:
    seed = ctx.eval_seed if opts["seed"] is None else opts["seed"]
    S, vocab, R = ctx.stride, ctx.data_cfg.vocab, ctx.data_cfg.num_records
    results = {}
    for pad in ctx.paddings(opts["padding"]):
        ds = eval_set(ctx, pad, opts["per_residue"], seed)
        out = predict(ctx.model, ds, opts["batch_size"])
        wrong = ~out.correct
        cols = ds.with_format("numpy")[:]
        target_pos = np.asarray(cols["target_pos"])
        category, chance = classify(np.asarray(cols["input_ids"])[wrong], out.pred[wrong], target_pos[wrong], S, R,
                                    vocab)
        phase = target_pos % S
        share = {c: np.full(S, np.nan) for c in CATEGORIES}
        for r in range(S):
            at = phase[wrong] == r
            for j, c in enumerate(CATEGORIES):
                share[c][r] = (category[at] == j).mean() if at.any() else np.nan
        scalars = {"accuracy": float(1 - wrong.mean()), "errors": float(wrong.sum()),
                   **{f"{c}_share": float((category == j).mean()) if wrong.any() else float("nan")
                      for j, c in enumerate(CATEGORIES)},
                   **{f"{c}_chance": float(np.nanmean(chance[:, j])) if wrong.any() else float("nan")
                      for j, c in enumerate(CATEGORIES[:-1])}}
        print(f"\nconfusions ({pad} padding, {len(ds)} prompts, {int(wrong.sum())} wrong; stride {S})")
        print("of the wrong answers: " + "  ".join(
            f"{c} {fmt(scalars[c + '_share'], 5, 2)}" + (f" (chance {fmt(scalars[c + '_chance'], 4, 2)})"
                                                         if c != "other" else "") for c in CATEGORIES))
        print("phase  " + " ".join(f"{r:>6d}" for r in range(S)))
        print("acc    " + " ".join(fmt(1 - wrong[phase == r].mean(), 6, 2) for r in range(S)))
        for c in CATEGORIES:
            print(f"{c:<6} " + " ".join(fmt(share[c][r], 6, 2) for r in range(S)))
        print(log_results(ctx, "confusions", pad, scalars, {f"{c}_share": share[c] for c in CATEGORIES},
                          None, opts))
        results[pad] = {**scalars, "by_phase": share}
    return results


__all__ = ["CATEGORIES", "classify", "run"]
