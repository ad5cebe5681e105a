"""Language-modelling mix (issue 10): byte-level text around the retrieval task, so the same gates serve both.

One sequence (positions 0-based):

    BOS | text_before bytes | retrieval block (as in retrieval.py, without its BOS) | text_after bytes

Text windows are drawn uniformly from the split's text (files joined by a newline). Bytes are tokens
``vocab.byte_token(b)`` (256 ids after the value range). ``labels`` is next-token on text (from BOS and every text
byte whose successor is text) plus the retrieval queries; text labels are exactly the labels >= vocab.byte_start,
which is how a validation LM loss picks them out. The records still start at a uniform phase mod 24.

Held-out text: files are ranked by a hash of their relative path and the first ``val_fraction`` of them (at least
one) are validation text, whatever the seed; a single-file corpus holds out its last ``val_fraction`` of bytes.
Default corpus: the top-level ``.py`` files of the running Python's standard library (present on every machine).

Evaluation with text (``add_text_context``): the phase-controlled prompts (phase_eval.py) with ``text_before`` bytes
of held-out text after their BOS, as in training; every position shifts by the same amount, so residue groups keep
their matched moments (they are renumbered, not re-drawn).
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from phasefix.data.retrieval import (SCHEDULE_KEYS, SPLITS, RetrievalConfig, arrays_to_dataset, build_train_arrays,
                                     cached_dataset)
from phasefix.data.vocab import RetrievalVocab
from phasefix.errors import check, check_choice

if TYPE_CHECKING:  # datasets is imported where a dataset is built
    from datasets import Dataset


TEXT_LOSS_KEYS = ("lm_weight", "lm_start_step", "lm_ramp_steps")


@dataclass
class LMMixConfig(RetrievalConfig):
    text_before: int = 64
    text_after: int = 64
    corpus: str | None = None  # a text file or a directory; None: the Python standard library's .py files
    corpus_glob: str = "*.py"  # files taken from a corpus directory (use "**/*.txt" etc. to recurse)
    val_fraction: float = 0.1
    # how training weighs the text (TEXT_LOSS_KEYS: not part of the data, so not part of its cache key)
    lm_weight: float = 1.0  # training loss = retrieval mean + lm_weight * text mean (each over its own labels)
    lm_start_step: int = 300  # the text loss is off before this step (lets the retrieval circuit form first)
    lm_ramp_steps: int = 100  # then its weight rises linearly to lm_weight over this many steps

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("text_before", "text_after"):
            value = getattr(self, key)
            check(isinstance(value, int) and value >= 2, f"data.{key}", value, "must be an integer >= 2")
        check(isinstance(self.lm_weight, (int, float)) and self.lm_weight >= 0, "data.lm_weight", self.lm_weight,
              "must be a number >= 0")
        for key in ("lm_start_step", "lm_ramp_steps"):
            value = getattr(self, key)
            check(isinstance(value, int) and value >= 0, f"data.{key}", value, "must be an integer >= 0")
        check(0.0 < self.val_fraction < 1.0, "data.val_fraction", self.val_fraction, "must be in (0, 1)")
        check(self.corpus is None or Path(self.corpus).exists(), "data.corpus", self.corpus,
              "must be an existing file or directory, or null for the Python standard library")

    @property
    def text_loss(self) -> dict:
        """`PhaseFixModule` options for the mixed loss: the first text label id and the text weight's schedule."""
        return {"text_label_start": self.vocab.byte_start, **{k: getattr(self, k) for k in TEXT_LOSS_KEYS}}

    @property
    def block(self) -> RetrievalConfig:
        """The retrieval part on its own."""
        return RetrievalConfig(**{f.name: getattr(self, f.name) for f in fields(RetrievalConfig)})

    @property
    def length(self) -> int:
        return self.text_before + self.block.length + self.text_after

    @property
    def vocab(self) -> RetrievalVocab:
        return RetrievalVocab(self.num_keys, self.num_values, self.num_filler, num_bytes=256)


def corpus_files(cfg: LMMixConfig) -> tuple[Path, list[Path]]:
    """The corpus root and its files, sorted."""
    root = Path(cfg.corpus) if cfg.corpus is not None else Path(sysconfig.get_paths()["stdlib"])
    if root.is_file():
        return root.parent, [root]
    files = sorted(p for p in root.glob(cfg.corpus_glob) if p.is_file())
    check(len(files) > 0, "data.corpus_glob", cfg.corpus_glob, f"matches no file under {root}")
    return root, files


def split_text(cfg: LMMixConfig, split: str) -> np.ndarray:
    """The split's text as uint8 bytes (held-out files for val, the rest for train)."""
    root, files = corpus_files(cfg)
    if len(files) == 1:
        data = files[0].read_bytes()
        cut = int(len(data) * (1 - cfg.val_fraction))
        text = data[:cut] if split == "train" else data[cut:]
    else:
        ranked = sorted(files, key=lambda p: hashlib.sha1(str(p.relative_to(root)).encode()).hexdigest())
        num_val = min(len(files) - 1, max(1, round(cfg.val_fraction * len(files))))
        chosen = ranked[num_val:] if split == "train" else ranked[:num_val]
        text = b"\n".join(p.read_bytes() for p in sorted(chosen))
    need = max(cfg.text_before, cfg.text_after)
    check(len(text) >= need, "data.corpus", cfg.corpus,
          f"its {split} text has {len(text)} bytes, fewer than one text window ({need})")
    return np.frombuffer(text, dtype=np.uint8)


def make_lm_mix_dataset(cfg: LMMixConfig, split: str = "train", seed: int | None = None,
                        cache_dir: str | Path | None = None) -> Dataset:
    """Columns ``input_ids`` (int32, length cfg.length) and ``labels`` (int64; -100 where nothing is predicted)."""
    check_choice("data.split", split, SPLITS)
    seed = cfg.seed if seed is None else seed
    root, files = corpus_files(cfg)
    # The corpus's identity (names, sizes, times) keys the cache, so edited files are never served stale.
    corpus_id = hashlib.sha1(repr([(str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
                                   for p in files]).encode()).hexdigest()
    data = {k: v for k, v in asdict(cfg).items() if k not in TEXT_LOSS_KEYS + SCHEDULE_KEYS}
    params = {**data, "corpus": str(root), "corpus_id": corpus_id, "split": split, "seed": seed}
    return cached_dataset("lm_mix", params, lambda: arrays_to_dataset(_build(cfg, split, seed)), cache_dir)


def _build(cfg: LMMixConfig, split: str, seed: int) -> dict[str, np.ndarray]:
    n = cfg.num_train if split == "train" else cfg.num_val
    rng = np.random.default_rng([seed, SPLITS.index(split), 1])  # a stream of its own, apart from retrieval's
    block_ids, block_labels = build_train_arrays(cfg.block, n, rng)
    text = split_text(cfg, split)
    vocab = cfg.vocab

    def windows(size: int) -> np.ndarray:
        starts = rng.integers(0, text.size - size + 1, n)
        return vocab.byte_token(text[starts[:, None] + np.arange(size)].astype(np.int32))

    before, after = windows(cfg.text_before), windows(cfg.text_after)
    ids = np.concatenate([block_ids[:, :1], before, block_ids[:, 1:], after], axis=1)
    labels = np.full(ids.shape, -100, dtype=np.int64)
    labels[:, :cfg.text_before] = before  # BOS and each text byte predict the next byte
    shift = cfg.text_before
    labels[:, 1 + shift:shift + block_ids.shape[1]] = block_labels[:, 1:]
    start = shift + block_ids.shape[1]
    labels[:, start:-1] = after[:, 1:]
    return {"input_ids": ids, "labels": labels}


def add_text_context(dataset: Dataset, cfg: LMMixConfig, period: int, seed: int = 0) -> Dataset:
    """Phase-controlled prompts (``make_phase_eval`` columns) shaped like LM-mix training: ``cfg.text_before`` bytes
    of held-out (val split) text inserted after BOS, one text window per cluster (a cluster still differs only in
    placement). ``target_pos`` and ``query_pos`` move by ``text_before`` and ``residue`` is recomputed mod ``period``:
    a constant shift maps each residue group onto another one whole, so the groups' position moments stay matched."""
    check(isinstance(period, int) and period >= 1, "period", period, "must be an integer >= 1")
    cols = {k: np.asarray(v) for k, v in dataset.with_format("numpy")[:].items()}
    n = cfg.text_before
    text = split_text(cfg, "val")
    clusters = cols["cluster"]
    num_clusters = int(clusters.max()) + 1
    rng = np.random.default_rng([seed, 2])  # a stream of its own, apart from the prompts'
    starts = rng.integers(0, text.size - n + 1, num_clusters)
    windows = cfg.vocab.byte_token(text[starts[:, None] + np.arange(n)].astype(np.int32))  # [clusters, n]
    ids = cols["input_ids"]
    cols["input_ids"] = np.concatenate([ids[:, :1], windows[clusters], ids[:, 1:]], axis=1).astype(ids.dtype)
    cols["target_pos"] = cols["target_pos"] + n
    cols["query_pos"] = cols["query_pos"] + n
    cols["residue"] = cols["target_pos"] % period
    cols["end_residue"] = (cols["query_pos"] + 1) % period
    return arrays_to_dataset(cols)
