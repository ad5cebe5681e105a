"""The verdict: every rule that says whether a run, an arm or a fix is good enough, in one place and without I/O.
Every table, page, plot, study confirm and staging decision asks this module; a column named `goal_met` counts
`meets_goal` and nothing else.

- **chance**: 1 / data.num_values (the key-value lookup answers one of num_values values).
- **learned**: the prefix-padding mean is at least `LEARNED_FACTOR` x chance (answering by elimination scores at most
  2 / num_records, below that line: the evaluation demonstrates at most half the records).
- **the unmitigated reference** (the goal's bar) of a regime and padding: the mean accuracy of the unmitigated arm
  (`BASELINE_ARM`) over its seeds that learned; nan (no bar) when none learned. The staging rule uses the same
  reference over the first seeds.
- **goal met** (one run, one padding): it learned, its worst residue is >= `GOAL_RATIO` x its mean (`flat`), and its
  mean is not below the reference. A seed meets the goal when it does on every padding it was scored on.
- **qualifies** (staging, `then:` seeds): every first seed learned and their mean is not below the reference.
- **free** (the unmitigated cost): the same cache entries and bytes per token, <= `FREE_MACS` x the compressor
  multiply-adds.
- **the rate** of an arm: k of n seeds meeting the goal, with a 95% Wilson interval; **the recommendation** of a
  regime is the arm whose interval's lower end is highest, ties broken by the least cost (bytes, entries, MACs),
  provisional when it rests on fewer than `MIN_SEEDS` seeds; **reliable** when it meets the goal on at least
  `RELIABLE_SHARE` of at least `MIN_SEEDS` seeds (7 of 8: issues 66 and 70), short of it otherwise. Beside it the
  page lists the arms that met the goal on every seed scored and the arms rated on `MIN_SEEDS` seeds or more.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

LEARNED_FACTOR = 5.0
GOAL_RATIO = 0.9  # worst >= GOAL_RATIO x mean
BASELINE_ARM = "baseline"  # the unmitigated model
FREE_MACS = 1.02  # issue 54's "unmitigated cost": at most +2% compressor multiply-adds, same entries and bytes
MIN_SEEDS = 8  # a recommendation on fewer seeds is provisional (issue 70)
RELIABLE_SHARE = 7 / 8  # the issues' bar for a fix to rely on: the goal met on >= 7 of 8 seeds
Z95 = 1.959963984540054  # the standard normal's 97.5% quantile: a two-sided 95% interval


def chance(num_values: float) -> float:
    """Chance accuracy of the lookup: one of `num_values` values (nan when unknown)."""
    return 1.0 / num_values if num_values and num_values > 0 else math.nan


def learned(prefix_mean: float, num_values: float) -> bool:
    return prefix_mean >= LEARNED_FACTOR * chance(num_values)


def flat(mean: float, worst: float) -> bool:
    """The goal's first half: the worst residue is at least GOAL_RATIO x the mean."""
    return worst >= GOAL_RATIO * mean


def reference(means: Iterable[float], learned_flags: Iterable[bool]) -> float:
    """The unmitigated reference: the mean over the unmitigated seeds that learned (nan: none learned, no bar)."""
    got = [m for m, ok in zip(means, learned_flags) if ok and not math.isnan(m)]
    return statistics.fmean(got) if got else math.nan


def meets_goal(is_learned: bool, mean: float, worst: float, bar: float) -> bool:
    """One run on one padding: learned, flat, and its mean no lower than `bar` (the reference; nan: no bar)."""
    return bool(is_learned) and flat(mean, worst) and not (mean < bar)


def member_meets_goal(member: Mapping, bar: float) -> bool:
    """`meets_goal` of a table member ({learned, acc_mean, acc_worst}: one run and padding)."""
    return meets_goal(member["learned"], member["acc_mean"], member["acc_worst"], bar)


def seed_meets_goal(by_padding: Mapping[str, bool]) -> bool:
    """A seed meets the goal when it does on every padding it was scored on (and it was scored on one)."""
    return bool(by_padding) and all(by_padding.values())


def qualifies(arm: str, first_means: Sequence[float], baseline_first_means: Sequence[float],
              num_values: float) -> tuple[bool, str]:
    """The staging rule: whether an arm goes on to its `then` seeds, from the prefix means of its first seeds and of
    the unmitigated arm's (nan: not scored); (yes or no, why)."""
    if arm == BASELINE_ARM:
        return True, "the unmitigated reference"
    if not all(learned(m, num_values) for m in first_means):
        return False, "did not learn on its first seed(s)"
    bar = reference(baseline_first_means, [learned(m, num_values) for m in baseline_first_means])
    if statistics.fmean(first_means) < bar:
        return False, "mean below the unmitigated mean"
    return True, "learned, mean not below the unmitigated mean"


@dataclass(frozen=True)
class Cost:
    """What an arm costs per token, summed over layers: compressed-cache bytes, cache entries, compressor MACs."""
    cache_bytes: float
    entries: float
    macs: float

    def key(self) -> tuple[float, float, float]:
        """The order of costs: bytes first (what a cache holds), then entries, then compressor work."""
        return self.cache_bytes, self.entries, self.macs


def free(cost: Cost, unmitigated: Cost) -> bool:
    """At the unmitigated model's cost: the same cache entries and bytes per token, <= FREE_MACS x its MACs."""
    return math.isclose(cost.cache_bytes, unmitigated.cache_bytes) and math.isclose(cost.entries, unmitigated.entries) \
        and cost.macs <= FREE_MACS * unmitigated.macs


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion k / n (nan, nan for n = 0)."""
    if n <= 0:
        return math.nan, math.nan
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Rate:
    """k of n seeds meeting the goal, with its 95% Wilson interval."""
    k: int
    n: int

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.k, self.n)

    @property
    def provisional(self) -> bool:
        return self.n < MIN_SEEDS

    @property
    def every_seed(self) -> bool:
        return self.n > 0 and self.k == self.n

    @property
    def reliable(self) -> bool:
        return not self.provisional and self.k >= RELIABLE_SHARE * self.n

    def text(self, say_provisional: bool = True) -> str:
        """"k of n seeds (95% CI lo-hi)", and ", provisional: < 8" below MIN_SEEDS seeds (unless `say_provisional`
        is off: a list of candidates says it once), ", short of 7 of 8" on enough seeds but below RELIABLE_SHARE."""
        lo, hi = self.interval
        return f"{self.k} of {self.n} seeds (95% CI {lo:.2f}-{hi:.2f})" + (
            (f", provisional: < {MIN_SEEDS}" if say_provisional else "") if self.provisional else
            "" if self.reliable else f", short of {round(RELIABLE_SHARE * MIN_SEEDS)} of {MIN_SEEDS}")


@dataclass(frozen=True)
class Recommendation:
    arm: str | None  # None: no arm meets the goal on any seed
    rate: Rate | None
    alternatives: tuple[str, ...]  # the other arms meeting the goal on every seed scored or rated on MIN_SEEDS+ seeds


def rank(arms: Mapping[str, tuple[Rate, Cost]]) -> list[str]:
    """The arms best first: highest Wilson lower bound, then least cost, then name."""
    return sorted(arms, key=lambda a: (-arms[a][0].interval[0], arms[a][1].key(), a))


def recommend(arms: Mapping[str, tuple[Rate, Cost]]) -> Recommendation:
    """A regime's recommendation from its arms' rates and costs (the unmitigated arm included: it is recommended
    when nothing beats it): the first of `rank`, if any of its seeds met the goal; the alternatives, best first, are
    the other arms that met it on every seed scored and those rated on MIN_SEEDS seeds or more (the rates a reader
    weighs the recommendation against; where it falls short of 7 of 8, the least cost that reaches it is among them)."""
    order = [a for a in rank(arms) if arms[a][0].k > 0]
    if not order:
        return Recommendation(None, None, ())
    best = order[0]
    return Recommendation(best, arms[best][0], tuple(a for a in order[1:] if arms[a][0].every_seed
                                                      or not arms[a][0].provisional))


__all__ = ["BASELINE_ARM", "Cost", "FREE_MACS", "GOAL_RATIO", "LEARNED_FACTOR", "MIN_SEEDS", "RELIABLE_SHARE", "Rate",
           "Recommendation", "chance", "flat", "free", "learned", "meets_goal", "member_meets_goal", "qualifies",
           "rank", "recommend", "reference", "seed_meets_goal", "wilson"]
