"""phasefix.data.lm_mix: determinism, held-out text, labels re-derived from the tokens."""
import numpy as np
import pytest

from phasefix.data.lm_mix import LMMixConfig, make_lm_mix_dataset
from phasefix.errors import ConfigError


@pytest.fixture
def letter_corpus(tmp_path):
    """Ten files, each one distinct letter repeated: any byte names the file it came from."""
    root = tmp_path / "corpus"
    root.mkdir()
    for i, letter in enumerate("abcdefghij"):
        (root / f"f{i}.txt").write_bytes(letter.encode() * 500)
    return root


def _letters(ds, cfg):
    ids = np.array(ds["input_ids"])
    v = cfg.vocab
    text = ids[(ids >= v.byte_start)] - v.byte_start
    return set(bytes(text.tolist()).decode()) - {"\n"}


def test_validation_text_is_held_out_by_file(letter_corpus, tmp_path):
    cfg = LMMixConfig(corpus=str(letter_corpus), corpus_glob="*.txt", val_fraction=0.2, num_train=400, num_val=200,
                      text_before=16, text_after=16)
    train = _letters(make_lm_mix_dataset(cfg, "train", cache_dir=tmp_path), cfg)
    val = _letters(make_lm_mix_dataset(cfg, "val", cache_dir=tmp_path), cfg)
    assert len(val) == 2 and not train & val and train | val == set("abcdefghij")
    # The held-out files do not depend on the seed.
    assert _letters(make_lm_mix_dataset(cfg, "val", seed=9, cache_dir=tmp_path), cfg) == val


def test_single_file_corpus_holds_out_its_tail(tmp_path):
    path = tmp_path / "one.txt"
    path.write_bytes(b"a" * 900 + b"z" * 100)
    cfg = LMMixConfig(corpus=str(path), val_fraction=0.1, num_train=100, num_val=50, text_before=8, text_after=8)
    assert _letters(make_lm_mix_dataset(cfg, "train", cache_dir=tmp_path), cfg) == {"a"}
    assert _letters(make_lm_mix_dataset(cfg, "val", cache_dir=tmp_path), cfg) == {"z"}


def test_layout_and_labels(tmp_path):
    cfg = LMMixConfig(num_train=50, num_val=10)  # the standard library's own source files
    ds = make_lm_mix_dataset(cfg, "train", cache_dir=tmp_path)
    v = cfg.vocab
    assert v.size == 1 + 16 + 32 + 32 + 256
    for row in ds.select(range(20)):
        ids, labels = np.array(row["input_ids"]), np.array(row["labels"])
        assert ids.shape == (cfg.length,) and ids[0] == v.bos
        is_text = ids >= v.byte_start
        assert is_text[1:1 + cfg.text_before].all() and is_text[-cfg.text_after:].all()
        assert is_text.sum() == cfg.text_before + cfg.text_after
        # Text labels: next token wherever both this position (or BOS) and the next are text.
        text_from = np.flatnonzero(((is_text[:-1]) | (np.arange(cfg.length - 1) == 0)) & is_text[1:])
        assert np.array_equal(np.flatnonzero(labels >= v.byte_start), text_from)
        assert np.array_equal(labels[text_from], ids[text_from + 1])
        # Retrieval labels: at demonstration keys, the value of the record with that key.
        keys = np.flatnonzero(v.is_key(ids))
        records, demos = keys[:cfg.num_records], keys[cfg.num_records:]
        mapping = {ids[p]: ids[p + 1] for p in records}
        query = np.flatnonzero((labels != -100) & (labels < v.byte_start))
        assert np.array_equal(query, demos) and all(labels[p] == mapping[ids[p]] for p in demos)
        assert v.is_value(ids[records + 1]).all()


def test_determinism(tmp_path):
    cfg = LMMixConfig(num_train=30, num_val=10, text_before=8, text_after=8)
    a = make_lm_mix_dataset(cfg, "train", seed=1, cache_dir=tmp_path / "a")["input_ids"]
    b = make_lm_mix_dataset(cfg, "train", seed=1, cache_dir=tmp_path / "b")["input_ids"]
    c = make_lm_mix_dataset(cfg, "train", seed=2, cache_dir=tmp_path / "a")["input_ids"]
    assert a == b and a != c


@pytest.mark.parametrize("kwargs,key", [
    (dict(text_before=1), "data.text_before"), (dict(val_fraction=1.0), "data.val_fraction"),
    (dict(corpus="/no/such/corpus"), "data.corpus"), (dict(num_records=0), "data.num_records"),
])
def test_config_errors(kwargs, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        LMMixConfig(**kwargs)


def test_glob_matching_nothing(letter_corpus, tmp_path):
    cfg = LMMixConfig(corpus=str(letter_corpus), corpus_glob="*.md")
    with pytest.raises(ConfigError, match="data.corpus_glob"):
        make_lm_mix_dataset(cfg, cache_dir=tmp_path)


def test_training_loss_averages_queries_and_text_separately():
    """Hand-computed: 2 query labels and 6 text labels; the loss is mean(query NLL) + w * mean(text NLL), not the
    mean over all 8 (which would give the text 3/4 of the weight)."""
    import math

    import torch

    from phasefix.module import next_token_loss

    text_start = 10
    logits = torch.randn(1, 9, 16, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[3, 11, 12, -100, 5, 13, 14, 15, 10]])
    nll = [-torch.log_softmax(logits[0, i], -1)[labels[0, i]].item() for i in range(9) if labels[0, i] >= 0]
    labelled = [int(x) for x in labels[0] if x >= 0]
    query = [n for n, y in zip(nll, labelled) if y < text_start]
    text = [n for n, y in zip(nll, labelled) if y >= text_start]
    assert len(query) == 2 and len(text) == 6
    loss, parts = next_token_loss(logits, labels, text_label_start=text_start, lm_weight=0.5)
    assert math.isclose(parts["retrieval_loss"].item(), sum(query) / 2, rel_tol=1e-5)
    assert math.isclose(parts["text_loss"].item(), sum(text) / 6, rel_tol=1e-5)
    assert math.isclose(loss.item(), sum(query) / 2 + 0.5 * sum(text) / 6, rel_tol=1e-5)


def test_text_loss_weight_is_off_then_ramps():
    from phasefix.module import text_loss_weight

    assert [text_loss_weight(s, 2.0, start_step=3, ramp_steps=4) for s in range(9)] == \
        [0.0, 0.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.0, 2.0]
    assert text_loss_weight(0, 0.7) == 0.7  # no schedule: on from the first step


def test_lm_schedule_keys_are_checked():
    with pytest.raises(ConfigError, match="data.lm_start_step"):
        LMMixConfig(lm_start_step=-1)


def test_eval_prompts_get_held_out_text_and_keep_balanced_residues(tmp_path):
    from phasefix.data import make_phase_eval
    from phasefix.data.lm_mix import add_text_context

    path = tmp_path / "one.txt"
    tail = bytes(range(ord("A"), ord("Z") + 1)) * 4  # the held-out 10%: capitals only, so any window is recognisable
    path.write_bytes(b"a" * (9 * len(tail)) + tail)
    cfg = LMMixConfig(corpus=str(path), val_fraction=0.1, text_before=10, num_records=16, num_demos=15)
    period, n = 24, 10
    plain = make_phase_eval("kv_lookup", "in_sequence", period=period, per_residue=24, num_records=16, num_demos=15,
                            num_keys=32, num_values=32, num_filler=16, max_pad=71)
    ds = add_text_context(plain, cfg, period, seed=3)
    v = cfg.vocab
    ids, old = np.array(ds["input_ids"]), np.array(plain["input_ids"])
    assert ids.shape == (old.shape[0], old.shape[1] + n)
    assert (ids[:, 0] == v.bos).all() and np.array_equal(ids[:, 1 + n:], old[:, 1:])
    text = ids[:, 1:1 + n] - v.byte_start
    assert ((text >= ord("A")) & (text <= ord("Z"))).all()  # held-out bytes only
    assert all(bytes(row.tolist()) in tail for row in text)  # contiguous windows of the text
    cluster = np.array(ds["cluster"])
    for c in np.unique(cluster):  # one text per cluster: its prompts still differ only in placement
        assert (text[cluster == c] == text[cluster == c][0]).all()
    assert len({bytes(row.tolist()) for row in text}) > 1
    target, query = np.array(ds["target_pos"]), np.array(ds["query_pos"])
    assert np.array_equal(target, np.array(plain["target_pos"]) + n) and (query == ids.shape[1] - 1).all()
    rows = np.arange(len(ids))
    assert np.array_equal(ids[rows, target], ids[:, -1])  # the target key sits at its new position
    residue = np.array(ds["residue"])
    assert np.array_equal(residue, target % period)
    # Each new residue group is one whole plain group moved by n: the same size, mean + n, the same variance.
    old_target, old_residue = np.array(plain["target_pos"]), np.array(plain["residue"])
    for r in range(period):
        moved = old_target[old_residue == (r - n) % period] + n
        assert np.array_equal(np.sort(target[residue == r]), np.sort(moved)) and moved.size == 24
