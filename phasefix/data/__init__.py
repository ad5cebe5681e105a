"""Synthetic retrieval data: the token layout, training sequences, the LM mix, phase-controlled evaluation sets, and
which of them a run trains and is evaluated on (`select`)."""
from phasefix.data.lm_mix import LMMixConfig, make_lm_mix_dataset
from phasefix.data.phase_eval import make_phase_eval
from phasefix.data.retrieval import RetrievalConfig, make_train_dataset
from phasefix.data.select import DATA_KINDS, data_config, eval_set, eval_task_kwargs, train_set
from phasefix.data.vocab import RetrievalVocab

__all__ = ["DATA_KINDS", "LMMixConfig", "RetrievalConfig", "RetrievalVocab", "data_config", "eval_set",
           "eval_task_kwargs", "make_lm_mix_dataset", "make_phase_eval", "make_train_dataset", "train_set"]
