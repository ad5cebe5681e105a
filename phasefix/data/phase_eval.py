"""Phase-controlled evaluation sets (science.md section 4).

A prompt (positions 0-based, length fixed for the whole set):

    BOS, filler and R records (gaps g_0 .. g_R, sum G = max_pad), D demonstrations, the target key

kv_lookup: a record is "key value" (1 + 1 tokens). needle: a record is "k1 k2 v1 v2" (2-token key, 2-token value).
The target is a record that is never demonstrated; the prompt ends with its key again, so ``query_pos`` (the last
position) is where the model must predict ``answer`` (the target's value; for needle its first value token).
``target_pos`` is the position of the target key's first token among the records, ``residue = target_pos % period``.

Padding (prefix, in_sequence) and the layout itself: `phasefix.data.layout`, shared with the text prompts.

Balance: every residue group has ``per_residue`` samples with the same prompt length and query position, and target
positions whose mean and variance agree across groups (see ``balanced_positions`` for when this is exact).
Clusters: cluster c fixes one key-value mapping (records, target, demonstrations) and is evaluated once at every
residue; only the placement (and the filler) changes.

The end phase (``phase_of=end|both``, as for the text prompts): a filler tail of 0 .. period - 1 tokens after the
records moves the prompt's end (``end_residue`` = its length mod period) with the target fixed; ``end`` puts each
cluster at every end residue (its target residue cycling over the clusters), ``both`` every cluster at every target
residue x end residue. Such sets are right-padded with filler to the longest prompt; ``query_pos`` is each row's.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from datasets import Dataset

from phasefix.data.layout import PADDINGS, PHASE_AXES, default_max_pad, end_tail, layout_prompt, target_window
from phasefix.data.retrieval import arrays_to_dataset, cached_dataset
from phasefix.data.vocab import RetrievalVocab
from phasefix.errors import ConfigError, check, check_choice

TASKS = ("kv_lookup", "needle")
TASK_DEFAULTS = {
    # The paper's animal-to-name lookup: 64 single-token records, 8 demonstrations, then the target key.
    "kv_lookup": dict(num_records=64, num_demos=8, num_keys=64, num_values=64, num_filler=16, max_pad=None,
                      target_span=None),
    # The paper's needle runs 16,000 records (64K tokens, pass num_records=16000); the default stays CPU-sized.
    # target_span: width in tokens of the window, centred on the records, that the target key's position is drawn
    # from (default 8 * period).
    "needle": dict(num_records=1024, num_demos=8, num_keys=128, num_values=128, num_filler=16, max_pad=None,
                   target_span=None),
}


def make_phase_eval(task: str = "kv_lookup", padding: str = "prefix", period: int = 24, per_residue: int = 96,
                    seed: int = 0, cache_dir: str | Path | None = None, phase_of: str = "fact",
                    **task_kwargs) -> Dataset:
    """Columns: ``input_ids`` (int32, fixed length), ``answer``, ``target_pos``, ``query_pos``, ``residue``,
    ``end_residue``, ``cluster`` (all int64). Rows are ordered by cluster, then residue (then end residue).

    task_kwargs (defaults in TASK_DEFAULTS): num_records, num_demos, num_keys, num_values, num_filler,
    max_pad (total filler G; default period - 1, or more when needed for target positions to span
    MIN_SPAN_PERIODS periods: 65 for 16 records and period 24), target_span (needle only).
    ``cache_dir``: if given, the set is built once and memory-mapped from there afterwards.
    """
    check_choice("task", task, TASKS)
    check_choice("padding", padding, PADDINGS)
    check_choice("phase_of", phase_of, PHASE_AXES)
    check(isinstance(period, int) and period >= 1, "period", period, "must be an integer >= 1")
    check(isinstance(per_residue, int) and per_residue >= 1, "per_residue", per_residue, "must be an integer >= 1")
    kw = dict(TASK_DEFAULTS[task])
    for key, value in task_kwargs.items():
        check_choice(f"{task} option", key, tuple(kw))
        kw[key] = value
    spec = _TaskSpec(task, padding, period, per_residue, phase_of=phase_of, **kw)
    params = dict(task=task, padding=padding, period=period, per_residue=per_residue, seed=seed, phase_of=phase_of,
                  **kw)
    if cache_dir is None:
        return arrays_to_dataset(spec.build(np.random.default_rng(seed)))
    return cached_dataset("phase_eval", params, lambda: arrays_to_dataset(spec.build(np.random.default_rng(seed))),
                          cache_dir)


class _TaskSpec:
    def __init__(self, task: str, padding: str, period: int, per_residue: int, *, phase_of: str = "fact",
                 num_records: int, num_demos: int,
                 num_keys: int, num_values: int, num_filler: int, max_pad: int | None, target_span: int | None):
        for key, value in dict(num_records=num_records, num_keys=num_keys, num_values=num_values,
                               num_filler=num_filler).items():
            check(isinstance(value, int) and value >= 1, key, value, "must be an integer >= 1")
        check(isinstance(num_demos, int) and 0 <= num_demos < num_records, "num_demos", num_demos,
              f"must be an integer in [0, num_records) = [0, {num_records}) (demonstrations are non-target records)")
        self.key_len = 1 if task == "kv_lookup" else 2
        self.rec_len = 2 * self.key_len
        distinct_keys = num_keys ** self.key_len
        check(distinct_keys >= num_records, "num_keys", num_keys,
              f"must give >= num_records={num_records} distinct keys (num_keys ** {self.key_len} = {distinct_keys})")
        if max_pad is None:
            max_pad = default_max_pad(period, self.rec_len, num_records)
        # Every residue needs a reachable target position: the filler must cover a record's length.
        check(isinstance(max_pad, int) and max_pad >= self.rec_len - 1, "max_pad", max_pad,
              f"must be an integer >= {self.rec_len - 1} (record length - 1)")
        self.task, self.padding, self.period, self.per_residue = task, padding, period, per_residue
        self.phase_of = phase_of
        self.R, self.D, self.G = num_records, num_demos, max_pad
        self.vocab = RetrievalVocab(num_keys, num_values, num_filler)
        self.length = 1 + max_pad + self.rec_len * (num_records + num_demos) + self.key_len
        lo, hi = target_window(task, 1, self.rec_len, num_records, max_pad, period, target_span)
        self.lo, self.hi = lo, hi

    def build(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        P, n = self.period, self.per_residue
        positions = balanced_positions(self.lo, self.hi, P, n)
        # Which of group r's positions cluster c gets: a random matching, so clusters and positions are unrelated.
        placement = np.stack([rng.permutation(positions[r]) for r in range(P)], axis=1)  # [n clusters, P]
        if self.phase_of == "fact":
            ids = np.empty((n * P, self.length), dtype=np.int32)
            answer = np.empty(n * P, dtype=np.int64)
            for c in range(n):
                records, demos = self._mapping(rng)
                demo_tokens = records[demos].reshape(-1)
                for r in range(P):
                    row = c * P + r
                    ids[row], answer[row] = self._prompt(records, demo_tokens, placement[c, r], rng)
            target_pos = placement.reshape(-1).astype(np.int64)
            return dict(input_ids=ids, answer=answer, target_pos=target_pos,
                        query_pos=np.full(n * P, self.length - 1, dtype=np.int64), residue=target_pos % P,
                        end_residue=np.full(n * P, self.length % P, dtype=np.int64),
                        cluster=np.repeat(np.arange(n, dtype=np.int64), P))
        return self._build_ends(rng, placement)

    def _build_ends(self, rng: np.random.Generator, placement: np.ndarray) -> dict[str, np.ndarray]:
        """phase_of end or both: each (cluster, target position) at every end residue, its prompts differing only in
        the tail (one seed drawn per pair)."""
        P, n = self.period, self.per_residue
        rows = {k: [] for k in ("input_ids", "answer", "target_pos", "query_pos", "cluster")}
        for c in range(n):
            records, demos = self._mapping(rng)
            demo_tokens = records[demos].reshape(-1)
            for r in ([c % P] if self.phase_of == "end" else range(P)):
                x, seed = int(placement[c, r]), int(rng.integers(2 ** 63))
                for e in range(P):
                    ids, answer = self._prompt(records, demo_tokens, x, np.random.default_rng(seed),
                                               tail=end_tail(self.length, e, P))
                    for k, v in zip(rows, (ids, answer, x, ids.size - 1, c)):
                        rows[k].append(v)
        padded = np.full((len(rows["answer"]), self.length + P - 1), self.vocab.filler_token(0), dtype=np.int32)
        for b, ids in enumerate(rows["input_ids"]):  # right padding: after the query, unseen by a causal model
            padded[b, :ids.size] = ids
        cols = {k: np.asarray(v, dtype=np.int64) for k, v in rows.items() if k != "input_ids"}
        return dict(input_ids=padded, **cols, residue=cols["target_pos"] % P, end_residue=(cols["query_pos"] + 1) % P)

    def _mapping(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Record tokens [R, rec_len] with the target in row 0, and the demonstrated rows (never 0)."""
        v, k = self.vocab, self.key_len
        key_ids = rng.choice(v.num_keys ** k, self.R, replace=False)
        key_tokens = np.stack([key_ids // v.num_keys ** i % v.num_keys for i in reversed(range(k))], axis=1)
        records = np.concatenate([v.key_token(key_tokens), v.value_token(rng.integers(0, v.num_values, (self.R, k)))],
                                 axis=1)
        return records, 1 + rng.permutation(self.R - 1)[:self.D]

    def _prompt(self, records: np.ndarray, demo_tokens: np.ndarray, x: int, rng: np.random.Generator, tail: int = 0):
        """One prompt with the target key (records[0]) at position x (and `tail` filler before the demonstrations),
        and its answer."""
        v = self.vocab
        ids = layout_prompt(records, demo_tokens, x, rng, header=np.array([v.bos]),
                            filler=v.filler_token(np.arange(v.num_filler)), max_pad=self.G, length=self.length,
                            query_len=self.key_len, padding=self.padding, tail=tail)
        return ids, records[0, self.key_len]


def balanced_positions(lo: int, hi: int, period: int, n: int) -> np.ndarray:
    """Target positions [period, n] in [lo, hi], row r all congruent to r mod period, with matched moments.

    Row r is period * a + r for an integer multiset {a}, so its sum is n*r mod period: the row means can be equal
    only when n is a multiple of period (otherwise they differ by up to period / n). The sum of squares is then
    pinned down modulo period**2 (up to the parity of sum a**2), so exactly equal variances need more: n a multiple
    of period**2 always suffices (576 for period 24); n = period generally cannot (period 2: {0, 2} vs {1, 3}...).
    We search the common sum and variance for the best equalisation, which is exact whenever this search can reach
    it, and otherwise leaves each row within one step of sum a**2 (variance within period**2 / n tokens**2).
    Rows start from an even spread over the window, so no row is oddly shaped. Deterministic (no randomness).
    """
    P = period
    # A template with the uniform spread of the window, trimmed by P/2 so rounding to a row stays inside.
    t = lo + P / 2 + (hi - lo - P) * (np.arange(n) + 0.5) / n
    r = np.arange(P)
    best = None
    # Search the common sum of positions S1 (rows' sums of a follow) and, for each, the common variance: the
    # congruences that decide exactness depend on S1 modulo 2 * P**2, so a window of 2P multiples of P covers them.
    s0 = P * round(n * t.mean() / P)
    shifts = P * np.arange(-P, P + 1) if n % P == 0 else np.arange(-P, P + 1)
    for s1 in s0 + shifts[np.abs(shifts) <= n * P / 2]:
        A = np.rint((s1 - n * r) / P).astype(np.int64)
        mean = (P * A + n * r) / n
        own = _nearest_variances(np.array([t.var()]), A, n, P)[0][0]
        candidates = (own[:, None] + 2 * P * P / n * np.arange(-2, 3)).reshape(-1)
        var, B = _nearest_variances(candidates, A, n, P)
        k = int(np.argmin(np.ptp(var, axis=1) + 1e-9 * np.abs(candidates - t.var())))
        score = (round(float(np.ptp(mean)), 9), round(float(np.ptp(var[k])), 6), abs(s1 - s0))
        if best is None or score < best[0]:
            best = (score, A, B[k].astype(np.int64))
    _, A, B = best

    rows = []
    for i in range(P):
        a_lo, a_hi = -((i - lo) // P), (hi - i) // P
        a = np.clip(np.rint((t - i) / P).astype(np.int64), a_lo, a_hi)
        rows.append(P * _match_moments(a, int(A[i]), int(B[i]), a_lo, a_hi, (t - i) / P) + i)
    return np.stack(rows)


def _nearest_variances(v: np.ndarray, A: np.ndarray, n: int, P: int) -> tuple[np.ndarray, np.ndarray]:
    """For each candidate variance v [C], each row's nearest achievable variance [C, P] and its sum of a**2.

    Row r with sum of a = A[r]: sum x = P A + n r, sum x**2 = P**2 B + 2 r P A + n r**2 where B = sum a**2 has the
    parity of A (a**2 = a mod 2) and can otherwise be any nearby integer.
    """
    r = np.arange(P)
    mean = (P * A + n * r) / n
    linear = 2 * r * P * A + n * r * r
    B = (n * (v[:, None] + mean ** 2) - linear) / P ** 2
    B = 2 * np.rint((B - A) / 2) + A
    return (P * P * B + linear) / n - mean ** 2, B


def _match_moments(a: np.ndarray, total: int, squares: int, a_lo: int, a_hi: int, ideal: np.ndarray) -> np.ndarray:
    """Move integers a (within [a_lo, a_hi]) to sum ``total`` and, as closely as possible, sum of squares
    ``squares``."""
    a = a.copy()
    order = np.argsort(ideal - a)  # round up those that were rounded down the most
    for idx in (order[::-1] if total > a.sum() else order):
        if a.sum() == total:
            break
        step = 1 if total > a.sum() else -1
        if a_lo <= a[idx] + step <= a_hi:
            a[idx] += step
    if a.sum() != total:
        raise ConfigError(f"per_residue={a.size} is invalid: the target window cannot hold that many positions")

    counts = np.bincount(a - a_lo, minlength=a_hi - a_lo + 1)
    vals = np.arange(a_lo, a_hi + 1)
    diff = squares - int((vals * vals * counts).sum())
    # Move one element up from value u and one down from value w: the sum stays, squares change by 2(u - w + 1).
    u, w = np.meshgrid(np.arange(vals.size), np.arange(vals.size), indexing="ij")
    while diff != 0:
        ok = (counts[u] > 0) & (counts[w] > 0) & (u < vals.size - 1) & (w > 0) & ((u != w) | (counts[u] >= 2))
        remaining = np.where(ok, np.abs(diff - 2 * (u - w + 1)), np.iinfo(np.int64).max)
        best = np.unravel_index(np.argmin(remaining), remaining.shape)
        if remaining[best] >= abs(diff):
            break  # no move gets closer: the best achievable for this row
        bu, bw = best
        counts[bu] -= 1
        counts[bu + 1] += 1
        counts[bw] -= 1
        counts[bw - 1] += 1
        diff -= 2 * (bu - bw + 1)
    return np.repeat(vals, counts)
