"""The phase-controlled prompt layout (science.md section 4), one implementation for the token prompts
(`phase_eval`, synthetic ids) and the text prompts (`text_prompts`, any tokenizer's ids):

    header, filler and R records (gaps g_0 .. g_R, sum G = max_pad), D demonstrations, the query (target key)

Padding: "prefix" puts the filler in two blocks, before the records (g_0) and after them (g_R), so all records shift
together; "in_sequence" spreads it randomly over all R + 1 gaps, so distractors do not move in lockstep with the
target.
"""
from __future__ import annotations

import numpy as np

from phasefix.errors import check

PADDINGS = ("prefix", "in_sequence")
# Target positions must span this many periods: with fewer, some residue groups hold only two or three distinct
# positions and their variances cannot be matched (for 96 per residue, 4 periods give std within 1%).
MIN_SPAN_PERIODS = 4


def default_max_pad(period: int, rec_len: int, num_records: int) -> int:
    """Enough filler that target positions span MIN_SPAN_PERIODS periods (few records need more filler)."""
    return max(period - 1, MIN_SPAN_PERIODS * period - 1 - rec_len * (num_records - 1))


def target_window(task: str, start: int, rec_len: int, num_records: int, max_pad: int, period: int,
                  target_span: int | None) -> tuple[int, int]:
    """The positions [lo, hi] the target key may take: start + rec_len * j + (filler before record j), j < R, filler
    in [0, max_pad]; for the needle a window of `target_span` tokens (default 8 * period) centred on the records."""
    lo, hi = start, start + max_pad + rec_len * (num_records - 1)
    if task == "needle":
        check(target_span is None or (isinstance(target_span, int) and target_span >= 1), "target_span",
              target_span, "must be an integer >= 1 or null")
        span = target_span if target_span is not None else 8 * period
        mid = (lo + hi) // 2
        lo, hi = max(lo, mid - span // 2), min(hi, mid - span // 2 + span - 1)
    else:
        check(target_span is None, "target_span", target_span, "applies to task='needle' only")
    check(hi - lo + 1 >= MIN_SPAN_PERIODS * period, "max_pad" if task == "kv_lookup" else "target_span",
          max_pad if task == "kv_lookup" else target_span,
          f"leaves target positions spanning {hi - lo + 1} tokens: need >= {MIN_SPAN_PERIODS} * period = "
          f"{MIN_SPAN_PERIODS * period} (raise it or num_records, or lower period)")
    return lo, hi


def layout_prompt(records: np.ndarray, demo_tokens: np.ndarray, x: int, rng: np.random.Generator, *,
                  header: np.ndarray, filler: np.ndarray, max_pad: int, length: int, query_len: int,
                  padding: str, tail: int = 0) -> np.ndarray:
    """One prompt [length + tail] with the target record (row 0 of `records` [R, L]) starting at position x.

    The other records keep their order around it; `demo_tokens` (the demonstrated records, flattened) follow the
    records and filler; the prompt ends with the first `query_len` tokens of the target record. Filler tokens are
    drawn from `filler` (ids) at every position not otherwise written. `tail` more filler tokens go after the records
    and before the demonstrations: they move the prompt's end (its length mod the period) and leave the target where
    it is. The draws from `rng`, in order: the target's record index, the gaps (in_sequence), the filler, the
    tail's filler (so tail=0 draws exactly what it did before tails existed)."""
    R, L = records.shape
    G, H = max_pad, header.size
    # Target record index j: the filler before it, x - H - L*j, must lie in [0, G].
    j = int(rng.integers(max(0, -((G - x + H) // L)), min(R - 1, (x - H) // L) + 1))
    before = x - H - L * j
    if padding == "prefix":
        gaps = np.zeros(R + 1, dtype=np.int64)
        gaps[0], gaps[R] = before, G - before
    else:
        gaps = np.concatenate([rng.multinomial(before, np.full(j + 1, 1.0 / (j + 1))),
                               rng.multinomial(G - before, np.full(R - j, 1.0 / (R - j)))])
    order = np.concatenate([np.arange(1, j + 1), [0], np.arange(j + 1, R)])
    starts = H + L * np.arange(R) + np.cumsum(gaps[:R])
    ids = filler[rng.integers(0, filler.size, length)]
    ids[:H] = header
    ids[starts[:, None] + np.arange(L)] = records[order]
    demo_start = H + G + L * R
    ids[demo_start:demo_start + demo_tokens.size] = demo_tokens
    ids[-query_len:] = records[0, :query_len]
    assert starts[j] == x
    if tail:
        ids = np.concatenate([ids[:demo_start], filler[rng.integers(0, filler.size, tail)], ids[demo_start:]])
    return ids


PHASE_AXES = ("fact", "end", "both")


def end_tail(length: int, end_residue: int, period: int) -> int:
    """The filler tail in [0, period) that makes a prompt of `length` tokens (without it) end at `end_residue`: its
    length with the tail is congruent to end_residue mod period (the end phase is the prompt's length mod the period,
    the position of the first generated token)."""
    return (end_residue - length) % period
