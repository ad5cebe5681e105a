"""Synthetic retrieval data: the token layout, training sequences, the LM mix, phase-controlled evaluation sets, and
which of them a run trains and is evaluated on (`select`).

The names below load on first use (PEP 562), so that importing a light submodule such as `phasefix.data.layout`
does not import `datasets` through the LM mix."""
from importlib import import_module

_WHERE = {"LMMixConfig": "lm_mix", "make_lm_mix_dataset": "lm_mix", "make_phase_eval": "phase_eval",
          "RetrievalConfig": "retrieval", "make_train_dataset": "retrieval", "DATA_KINDS": "select",
          "data_config": "select", "eval_set": "select", "eval_task_kwargs": "select", "train_set": "select",
          "RetrievalVocab": "vocab"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'phasefix.data' has no attribute {name!r}")
    return getattr(import_module(f"phasefix.data.{_WHERE[name]}"), name)
