"""`phasefix.evaluate endpoint=...` against a real `transformers serve` process serving a tiny random Qwen3 built here.

The reference is independent of `phasefix.endpoint`: the same prompts (rebuilt from `TextPhaseSet`) answered by
Hugging Face `generate` in this process, one prompt at a time, greedy, as many tokens as the answer has, decoded with
special tokens skipped, matched exactly. Where each prompt ends is checked by re-tokenising its text and against the
server's own count of prompt tokens. One server for the module (its start costs most of the time here); the last
test kills it.
"""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from helpers import tiny_qwen3, transformers_serve
from mlflow.tracking import MlflowClient

from phasefix.data.text_prompts import TextPhaseSet
from phasefix.evaluate import evaluate, main

PERIOD = 4
TASKS = {"kv_lookup": ["max_pad=40"], "needle": ["num_records=24", "max_pad=8"]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_qwen3(tmp_path_factory.mktemp("served") / "tiny-qwen3", varied=True)


@pytest.fixture(scope="module")
def server(model_dir):
    """(base URL, process) of `transformers serve` pinned to the tiny model, on 127.0.0.1 and a free port."""
    with transformers_serve(model_dir) as served:
        yield served


@pytest.fixture(scope="module")
def reference(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def args(tmp_path, name, server, model_dir, *extra):
    return [f"endpoint={server[0]}", f"model={model_dir}", f"tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"out={tmp_path / name}", "progress=false", "n_boot=20", "experiment=endpoint-test", f"period={PERIOD}",
            "padding=prefix", *extra]


def greedy_answers(model, tok, prompts: TextPhaseSet) -> tuple[list[str], list[bool]]:
    texts, correct = [], []
    for i in range(len(prompts)):
        row = prompts.row(i)
        ids = torch.from_numpy(row["input_ids"])[None]
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=row["answer_ids"].size,
                                 do_sample=False, pad_token_id=tok.pad_token_id)
        texts.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
        correct.append(texts[-1] == tok.decode(row["answer_ids"]))
    return texts, correct


def rows_of(out) -> list[dict]:
    with open(out / "answers.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("task,phase_of,per_residue", [("kv_lookup", "both", 1), ("needle", "end", 4)])
def test_endpoint_scores_equal_in_process_prompt_by_prompt(server, model_dir, reference, tmp_path, task, phase_of,
                                                           per_residue):
    model, tok = reference
    summary = evaluate(args(tmp_path, "ep", server, model_dir, f"task={task}", f"phase_of={phase_of}",
                            f"per_residue={per_residue}", "concurrency=4", *TASKS[task]))
    prompts = TextPhaseSet(tok, task, "prefix", period=PERIOD, per_residue=per_residue, phase_of=phase_of,
                           **{k: int(v) for k, v in (a.split("=") for a in TASKS[task])})
    texts, correct = greedy_answers(model, tok, prompts)
    got = rows_of(tmp_path / "ep")
    assert [r["text"] for r in got] == texts  # every prompt's answer, generated on the server
    assert len(set(texts)) > len(texts) // 4  # the answers vary: a misplaced prompt would show
    assert [r["correct"] == "1" for r in got] == correct
    # per end residue and per fact residue, the in-process accuracy
    ends = np.array([prompts.row(i)["input_ids"].size % PERIOD for i in range(len(prompts))])
    facts = np.array([prompts.row(i)["target_pos"] % PERIOD for i in range(len(prompts))])
    expect_end = [float(np.mean(np.array(correct)[ends == e])) for e in range(PERIOD)]
    assert summary["prefix_end"]["per_residue"] == pytest.approx(expect_end)
    assert summary["prefix_end"]["count"] == [len(prompts) // PERIOD] * PERIOD
    if phase_of == "both":
        expect_fact = [float(np.mean(np.array(correct)[facts == r])) for r in range(PERIOD)]
        assert summary["prefix"]["per_residue"] == pytest.approx(expect_fact)
        assert np.array(summary["prefix_grid"]["count"]).tolist() == [[per_residue] * PERIOD] * PERIOD
    # the prompt's end where it was meant to be: re-tokenised text, and the server's own count of prompt tokens
    served = {json.loads(line)["index"]: json.loads(line)["prompt_tokens"]
              for line in (tmp_path / "ep" / "responses.jsonl").read_text().splitlines()}
    for i in range(len(prompts)):
        row = prompts.row(i)
        text = tok.decode(row["input_ids"])
        n = len(tok(text)["input_ids"])
        assert n == served[i] == row["input_ids"].size and n % PERIOD == row["end_residue"] == int(got[i]["end_residue"])
    assert sorted(set(ends)) == list(range(PERIOD))
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = c.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["score"] == "exact"
    assert run.data.tags["endpoint"] == server[0] and run.data.tags["phase_of"] == phase_of
    artifacts = {a.path for a in c.list_artifacts(run.info.run_id)}
    assert {"phase_curves.png", "answers.csv", "summary.json"} <= artifacts
    assert ("phase_grid.png" in artifacts) == (phase_of == "both")


def test_a_local_model_scored_exact_equals_the_endpoint(server, model_dir, tmp_path):
    """score=exact in process (phasefix.endpoint.generate_set, batched) and through the server: the same answers."""
    common = ["task=kv_lookup", "phase_of=end", "per_residue=2", "max_pad=40"]
    local = evaluate([f"model={model_dir}", "score=exact", "batch_size=8"]
                     + args(tmp_path, "local", server, model_dir, *common)[2:])
    served = evaluate(args(tmp_path, "served", server, model_dir, *common))
    assert [r["text"] for r in rows_of(tmp_path / "local")] == [r["text"] for r in rows_of(tmp_path / "served")]
    assert local["prefix_end"]["per_residue"] == served["prefix_end"]["per_residue"]


@pytest.mark.slow  # a second server (its start: a minute or more here)
def test_continuous_batching_gives_the_same_answers(model_dir, reference, tmp_path):
    """`transformers serve --continuous-batching` (docs/evaluate.md recommends it for audits): the same greedy
    answers as generate in process, prompt by prompt, at concurrency 8."""
    model, tok = reference
    with transformers_serve(model_dir, "--continuous-batching", startup_s=900) as served:
        evaluate(args(tmp_path, "ep", served, model_dir, "task=kv_lookup", "phase_of=both", "per_residue=2",
                      "concurrency=8", "max_pad=40"))
    prompts = TextPhaseSet(tok, "kv_lookup", "prefix", period=PERIOD, per_residue=2, phase_of="both", max_pad=40)
    texts, _ = greedy_answers(model, tok, prompts)
    assert [r["text"] for r in rows_of(tmp_path / "ep")] == texts


def test_resume_requests_only_what_is_missing(server, model_dir, tmp_path):
    run = args(tmp_path, "ep", server, model_dir, "task=kv_lookup", "per_residue=2", "max_pad=40")
    first = evaluate(run)
    path = tmp_path / "ep" / "responses.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][:10])  # a crash mid-line
    again = evaluate(run)
    assert again["prefix"]["per_residue"] == first["prefix"]["per_residue"]
    kept = path.read_text().splitlines()
    assert kept[:3] == lines[:3] and len(kept) == len(lines) + 1  # the cut line stays, unread; the rest asked again


def one_error_line(capsys) -> str:
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, errors
    return errors[0]


def no_runs(tmp_path) -> bool:
    db = tmp_path / "mlflow.db"
    if not db.exists():
        return True
    c = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = c.get_experiment_by_name("endpoint-test")
    return exp is None or not c.search_runs([exp.experiment_id])


def test_wrong_model_name_and_silent_url_exit_2_with_one_line(server, model_dir, tmp_path, capsys):
    from helpers import free_port

    base = ["task=kv_lookup", "per_residue=1", "max_pad=40", f"tokenizer={model_dir}"]
    wrong = args(tmp_path, "a", server, model_dir, *base)
    wrong[1] = "model=not-served"
    assert main(wrong) == 2
    line = one_error_line(capsys)
    assert "model='not-served' is invalid" in line and str(model_dir) in line
    silent = args(tmp_path, "b", server, model_dir, *base, "retries=0")
    silent[0] = f"endpoint=http://127.0.0.1:{free_port()}/v1"
    assert main(silent) == 2
    assert "does not answer" in one_error_line(capsys)
    assert main(["endpoint=localhost:1"] + args(tmp_path, "c", server, model_dir, *base)[1:]) == 2
    assert "endpoint='localhost:1' is invalid" in one_error_line(capsys)
    assert no_runs(tmp_path)


def test_server_killed_mid_run_fails_with_one_line_and_keeps_what_was_scored(server, model_dir, tmp_path, capsys):
    """The module's last test: it kills the server."""
    import threading
    import time

    url, proc = server
    out = tmp_path / "ep"
    responses = out / "responses.jsonl"

    def kill_after_a_few():
        while not responses.exists() or len(responses.read_text().splitlines()) < 3:
            time.sleep(0.05)
        proc.kill()

    killer = threading.Thread(target=kill_after_a_few, daemon=True)
    killer.start()
    rc = main(args(tmp_path, "ep", server, model_dir, "task=kv_lookup", "per_residue=4", "max_pad=40",
                   "concurrency=1", "retries=1", "timeout=10"))
    killer.join(5)
    assert rc == 2
    line = one_error_line(capsys)
    kept = len(responses.read_text().splitlines())
    assert 3 <= kept < 16 and f"{kept} of 16 prefix prompts were scored and are kept in {responses}" in line
    assert f"out={out} resumes" in line
    assert no_runs(tmp_path) and not (out / "summary.json").exists()


def test_prompts_survive_a_tokenizer_that_merges_runs_of_punctuation():
    """A tokenizer that learned "..", "--", "**" (the plain pieces would merge): the filler moves to " .", " -" ...,
    and every prompt's text tokenises back to its ids."""
    from helpers import tiny_tokenizer

    from phasefix.data.text_prompts import ANIMALS, FILLER, HEADERS, NAMES
    from phasefix.endpoint import prompt_text

    corpus = (list(HEADERS.values()) + [f"{a}: {n}\n" for a, n in zip(ANIMALS, NAMES)] + [f * 8 for f in FILLER] * 20
              + [" ".join(FILLER)] * 20)  # runs of one piece, and pieces after a space
    tok = tiny_tokenizer(corpus, vocab_size=600)
    assert all(len(tok(f + f, add_special_tokens=False)["input_ids"]) == 1 for f in FILLER[:3])  # ".." is one token
    prompts = TextPhaseSet(tok, "kv_lookup", "prefix", period=PERIOD, per_residue=2, max_pad=40, phase_of="end")
    assert {tok.decode([i]) for i in prompts.filler} <= {" " + f for f in FILLER}
    for i in range(len(prompts)):
        ids = prompts.row(i)["input_ids"]
        assert tok(prompt_text(tok, ids))["input_ids"] == ids.tolist()
