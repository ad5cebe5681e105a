"""Synthetic retrieval data: the token layout, training sequences and phase-controlled evaluation sets."""
from phasefix.data.phase_eval import make_phase_eval
from phasefix.data.retrieval import RetrievalConfig, make_train_dataset
from phasefix.data.vocab import RetrievalVocab

__all__ = ["RetrievalConfig", "RetrievalVocab", "make_phase_eval", "make_train_dataset"]
