"""The decisive comparison's rules (phasefix.decisive) on hand-built runs, and its figures render."""
import math

import matplotlib
from matplotlib.collections import PathCollection
import pytest

from phasefix import decisive, plots


def _row(rid, pad, mean, worst, gap=0.5, period=4.0, train=100.0, lm=math.nan):
    return {"run_id": rid, "run_name": rid, "padding": pad, "stride": "4", "acc_mean": mean, "acc_worst": worst,
            "acc_gap": gap, "period_detected": period, "train_seconds": train, "lm_loss": lm}


def _facts(regime, arm, learned):
    return {"regime": regime, "arm": arm, "learned": learned, "stride": 4, "compressor_flops_per_token": 1000.0,
            "cache_entries_per_token": 0.5}


def test_boundary_residues_and_worst_excluding_them():
    assert decisive.boundary_residues(24, 4) == [3, 7, 11, 15, 19, 23]
    assert decisive.boundary_residues(24, 8) == [7, 15, 23]
    curve = [1.0, 0.9, 0.8, 0.1] * 6  # the boundary phase 3 is the worst; excluding it the worst is 0.8
    assert decisive.worst_excluding_boundary(curve, 4) == 0.8


def test_rows_average_learned_seeds_only_and_goal_needs_baseline_mean():
    rows = [_row("b0", "prefix", 0.80, 0.30), _row("b1", "prefix", 0.90, 0.40), _row("b2", "prefix", 0.05, 0.0),
            _row("m0", "prefix", 0.95, 0.90),   # goal: 0.90 >= 0.855 and 0.95 >= baseline mean 0.85
            _row("m1", "prefix", 0.84, 0.80),   # worst ok (0.80 >= 0.756) but mean below the baseline's 0.85
            _row("m2", "prefix", 0.90, 0.70)]   # mean ok, worst 0.70 < 0.81
    facts = {"b0": _facts("w4s4", "baseline", True), "b1": _facts("w4s4", "baseline", True),
             "b2": _facts("w4s4", "baseline", False), "m0": _facts("w4s4", "token_shift", True),
             "m1": _facts("w4s4", "token_shift", True), "m2": _facts("w4s4", "token_shift", True)}
    curves = {(r["run_id"], "prefix"): [1.0, 1.0, 1.0, r["acc_worst"]] * 6 for r in rows}
    drows = decisive.decisive_rows(decisive.run_members(rows, curves, facts))
    assert [(d["regime"], d["arm"]) for d in drows] == [("w4s4", "baseline"), ("w4s4", "token_shift")]
    base, arm = drows
    assert (base["seeds"], base["learned"]) == (3, 2)
    assert math.isclose(base["acc_mean"], 0.85) and math.isclose(base["acc_worst"], 0.35)
    assert base["goal_met"] == 0
    assert arm["goal_met"] == 1 and arm["learned"] == 3
    assert arm["worst_excl_boundary"] == 1.0  # every non-boundary residue is at 1.0 in these curves
    assert decisive.best_rows(drows) == [base, arm]
    md = decisive.markdown(drows)
    assert "| w4s4 | token_shift | prefix | 3/3 |" in md and "1/3" in md


def test_each_seed_is_listed_with_the_goal_in_bold_where_that_run_meets_it():
    """runs.md: the hand-checked runs above, one line per run, bold exactly where that run meets the goal (m0 only:
    m1's mean is below the baseline's 0.85, m2's worst below 0.9 x its mean), the unlearned baseline seed marked,
    the baseline first; a second padding is a second column."""
    rows = [_row("b0", "prefix", 0.80, 0.30), _row("b1", "prefix", 0.90, 0.40), _row("b2", "prefix", 0.05, 0.0),
            _row("m0", "prefix", 0.95, 0.90), _row("m1", "prefix", 0.84, 0.80), _row("m2", "prefix", 0.90, 0.70),
            _row("m0", "in_sequence", 0.97, 0.80)]
    facts = {"b0": _facts("w4s4", "baseline", True), "b1": _facts("w4s4", "baseline", True),
             "b2": _facts("w4s4", "baseline", False), "m0": _facts("w4s4", "token_shift", True),
             "m1": _facts("w4s4", "token_shift", True), "m2": _facts("w4s4", "token_shift", True)}
    for r in rows:
        r["run_id"] = r["run_id"] + "0" * 30
    facts = {k + "0" * 30: v for k, v in facts.items()}
    md = decisive.runs_markdown(decisive.run_members(rows, {}, facts))
    lines = md.splitlines()
    assert lines[0] == "| regime | arm | run | prefix: mean / worst | in_sequence: mean / worst |"
    assert lines[2:] == [
        "| w4s4 | baseline | b0 (`b0000000`) | 0.800 / 0.300 |  |",
        "| w4s4 | baseline | b1 (`b1000000`) | 0.900 / 0.400 |  |",
        "| w4s4 | baseline | b2 (`b2000000`) | 0.050 / 0.000 (not learned) |  |",
        "| w4s4 | token_shift | m0 (`m0000000`) | **0.950 / 0.900** | 0.970 / 0.800 |",  # in_sequence: no bar,
        "| w4s4 | token_shift | m1 (`m1000000`) | 0.840 / 0.800 |  |",                  # but 0.80 < 0.873
        "| w4s4 | token_shift | m2 (`m2000000`) | 0.900 / 0.700 |  |"]


def test_a_regime_whose_baseline_never_learns_meets_no_goal():
    rows = [_row("b0", "prefix", 0.01, 0.0), _row("m0", "prefix", 0.9, 0.9)]
    facts = {"b0": _facts("hard", "baseline", False), "m0": _facts("hard", "gate_diversity", True)}
    drows = decisive.decisive_rows(decisive.run_members(rows, {}, facts))
    assert not drows[0]["baseline_learned"]
    assert "baseline not learned" in decisive.markdown(drows)
    alone = decisive.decisive_rows(decisive.run_members([_row("m0", "prefix", 0.9, 0.9)], {},
                                                            {"m0": _facts("new", "shared", True)}))
    assert "| no baseline run |" in decisive.markdown(alone)


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


def test_worst_vs_mean_gives_every_arm_its_own_colour():
    """zero_cost has more than ten arms: matplotlib's ten-colour cycle (C0-C9) drew its 11th arm in its 1st's colour."""
    arms = [f"arm{i:02d}" for i in range(12)]
    rows = [_row(a, "prefix", 0.5 + i / 40, 0.4) for i, a in enumerate(arms)]
    facts = {a: _facts("w8s8", a, True) for a in arms}
    fig = plots.worst_vs_mean(rows, facts)
    legend = fig.axes[0].get_legend()
    colour = {t.get_text(): tuple(h.get_color()[:3]) for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert len({colour[a] for a in arms}) == 12
    points = fig.axes[0].collections  # one scatter per row, in the rows' order
    assert [tuple(p.get_facecolors()[0][:3]) for p in points] == [colour[a] for a in arms]
    matplotlib.pyplot.close(fig)


def _drow(regime, arm, pad, seeds, learned, mean, worst, goal, entries=0.5, flops=1000.0):
    return {"regime": regime, "arm": arm, "padding": pad, "seeds": seeds, "learned": learned, "acc_mean": mean,
            "acc_mean_sd": math.nan, "acc_worst": worst, "acc_worst_sd": math.nan, "worst_excl_boundary": worst,
            "acc_gap": mean - worst, "period": 8.0, "goal_met": goal, "train_seconds": 10.0,
            "compressor_flops_per_token": flops, "cache_entries_per_token": entries, "lm_loss": math.nan,
            "lm_loss_change": math.nan, "run_ids": f"{arm[:4]}0000 {arm[:4]}0001"}


def test_the_headline_arm_is_judged_on_every_padding_at_the_baselines_cache_size():
    """`prefix_only` meets the goal on prefix in 2 of 2 seeds but on no in-sequence seed; `both` meets it on 1 of 2
    in each padding (2 of 4 either way, then the higher worst residue: 0.7 against 0.2); `bigger_cache` meets it
    everywhere but keeps twice the entries, so it is no headline arm."""
    rows = [_drow("w8s8", "baseline", p, 2, 2, 0.8, 0.3, 0) for p in ("in_sequence", "prefix")]
    rows += [_drow("w8s8", "prefix_only", "in_sequence", 2, 2, 0.9, 0.2, 0),
             _drow("w8s8", "prefix_only", "prefix", 2, 2, 0.95, 0.9, 2),
             _drow("w8s8", "both", "in_sequence", 2, 2, 0.9, 0.7, 1),
             _drow("w8s8", "both", "prefix", 2, 2, 0.9, 0.8, 1),
             _drow("w8s8", "bigger_cache", "in_sequence", 2, 2, 1.0, 1.0, 2, entries=1.0),
             _drow("w8s8", "bigger_cache", "prefix", 2, 2, 1.0, 1.0, 2, entries=1.0)]
    best = decisive.best_rows(rows)
    assert [(r["arm"], r["padding"]) for r in best] == [("baseline", "in_sequence"), ("baseline", "prefix"),
                                                        ("both", "in_sequence"), ("both", "prefix")]
    # a single seed meeting the goal everywhere with a higher worst residue does not outrank three seeds doing it
    three = [_drow("w8s8", "three", p, 3, 3, 0.95, 0.88, 3) for p in ("in_sequence", "prefix")]
    one = [_drow("w8s8", "one", p, 1, 1, 0.95, 0.89, 1) for p in ("in_sequence", "prefix")]
    assert {r["arm"] for r in decisive.best_rows(rows + one + three)} == {"baseline", "three"}


def test_a_headline_from_committed_tables_reads_them_back_and_names_their_folders(tmp_path):
    """Two report folders written with report.write_csv as `decisive` writes them; the headline takes w4s4 from
    the first and w8s8 from the second, reads integers and blanks (nan) back, and refuses a regime named twice or
    absent."""
    from phasefix.errors import ConfigError
    from phasefix.tables import headline_from_tables, read_table, write_csv

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    write_csv(b / "decisive.csv", [_drow("w8s8", "baseline", "prefix", 3, 2, 0.8, 0.3, 0),
                                   _drow("w8s8", "token_shift", "prefix", 3, 3, 1.0, 0.95, 3)], decisive.COLUMNS)
    write_csv(a / "decisive.csv", [_drow("w4s4", "baseline", "prefix", 3, 2, 0.8, 0.3, 0),
                                   _drow("w4s4", "token_shift", "prefix", 3, 3, 1.0, 0.95, 3),
                                   _drow("w8s8", "baseline", "prefix", 1, 0, 0.03, 0.0, 0)], decisive.COLUMNS)
    back = [r for r in read_table(a) if r["regime"] == "w8s8"]
    assert len(back) == 1 and back[0]["seeds"] == 1 and back[0]["learned"] == 0 and math.isnan(back[0]["lm_loss"])
    assert back[0]["baseline_run"] and not back[0]["baseline_learned"]
    files, hrows = headline_from_tables([f"{a}:w4s4", str(b)], tmp_path / "h")
    assert files == ["headline.csv", "headline.md", "runs.md"]
    assert (tmp_path / "h" / "runs.md").read_text() == (  # neither folder records its runs one by one
        f"\nNot listed per run (each run is in the table's `comparison.md`): "
        f"w4s4 baseline (`{a}`); w4s4 token_shift (`{a}`); w8s8 baseline (`{b}`); w8s8 token_shift (`{b}`).\n")
    # with b's runs recorded (decisive_runs.csv), the headline lists them, bold where a run meets the goal
    runs = [{"run_id": f"{i}" * 32, "run_name": f"{arm}-s{i}", "regime": "w8s8", "arm": arm, "padding": "prefix",
             "learned": True, "acc_mean": mean, "acc_worst": worst, "table": str(b)}
            for i, arm, mean, worst in ((1, "baseline", 0.8, 0.3), (2, "token_shift", 1.0, 0.95))]
    write_csv(b / "decisive_runs.csv", runs, decisive.MEMBER_COLUMNS)
    files, _ = headline_from_tables([f"{a}:w4s4", str(b)], tmp_path / "h")
    assert files[3:] == ["worst_vs_mean_prefix.png"]  # the runs it lists, by regime
    assert (tmp_path / "h" / "worst_vs_mean_prefix.png").stat().st_size > 0
    listed = (tmp_path / "h" / "runs.md").read_text().splitlines()
    assert listed[2:4] == [f"| w8s8 | baseline | baseline-s1 (`11111111`) | 0.800 / 0.300 | `{b}` |",
                           f"| w8s8 | token_shift | token_shift-s2 (`22222222`) | **1.000 / 0.950** | `{b}` |"]
    assert "w8s8" not in listed[-1] and "w4s4 token_shift" in listed[-1]
    (b / "decisive_runs.csv").unlink()
    assert [(r["regime"], r["arm"], r["table"]) for r in hrows] == [
        ("w4s4", "baseline", str(a)), ("w4s4", "token_shift", str(a)),
        ("w8s8", "baseline", str(b)), ("w8s8", "token_shift", str(b))]
    assert hrows[1]["goal_met"] == 3 and hrows[1]["acc_worst"] == 0.95
    md = (tmp_path / "h" / "headline.md").read_text()
    assert "| w8s8 | token_shift | prefix | 3/3 | 1.000 | 0.950 |" in md and f"`{b}` |" in md
    # read back, a mean prints as the table's own markdown prints it: (0.7335 + 0.7101 + 0.9010) / 3 = 0.78153
    write_csv(b / "decisive.csv", [_drow("w8s8", "baseline", "prefix", 3, 3, 0.78153, 0.3, 0)], decisive.COLUMNS)
    headline_from_tables([str(b)], tmp_path / "h")
    assert "| w8s8 | baseline | prefix | 3/3 | 0.782 |" in (tmp_path / "h" / "headline.md").read_text()
    for specs, says in (([str(a), str(b)], "repeats regime w8s8"), ([f"{a}:w6s6"], "has no regime w6s6"),
                        ([str(tmp_path)], "decisive.csv")):
        with pytest.raises(ConfigError, match=says):
            headline_from_tables(specs, tmp_path / "h")


def test_a_folder_written_before_decisive_runs_csv_gives_its_runs_from_its_two_tables(tmp_path):
    """decisive.csv says which runs a regime x arm holds and how many learned; comparison.csv scores each run. Of
    the baseline's three runs two learned: those are the two highest prefix means (0.7, 0.8; not 0.1, even though
    its in-sequence mean is the highest), whatever order the ids come in. The bar is their mean, 0.75 on prefix;
    the arm's runs meet the goal where worst >= 0.9 x mean and mean >= 0.75 (by hand: s0 yes, s1 no: 0.6 < 0.75,
    s2 no: 0.5 < 0.9 x 0.9). A run comparison.csv lacks is not listed; a row naming another table is left to it."""
    import csv

    from phasefix.tables import folder_members, headline_from_tables, write_csv

    f = tmp_path / "old"
    f.mkdir()
    ids = {name: str(i) * 8 + "a" * 24 for i, name in enumerate(("base-s0", "base-s1", "base-s2", "arm-s0",
                                                                   "arm-s1", "arm-s2"))}
    scores = {  # run: (prefix mean, worst), (in-sequence mean, worst)
        "base-s0": ((0.1, 0.0), (0.95, 0.5)), "base-s1": ((0.8, 0.3), (0.8, 0.3)), "base-s2": ((0.7, 0.2), (0.7, 0.2)),
        "arm-s0": ((0.95, 0.9), (0.9, 0.85)), "arm-s1": ((0.6, 0.58), (0.6, 0.58)), "arm-s2": ((0.9, 0.5), (0.9, 0.5))}
    with open(f / "comparison.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["run_id", "run_name", "kind", "padding", "acc_mean", "acc_worst", "acc_gap", "period_detected"])
        for name, pads in scores.items():
            for pad, (mean, worst) in zip(("prefix", "in_sequence"), pads):
                w.writerow([ids[name], name, "fit", pad, mean, worst, mean - worst, 8])
    base = " ".join(ids[n][:8] for n in ("base-s2", "base-s0", "base-s1"))
    arm = " ".join(ids[n][:8] for n in ("arm-s0", "arm-s1", "arm-s2")) + " deadbeef"  # no such run scored
    drows = [{**_drow("w8s8", "baseline", p, 3, 2, 0.75, 0.25, 0), "run_ids": base} for p in ("prefix",)]
    drows += [{**_drow("w8s8", "shift", p, 3, 3, 0.8, 0.66, 1), "run_ids": arm} for p in ("prefix",)]
    drows += [{**_drow("w8s8", "other", "prefix", 3, 3, 0.9, 0.9, 3, entries=1.0), "table": "docs/figures/elsewhere"}]
    write_csv(f / "decisive.csv", drows, (*decisive.COLUMNS, "table"))
    members = folder_members(f)
    assert {(m["run_name"], m["padding"], m["learned"]) for m in members} == {
        ("base-s0", "prefix", False), ("base-s1", "prefix", True), ("base-s2", "prefix", True),
        ("arm-s0", "prefix", True), ("arm-s1", "prefix", True), ("arm-s2", "prefix", True)}
    s1 = next(m for m in members if m["run_name"] == "base-s1")
    assert (s1["run_id"], s1["acc_mean"], s1["acc_worst"], s1["cache_entries_per_token"]) == (ids["base-s1"], 0.8,
                                                                                               0.3, 0.5)
    assert math.isnan(s1["train_seconds"]) and math.isnan(s1["worst_excl_boundary"])
    headline_from_tables([f"{f}:w8s8"], tmp_path / "h")
    assert (tmp_path / "h" / "runs.md").read_text().splitlines()[2:] == [
        f"| w8s8 | baseline | base-s0 (`{ids['base-s0'][:8]}`) | 0.100 / 0.000 (not learned) | `{f}` |",
        f"| w8s8 | baseline | base-s1 (`{ids['base-s1'][:8]}`) | 0.800 / 0.300 | `{f}` |",
        f"| w8s8 | baseline | base-s2 (`{ids['base-s2'][:8]}`) | 0.700 / 0.200 | `{f}` |",
        f"| w8s8 | shift | arm-s0 (`{ids['arm-s0'][:8]}`) | **0.950 / 0.900** | `{f}` |",
        f"| w8s8 | shift | arm-s1 (`{ids['arm-s1'][:8]}`) | 0.600 / 0.580 | `{f}` |",
        f"| w8s8 | shift | arm-s2 (`{ids['arm-s2'][:8]}`) | 0.900 / 0.500 | `{f}` |"]


def test_a_comparison_pools_an_old_folders_arm_code_with_todays_runs_of_that_arm(tmp_path):
    """An old folder (no decisive_runs.csv) holds the bridge under its old code `w9_spread`, seeds 0-1, and the
    baseline; a newer folder holds runs of `bridge` itself, seed 2. A comparison joining both (skip_known) pools the
    three seeds into one `bridge` row, so that its table and the results page count the same seeds; joined plainly
    (a report's `join=`), the old row stays as it was. By hand: the bar is the baseline's prefix mean (0.8 + 0.7) / 2
    = 0.75; s0 (0.95 / 0.9) meets it, s1 (0.9 / 0.5) does not (0.5 < 0.81), s2 (0.9 / 0.85) does: 2 of 3, mean
    (0.95 + 0.9 + 0.9) / 3. The worst phase other than the boundary is known for s2 only, so the pooled row has none
    (a mean over one seed would stand beside a worst over three)."""
    import csv

    from phasefix.tables import joined_rows, write_csv

    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    ids = {n: str(i) * 8 + "b" * 24 for i, n in enumerate(("base-s0", "base-s1", "w9-s0", "w9-s1"))}
    scores = {"base-s0": (0.8, 0.3), "base-s1": (0.7, 0.2), "w9-s0": (0.95, 0.9), "w9-s1": (0.9, 0.5)}
    with open(old / "comparison.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["run_id", "run_name", "kind", "padding", "acc_mean", "acc_worst", "acc_gap", "period_detected"])
        for n, (mean, worst) in scores.items():
            w.writerow([ids[n], n, "fit", "prefix", mean, worst, mean - worst, 8])
    write_csv(old / "decisive.csv", [
        {**_drow("w8s8", "baseline", "prefix", 2, 2, 0.75, 0.25, 0), "run_ids": f"{ids['base-s0'][:8]} "
                                                                                f"{ids['base-s1'][:8]}"},
        {**_drow("w8s8", "w9_spread", "prefix", 2, 2, 0.925, 0.7, 1),
         "run_ids": f"{ids['w9-s0'][:8]} {ids['w9-s1'][:8]}"}], (*decisive.COLUMNS, "table"))
    s2 = {"run_id": "c" * 32, "run_name": "w8s8-bridge-s2", "regime": "w8s8", "arm": "bridge", "padding": "prefix",
          "learned": True, "acc_mean": 0.9, "acc_worst": 0.85, "worst_excl_boundary": 0.88, "acc_gap": 0.05,
          "period_detected": 8, "train_seconds": 10.0, "lm_loss": math.nan, "compressor_flops_per_token": 1000.0,
          "cache_entries_per_token": 0.5, "table": ""}
    write_csv(new / "decisive_runs.csv", [s2], decisive.MEMBER_COLUMNS)
    write_csv(new / "decisive.csv", [_drow("w8s8", "bridge", "prefix", 1, 1, 0.9, 0.85, 1)],
              (*decisive.COLUMNS, "table"))

    rows, members = joined_rows([str(old), str(new)], set(), set(), ["w8s8"], skip_known=True)
    got = {(r["arm"], r["padding"]): r for r in decisive.decisive_rows(members, rows)}
    assert sorted(got) == [("baseline", "prefix"), ("bridge", "prefix")]
    bridge = got[("bridge", "prefix")]
    assert (bridge["seeds"], bridge["learned"], bridge["goal_met"]) == (3, 3, 2)
    assert bridge["acc_mean"] == pytest.approx((0.95 + 0.9 + 0.9) / 3) and math.isnan(bridge["worst_excl_boundary"])
    plain, _ = joined_rows([str(old)], set(), set(), ["w8s8"])
    assert {r["arm"] for r in plain} == {"baseline", "w9_spread"}


def test_a_document_quotes_the_headline_as_written_and_a_bad_document_is_refused_before_any_work(tmp_path):
    """`into=` rewrites only the text between `<!-- quote: PATH -->` (PATH relative to the document) and
    `<!-- /quote -->` when PATH is a file of out=; other quotes and the rest of the document stay as they were; a
    document without a quote of out=, or with an unclosed quote, is refused in one line before out= is written."""
    from phasefix.errors import ConfigError
    from phasefix.report import report
    from phasefix.tables import write_csv

    a = tmp_path / "a"
    a.mkdir()
    write_csv(a / "decisive.csv", [_drow("w4s4", "baseline", "prefix", 3, 2, 0.8, 0.3, 0),
                                   _drow("w4s4", "token_shift", "prefix", 3, 3, 1.0, 0.95, 3)], decisive.COLUMNS)
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "results.md"
    other = "<!-- quote: ../a/decisive.md -->\nkept by hand\n<!-- /quote -->\n"
    doc.write_text("# Results\n\nintro\n<!-- quote: ../h/headline.md -->\n| old | table |\n|---|---|\n"
                   "<!-- /quote -->\nafter\n" + other)
    report({"tables": [str(a)], "out": str(tmp_path / "h"), "into": str(doc)})
    headline = (tmp_path / "h" / "headline.md").read_text()
    expected = ("# Results\n\nintro\n<!-- quote: ../h/headline.md -->\n\n" + headline.strip("\n")
                + "\n\n<!-- /quote -->\nafter\n" + other)
    assert doc.read_text() == expected
    assert "| w4s4 | token_shift | prefix | 3/3 | 1.000 | 0.950 |" in doc.read_text()
    report({"tables": [str(a)], "out": str(tmp_path / "h"), "into": str(doc)})  # again: the same document
    assert doc.read_text() == expected
    for text, says in (("# Results\n| old |\n", "has no line <!-- quote: PATH --> of a file in out="),
                       ("<!-- quote: ../h2/headline.md -->\n| old |\n", "leaves the quote of .* open"),
                       ("<!-- /quote -->\n", "closes a quote that is not open")):
        bad = tmp_path / "docs" / "bad.md"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=says):
            report({"tables": [str(a)], "out": str(tmp_path / "h2"), "into": str(bad)})
        assert not (tmp_path / "h2").exists() and bad.read_text() == text
    with pytest.raises(ConfigError, match="is not a file"):
        report({"tables": [str(a)], "out": str(tmp_path / "h2"), "into": str(tmp_path / "none.md")})
    with pytest.raises(ConfigError, match="add out="):
        report({"tables": [str(a)], "into": str(doc)})


def test_the_headline_figure_draws_each_regimes_runs_in_its_own_panel_and_counts_the_goal_by_hand():
    """Two regimes: w4s4's arm has one run meeting the goal (0.95 / 0.9) and one under the mean bar 0.85 (0.8 /
    0.8, worst 1.0 x mean but mean < bar); w8s8's arm one run that did not learn (hollow) and one meeting it. In-
    sequence members and a run with no mean are not drawn."""
    def member(regime, arm, mean, worst, learned=True, padding="prefix"):
        return {"regime": regime, "arm": arm, "padding": padding, "learned": learned, "acc_mean": mean,
                "acc_worst": worst}

    members = [member("w4s4", "baseline", 0.85, 0.2), member("w4s4", "t5", 0.95, 0.9), member("w4s4", "t5", 0.8, 0.8),
               member("w8s8", "baseline", 0.7, 0.3), member("w8s8", "w9_spread", 0.1, 0.05, learned=False),
               member("w8s8", "w9_spread", 0.99, 0.95), member("w8s8", "w9_spread", math.nan, math.nan),
               member("w8s8", "w9_spread", 0.5, 0.5, padding="in_sequence")]
    fig = plots.headline_worst_vs_mean(members, {("w4s4", "prefix"): 0.85, ("w8s8", "prefix"): 0.7})
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["w4s4\nt5", "w8s8\nw9_spread"]
    for ax, points, hollow, met in ((panels[0], {(0.85, 0.2), (0.95, 0.9), (0.8, 0.8)}, 0, "goal met 1/2"),
                                    (panels[1], {(0.7, 0.3), (0.1, 0.05), (0.99, 0.95)}, 1, "goal met 1/2")):
        drawn = [c for c in ax.collections if isinstance(c, PathCollection)]  # one scatter per run
        assert {tuple(round(float(v), 6) for v in c.get_offsets()[0]) for c in drawn} == points
        assert sum(len(c.get_facecolors()) == 0 for c in drawn) == hollow  # not learned: no fill
        assert [t.get_text() for t in ax.texts] == [met]
    matplotlib.pyplot.close(fig)
