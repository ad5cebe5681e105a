"""Phase-controlled prompts as text, through any Hugging Face tokenizer (used by `phasefix.evaluate`).

The layout is `phasefix.data.layout`'s, as for the synthetic prompts (science.md section 4), with tokens replaced by
rendered text pieces. Every piece is tokenised on its own and the ids are concatenated, so token positions are known
exactly:

    header, filler and R records (gaps g_0 .. g_R, sum G), D demonstrations, the target key and separator

kv_lookup: a record is the line ``"{animal}: {name}\\n"`` (the paper's animal-to-name lookup).
needle:    a record is the line ``"{colour} {animal}: {name} {name}\\n"`` (a 2-word key, a 2-word value), many of
           them, with the target drawn from a window of ``target_span`` tokens centred on the records.
Filler: single-token decorative pieces (".", "-", "*", ...), drawn at random per position.

Words are kept only when their piece tokenises to the most common length in their list, so every record has the
same number of tokens; values are also kept distinct in their first token (``answer`` is that token).
``target_pos`` is the position of the target key's first token; ``residue = target_pos % period``. Target positions
come from `phase_eval.balanced_positions` (matched mean and variance across residue groups), the prompt length and
the query position (the last token) are the same for every prompt, and cluster c (one key-value mapping) is
evaluated once at every residue.

The second phase axis, where the prompt ends (``phase_of``): ``end`` keeps each cluster's target where it is and
adds a filler tail of 0 .. period - 1 tokens after the records, so that the prompt's length mod the period sweeps
every residue (the phase of the first generated token, where a serving stack's last, incomplete compression window
lies); ``both`` crosses every target residue with every end residue. The tail is drawn after the rest of the prompt,
so the prompts of one cluster and target position differ only in it.

Prompts are generated lazily, a batch at a time, from per-cluster and per-prompt seeds, so a 128K-token set never
exists in memory as a whole. The flipping-completion probe (`FlipProbe`) is here too.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np

from phasefix.data.layout import (MIN_SPAN_PERIODS, PADDINGS, PHASE_AXES, default_max_pad, end_tail, layout_prompt,
                                   target_window)
from phasefix.data.phase_eval import balanced_positions
from phasefix.errors import ConfigError, check, check_choice

TEXT_TASKS = ("kv_lookup", "needle")

ANIMALS = """cat dog horse cow pig sheep goat duck goose chicken rabbit mouse rat fox wolf bear deer moose elk lion
tiger leopard cheetah panther jaguar zebra giraffe camel llama donkey mule bison buffalo hippo rhino elephant monkey
gorilla ape lemur bat owl hawk eagle falcon crow raven dove pigeon parrot swan heron crane stork robin sparrow finch
wren lark gull penguin seal otter beaver badger mole hedgehog squirrel skunk raccoon possum weasel ferret mink lynx
hyena jackal coyote frog toad newt lizard snake turtle tortoise crocodile shark whale dolphin salmon trout cod eel
crab lobster shrimp squid octopus snail slug worm ant bee wasp moth beetle spider fly flea tick yak ox boar hare
kitten puppy calf lamb pony koala panda sloth walrus""".split()
NAMES = """Anna Ben Carl Dana Emma Frank Grace Henry Ivan Jack Kate Leo Mary Nick Olga Paul Quinn Rose Sam Tom Uma
Vera Walt Xena Yuri Zoe Alice Bob Clara David Eric Fiona George Helen Isaac Julia Kevin Laura Mike Nina Oscar Peter
Rita Steve Tina Victor Wendy Adam Beth Chris Diana Ethan Fred Gina Hugo Iris James Karen Luke Maria Noah Owen Pam
Ryan Sara Tony Ursula Vince Will Amy Bill Cindy Dan Eva Gary Holly Ian Jane Kim Larry Megan Ned Pat Ray Sue Ted
Val Alan Brian Carol Derek Ellen Gavin Hannah Jason Lily Mark Nora Phil Rachel Scott Tara Wayne Ada Bruce Chloe
Dean Elsa Felix Greg Heidi Jill Kurt Lisa Max Neil Ruth Sean""".split()
COLOURS = """red blue green black white brown pink grey gold silver orange purple yellow violet amber ivory teal navy
olive coral ruby jade plum rust""".split()
FILLER = (".", "-", "*", "~", "=", "+", "#", "_", "|", "^")  # never ":", the key-value separator

TEXT_DEFAULTS = {
    "kv_lookup": dict(num_records=64, num_demos=8, num_filler=4, max_pad=None, target_span=None, max_length=None),
    "needle": dict(num_records=1024, num_demos=8, num_filler=4, max_pad=None, target_span=None, max_length=None),
}
HEADERS = {
    "kv_lookup": "Each line names an animal and its keeper. Remember who keeps which animal.\n",
    "needle": "Each line gives a coloured animal and the two people who look after it. Remember them.\n",
}


def spread_positions(lo: int, hi: int, period: int, n: int, max_periods: int = 256) -> np.ndarray:
    """`balanced_positions(lo, hi, period, n)` [period, n] (row r: residue r, matched mean and variance), cheap for
    any window: a window wider than ``max_periods`` periods is solved on a window ``s`` times narrower, ``s``
    coprime to the period, and mapped back by x = lo + s * x'. That keeps every row's mean and variance equal
    (all scale alike) and permutes the residues (s * r + lo mod period is a bijection), at the cost of a coarser
    lattice (positions of one residue are s periods apart). balanced_positions' own cost grows with the square of
    the window in periods, which a 128K-token prompt makes prohibitive."""
    width, s = hi - lo + 1, 1
    while width > max_periods * period * s or math.gcd(s, period) != 1:
        s += 1
    if s == 1:
        return balanced_positions(lo, hi, period, n)
    small = lo + s * balanced_positions(0, (hi - lo) // s, period, n)
    rows = np.empty_like(small)
    rows[(lo + s * np.arange(period)) % period] = small
    return rows


def encode(tokenizer, text: str) -> list[int]:
    """Ids of one piece, without special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def word_table(tokenizer, words: Sequence[str], template: str, need: int, what: str,
               distinct_first: bool = False) -> np.ndarray:
    """Token ids [n, length] of ``template.format(word)`` for the words whose piece has the most common length.

    ``distinct_first``: also keep only one word per first token (the answer is scored on the first token)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    pieces = [encode(tokenizer, template.format(w)) for w in words]
    pieces = [p for p in pieces if p and (unk is None or unk not in p)]
    lengths = Counter(len(p) for p in pieces)
    if not lengths:
        raise ConfigError(f"model={getattr(tokenizer, 'name_or_path', '')!r} is invalid: its tokenizer cannot render "
                          f"any {what}")
    length = max(lengths, key=lambda n: (lengths[n], -n))
    out, seen = [], set()
    for p in pieces:
        key = p[0] if distinct_first else tuple(p)
        if len(p) == length and key not in seen:
            seen.add(key)
            out.append(p)
    if len(out) < need:
        raise ConfigError(f"num_records is invalid: the tokenizer renders only {len(out)} {what} of equal token "
                          f"length, need >= {need} (lower num_records)")
    return np.asarray(out, dtype=np.int64)


def filler_ids(tokenizer, num_filler: int) -> np.ndarray:
    """Up to ``num_filler`` decorative pieces that are exactly one token each and stay apart when written next to each
    other, after a line break and before a word: the prompt's text then tokenises back to its ids (what an endpoint
    reads, `phasefix.endpoint.prompt_text`). FILLER first; where a tokenizer merges runs of punctuation ("..",
    "--"), the same pieces after a space (" .", " -"), which a regex pre-tokenizer keeps apart."""
    check(isinstance(num_filler, int) and num_filler >= 1, "num_filler", num_filler, "must be an integer >= 1")
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    chosen: list[tuple[str, int]] = []

    def apart(a: str, b: str) -> bool:
        return encode(tokenizer, a + b) == encode(tokenizer, a) + encode(tokenizer, b)

    for piece in FILLER + tuple(" " + f for f in FILLER):
        p = encode(tokenizer, piece)
        if len(p) != 1 or p[0] in special or p[0] in [i for _, i in chosen]:
            continue
        if all(apart(piece, q) and apart(q, piece) for q, _ in chosen + [(piece, p[0])]) \
                and apart("\n", piece) and apart(piece, "Anna"):
            chosen.append((piece, p[0]))
        if len(chosen) == num_filler:
            break
    if not chosen:
        raise ConfigError("model is invalid: its tokenizer has no single-token filler piece that stays apart from "
                          "its neighbours among " + " ".join(repr(f) for f in FILLER + tuple(" " + f for f in FILLER)))
    return np.asarray([i for _, i in chosen], dtype=np.int64)


def header_ids(tokenizer, text: str) -> list[int]:
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([bos] if bos is not None else []) + encode(tokenizer, text)


class TextPhaseSet:
    """A phase-controlled retrieval set for one tokenizer; rows are ordered by cluster, then residue.

    ``batches(batch_size)`` yields dicts of numpy arrays: input_ids [B, length] (int64), answer, target_pos,
    query_pos, residue, cluster [B]. ``row(i)`` builds one prompt. Options (defaults in TEXT_DEFAULTS):
    num_records, num_demos, num_filler, max_pad (total filler G), target_span (needle), max_length (the prompt
    length in tokens: sets max_pad, and for needle without num_records also the number of records).

    ``phase_of``: ``fact`` (the rows above), ``end`` (per_residue clusters, each at every end residue, its target
    fixed, the target residues cycling over the clusters) or ``both`` (per_residue clusters at every target residue x
    end residue). ``residue`` is always the target's, ``end_residue`` the prompt's length mod the period; with a tail, prompts are up to period - 1 tokens longer than ``length`` and ``batches`` pads
    them on the right (the query position is each row's own).
    """

    def __init__(self, tokenizer, task: str = "kv_lookup", padding: str = "prefix", period: int = 24,
                 per_residue: int = 48, seed: int = 0, phase_of: str = "fact", **options):
        check_choice("task", task, TEXT_TASKS)
        check_choice("padding", padding, PADDINGS)
        check_choice("phase_of", phase_of, PHASE_AXES)
        check(isinstance(period, int) and period >= 1, "period", period, "must be an integer >= 1")
        check(isinstance(per_residue, int) and per_residue >= 1, "per_residue", per_residue,
              "must be an integer >= 1")
        kw = dict(TEXT_DEFAULTS[task])
        given = {k for k, v in options.items() if v is not None}
        for key, value in options.items():
            check_choice(f"{task} option", key, tuple(kw))
            if value is not None:
                kw[key] = value
        self.task, self.padding, self.period, self.per_residue, self.seed = task, padding, period, per_residue, seed
        self.phase_of, self.options = phase_of, kw

        self.header = np.asarray(header_ids(tokenizer, HEADERS[task]), dtype=np.int64)
        self.filler = filler_ids(tokenizer, kw["num_filler"])
        self.sep = np.asarray(encode(tokenizer, ":"), dtype=np.int64)
        self.newline = np.asarray(encode(tokenizer, "\n"), dtype=np.int64)
        R, D = kw["num_records"], kw["num_demos"]
        max_length = kw["max_length"]
        if task == "kv_lookup":
            keys = word_table(tokenizer, ANIMALS, "{}", 1, "animals")
            self.key_parts = [keys]
            self.values = word_table(tokenizer, NAMES, " {}", 2, "names", distinct_first=True)
            self.value_parts = 1
        else:
            colours = word_table(tokenizer, COLOURS, "{}", 1, "colours")
            animals = word_table(tokenizer, ANIMALS, " {}", 1, "animals")
            self.key_parts = [colours, animals]
            self.values = word_table(tokenizer, NAMES, " {}", 2, "names", distinct_first=True)
            self.value_parts = 2
        self.key_len = sum(p.shape[1] for p in self.key_parts)
        self.value_len = self.values.shape[1] * self.value_parts
        self.rec_len = L = self.key_len + self.sep.size + self.value_len + self.newline.size
        self.query_len = self.key_len + self.sep.size
        H = self.header.size
        self.num_distinct_keys = int(np.prod([p.shape[0] for p in self.key_parts]))

        if max_length is not None:
            check(isinstance(max_length, int) and max_length >= 1, "max_length", max_length,
                  "must be an integer >= 1 or null")
            fixed = H + self.query_len
            if task == "needle" and "num_records" not in given:
                # as many records as fit (and as there are distinct keys), leaving at least a period of filler
                R = max(D + 1, min(self.num_distinct_keys,
                                   (max_length - fixed - L * D - max(period - 1, L - 1)) // L))
            check("max_pad" not in given, "max_pad", kw["max_pad"], "cannot be given together with max_length")
            kw["max_pad"] = max_length - fixed - L * (R + D)
            check(kw["max_pad"] >= L - 1, "max_length", max_length,
                  f"is too short for {R} records of {L} tokens and {D} demonstrations: need >= "
                  f"{fixed + L * (R + D) + L - 1}")
        for key, value in dict(num_records=R, num_filler=kw["num_filler"]).items():
            check(isinstance(value, int) and value >= 1, key, value, "must be an integer >= 1")
        check(isinstance(D, int) and 0 <= D < R, "num_demos", D,
              f"must be an integer in [0, num_records) = [0, {R}) (demonstrations are non-target records)")
        check(self.num_distinct_keys >= R, "num_records", R,
              f"must be <= {self.num_distinct_keys}, the distinct keys this tokenizer renders at equal length")
        G = kw["max_pad"]
        if G is None:
            G = default_max_pad(period, L, R)
        check(isinstance(G, int) and G >= L - 1, "max_pad", G, f"must be an integer >= {L - 1} (record length - 1)")
        self.R, self.D, self.G = R, D, G
        self.length = H + G + L * (R + D) + self.query_len  # without a tail
        self.width = self.length + (0 if phase_of == "fact" else period - 1)  # the longest prompt
        self.query_pos = self.length - 1
        lo, hi = target_window(task, H, L, R, G, period, kw["target_span"])
        self.lo, self.hi = lo, hi
        positions = spread_positions(lo, hi, period, per_residue)  # [period, n]
        rng = np.random.default_rng([seed, 0])
        self.placement = np.stack([rng.permutation(positions[r]) for r in range(period)], axis=1)  # [n, period]
        self._mapping_cache: tuple[int, tuple] | None = None

    def __len__(self) -> int:
        return self.per_residue * self.period * (self.period if self.phase_of == "both" else 1)

    def describe(self) -> dict:
        return dict(task=self.task, padding=self.padding, period=self.period, per_residue=self.per_residue,
                    phase_of=self.phase_of, num_prompts=len(self), prompt_length=self.length,
                    prompt_length_max=self.width, query_pos=self.query_pos,
                    num_records=self.R, num_demos=self.D, max_pad=self.G, record_tokens=self.rec_len,
                    header_tokens=int(self.header.size), target_window=[self.lo, self.hi])

    # ---------------------------------------------------------------- generation
    def _mapping(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Cluster c's records [R, rec_len] (target in row 0) and demonstrated rows (never 0)."""
        if self._mapping_cache is not None and self._mapping_cache[0] == c:
            return self._mapping_cache[1]
        rng = np.random.default_rng([self.seed, 1, c])
        sizes = [p.shape[0] for p in self.key_parts]
        flat = rng.choice(self.num_distinct_keys, self.R, replace=False)
        parts = []
        for i, (table, size) in enumerate(zip(self.key_parts, sizes)):
            stride = int(np.prod(sizes[i + 1:]))
            parts.append(table[flat // stride % size])
        values = self.values[rng.integers(0, self.values.shape[0], (self.R, self.value_parts))]  # [R, parts, len]
        R = self.R
        records = np.concatenate(parts + [np.broadcast_to(self.sep, (R, self.sep.size)),
                                          values.reshape(R, -1),
                                          np.broadcast_to(self.newline, (R, self.newline.size))], axis=1)
        demos = 1 + rng.permutation(R - 1)[:self.D]
        self._mapping_cache = (c, (records, demos))
        return records, demos

    def cell(self, i: int) -> tuple[int, int, int | None]:
        """Row i's cluster, target residue and end residue (None: no tail, phase_of=fact)."""
        P, i = self.period, int(i)
        if self.phase_of == "fact":
            c, r = divmod(i, P)
            return c, r, None
        if self.phase_of == "end":
            c, e = divmod(i, P)
            return c, c % P, e
        c, k = divmod(i, P * P)
        return (c, *divmod(k, P))

    def row(self, i: int) -> dict:
        """input_ids [its length], answer (the value's first token), answer_ids (the value's tokens), target_pos,
        query_pos (the last position), residue (the target's), end_residue (the prompt's length mod the period),
        cluster."""
        P = self.period
        c, r, e = self.cell(i)
        records, demos = self._mapping(c)
        x = int(self.placement[c, r])
        tail = 0 if e is None else end_tail(self.length, e, P)
        rng = np.random.default_rng([self.seed, 2, c, r])
        ids = layout_prompt(records, records[demos].reshape(-1), x, rng, header=self.header, filler=self.filler,
                            max_pad=self.G, length=self.length, query_len=self.query_len, padding=self.padding,
                            tail=tail)
        q = self.query_len
        return dict(input_ids=ids, answer=int(records[0, q]), answer_ids=records[0, q:q + self.value_len].copy(),
                    target_pos=x, query_pos=ids.size - 1, residue=x % P,
                    end_residue=ids.size % P, cluster=c)

    def batches(self, batch_size: int, start: int = 0) -> Iterator[dict]:
        """Rows as arrays; input_ids [B, width], right-padded with filler after each row's query position (a causal
        model's prediction there does not see it)."""
        check(isinstance(batch_size, int) and batch_size >= 1, "batch_size", batch_size, "must be an integer >= 1")
        for lo in range(start, len(self), batch_size):
            rows = [self.row(i) for i in range(lo, min(lo + batch_size, len(self)))]
            width = max(row["input_ids"].size for row in rows)
            ids = np.full((len(rows), width), self.filler[0], dtype=np.int64)
            for b, row in enumerate(rows):
                ids[b, :row["input_ids"].size] = row["input_ids"]
            yield {k: ids if k == "input_ids" else np.stack([row[k] for row in rows]) for k in rows[0]}


# -------------------------------------------------------------------------------------------- flip probe
FLIP_PROMPT = ("# geometry.py\n", "\ndef area(width, height):\n    return width", (" * height", " + height"))


class FlipProbe:
    """The flipping-completion probe: ``header, filler (f tokens), snippet`` then one of two completions.

    The filler is one decorative single-token piece repeated f times, for f in ``start .. start + lengths - 1``:
    everything after it shifts by one position per step, so a phase-sensitive model's preference between the
    completions oscillates with the compression stride. ``sequences(which)`` yields (f, ids) for completion 0 or 1.
    """

    def __init__(self, tokenizer, period: int = 24, lengths: int | None = None, start: int = 0,
                 prompt: Sequence = FLIP_PROMPT):
        check(isinstance(period, int) and period >= 1, "period", period, "must be an integer >= 1")
        lengths = MIN_SPAN_PERIODS * period if lengths is None else lengths
        check(isinstance(lengths, int) and lengths >= MIN_SPAN_PERIODS * period, "lengths", lengths,
              f"must be an integer >= {MIN_SPAN_PERIODS} * period = {MIN_SPAN_PERIODS * period} (at least "
              f"{MIN_SPAN_PERIODS} periods of filler lengths)")
        check(isinstance(start, int) and start >= 0, "start", start, "must be an integer >= 0")
        head, snippet, completions = prompt
        self.period, self.lengths, self.start = period, lengths, start
        self.head = np.asarray(header_ids(tokenizer, head), dtype=np.int64)
        self.filler = int(filler_ids(tokenizer, 1)[0])
        self.snippet = np.asarray(encode(tokenizer, snippet), dtype=np.int64)
        self.completions = [np.asarray(encode(tokenizer, c), dtype=np.int64) for c in completions]
        self.completion_text = tuple(completions)
        check(all(c.size for c in self.completions), "prompt", completions, "completions must not be empty")

    @property
    def filler_lengths(self) -> np.ndarray:
        return np.arange(self.start, self.start + self.lengths)

    def prompt(self, f: int) -> np.ndarray:
        return np.concatenate([self.head, np.full(f, self.filler, dtype=np.int64), self.snippet])

    def sequences(self, which: int) -> Iterator[tuple[int, np.ndarray, int]]:
        """(filler length, prompt + completion ids, index of the completion's first token)."""
        for f in self.filler_lengths:
            p = self.prompt(int(f))
            yield int(f), np.concatenate([p, self.completions[which]]), p.size

    def describe(self) -> dict:
        return dict(period=self.period, lengths=self.lengths, start=self.start,
                    completions=list(self.completion_text), snippet_start=int(self.head.size + self.start),
                    prompt_length_min=int(self.prompt(self.start).size),
                    prompt_length_max=int(self.prompt(self.start + self.lengths - 1).size))
