"""`phasefix.evaluate` on a tiny random Hugging Face Qwen3 with a tokenizer trained here, and on a phasefix checkpoint.

Residue groups and positions are recomputed independently of `phasefix.data.text_prompts`: the target key is read off
the decoded last line of the prompt, re-tokenised from the word lists' templates, and searched for in the ids.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import save_fit_run
from mlflow.tracking import MlflowClient

from phasefix.data.text_prompts import (ANIMALS, COLOURS, FILLER, HEADERS, NAMES, FlipProbe,
                                        TextPhaseSet, spread_positions)
from phasefix.errors import ConfigError
from phasefix.evaluate import evaluate, main
from phasefix.predict import logits_at

PERIOD = 24


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


pytestmark = pytest.mark.usefixtures("cache_dir")  # conftest.py


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A byte-level BPE tokenizer trained on the templates' words and a random 2-layer Qwen3, saved together."""
    from helpers import tiny_qwen3

    return tiny_qwen3(tmp_path_factory.mktemp("hf") / "tiny-qwen3")


@pytest.fixture(scope="module")
def tokenizer(hf_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_dir)


def ids_of(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def find_all(seq: list[int], sub: list[int]) -> list[int]:
    return [i for i in range(len(seq) - len(sub) + 1) if seq[i:i + len(sub)] == sub]


def check_prompt(tok, task, ids, row):
    """Recompute the target position and answer of one prompt from its text and a fresh tokenisation."""
    ids = [int(i) for i in ids]
    last_line = tok.decode(ids).rsplit("\n", 1)[1]
    assert last_line.endswith(":")
    words = last_line[:-1].split(" ")
    if task == "kv_lookup":
        (animal,) = words
        assert animal in ANIMALS
        key = ids_of(tok, animal)
    else:
        colour, animal = words
        assert colour in COLOURS and animal in ANIMALS
        key = ids_of(tok, colour) + ids_of(tok, " " + animal)
    sep = ids_of(tok, ":")
    hits = find_all(ids, key + sep)
    assert len(hits) == 2 and hits[1] == len(ids) - len(key + sep)  # once among the records, once as the query
    pos = hits[0]
    value_at = pos + len(key + sep)
    name = tok.decode(ids[value_at:]).split("\n", 1)[0].strip().split(" ")[0]
    assert name in NAMES and ids[value_at] == ids_of(tok, " " + name)[0] == row["answer"]
    return pos


@pytest.mark.parametrize("task,padding", [("kv_lookup", "prefix"), ("kv_lookup", "in_sequence"),
                                          ("needle", "prefix"), ("needle", "in_sequence")])
def test_text_sets_balanced_groups_at_recomputed_positions(tokenizer, task, padding):
    n = PERIOD  # a multiple of the period: means match exactly
    kw = dict(num_records=32) if task == "needle" else {}
    prompts = TextPhaseSet(tokenizer, task, padding, period=PERIOD, per_residue=n, seed=3, **kw)
    positions, residues, clusters, lengths, queries = [], [], [], set(), set()
    for batch in prompts.batches(100):
        for b in range(len(batch["answer"])):
            row = {k: v[b] for k, v in batch.items()}
            pos = check_prompt(tokenizer, task, row["input_ids"], row)
            assert pos == row["target_pos"] and pos % PERIOD == row["residue"]
            positions.append(pos)
            residues.append(pos % PERIOD)
            clusters.append(int(row["cluster"]))
            lengths.add(len(row["input_ids"]))
            queries.add(int(row["query_pos"]))
    assert lengths == {prompts.length} and queries == {prompts.length - 1}
    positions, residues = np.array(positions), np.array(residues)
    assert np.bincount(residues, minlength=PERIOD).tolist() == [n] * PERIOD
    for c in set(clusters):  # every key-value mapping is evaluated once at every residue
        assert sorted(residues[np.array(clusters) == c]) == list(range(PERIOD))
    means = [positions[residues == r].mean() for r in range(PERIOD)]
    stds = [positions[residues == r].std() for r in range(PERIOD)]
    assert np.ptp(means) < 1e-9
    assert np.ptp(stds) < 0.02 * np.mean(stds)
    # prefix padding: filler only before and after the records (<= 2 runs); in-sequence: also between them
    filler = {p[0] for p in (ids_of(tokenizer, f) for f in FILLER) if len(p) == 1}
    header = len(ids_of(tokenizer, HEADERS[task]))
    runs = []
    for row in next(prompts.batches(2 * PERIOD))["input_ids"]:
        is_filler = np.isin(row[header:], list(filler)).astype(int)
        runs.append(int(np.sum(np.diff(np.concatenate([[0], is_filler])) == 1)))
    if padding == "prefix":
        assert max(runs) <= 2
    else:
        assert np.mean(runs) > 4


def test_long_prompts_are_generated_lazily(tokenizer):
    prompts = TextPhaseSet(tokenizer, "needle", "prefix", period=PERIOD, per_residue=2, max_length=3000)
    assert prompts.length == 3000 and prompts.R > 300
    batches = prompts.batches(4)
    assert not isinstance(batches, (list, tuple))
    first = next(batches)
    assert first["input_ids"].shape == (4, 3000)
    assert check_prompt(tokenizer, "needle", first["input_ids"][1], {k: v[1] for k, v in first.items()}) == \
        first["target_pos"][1]
    with pytest.raises(ConfigError, match="max_length"):
        TextPhaseSet(tokenizer, "kv_lookup", "prefix", max_length=100)


@pytest.mark.parametrize("max_periods", [8, 256])
def test_spread_positions_wide_windows_keep_residues_and_moments(max_periods):
    x = spread_positions(37, 6000, PERIOD, 2 * PERIOD, max_periods=max_periods)  # 8: solved 11x narrower
    assert x.shape == (PERIOD, 2 * PERIOD) and x.min() >= 37 and x.max() <= 6000 and np.ptp(x) > 5000
    assert all((x[r] % PERIOD == r).all() for r in range(PERIOD))
    assert np.ptp(x.mean(1)) < 1e-9 and np.ptp(x.std(1)) < 0.02 * x.std(1).mean()


def run_args(tmp_path, name):
    return [f"tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", f"out={tmp_path / name}", "progress=false",
            "n_boot=20", "experiment=eval-test"]


@pytest.mark.parametrize("task", ["kv_lookup", "needle"])
def test_evaluate_hf_model_logs_like_a_fit(hf_dir, tmp_path, task):
    extra = ["num_records=24"] if task == "needle" else []
    summary = evaluate([f"model={hf_dir}", f"task={task}", "per_residue=2", "batch_size=16"] + extra
                       + run_args(tmp_path, "out"))
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary
    for pad in ("prefix", "in_sequence"):
        s = summary[pad]
        assert s["count"] == [2] * PERIOD and len(s["per_residue"]) == PERIOD
        assert 0 <= s["acc_worst"] <= s["acc_mean"] <= s["acc_best"] <= 1
        assert summary["prompts"][pad]["query_pos"] == summary["prompts"][pad]["prompt_length"] - 1
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = c.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["phasefix.kind"] == "evaluate" and run.data.tags["task"] == task
    assert sorted(m.step for m in c.get_metric_history(run.info.run_id, "phase_acc/prefix")) == list(range(PERIOD))
    assert "final/in_sequence/acc_worst" in run.data.metrics
    artifacts = {a.path for a in c.list_artifacts(run.info.run_id)}
    assert {"phase_curves.png", "phase_table.csv", "summary.json"} <= artifacts


def test_flip_probe_gives_a_difference_per_length(hf_dir, tokenizer, tmp_path):
    summary = evaluate([f"model={hf_dir}", "task=flip", "period=8", "batch_size=7"] + run_args(tmp_path, "flip"))
    f = summary["flip"]
    assert f["filler_lengths"] == list(range(32)) and len(f["logp_diff"]) == 32
    assert isinstance(f["period_detected"], int) and 1 <= f["period_detected"] <= 8
    assert np.all(np.isfinite(f["logp_diff"]))
    # the batched, right-padded scoring agrees with one unpadded forward over the full logits
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    probe = FlipProbe(tokenizer, period=8)
    for length in (0, 13):
        logp = []
        for which in (0, 1):
            _, ids, start = list(probe.sequences(which))[length]
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.from_numpy(ids)[None]).logits[0].float(), -1)
            logp.append(sum(float(lp[start - 1 + k, ids[start + k]]) for k in range(len(ids) - start)))
        assert f["logp_diff"][length] == pytest.approx(logp[0] - logp[1], abs=1e-4)
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert len(c.get_metric_history(summary["mlflow_run_id"], "flip/logp_diff")) == 32
    with pytest.raises(ConfigError, match="lengths"):
        FlipProbe(tokenizer, period=8, lengths=31)


def test_logits_at_matches_full_logits(hf_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    ids = torch.randint(0, 500, (2, 40))
    with torch.no_grad():
        full = model(ids).logits
        part = logits_at(model, ids, torch.tensor([3, 39]))
    torch.testing.assert_close(part, full[:, [3, 39]], atol=1e-5, rtol=1e-4)


def test_phasefix_checkpoint_uses_its_training_task(tmp_path):
    from phasefix.fit import compose

    cfg = compose([])
    run_dir = tmp_path / "fitrun"
    save_fit_run(run_dir, cfg)
    summary = evaluate([f"model={run_dir}", "task=kv_lookup", "per_residue=1", "padding=prefix"]
                       + run_args(tmp_path, "out"))
    assert summary["stride"] == cfg.model.stride and summary["period"] == 24
    assert summary["prefix"]["count"] == [1] * 24 and "in_sequence" not in summary
    assert summary["prompts"]["prefix"]["num_records"] == cfg.data.num_records
    with pytest.raises(ConfigError, match="task='flip'|Hugging Face"):
        evaluate([f"model={run_dir}", "task=flip"] + run_args(tmp_path, "out2"))


def test_lm_mix_checkpoint_is_evaluated_with_text_before_the_records(tmp_path):
    from phasefix.data import eval_task_kwargs, make_phase_eval
    from phasefix.fit import compose

    cfg = compose(["data=lm_mix", "model.vocab_size=384", "data.text_before=16"])
    run_dir = tmp_path / "lmrun"
    save_fit_run(run_dir, cfg)
    plain_prompt = make_phase_eval("kv_lookup", "prefix", per_residue=1, **eval_task_kwargs(cfg.data))[0]
    plain_length = len(plain_prompt["input_ids"])
    base = [f"model={run_dir}", "task=kv_lookup", "per_residue=1", "padding=prefix"]
    with_text = evaluate(base + run_args(tmp_path, "a"))
    assert with_text["prompts"]["prefix"]["prompt_length"] == plain_length + 16
    assert with_text["prompts"]["prefix"]["text_before"] == 16 and with_text["prefix"]["count"] == [1] * 24
    plain = evaluate(base + ["text=false"] + run_args(tmp_path, "b"))
    assert plain["prompts"]["prefix"]["prompt_length"] == plain_length
    plain_run = tmp_path / "plainrun"
    save_fit_run(plain_run, compose([]))
    with pytest.raises(ConfigError, match="text=True.*lm_mix"):
        evaluate([f"model={plain_run}", "task=kv_lookup", "text=true"] + run_args(tmp_path, "c"))


@pytest.mark.parametrize("args,key", [(["task=kv_lookup"], "model="),
                                      (["model=/nonexistent", "task=kv_lookup"], "model="),
                                      (["model=x", "task=bogus"], "task="),
                                      (["model=x", "task=flip", "colour=1"], "unknown key colour"),
                                      (["model=x", "task=flip", "per_residu=1"], "did you mean per_residue?")])
def test_bad_options_exit_2_with_one_line(args, key, capsys, tmp_path):
    assert main(args + [f"tracking_uri=sqlite:///{tmp_path / 'm.db'}"]) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]  # MLflow may log too
    assert len(errors) == 1 and key in errors[0]


def test_the_first_mistake_is_reported_first_and_both_at_once(tmp_path, capsys):
    """`model=/tmp` (a directory that is no model) without a task: the line names the model first, then the task,
    and nothing is loaded or logged."""
    (tmp_path / "notamodel").mkdir()
    assert main([f"model={tmp_path / 'notamodel'}", f"tracking_uri=sqlite:///{tmp_path / 'm.db'}"]) == 2
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]
    assert line.startswith(f"error: model='{tmp_path / 'notamodel'}' is invalid: the directory is neither a Hugging "
                           "Face model (no config.json) nor a phasefix run output directory")
    assert line.index("model=") < line.index("task=None is invalid")
    assert not (tmp_path / "m.db").exists()


def test_bad_options_are_refused_before_torch_is_imported(tmp_path):
    """The order, not the clock: `python -X importtime` lists what the process imported before it exited 2."""
    import os
    import subprocess
    import sys

    from phasefix.paths import PROJECT_ROOT

    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "phasefix.evaluate", f"model={tmp_path}",
                           f"tracking_uri=sqlite:///{tmp_path / 'm.db'}"], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, timeout=120, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    imported = {ln.rsplit("|", 1)[1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    errors = [ln for ln in proc.stderr.splitlines() if not ln.startswith("import time:")]
    assert proc.returncode == 2 and len(errors) == 1 and errors[0].startswith(f"error: model='{tmp_path}'"), errors
    assert "phasefix.evaluate" in imported or "phasefix.errors" in imported
    assert not imported & {"torch", "lightning", "mlflow", "transformers"}


def test_phasefix_run_named_by_a_unique_mlflow_id_prefix(tmp_path):
    from phasefix import tracking
    from phasefix.fit import compose

    run_dir = tmp_path / "fitrun"
    save_fit_run(run_dir, compose([]))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)
    exp = tracking.get_or_create_experiment(c, "phasefix")
    run_id = c.create_run(exp, run_name="fit", tags={"phasefix.kind": "fit", "output_dir": str(run_dir)}).info.run_id
    summary = evaluate([f"model={run_id[:8]}", "task=kv_lookup", "per_residue=1", "padding=prefix"]
                       + run_args(tmp_path, "out"))
    assert summary["source"] == str(run_dir / "checkpoints" / "last.ckpt")
    assert c.get_run(summary["mlflow_run_id"]).data.tags["phasefix.source_run"] == run_id


def test_synthetic_end_sweep_moves_only_the_end(tmp_path):
    """make_phase_eval phase_of=both: each (cluster, target) at every end residue, the prompts equal but for the
    filler tail before the demonstrations; a phasefix run is evaluated on both axes."""
    from phasefix.data import make_phase_eval
    from phasefix.fit import compose

    P = 8
    plain = make_phase_eval("kv_lookup", "prefix", period=P, per_residue=2, num_records=16, num_demos=4)
    ds = make_phase_eval("kv_lookup", "prefix", period=P, per_residue=2, num_records=16, num_demos=4,
                         phase_of="both").with_format("numpy")
    n0 = len(plain[0]["input_ids"])  # without a tail
    assert len(ds) == 2 * P * P and ds[:]["input_ids"].shape[1] == n0 + P - 1
    rows = ds[:]
    demo_start = n0 - 1 - 2 * 4  # the demonstrations and the query key end the prompt
    for c in range(2):
        for r in range(P):
            cell = slice((c * P + r) * P, (c * P + r + 1) * P)
            ids, q = rows["input_ids"][cell], rows["query_pos"][cell]
            assert sorted((q + 1) % P) == list(range(P)) and list(rows["end_residue"][cell]) == list((q + 1) % P)
            assert len(set(rows["target_pos"][cell])) == 1 and set(rows["residue"][cell]) == {r}
            x = rows["target_pos"][cell][0]
            for b in range(P):
                tail = q[b] + 1 - n0
                assert ids[b, q[b]] == ids[b, x] and rows["answer"][cell][b] == ids[b, x + 1]  # the key, its value
                assert (ids[b, :demo_start] == ids[0, :demo_start]).all()  # the records never move
                first_tail = q[0] + 1 - n0
                assert (ids[b, demo_start + tail:q[b] + 1] == ids[0, demo_start + first_tail:q[0] + 1]).all()
    run_dir = tmp_path / "fitrun"
    save_fit_run(run_dir, compose([]))
    summary = evaluate([f"model={run_dir}", "task=kv_lookup", "per_residue=1", "padding=prefix", "phase_of=end"]
                       + run_args(tmp_path, "out"))
    assert summary["prefix_end"]["count"] == [1] * 24 and "prefix" not in summary
