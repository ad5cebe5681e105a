"""`phasefix.report runs=A,B` of two evaluate runs of the same prompts: one figure, and the phases where they differ
beyond their 95% Wilson intervals named, against hand-computed intervals."""
from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from phasefix import tracking
from phasefix.errors import ConfigError
from phasefix.metrics import PhaseAccuracy
from phasefix.report import report

P, N = 4, 40  # period, prompts per residue


def result(correct_per_residue: list[int]) -> dict:
    residue = np.repeat(np.arange(P), N)
    correct = np.concatenate([np.arange(N) < k for k in correct_per_residue])
    metric = PhaseAccuracy(P, n_boot=20)
    metric.update(torch.from_numpy(correct), torch.from_numpy(residue), torch.from_numpy(np.tile(np.arange(N), P)))
    return metric.compute()


def log_audit(c, exp, name, fact, end, prompts=None):
    run_id = c.create_run(exp, run_name=name, tags={"phasefix.kind": "evaluate", "model": "m"}).info.run_id
    summary = {"task": "kv_lookup", "period": P, "phase_of": "both", "score": "exact",
               "prompts": prompts or {"prefix": {"prompt_length": 300}}}
    for label, counts in (("prefix", fact), ("prefix_end", end)):
        res = result(counts)
        tracking.log_phase_result(c, run_id, label, res)
        summary[label] = {k: res[k].tolist() for k in ("per_residue", "count", "acc_mean")}
    c.log_dict(run_id, summary, "summary.json")
    c.set_terminated(run_id)
    return run_id


def test_two_audits_name_the_end_phase_where_they_differ(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)
    exp = tracking.get_or_create_experiment(c, "audits")
    # the reference: 36/40 everywhere; the deployment: the same by fact, 4/40 at end residue 3, 30/40 at end 1
    ref = log_audit(c, exp, "in-process", [36] * 4, [36] * 4)
    dep = log_audit(c, exp, "served", [36] * 4, [36, 30, 36, 4])
    res = report([f"runs={ref},{dep}", f"tracking_uri={uri}", f"out={tmp_path / 'rep'}", "log=false"])
    assert {"side_by_side.csv", "side_by_side.md", "side_by_side.png"} <= set(res["files"])
    rows = list(csv.DictReader(open(tmp_path / "rep" / "side_by_side.csv")))
    differs = [(r["label"], r["phase"]) for r in rows if r["differs"] == "1"]
    # Wilson 95%: 36/40 -> [0.769, 0.960], 30/40 -> [0.598, 0.858] (overlap), 4/40 -> [0.040, 0.231] (disjoint)
    assert differs == [("prefix_end", "3")]
    row = next(r for r in rows if (r["label"], r["phase"]) == ("prefix_end", "1"))
    assert float(row["a_low"]) == pytest.approx(0.7694, abs=1e-3) and float(row["b_high"]) == pytest.approx(0.8582,
                                                                                                          abs=1e-3)
    md = (tmp_path / "rep" / "side_by_side.md").read_text()
    assert "`prefix_end` (end residue): 3 (0.90 vs 0.10)" in md and "`prefix` (fact residue): none" in md
    other = log_audit(c, exp, "other-prompts", [36] * 4, [36] * 4, prompts={"prefix": {"prompt_length": 301}})
    with pytest.raises(ConfigError, match="not audits of the same prompts, prompts differs"):
        report([f"runs={ref},{other}", f"tracking_uri={uri}", f"out={tmp_path / 'rep2'}", "log=false"])
