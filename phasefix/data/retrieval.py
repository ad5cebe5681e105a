"""Training data for the controlled retrieval (key-value lookup) task.

One sequence (all positions 0-based, total filler always ``max_prefix_pad`` so the length is fixed):

    BOS, p filler, R records "key value" (optional filler gaps between them), remaining filler,
    num_demos demonstrations "key value" re-asking distinct record keys in random order, trailing filler

Every demonstration is a query: ``labels[t]`` at a demonstration's key position t is that record's value (the token
at t+1); all other labels are -100. Many queries per sequence is what lets a tiny model learn the lookup in minutes.
The prefix p is uniform on 0..max_prefix_pad (default 71 = 3 * 24 - 1, so p mod 24, and thus the records' phase
modulo every stride dividing 24, is exactly uniform; and 71 covers the filler of the default phase evaluation for 16
records, whose max_pad is 65). With probability ``in_sequence_prob`` the remaining filler is spread over the gaps
after each record (multinomially) instead of sitting in one block after the last record, so the model also sees
records that do not move in lockstep. ``in_sequence_from_step`` > 0 is a curriculum: training draws from a set
generated with ``in_sequence_prob_before`` (default 0: dense sequences only; 1: in-sequence only) before that step
and from the configured mix from it on (``phasefix.data.select.train_stages``).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from phasefix import paths
from phasefix.data.vocab import RetrievalVocab
from phasefix.errors import check, check_choice

if TYPE_CHECKING:  # datasets is imported where a dataset is built
    from datasets import Dataset

# Bump when the generator changes, so stale caches are never reused.
FORMAT_VERSION = 1
SPLITS = ("train", "val")
# When training switches to in-sequence records: a schedule over the data, not part of the data's cache key
SCHEDULE_KEYS = ("in_sequence_from_step", "in_sequence_prob_before")


@dataclass
class RetrievalConfig:
    num_records: int = 16
    num_keys: int = 32
    num_values: int = 32
    num_demos: int = 15
    num_filler: int = 16
    max_prefix_pad: int = 71
    in_sequence_prob: float = 0.5
    in_sequence_from_step: int = 0  # > 0: a curriculum, in_sequence_prob_before until this step, then in_sequence_prob
    in_sequence_prob_before: float = 0.0  # the in-sequence share before in_sequence_from_step (0: dense first)
    seq_len: int | None = None  # None: the minimum, 1 + max_prefix_pad + 2 * (num_records + num_demos)
    num_train: int = 100_000
    num_val: int = 2_000
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("num_records", "num_keys", "num_values", "num_demos", "num_filler", "num_train", "num_val"):
            value = getattr(self, key)
            check(isinstance(value, int) and value >= 1, f"data.{key}", value, "must be an integer >= 1")
        check(self.num_keys >= self.num_records, "data.num_keys", self.num_keys,
              f"must be >= data.num_records={self.num_records} (keys are distinct within a sequence)")
        check(self.num_demos <= self.num_records, "data.num_demos", self.num_demos,
              f"must be <= data.num_records={self.num_records} (demonstrations re-ask distinct records)")
        check(isinstance(self.max_prefix_pad, int) and self.max_prefix_pad >= 0, "data.max_prefix_pad",
              self.max_prefix_pad, "must be an integer >= 0")
        check(0.0 <= self.in_sequence_prob <= 1.0, "data.in_sequence_prob", self.in_sequence_prob,
              "must be in [0, 1]")
        check(isinstance(self.in_sequence_from_step, int) and self.in_sequence_from_step >= 0,
              "data.in_sequence_from_step", self.in_sequence_from_step, "must be an integer >= 0")
        check(0.0 <= self.in_sequence_prob_before <= 1.0, "data.in_sequence_prob_before",
              self.in_sequence_prob_before, "must be in [0, 1]")
        check(self.in_sequence_from_step == 0 or self.in_sequence_prob != self.in_sequence_prob_before,
              "data.in_sequence_from_step", self.in_sequence_from_step,
              f"must be 0 when data.in_sequence_prob=data.in_sequence_prob_before={self.in_sequence_prob} "
              "(nothing to switch to)")
        check(self.seq_len is None or self.seq_len >= self.min_seq_len, "data.seq_len", self.seq_len,
              f"must be >= {self.min_seq_len} (1 + max_prefix_pad + 2 * (num_records + num_demos)) or null")

    @property
    def min_seq_len(self) -> int:
        return 1 + self.max_prefix_pad + 2 * (self.num_records + self.num_demos)

    @property
    def length(self) -> int:
        return self.seq_len if self.seq_len is not None else self.min_seq_len

    @property
    def vocab(self) -> RetrievalVocab:
        return RetrievalVocab(self.num_keys, self.num_values, self.num_filler)


def arrays_to_dataset(columns: dict[str, np.ndarray]) -> Dataset:
    """A Dataset from numpy columns; 2-D arrays become fixed-length list columns (fast, no per-row Python)."""
    import pyarrow as pa  # datasets and pyarrow on first use: the configs above are checked without them
    from datasets import Dataset
    from datasets.table import InMemoryTable

    arrays = {}
    for name, arr in columns.items():
        arr = np.ascontiguousarray(arr)
        if arr.ndim == 2:
            arrays[name] = pa.FixedSizeListArray.from_arrays(pa.array(arr.reshape(-1)), arr.shape[1])
        else:
            arrays[name] = pa.array(arr)
    return Dataset(InMemoryTable(pa.table(arrays)))


def cached_dataset(kind: str, params: dict, build: Callable[[], Dataset], cache_dir: str | Path | None) -> Dataset:
    """Build once, then memory-map from ``cache_dir/kind/<hash of params>`` (safe against concurrent builders)."""
    key = json.dumps({"format": FORMAT_VERSION, **params}, sort_keys=True, default=str)
    path = Path(cache_dir or paths.cache_dir()) / kind / hashlib.sha1(key.encode()).hexdigest()[:16]
    if not path.exists():
        tmp = path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex}")
        build().save_to_disk(str(tmp))
        (tmp / "params.json").write_text(key)
        try:
            os.replace(tmp, path)
        except OSError:  # another process finished first: keep its copy
            shutil.rmtree(tmp, ignore_errors=True)
    from datasets import load_from_disk

    return load_from_disk(str(path))


def make_train_dataset(cfg: RetrievalConfig, split: str = "train", seed: int | None = None,
                       cache_dir: str | Path | None = None) -> Dataset:
    """Columns ``input_ids`` (int32, length cfg.length) and ``labels`` (int64, -100 except at demonstration keys)."""
    check_choice("data.split", split, SPLITS)
    seed = cfg.seed if seed is None else seed
    n = cfg.num_train if split == "train" else cfg.num_val
    # Train and val draw from independent streams of the same seed.
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    params = {k: v for k, v in asdict(cfg).items() if k not in SCHEDULE_KEYS}

    def build():
        return arrays_to_dataset(dict(zip(("input_ids", "labels"), build_train_arrays(cfg, n, rng))))

    return cached_dataset("retrieval", {**params, "split": split, "seed": seed}, build, cache_dir)


def build_train_arrays(cfg: RetrievalConfig, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids int32 [n, L], labels int64 [n, L]), vectorised over sequences."""
    vocab = cfg.vocab
    R, D, G, L = cfg.num_records, cfg.num_demos, cfg.max_prefix_pad, cfg.length
    rows = np.arange(n)[:, None]

    keys = np.argsort(rng.random((n, cfg.num_keys)), axis=1)[:, :R]  # distinct keys per sequence
    values = rng.integers(0, cfg.num_values, (n, R))
    demos = np.argsort(rng.random((n, R)), axis=1)[:, :D]  # distinct records, random order

    prefix = rng.integers(0, G + 1, n)
    gaps = np.zeros((n, R), dtype=np.int64)  # filler after record i
    gaps[:, -1] = G - prefix
    spread = rng.random(n) < cfg.in_sequence_prob
    if spread.any():
        gaps[spread] = rng.multinomial(G - prefix[spread], np.full(R, 1.0 / R))
    before = np.concatenate([np.zeros((n, 1), dtype=np.int64), np.cumsum(gaps, axis=1)[:, :-1]], axis=1)
    key_pos = 1 + prefix[:, None] + 2 * np.arange(R) + before

    ids = vocab.filler_token(rng.integers(0, cfg.num_filler, (n, L))).astype(np.int32)
    ids[:, 0] = vocab.bos
    ids[rows, key_pos] = vocab.key_token(keys)
    ids[rows, key_pos + 1] = vocab.value_token(values)

    demo_pos = 1 + G + 2 * R + 2 * np.arange(D)
    demo_values = vocab.value_token(np.take_along_axis(values, demos, axis=1))
    ids[:, demo_pos] = vocab.key_token(np.take_along_axis(keys, demos, axis=1))
    ids[:, demo_pos + 1] = demo_values

    labels = np.full((n, L), -100, dtype=np.int64)
    labels[:, demo_pos] = demo_values
    return ids, labels
