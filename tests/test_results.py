"""The results page's costs against hand-computed ones (phasefix.results)."""
from phasefix.results import arm_overrides, cache_bytes


def test_costs_of_the_w4s4_winner_by_hand():
    # tiny: 2 layers, 2 KV heads of dim 32, W4/S4 -> bridge W5/S4; an entry is a key and a value vector in bf16
    assert cache_bytes("w4s4", "baseline") == 2 * 2 / 4 * 2 * 32 * 2 == 128
    assert cache_bytes("w4s4", "bridge_gate_diversity") == 128  # the bridge writes as many entries
    assert cache_bytes("records64", "bridge_shift_wide") == 2 * 2 / 8 * 2 * 64 * 2 == 128  # 64-dim heads, S = 8
    assert cache_bytes("records64", "baseline") == 64


def test_the_arm_legend_reads_conf_arm():
    assert arm_overrides("bridge") == "model.window=S+1 model.head_offsets=spread"
    assert arm_overrides("baseline").startswith("(nothing")
    # an arm composed of arms (conf/arm/shift_spread_head_coord.yaml: shift_spread = spread + shift, then the term)
    assert arm_overrides("shift_spread_head_coord") == \
        "model.head_offsets=spread model.token_shift=2 +mitigation=head_coord"
    assert arm_overrides("shift_spread_late_head_coord") == "model.head_offsets=spread model.token_shift=2 " \
        "+mitigation=head_coord mitigation.head_coord.start_step=1000 mitigation.head_coord.ramp_steps=500"


def test_mechanism_links_one_line_per_regime_in_the_comparisons_order(tmp_path, monkeypatch):
    import re
    from types import SimpleNamespace

    from phasefix import results
    out = tmp_path / "docs" / "figures" / "cmp"
    for cell in ("records64-spread-s0", "records64-baseline-s0", "records64-anchor-s0", "w4s4_inseqfirst-spread-s3"):
        (out / "mechanism" / cell).mkdir(parents=True)
    monkeypatch.setattr(results, "PROJECT_ROOT", tmp_path)
    comp = SimpleNamespace(out=out, regimes=[SimpleNamespace(name="w4s4_inseqfirst"), SimpleNamespace(name="records64")])
    items = [line for line in results.mechanism_links(comp) if line.startswith("- ")]
    assert [re.findall(r"^- (\w+)|`([^`]+)`", line) for line in items] == [
        [("w4s4_inseqfirst", ""), ("", "spread-s3")],
        [("records64", ""), ("", "baseline-s0"), ("", "anchor-s0"), ("", "spread-s0")]]  # the unmitigated run first
    assert "[gates](figures/cmp/mechanism/records64-baseline-s0/gates.png)" in items[1]
    assert results.mechanism_links(SimpleNamespace(out=tmp_path / "docs" / "none", regimes=[])) == []


def _member(run_id, seed, arm, pad, mean, worst, flops, learned=True):
    return {"run_id": run_id, "run_name": f"w8-{arm}-s{seed}", "regime": "w8s8", "arm": arm, "padding": pad,
            "learned": learned, "acc_mean": mean, "acc_worst": worst, "worst_excl_boundary": worst,
            "acc_gap": mean - worst, "period_detected": 8, "train_seconds": 1.0, "lm_loss": float("nan"),
            "compressor_flops_per_token": flops, "cache_entries_per_token": 0.5, "table": ""}


def test_seeds_pool_across_comparisons_once_each_and_the_rule_picks_the_highest_lower_bound(tmp_path):
    """Folder a (a headline table): the unmitigated w8s8 on seeds 0-2 (0.80 / 0.30: a weak phase) and `bridge` on
    seeds 0-2 (0.95 / 0.93). Folder b (a comparison's own table) repeats baseline seed 0 (the same run) and has
    `spread` on seeds 0-2, seed 1 missing the goal in-sequence (worst 0.50 < 0.9 x 0.95). Folder c re-scores bridge
    seed 0 worse after a: it counts once, from a. By hand: baseline 0 of 3, bridge 3 of 3 (Wilson lower 0.44),
    spread 2 of 3 (lower 0.21): bridge is recommended though it costs +12.5% MACs, and no arm is an alternative. The
    same regime at 4,500 steps is its own row (its seeds are not the 3,000-step ones)."""
    from types import SimpleNamespace

    from phasefix import decisive, results
    from phasefix.tables import write_csv

    pads = ("prefix", "in_sequence")
    a = [_member(f"b{s}", s, "baseline", p, 0.80, 0.30, 33792.0) for s in range(3) for p in pads]
    a += [_member(f"r{s}", s, "bridge", p, 0.95, 0.93, 38016.0) for s in range(3) for p in pads]
    b = [m for m in a if m["run_id"] == "b0"]
    b += [_member(f"s{s}", s, "spread", p, 0.95, 0.50 if (s, p) == (1, "in_sequence") else 0.94, 33792.0)
          for s in range(3) for p in pads]
    c = [_member("r0-again", 0, "bridge", p, 0.95, 0.10, 38016.0) for p in pads]
    for name, members in (("a", a), ("b", b), ("c", c), ("long", a)):
        (tmp_path / name).mkdir()
        write_csv(tmp_path / name / "decisive_runs.csv", members, decisive.MEMBER_COLUMNS)
        write_csv(tmp_path / name / "decisive.csv", [], decisive.COLUMNS)
    regime = SimpleNamespace(name="w8s8", steps=None, tables=[str(tmp_path / "c")])
    comps = [SimpleNamespace(tables=[f"{tmp_path / 'a'}:w8s8"], regimes=[SimpleNamespace(name="w8s8", steps=None,
                                                                                         tables=[])], out=None),
             SimpleNamespace(tables=[], regimes=[regime], out=tmp_path / "b"),
             SimpleNamespace(tables=[], regimes=[SimpleNamespace(name="w8s8", steps=4500, tables=[])],
                             out=tmp_path / "long")]
    pooled = results.pooled_members(comps, {"baseline", "bridge", "spread"})
    assert list(pooled) == [results.Regime("w8s8"), results.Regime("w8s8", 4500)]
    [(regime, rec, arms), (long, long_rec, _)] = results.recommendations(pooled)
    assert {a: (r.k, r.n) for a, (r, _) in arms.items()} == {"baseline": (0, 3), "bridge": (3, 3), "spread": (2, 3)}
    assert rec.arm == "bridge" and rec.alternatives == () and rec.rate.text().startswith("3 of 3 seeds (95% CI 0.44-")
    assert long.label() == "w8s8 (4,500 steps)" and long_rec.arm == "bridge"  # the same runs: another regime's
    lines = results.answer(results.recommendations(pooled))
    [line] = [x for x in lines if x.startswith("| w8s8 |")]
    # on 3 seeds the pick is a candidate, not a recommendation: no "use" table, its row under the candidates'
    assert lines[0] == "No regime is rated on 8+ seeds yet." and not any("| use |" in x for x in lines)
    assert lines.index(line) > next(i for i, x in enumerate(lines) if "| candidate |" in x)
    assert line == "| w8s8 | `bridge` | 3 of 3 seeds (95% CI 0.44-1.00) | MACs +12.5%, bytes same | - |"


def test_the_readme_figure_draws_the_committed_curves_of_the_unmitigated_run_and_the_recommended_arm(tmp_path):
    """A folder as `phasefix.report out=` leaves it (decisive_runs.csv, phase_curves.csv: written and read back by
    tables.write_curves / read_curves): the unmitigated w4s4 run dips at the boundary phase 3, the arm's is flat; the
    figure has one panel per run, the unmitigated first, each drawing the curves it was given."""
    import matplotlib

    from phasefix import decisive, results, verdict
    from phasefix.tables import read_curves, write_csv, write_curves

    dip, flat = [1.0, 1.0, 1.0, 0.2] * 6, [1.0] * 24
    members = [{**_member("base0", 3, "baseline", p, 0.8, 0.2, 33792.0), "regime": "w4s4"} for p in ("prefix",)]
    members += [{**_member("arm0", 3, "bridge_gate_diversity", "prefix", 1.0, 1.0, 42240.0), "regime": "w4s4"}]
    write_csv(tmp_path / "decisive_runs.csv", members, decisive.MEMBER_COLUMNS)
    write_curves(tmp_path, {("base0", "prefix"): dip, ("arm0", "prefix"): flat})
    assert read_curves(tmp_path) == {("base0", "prefix"): dip, ("arm0", "prefix"): flat}
    rec = verdict.recommend({"baseline": (verdict.Rate(0, 3), verdict.Cost(128, 1, 33792)),
                             "bridge_gate_diversity": (verdict.Rate(3, 3), verdict.Cost(128, 1, 42240))})
    fig = results.readme_figure([(results.Regime("w4s4"), rec, {})], tmp_path)
    left, right = fig.axes
    assert left.get_title().startswith("w4s4, arm=baseline") and right.get_title().startswith(
        "w4s4, arm=bridge_gate_diversity")
    assert [list(line.get_ydata()) for line in left.lines] == [dip]
    assert [list(line.get_ydata()) for line in right.lines] == [flat]
    matplotlib.pyplot.close(fig)
    assert results.readme_figure([(results.Regime("w4s4"), rec, {})], tmp_path / "none") is None


def test_a_regime_another_comparison_pools_with_later_seeds_is_shown_in_that_comparisons_section_only(tmp_path):
    """Comparison `a` trained regimes w8s8 and w4s4; `b` trained more seeds of w8s8 and joins `a`'s folder for it
    (its table pools a's runs), but has no cell of w4s4 yet, though it lists a's folder there too. So w8s8 is left to
    b's section, w4s4 stays in a's, and b leaves nothing to anyone. On the committed page no regime's rows stand in
    two comparison sections."""
    from types import SimpleNamespace

    from phasefix import decisive, results
    from phasefix.paths import PROJECT_ROOT
    from phasefix.tables import write_csv

    def folder(name, rows):
        (tmp_path / name).mkdir()
        write_csv(tmp_path / name / "decisive.csv", [{"regime": r, "arm": "spread", "padding": "prefix", "seeds": 3,
                                                      "learned": 3, "goal_met": 3, "acc_mean": 1.0, "acc_worst": 1.0,
                                                      "table": str(tmp_path / t)} for r, t in rows],
                  (*decisive.COLUMNS, "table"))
        return tmp_path / name

    a = SimpleNamespace(name="a", out=folder("a", [("w8s8", "a"), ("w4s4", "a")]),
                        regimes=[SimpleNamespace(name="w8s8", tables=[]), SimpleNamespace(name="w4s4", tables=[])])
    b = SimpleNamespace(name="b", out=folder("b", [("w8s8", "b"), ("w4s4", "a")]),
                        regimes=[SimpleNamespace(name="w8s8", tables=[str(a.out)]),
                                 SimpleNamespace(name="w4s4", tables=[str(a.out)])])
    assert results.own_regimes(a) == {"w8s8", "w4s4"} and results.own_regimes(b) == {"w8s8"}
    assert results.pooled_elsewhere(a, [a, b]) == {"w8s8": "b"} and results.pooled_elsewhere(b, [a, b]) == {}

    comps = {c.name: c for c in results.load() if not c.tables}
    shown = []  # per comparison section: the (regime, steps) of its matrix rows
    for section in (PROJECT_ROOT / "docs" / "results.md").read_text().split("\n## "):
        if section.split(":")[0] in comps:
            steps = {r.name: r.steps for r in comps[section.split(":")[0]].regimes}
            names = {line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")}
            shown.append({(n, steps.get(n)) for n in names - {"regime", "arm"}})
    assert len(shown) >= 2 and all(not (x & y) for i, x in enumerate(shown) for y in shown[i + 1:])


def test_a_runs_seed_is_read_from_its_name_by_one_rule():
    from phasefix.tables import seed_in_name

    assert [seed_in_name(n) for n in ("w8s8-bridge-s3", "coverage_w8s8_curric-spread-s12-pr192", "w4s4-t5",
                                      "w4s4-s2x", "")] == [3, 12, None, None, None]


def test_only_a_pick_rated_on_8_seeds_is_a_recommendation_the_rest_are_candidates():
    from phasefix import results, verdict

    cost = verdict.Cost(128, 0.5, 33792)
    rated = {"baseline": (verdict.Rate(0, 8), cost), "spread": (verdict.Rate(8, 8), cost)}
    few = {"baseline": (verdict.Rate(0, 3), cost), "spread": (verdict.Rate(3, 3), cost)}
    none = {"baseline": (verdict.Rate(0, 3), cost), "spread": (verdict.Rate(0, 3), cost)}
    recs = [(results.Regime(name), verdict.recommend(arms), arms)
            for name, arms in (("a", rated), ("b", few), ("c", none))]
    lines = results.answer(recs)
    use, candidate = lines.index(next(x for x in lines if "| use |" in x)), \
        lines.index(next(x for x in lines if "| candidate |" in x))
    assert use == 0 and lines[2] == "| a | `spread` | 8 of 8 seeds (95% CI 0.68-1.00) | MACs same, bytes same | - |"
    assert lines[candidate + 2] == "| b | `spread` | 3 of 3 seeds (95% CI 0.44-1.00) | MACs same, bytes same | - |"
    assert lines[-1] == "No arm meets the goal on any seed in c."
    readme = results.readme_part(recs)
    assert readme.index("in a: 8 of 8") < readme.index("Candidates, on fewer than 8 seeds") < readme.index("in b: 3 of 3")
