"""The verdict's rules (phasefix.verdict) on hand-computed cases."""
import math

import pytest

from phasefix import verdict
from phasefix.verdict import Cost, Rate


def test_learned_is_five_times_chance():
    assert verdict.chance(32) == 1 / 32 and math.isnan(verdict.chance(float("nan")))
    assert verdict.learned(5 / 32, 32) and not verdict.learned(4.9 / 32, 32)


def test_goal_needs_learned_flat_and_the_unmitigated_mean():
    # the reference: the mean over the unmitigated seeds that learned (0.80, 0.90; not 0.05)
    bar = verdict.reference([0.80, 0.90, 0.05], [True, True, False])
    assert bar == pytest.approx(0.85)
    assert verdict.meets_goal(True, 0.95, 0.90, bar)       # 0.90 >= 0.855, 0.95 >= 0.85
    assert not verdict.meets_goal(True, 0.84, 0.80, bar)   # flat, but below the reference
    assert not verdict.meets_goal(True, 0.90, 0.70, bar)   # 0.70 < 0.81
    assert not verdict.meets_goal(False, 0.95, 0.90, bar)  # did not learn
    assert math.isnan(verdict.reference([0.05], [False]))
    assert verdict.meets_goal(True, 0.5, 0.45, math.nan)   # no reference: no bar
    assert verdict.seed_meets_goal({"prefix": True, "in_sequence": True})
    assert not verdict.seed_meets_goal({"prefix": True, "in_sequence": False}) and not verdict.seed_meets_goal({})


def test_staging_uses_the_same_reference():
    # num_values 32: learned at >= 0.15625. The unmitigated first seeds 0.80 and 0.10 (not learned): bar 0.80.
    assert verdict.qualifies("spread", [0.82], [0.80, 0.10], 32) == (True, "learned, mean not below the unmitigated mean")
    assert verdict.qualifies("spread", [0.79], [0.80, 0.10], 32)[1] == "mean below the unmitigated mean"
    assert verdict.qualifies("spread", [0.82, 0.1], [0.80], 32)[1] == "did not learn on its first seed(s)"
    assert verdict.qualifies("spread", [0.5], [math.nan], 32)[0]  # no unmitigated seed scored: no bar
    assert verdict.qualifies("baseline", [0.0], [0.0], 32)[0]


def test_free_is_same_entries_and_bytes_and_at_most_two_percent_more_macs():
    base = Cost(128, 0.5, 33792)
    assert verdict.free(Cost(128, 0.5, 34304), base)  # +1.5%
    assert not verdict.free(Cost(128, 0.5, 38016), base)  # +12.5%
    assert not verdict.free(Cost(256, 0.5, 33792), base) and not verdict.free(Cost(128, 1.0, 33792), base)


def test_wilson_interval_by_hand():
    # 3 of 3, z = 1.96: centre (1 + z^2/6) / (1 + z^2/3) = 0.71926, half z sqrt(z^2/36) / (1 + z^2/3) = 0.28074
    lo, hi = verdict.wilson(3, 3)
    assert lo == pytest.approx(0.43850, abs=5e-5) and hi == 1.0
    # 7 of 8: p = 0.875, centre (0.875 + 0.24009) / 1.48018 = 0.75334,
    # half 1.96 sqrt(0.875 * 0.125 / 8 + 3.84146 / 256) / 1.48018 = 0.22424
    lo, hi = verdict.wilson(7, 8)
    assert lo == pytest.approx(0.52911, abs=5e-5) and hi == pytest.approx(0.97762, abs=5e-5)
    assert verdict.wilson(0, 5)[0] == 0.0
    assert Rate(3, 3).text() == "3 of 3 seeds (95% CI 0.44-1.00), provisional: < 8"
    assert Rate(7, 8).text() == "7 of 8 seeds (95% CI 0.53-0.98)"
    # 6 of 8: centre (0.75 + 0.24009) / 1.48018 = 0.66890, half 1.96 sqrt(0.75 * 0.25 / 8 + 3.84146 / 256) / 1.48018
    # = 0.25963: enough seeds, below the 7 of 8 a fix is relied on at
    assert Rate(6, 8).text() == "6 of 8 seeds (95% CI 0.41-0.93), short of 7 of 8"
    assert Rate(7, 8).reliable and Rate(8, 9).reliable and not Rate(7, 9).reliable and not Rate(3, 3).reliable


def test_the_recommendation_is_the_highest_lower_bound_then_the_least_cost():
    cheap, dear = Cost(64, 0.5, 100), Cost(64, 0.5, 112)
    arms = {"baseline": (Rate(0, 3), cheap), "bridge": (Rate(3, 3), dear), "spread": (Rate(3, 3), cheap),
            "shift": (Rate(2, 3), cheap)}
    rec = verdict.recommend(arms)
    assert rec.arm == "spread" and rec.alternatives == ("bridge",)  # tie on 3 of 3: the cheaper
    arms["bridge"] = (Rate(8, 8), dear)  # more seeds, a higher lower bound (0.68 > 0.44): the costlier wins
    assert verdict.recommend(arms).arm == "bridge" and verdict.recommend(arms).alternatives == ("spread",)
    assert verdict.recommend({"baseline": (Rate(0, 3), cheap)}).arm is None
    # beside the recommendation, an arm rated on 8 seeds counts though it missed some (the reader weighs its rate);
    # one on 3 seeds that missed one does not
    arms = {"baseline": (Rate(0, 3), cheap), "late": (Rate(6, 8), cheap), "bridge": (Rate(6, 8), dear),
            "slots": (Rate(4, 8), cheap), "shift": (Rate(2, 3), cheap)}
    assert verdict.recommend(arms) == verdict.Recommendation("late", Rate(6, 8), ("bridge", "slots"))


def test_every_committed_goal_met_is_the_verdicts():
    """Every committed table that says how many seeds met the goal (a `goal_met` column: decisive.csv, headline.csv)
    says what `verdict.meets_goal` says of its runs, recounted here from each folder's runs (decisive_runs.csv, or
    comparison.csv for older folders) against the unmitigated reference of that folder; and no other committed table
    has a `goal_met` column (seeds.csv counts `flat` seeds: it knows no regime, so no reference)."""
    import csv

    from phasefix import decisive
    from phasefix.paths import PROJECT_ROOT
    from phasefix.tables import DECISIVE_CSV, HEADLINE_CSV, folder_members, read_table, same_folder

    checked = 0
    for path in sorted(PROJECT_ROOT.glob("docs/figures/**/*.csv")) + sorted(PROJECT_ROOT.glob("studies/**/*.csv")):
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        if "goal_met" not in header:
            continue
        assert path.name in (DECISIVE_CSV, HEADLINE_CSV), f"{path} has a goal_met column the verdict does not count"
        if path.name != DECISIVE_CSV:
            continue  # a headline's rows are copies of decisive.csv rows (test_comparisons checks the copy)
        rows, members = read_table(path.parent), folder_members(path.parent)
        bars = decisive.baseline_means(members, rows)
        for r in rows:
            if r.get("table") and not same_folder(PROJECT_ROOT / r["table"], path.parent):
                continue  # a row joined from another folder: counted there
            runs = [m for m in members if (m["regime"], m["arm"], m["padding"]) == (r["regime"], r["arm"], r["padding"])]
            if runs:
                bar = bars.get((r["regime"], r["padding"]), math.nan)
                assert r["goal_met"] == sum(verdict.member_meets_goal(m, bar) for m in runs), (path, r["arm"])
                checked += 1
    assert checked > 250
