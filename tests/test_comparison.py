"""The decisive comparison's rules (phasefix.comparison) on hand-built runs, and its figures render."""
import math

import matplotlib

from phasefix import comparison, plots


def _row(rid, pad, mean, worst, gap=0.5, period=4.0, train=100.0, lm=math.nan):
    return {"run_id": rid, "run_name": rid, "padding": pad, "stride": "4", "acc_mean": mean, "acc_worst": worst,
            "acc_gap": gap, "period_detected": period, "train_seconds": train, "lm_loss": lm}


def _facts(regime, arm, learned):
    return {"regime": regime, "arm": arm, "learned": learned, "stride": 4, "compressor_flops_per_token": 1000.0,
            "cache_entries_per_token": 0.5}


def test_learned_is_five_times_chance():
    params = {"data.num_values": "32"}
    assert comparison.chance(params) == 1 / 32
    assert comparison.learned(5 / 32, params) and not comparison.learned(4.9 / 32, params)


def test_boundary_residues_and_worst_excluding_them():
    assert comparison.boundary_residues(24, 4) == [3, 7, 11, 15, 19, 23]
    assert comparison.boundary_residues(24, 8) == [7, 15, 23]
    curve = [1.0, 0.9, 0.8, 0.1] * 6  # the boundary phase 3 is the worst; excluding it the worst is 0.8
    assert comparison.worst_excluding_boundary(curve, 4) == 0.8


def test_rows_average_learned_seeds_only_and_goal_needs_baseline_mean():
    rows = [_row("b0", "prefix", 0.80, 0.30), _row("b1", "prefix", 0.90, 0.40), _row("b2", "prefix", 0.05, 0.0),
            _row("m0", "prefix", 0.95, 0.90),   # goal: 0.90 >= 0.855 and 0.95 >= baseline mean 0.85
            _row("m1", "prefix", 0.84, 0.80),   # worst ok (0.80 >= 0.756) but mean below the baseline's 0.85
            _row("m2", "prefix", 0.90, 0.70)]   # mean ok, worst 0.70 < 0.81
    facts = {"b0": _facts("w4s4", "baseline", True), "b1": _facts("w4s4", "baseline", True),
             "b2": _facts("w4s4", "baseline", False), "m0": _facts("w4s4", "token_shift", True),
             "m1": _facts("w4s4", "token_shift", True), "m2": _facts("w4s4", "token_shift", True)}
    curves = {(r["run_id"], "prefix"): [1.0, 1.0, 1.0, r["acc_worst"]] * 6 for r in rows}
    drows = comparison.decisive_rows(rows, curves, facts)
    assert [(d["regime"], d["arm"]) for d in drows] == [("w4s4", "baseline"), ("w4s4", "token_shift")]
    base, arm = drows
    assert (base["seeds"], base["learned"]) == (3, 2)
    assert math.isclose(base["acc_mean"], 0.85) and math.isclose(base["acc_worst"], 0.35)
    assert base["goal_met"] == 0
    assert arm["goal_met"] == 1 and arm["learned"] == 3
    assert arm["worst_excl_boundary"] == 1.0  # every non-boundary residue is at 1.0 in these curves
    assert comparison.best_rows(drows) == [base, arm]
    md = comparison.markdown(drows)
    assert "| w4s4 | token_shift | prefix | 3/3 |" in md and "1/3" in md


def test_a_regime_whose_baseline_never_learns_meets_no_goal():
    rows = [_row("b0", "prefix", 0.01, 0.0), _row("m0", "prefix", 0.9, 0.9)]
    facts = {"b0": _facts("hard", "baseline", False), "m0": _facts("hard", "gate_diversity", True)}
    drows = comparison.decisive_rows(rows, {}, facts)
    assert not drows[0]["baseline_learned"]
    assert "baseline not learned" in comparison.markdown(drows)
    alone = comparison.decisive_rows([_row("m0", "prefix", 0.9, 0.9)], {}, {"m0": _facts("new", "shared", True)})
    assert "| no baseline run |" in comparison.markdown(alone)


def test_figures_render(tmp_path):
    rows, facts, curves = [], {}, {}
    for regime in ("w4s4", "w8s8"):
        for arm in ("baseline", "token_shift"):
            for s in range(2):
                rid = f"{regime}-{arm}-{s}"
                rows.append(_row(rid, "prefix", 0.8, 0.3))
                facts[rid] = _facts(regime, arm, s == 0)
                curves[(rid, "prefix")] = [1.0, 0.9, 0.8, 0.3] * 6
    for fig in (plots.phase_grid(rows, curves, facts), plots.worst_vs_mean(rows, facts)):
        assert isinstance(fig, matplotlib.figure.Figure)
        fig.savefig(tmp_path / "f.png")
        assert len(fig.axes) >= 1
