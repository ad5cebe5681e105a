"""Which data a run trains and is evaluated on, from its `data` config: the one place `fit`, `evaluate` and `analyze`
turn a config into datasets."""
from __future__ import annotations

import dataclasses

from phasefix.data.lm_mix import LMMixConfig, add_text_context, make_lm_mix_dataset
from phasefix.data.phase_eval import make_phase_eval
from phasefix.data.retrieval import RetrievalConfig, make_train_dataset
from phasefix.errors import check_choice, check_group_keys

DATA_KINDS = ("retrieval", "lm_mix")


def data_config(d: dict) -> RetrievalConfig | LMMixConfig:
    """The data dataclass for `data.kind`: the retrieval task alone, or interleaved with text (`lm_mix`)."""
    d = dict(d)
    kind = d.pop("kind", "retrieval")
    check_choice("data.kind", kind, DATA_KINDS)
    cls = LMMixConfig if kind == "lm_mix" else RetrievalConfig
    check_group_keys("data", d, {f.name for f in dataclasses.fields(cls)})
    return cls(**d)


def train_set(data_cfg, split: str, seed: int):
    """The training sequences (split "train"), or held-out ones ("val": the LM mix's text loss)."""
    if isinstance(data_cfg, LMMixConfig):
        return make_lm_mix_dataset(data_cfg, split=split, seed=seed)
    return make_train_dataset(data_cfg, split=split, seed=seed)


def train_stages(data_cfg, seed: int) -> list[tuple[int, object]]:
    """The training sets in the order training draws from them, each with the step it starts at: one set, or with
    `data.in_sequence_from_step` > 0 a set with in_sequence_prob = `data.in_sequence_prob_before` (0: dense) before
    that step, then the configured mix."""
    if data_cfg.in_sequence_from_step == 0:
        return [(0, train_set(data_cfg, "train", seed))]
    before = dataclasses.replace(data_cfg, in_sequence_prob=data_cfg.in_sequence_prob_before, in_sequence_from_step=0)
    return [(0, train_set(before, "train", seed)), (data_cfg.in_sequence_from_step, train_set(data_cfg, "train", seed))]


def eval_set(data_cfg, padding: str, period: int, per_residue: int, seed: int, *, task: str = "kv_lookup",
             task_kwargs: dict | None = None, text: bool = True, phase_of: str = "fact"):
    """The phase-controlled prompts (torch format) for the task the model was trained on (`task_kwargs`: default
    `eval_task_kwargs(data_cfg)`); for the LM mix with held-out text before the records, as in training
    (text=False: the plain protocol prompts); `phase_of`: `make_phase_eval`'s."""
    kw = eval_task_kwargs(data_cfg) if task_kwargs is None else task_kwargs
    ds = make_phase_eval(task, padding, period=period, per_residue=per_residue, seed=seed, phase_of=phase_of, **kw)
    if text and isinstance(data_cfg, LMMixConfig):
        ds = add_text_context(ds, data_cfg, period, seed)
    return ds.with_format("torch")


def eval_task_kwargs(data_cfg) -> dict:
    """`make_phase_eval` options that evaluate the task the model was trained on (sizes, vocabulary, filler)."""
    # At most half the records are demonstrated: the target is never demonstrated, so with R - 1 demonstrations a
    # model could answer by elimination (the one record not re-asked) without reading the query key; with <= R/2 that
    # route scores at most 2/R (below the `learned` line, 5 / num_values, for every regime here).
    return dict(num_records=data_cfg.num_records, num_demos=min(data_cfg.num_demos, data_cfg.num_records // 2),
                num_keys=data_cfg.num_keys, num_values=data_cfg.num_values, num_filler=data_cfg.num_filler,
                max_pad=data_cfg.max_prefix_pad)
