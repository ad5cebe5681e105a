"""phasefix.data: token layout, training sequences, phase-balanced evaluation sets.

Every property is re-derived here from the raw tokens (scanning records, numpy moments), never taken from the code.
"""
import numpy as np
import pytest

from phasefix.data import RetrievalConfig, RetrievalVocab, make_phase_eval, make_train_dataset
from phasefix.data.phase_eval import balanced_positions
from phasefix.errors import ConfigError


# ---------------------------------------------------------------- vocab
def test_vocab_layout_is_disjoint_and_sized():
    v = RetrievalVocab(num_keys=5, num_values=7, num_filler=3)
    assert v.bos == 0
    fillers = [v.filler_token(i) for i in range(3)]
    keys = [v.key_token(i) for i in range(5)]
    values = [v.value_token(i) for i in range(7)]
    assert fillers == [1, 2, 3] and keys == [4, 5, 6, 7, 8] and values == list(range(9, 16))
    assert v.size == 16
    v.check_fits(16)
    with pytest.raises(ConfigError, match="model.vocab_size"):
        v.check_fits(15)
    assert RetrievalVocab(5, 7, 3, num_bytes=256).size == 16 + 256


# ---------------------------------------------------------------- training data
def _scan_train_row(ids, vocab, cfg):
    """Records and demonstrations re-derived from the tokens: key positions in order of appearance."""
    key_positions = np.flatnonzero(vocab.is_key(ids))
    records, demos = key_positions[:cfg.num_records], key_positions[cfg.num_records:]
    return records, demos


def test_train_labels_point_at_the_record_values(tmp_path):
    cfg = RetrievalConfig(num_train=300, num_val=10)
    ds = make_train_dataset(cfg, "train", cache_dir=tmp_path)
    vocab = cfg.vocab
    assert len(ds) == 300
    for row in ds.select(range(100)):
        ids, labels = np.array(row["input_ids"]), np.array(row["labels"])
        assert ids.shape == labels.shape == (cfg.length,) and ids[0] == vocab.bos
        records, demos = _scan_train_row(ids, vocab, cfg)
        assert len(records) == cfg.num_records and len(demos) == cfg.num_demos
        mapping = {ids[p]: ids[p + 1] for p in records}
        assert len(mapping) == cfg.num_records  # distinct keys
        assert all(vocab.is_value(ids[p + 1]) for p in records)
        assert len({ids[p] for p in demos}) == cfg.num_demos  # demonstrations re-ask distinct keys
        # Loss exactly at demonstration keys, and the label is the record's value (the next token).
        assert np.array_equal(np.flatnonzero(labels != -100), demos)
        for p in demos:
            assert labels[p] == mapping[ids[p]] == ids[p + 1]
        # Everything that is neither BOS, key nor value is filler.
        others = np.ones(cfg.length, bool)
        others[0] = False
        others[np.concatenate([records, records + 1, demos, demos + 1])] = False
        assert vocab.is_filler(ids[others]).all()


def test_train_phases_are_uniform_and_both_paddings_occur(tmp_path):
    cfg = RetrievalConfig(num_train=4800, num_val=10)
    ids = np.array(make_train_dataset(cfg, cache_dir=tmp_path)["input_ids"])
    vocab = cfg.vocab
    first_key = np.argmax(vocab.is_key(ids), axis=1)
    counts = np.bincount(first_key % 24, minlength=24)
    assert counts.min() > 0.7 * 4800 / 24 and counts.max() < 1.3 * 4800 / 24
    # In-sequence padding: some sequences have filler between records, others none.
    spread = 1 - _records_in_lockstep(ids, cfg).mean()
    assert 0.35 < spread < 0.65  # in_sequence_prob = 0.5 (a few spread draws put all filler at the end)


def test_train_determinism_cache_and_splits(tmp_path):
    cfg = RetrievalConfig(num_train=50, num_val=20)
    a = np.array(make_train_dataset(cfg, "train", seed=1, cache_dir=tmp_path / "a")["input_ids"])
    b = np.array(make_train_dataset(cfg, "train", seed=1, cache_dir=tmp_path / "b")["input_ids"])
    c = np.array(make_train_dataset(cfg, "train", seed=2, cache_dir=tmp_path / "a")["input_ids"])
    val = np.array(make_train_dataset(cfg, "val", seed=1, cache_dir=tmp_path / "a")["input_ids"])
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert val.shape == (20, cfg.length) and not np.array_equal(val, a[:20])
    assert len(list((tmp_path / "a" / "retrieval").iterdir())) == 3  # cached: one directory per split and seed


@pytest.mark.parametrize("field,value,key", [
    ("num_records", 0, "data.num_records"), ("num_demos", 17, "data.num_demos"), ("num_keys", 8, "data.num_keys"),
    ("in_sequence_prob", 1.5, "data.in_sequence_prob"), ("seq_len", 10, "data.seq_len"),
    ("max_prefix_pad", -1, "data.max_prefix_pad"), ("in_sequence_from_step", -1, "data.in_sequence_from_step"),
    ("in_sequence_prob_before", -0.1, "data.in_sequence_prob_before"),
])
def test_train_config_errors_name_the_key(field, value, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        RetrievalConfig(**{field: value})


def test_in_sequence_curriculum_needs_a_change_to_switch_to():
    equal = r"data\.in_sequence_from_step=100 .*in_sequence_prob=data\.in_sequence_prob_before=0"
    with pytest.raises(ConfigError, match=equal):
        RetrievalConfig(in_sequence_prob=0.0, in_sequence_from_step=100)
    with pytest.raises(ConfigError, match=r"data\.in_sequence_from_step=100 .*=1\.0 "):
        RetrievalConfig(in_sequence_prob=1.0, in_sequence_prob_before=1.0, in_sequence_from_step=100)


def _records_in_lockstep(ids: np.ndarray, cfg: RetrievalConfig) -> np.ndarray:
    """Per row: the records sit back to back (no filler between them), read from the tokens."""
    keys = cfg.vocab.is_key(ids[:, :1 + cfg.max_prefix_pad + 2 * cfg.num_records])
    first_last = np.array([(np.flatnonzero(row)[0], np.flatnonzero(row)[cfg.num_records - 1]) for row in keys])
    return first_last[:, 1] - first_last[:, 0] == 2 * (cfg.num_records - 1)


def test_in_sequence_curriculum_trains_on_dense_records_until_its_step(tmp_path, monkeypatch):
    """data.in_sequence_from_step=4: the batches of steps 0-3 hold only sequences whose records sit back to back,
    later ones the configured mix; a sampler resumed at step 3 yields the uninterrupted run's batches."""
    from phasefix.data.select import train_stages
    from phasefix.module import RetrievalDataModule, StepBatchSampler

    monkeypatch.setenv("PHASEFIX_CACHE", str(tmp_path))
    cfg = RetrievalConfig(num_train=300, num_val=10, in_sequence_prob=1.0, in_sequence_from_step=4)
    stages = [(step, ds.with_format("torch")) for step, ds in train_stages(cfg, seed=0)]
    assert [step for step, _ in stages] == [0, 4]
    data = RetrievalDataModule(stages, {}, batch_size=32, eval_batch_size=8, seed=0, max_steps=8)
    batches = [b["input_ids"].numpy() for b in data.train_dataloader()]
    assert len(batches) == 8
    for step, ids in enumerate(batches):
        lockstep = _records_in_lockstep(ids, cfg)
        assert lockstep.all() if step < 4 else lockstep.mean() < 0.5, step  # prob 1: almost every row spread

    sampler = StepBatchSampler([(0, 300), (4, 300)], 32, 0, 0, 8)
    drawn = list(sampler)
    assert all(max(b) < 300 for b in drawn[:4]) and all(min(b) >= 300 for b in drawn[4:])
    assert list(StepBatchSampler([(0, 300), (4, 300)], 32, 0, 3, 8)) == drawn[3:]
    # in-sequence first (in_sequence_prob_before=1), then dense only: the other order
    cfg = RetrievalConfig(num_train=300, num_val=10, in_sequence_prob=0.0, in_sequence_prob_before=1.0,
                          in_sequence_from_step=2)
    stages = [(step, ds.with_format("torch")) for step, ds in train_stages(cfg, seed=0)]
    data = RetrievalDataModule(stages, {}, batch_size=32, eval_batch_size=8, seed=0, max_steps=4)
    lockstep = [_records_in_lockstep(b["input_ids"].numpy(), cfg) for b in data.train_dataloader()]
    assert [ls.mean() < 0.5 for ls in lockstep] == [True, True, False, False] and lockstep[3].all()
    # one set (no curriculum): the draws of the sampler before stages existed, step by step
    single = list(StepBatchSampler([(0, 300)], 32, 0, 0, 3))
    assert single == [np.random.default_rng([0, s, 0]).choice(300, size=32, replace=False).tolist() for s in range(3)]


def test_phase_eval_of_a_trained_task_cannot_be_answered_by_elimination():
    """The target is never demonstrated, so with R - 1 demonstrations it would be the one record not re-asked. The
    evaluation of a run's task leaves at least half the records undemonstrated, the target among them (read from the
    tokens: record keys before the demonstrations, demonstrated keys after)."""
    from phasefix.data.select import eval_set

    cfg = RetrievalConfig()  # 16 records, trained with 15 demonstrations
    ds = eval_set(cfg, "prefix", period=24, per_residue=2, seed=0)
    vocab = cfg.vocab
    for ids in np.array(ds["input_ids"]):
        query_key = ids[-1]
        keys_at = np.flatnonzero(vocab.is_key(ids[:-1]))
        record_keys, demo_keys = ids[keys_at[:cfg.num_records]], ids[keys_at[cfg.num_records:]]
        undemonstrated = set(record_keys) - set(demo_keys)
        assert len(undemonstrated) >= cfg.num_records // 2 and query_key in undemonstrated


def test_train_split_error(tmp_path):
    with pytest.raises(ConfigError, match="data.split"):
        make_train_dataset(RetrievalConfig(num_train=5, num_val=5), "test", cache_dir=tmp_path)


# ---------------------------------------------------------------- phase evaluation
def _check_eval(ds, task, period, per_residue, num_records, num_demos, vocab):
    """All protocol properties, re-derived from the tokens."""
    key_len = 1 if task == "kv_lookup" else 2
    rec_len = 2 * key_len
    ids = np.array(ds["input_ids"])
    answer, target, query = (np.array(ds[c]) for c in ("answer", "target_pos", "query_pos"))
    residue, cluster = np.array(ds["residue"]), np.array(ds["cluster"])
    n_rows, length = ids.shape
    assert n_rows == period * per_residue
    # Fixed prompt length and query position (the last token), for every row.
    assert (query == length - 1).all()
    assert np.array_equal(residue, target % period)
    assert np.array_equal(np.bincount(residue, minlength=period), np.full(period, per_residue))
    for row in range(n_rows):
        x = ids[row]
        starts = _key_starts(x, vocab, key_len)
        records, demos = starts[:num_records], starts[num_records:]
        assert len(records) == num_records and len(demos) == num_demos
        rec_keys = [tuple(x[p:p + key_len]) for p in records]
        assert len(set(rec_keys)) == num_records  # each key once among the records
        query_key = tuple(x[length - key_len:])
        hits = [p for p, k in zip(records, rec_keys) if k == query_key]
        assert hits == [target[row]]  # the target is a record...
        assert query_key not in {tuple(x[p:p + key_len]) for p in demos}  # ...never demonstrated
        assert x[target[row] + key_len] == answer[row]  # answer: the value that followed the target key
        assert vocab.is_value(answer[row])
        for p in demos:  # demonstrations repeat records faithfully
            i = rec_keys.index(tuple(x[p:p + key_len]))
            assert np.array_equal(x[p:p + rec_len], x[records[i]:records[i] + rec_len])
    # Clusters: one mapping, every residue once, only placement differs.
    for c in np.unique(cluster):
        rows = np.flatnonzero(cluster == c)
        assert sorted(residue[rows]) == list(range(period))
        answers = {answer[r] for r in rows}
        assert len(answers) == 1
        mappings = {frozenset(tuple(ids[r][p:p + rec_len]) for p in _key_starts(ids[r], vocab, key_len)[:num_records])
                    for r in rows}
        assert len(mappings) == 1
    return ids, target, residue


def _key_starts(x, vocab, key_len):
    """First positions of every key in records and demonstrations (not the final query key), in order."""
    is_key = vocab.is_key(x)
    return [p for p in range(1, len(x) - key_len) if is_key[p] and (key_len == 1 or is_key[p + 1])
            and not (key_len == 2 and is_key[p - 1])]


def _moments(target, residue, period):
    groups = [target[residue == r].astype(np.int64) for r in range(period)]
    sums = [int(sum(int(v) for v in g)) for g in groups]
    squares = [int(sum(int(v) ** 2 for v in g)) for g in groups]
    means = np.array([g.mean() for g in groups])
    stds = np.array([g.std() for g in groups])
    return sums, squares, means, stds


@pytest.mark.parametrize("padding", ["prefix", "in_sequence"])
def test_kv_lookup_protocol(padding):
    ds = make_phase_eval("kv_lookup", padding, period=24, per_residue=24, seed=3)
    ids, target, residue = _check_eval(ds, "kv_lookup", 24, 24, num_records=64, num_demos=8,
                                       vocab=RetrievalVocab(64, 64, 16))
    sums, squares, means, stds = _moments(target, residue, 24)
    assert len(set(sums)) == 1  # per_residue a multiple of period: means exactly equal
    assert np.abs(stds / stds.mean() - 1).max() < 0.01
    assert ids.shape[1] == 1 + 23 + 2 * (64 + 8) + 1


def test_kv_lookup_exact_moments_and_trained_sizes():
    # per_residue = period**2: mean and variance exactly equal (integer sums of x and x**2 agree).
    ds = make_phase_eval("kv_lookup", "prefix", period=8, per_residue=64, num_records=16, num_demos=15,
                         num_keys=32, num_values=32)
    _, target, residue = _check_eval(ds, "kv_lookup", 8, 64, num_records=16, num_demos=15,
                                 vocab=RetrievalVocab(32, 32, 16))
    sums, squares, _, _ = _moments(target, residue, 8)
    assert len(set(sums)) == 1 and len(set(squares)) == 1


@pytest.mark.parametrize("per_residue", [24, 96, 130])
def test_moment_tolerances(per_residue):
    pos = balanced_positions(1, 150, 24, per_residue)
    assert pos.shape == (24, per_residue)
    assert (pos % 24 == np.arange(24)[:, None]).all() and pos.min() >= 1 and pos.max() <= 150
    means, stds = pos.mean(axis=1), pos.std(axis=1)
    if per_residue % 24 == 0:
        assert np.ptp(pos.sum(axis=1)) == 0
    assert np.abs(means - means.mean()).max() <= 0.1
    assert np.abs(stds / stds.mean() - 1).max() < 0.01


def test_exact_moments_at_period_squared():
    pos = balanced_positions(1, 150, 24, 576)
    assert len({int(s) for s in pos.sum(axis=1)}) == 1
    assert len({int(s) for s in (pos.astype(np.int64) ** 2).sum(axis=1)}) == 1


@pytest.mark.parametrize("padding", ["prefix", "in_sequence"])
def test_needle_protocol(padding):
    ds = make_phase_eval("needle", padding, period=4, per_residue=16, seed=1, num_records=200, num_demos=4,
                         num_keys=32, num_values=32)
    ids, target, residue = _check_eval(ds, "needle", 4, 16, num_records=200, num_demos=4,
                                       vocab=RetrievalVocab(32, 32, 16))
    sums, squares, _, _ = _moments(target, residue, 4)
    assert len(set(sums)) == 1 and len(set(squares)) == 1  # per_residue = period**2: exact
    # Target near the middle of the records.
    assert abs(target.mean() - ids.shape[1] / 2) < 0.1 * ids.shape[1]


def test_distractors_move_with_the_target_only_under_prefix_padding():
    for padding, lockstep in (("prefix", True), ("in_sequence", False)):
        ds = make_phase_eval("kv_lookup", padding, period=24, per_residue=24, seed=0)
        vocab = RetrievalVocab(64, 64, 16)
        offsets_fixed = []
        for row in ds.select(range(48)):
            x = np.array(row["input_ids"])
            starts = np.flatnonzero(vocab.is_key(x))[:64]
            offsets_fixed.append(np.all(np.diff(starts) == 2))  # records contiguous: they shift together
        assert all(offsets_fixed) == lockstep


def test_eval_determinism():
    a = make_phase_eval("kv_lookup", "in_sequence", period=4, per_residue=8, seed=5)
    b = make_phase_eval("kv_lookup", "in_sequence", period=4, per_residue=8, seed=5)
    c = make_phase_eval("kv_lookup", "in_sequence", period=4, per_residue=8, seed=6)
    assert a["input_ids"] == b["input_ids"] and a["target_pos"] == b["target_pos"]
    assert a["input_ids"] != c["input_ids"]


def test_eval_cache(tmp_path):
    a = make_phase_eval("kv_lookup", "prefix", period=4, per_residue=4, seed=0, cache_dir=tmp_path)
    b = make_phase_eval("kv_lookup", "prefix", period=4, per_residue=4, seed=0, cache_dir=tmp_path)
    assert a["input_ids"] == b["input_ids"] and len(list((tmp_path / "phase_eval").iterdir())) == 1


def test_needle_at_128k_tokens():
    ds = make_phase_eval("needle", "prefix", period=4, per_residue=1, num_records=32_000, num_keys=200,
                         num_values=200)
    x = np.array(ds[0]["input_ids"])
    assert 128_000 <= x.size <= 131_072
    t = ds[0]["target_pos"]
    assert abs(t - x.size / 2) < 1000
    assert tuple(x[t:t + 2]) == tuple(x[-2:]) and x[t + 2] == ds[0]["answer"]


@pytest.mark.parametrize("args,kwargs,key", [
    (("kv_lookup", "prefix"), dict(period=0), "period"),
    (("kv_lookup", "prefix"), dict(per_residue=0), "per_residue"),
    (("lookup", "prefix"), {}, "task"),
    (("kv_lookup", "suffix"), {}, "padding"),
    (("kv_lookup", "prefix"), dict(num_records=0), "num_records"),
    (("kv_lookup", "prefix"), dict(num_demos=64), "num_demos"),
    (("kv_lookup", "prefix"), dict(num_keys=10), "num_keys"),
    (("kv_lookup", "prefix"), dict(max_pad=0), "max_pad"),
    (("kv_lookup", "prefix"), dict(num_records=16, max_pad=23), "max_pad"),
    (("kv_lookup", "prefix"), dict(target_span=100), "target_span"),
    (("kv_lookup", "prefix"), dict(bogus=1), "bogus"),
    (("needle", "prefix"), dict(num_records=2000, num_keys=40), "num_keys"),
])
def test_eval_errors_name_the_key(args, kwargs, key):
    with pytest.raises(ConfigError, match=key):
        make_phase_eval(*args, **kwargs)
