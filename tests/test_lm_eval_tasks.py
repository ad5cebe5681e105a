"""The lm-evaluation-harness tasks (phasefix/lm_eval_tasks) through the harness's own `hf` backend: the same prompts,
answers and per-residue accuracy as `phasefix.evaluate score=exact` on the same tiny model, prompt by prompt."""
from __future__ import annotations

import csv

import pytest
from helpers import tiny_qwen3

from phasefix.evaluate import evaluate

PERIOD = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_qwen3(tmp_path_factory.mktemp("harness") / "tiny-qwen3", varied=True)


@pytest.mark.parametrize("phase_of", ["end"])
def test_harness_per_residue_equals_phasefix_evaluate(model_dir, tmp_path, phase_of):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from phasefix.lm_eval_tasks import INCLUDE_PATH

    meta = {"period": PERIOD, "per_residue": 2, "max_pad": 40, "phase_of": phase_of, "tokenizer": str(model_dir)}
    res = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir},dtype=float32",
                                  tasks=["phasefix_kv_lookup"], task_manager=TaskManager(include_path=INCLUDE_PATH,
                                                                                         metadata=meta),
                                  batch_size=1, device="cpu", log_samples=True)
    harness = res["results"]["phasefix_kv_lookup"]
    samples = sorted(res["samples"]["phasefix_kv_lookup"], key=lambda s: s["doc_id"])
    summary = evaluate([f"model={model_dir}", "task=kv_lookup", "score=exact", f"period={PERIOD}", "per_residue=2",
                        "max_pad=40", f"phase_of={phase_of}", "padding=prefix", "n_boot=20", "progress=false",
                        f"tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", f"out={tmp_path / 'out'}"])
    with open(tmp_path / "out" / "answers.csv") as f:
        answers = list(csv.DictReader(f))
    assert [s["filtered_resps"][0] for s in samples] == [a["text"] for a in answers]
    assert len({a["text"] for a in answers}) > len(answers) // 4  # answers that vary with the prompt
    label = "prefix" if phase_of == "fact" else "prefix_end"
    assert [harness[f"r{r:02d},none"] for r in range(PERIOD)] == pytest.approx(summary[label]["per_residue"])
    assert all(harness[f"r{r:02d},none"] == -1.0 for r in range(PERIOD, 24))  # no such residue at this period
