"""Synthetic retrieval data: the token layout, training sequences, the LM mix and phase-controlled evaluation sets."""
from phasefix.data.lm_mix import LMMixConfig, make_lm_mix_dataset
from phasefix.data.phase_eval import make_phase_eval
from phasefix.data.retrieval import RetrievalConfig, make_train_dataset
from phasefix.data.vocab import RetrievalVocab

__all__ = ["LMMixConfig", "RetrievalConfig", "RetrievalVocab", "make_lm_mix_dataset", "make_phase_eval",
           "make_train_dataset"]
