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
