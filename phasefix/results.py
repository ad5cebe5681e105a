"""docs/results.md, generated from the committed tables (no MLflow): first the answer (per regime: the arm to use,
what it costs, how many seeds meet the goal), then the regime x arm matrix, the arm legend (conf/arm/) and links to
each committed table.

    python -m phasefix.report results=docs/results.md

The sources are the comparison files (comparisons/*.yaml): the headline's committed folders (`tables:`) and, for
any other comparison whose folder (`out:`) holds a `decisive.csv`, that table. Arm codes of tables written before
conf/arm/ existed are shown under today's names (`phasefix.comparison.ARM_NAMES`).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from omegaconf import OmegaConf

from phasefix.comparison import BASELINE_ARM, GOAL_RATIO, arm_name, read_table
from phasefix.paths import CONF_DIR, PROJECT_ROOT

PADS = ("prefix", "in_sequence")
BYTES_PER_VALUE = 2  # a cache entry's vectors stored in bf16
FREE_MACS = 1.02  # issue 54's "unmitigated cost": at most +2% compressor multiply-adds, same entries and bytes


def arm_overrides(arm: str) -> str:
    """conf/arm/<arm>.yaml as the overrides it amounts to (`model.window=S+1` for the stride-following window; an
    arm composed of other arms, by its defaults list, as theirs and then its own)."""
    return " ".join(_arm_words(arm)) or "(nothing: the regime as it is)"


STRIDE_RULES = {"${plus_one:": "S+1", "${double:": "2S"}  # the stride-following windows, as the tables write them


def _arm_words(arm: str) -> list[str]:
    node = OmegaConf.load(CONF_DIR / "arm" / f"{arm}.yaml")
    words = []
    for d in node.get("defaults", []):
        if isinstance(d, Mapping):  # `- /mitigation: NAME`
            words.append(f"+mitigation={next(iter(d.values()))}")
        elif d != "_self_":  # another arm
            words.extend(_arm_words(str(d)))
    body = OmegaConf.to_container(node, resolve=False)
    body.pop("defaults", None)

    def walk(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from walk(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v
    for key, value in walk(body):
        if isinstance(value, str):
            value = next((rule for start, rule in STRIDE_RULES.items() if value.startswith(start)), value)
        if isinstance(value, list):
            value = "[" + ",".join(str(v) for v in value) + "]"
        words.append(f"{key}={value}")
    return words


@functools.lru_cache(maxsize=None)  # one Hydra compose per cell, however many rows and sentences ask
def cache_bytes(regime: str, arm: str) -> float:
    """Compressed-cache bytes per token of a cell (entries per token x vectors per entry x head_dim, bf16)."""
    from phasefix.config import model_config
    from phasefix.fit import compose

    m = model_config(compose([f"regime={regime}", f"arm={arm}"]))
    return m.cache_entries_per_token() * (1 if m.tied_kv else 2) * m.head_dim * BYTES_PER_VALUE


def _rows(folder_spec: str) -> list[dict]:
    folder, _, regimes = folder_spec.partition(":")
    rows = read_table(PROJECT_ROOT / folder / "decisive.csv")
    wanted = [r for r in regimes.split("+") if r]
    return [{**r, "arm": arm_name(r["arm"]), "table": r.get("table") or folder} for r in rows
            if not wanted or r["regime"] in wanted]


def _by(rows, regime, arm, pad):
    return next((r for r in rows if (r["regime"], r["arm"], r["padding"]) == (regime, arm, pad)), None)


def _cell(r, excl: bool = False) -> str:
    if r is None:
        return "-"
    if not r["learned"]:
        return f"{r['goal_met']}/{r['seeds']} (not learned)"
    worst = "" if math.isnan(r["acc_worst"]) else f" / {r['acc_worst']:.2f}"
    if excl and not math.isnan(r["worst_excl_boundary"]):
        worst += f" / {r['worst_excl_boundary']:.2f}"
    return f"{r['goal_met']}/{r['seeds']} ({r['acc_mean']:.2f}{worst})"


def _pct(x: float, base: float, digits: int = 0) -> str:
    if not base or math.isclose(x, base, rel_tol=1e-9):
        return "same"
    return f"{100 * (x / base - 1):+.{digits}f}%"


def answer(rows: Sequence[Mapping]) -> list[str]:
    """The answer table: per regime, the best arm at the baseline's cache entries (the headline's choice), its cost
    and the seeds that meet the goal on each padding."""
    from phasefix.comparison import best_rows

    lines = ["| regime | use | seeds meeting the goal (prefix, in-sequence) | compressor MACs / token | "
             "cache entries / token | cache bytes / token |", "|---|---|---|---|---|---|"]
    best = best_rows(rows)
    for regime in dict.fromkeys(r["regime"] for r in best):
        arm = next((r["arm"] for r in best if r["regime"] == regime and r["arm"] != BASELINE_ARM), None)
        if arm is None:
            continue
        got = [_by(best, regime, arm, p) for p in PADS]
        base = [_by(best, regime, BASELINE_ARM, p) for p in PADS]
        one, b = next(r for r in got if r), next(r for r in base if r)
        met = ", ".join(f"{r['goal_met']}/{r['seeds']}" if r else "-" for r in got)
        macs, bmacs = one["compressor_flops_per_token"], b["compressor_flops_per_token"]
        by, bby = cache_bytes(regime, arm), cache_bytes(regime, BASELINE_ARM)
        entries, bentries = one["cache_entries_per_token"], b["cache_entries_per_token"]
        lines.append(f"| {regime} | `{arm}` | {met} | {macs:,.0f} ({_pct(macs, bmacs)}) | "
                     f"{entries:.3f} ({_pct(entries, bentries)}) | {by:,.0f} ({_pct(by, bby)}) |")
    return lines


def matrix(rows: Sequence[Mapping], arms: Sequence[str], costs: bool = False) -> list[str]:
    """Regime x arm: per padding, seeds meeting the goal of the seeds scored (mean / worst over learned seeds; with
    `costs`, also the worst phase other than the boundary, and a row of each arm's cost against the baseline)."""
    shown = [a for a in arms if any(r["arm"] == a for r in rows)]
    lines = ["| regime | padding | " + " | ".join(f"`{a}`" for a in shown) + " |",
             "|---|---|" + "---|" * len(shown)]
    for regime in dict.fromkeys(r["regime"] for r in rows):
        for pad in PADS:
            if any(_by(rows, regime, a, pad) for a in shown):
                lines.append(f"| {regime} | {pad} | " + " | ".join(_cell(_by(rows, regime, a, pad), costs)
                                                                  for a in shown) + " |")
        if costs:
            lines.append(f"| {regime} | cost | " + " | ".join(_cost(rows, regime, a) for a in shown) + " |")
    return lines


def _cost_of(rows, regime: str, arm: str) -> tuple[float, float, float] | None:
    """(cache bytes, cache entries, compressor MACs) per token of a cell, from its rows (bytes from its config)."""
    r = _by(rows, regime, arm, "prefix") or _by(rows, regime, arm, "in_sequence")
    if r is None:
        return None
    return cache_bytes(regime, arm), r["cache_entries_per_token"], r["compressor_flops_per_token"]


def _cost(rows, regime: str, arm: str) -> str:
    """An arm's cost against the baseline: compressor MACs, cache bytes per token (entries: as bytes, or named)."""
    mine, base = _cost_of(rows, regime, arm), _cost_of(rows, regime, BASELINE_ARM)
    if mine is None or base is None:
        return "-"
    by, entries, macs = mine
    text = f"MACs {_pct(macs, base[2], 1)}, bytes {_pct(by, base[0], 1)}"
    return text + ("" if math.isclose(entries, base[1]) else f", entries {_pct(entries, base[1], 1)}")


def free(rows, regime: str, arm: str) -> bool:
    """At the unmitigated model's cost: the same cache entries and bytes per token, <= +2% compressor MACs."""
    mine, base = _cost_of(rows, regime, arm), _cost_of(rows, regime, BASELINE_ARM)
    return bool(mine and base) and math.isclose(mine[0], base[0]) and math.isclose(mine[1], base[1]) \
        and mine[2] <= FREE_MACS * base[2]


def verdicts(rows: Sequence[Mapping]) -> list[str]:
    """One sentence per regime: the cheapest arm that meets the goal on every seed scored on both paddings, whether
    that is at the unmitigated cost, on how many seeds the unmitigated model meets it on its own (where it does),
    and what each gate term adds to the bridge it is stacked on."""
    out = []
    for regime in dict.fromkeys(r["regime"] for r in rows):
        arms = [a for a in dict.fromkeys(r["arm"] for r in rows if r["regime"] == regime) if a != BASELINE_ARM]
        def met(a):
            got = [_by(rows, regime, a, p) for p in PADS]
            return all(r is not None and r["seeds"] and r["goal_met"] == r["seeds"] for r in got)
        winners = sorted((a for a in arms if met(a)), key=lambda a: _cost_of(rows, regime, a))

        def seeds(a):
            n = _by(rows, regime, a, "prefix")["seeds"]
            return f"{n}/{n} seed{'s' if n > 1 else ''}{'' if n >= 3 else ' so far'}"

        def where(a):
            return "at the unmitigated cost" if free(rows, regime, a) else f"at {_cost(rows, regime, a)}"
        if winners:  # the cheapest on all three seeds first; a cheaper one on fewer seeds so far after it
            done = [a for a in winners if _by(rows, regime, a, "prefix")["seeds"] >= 3]
            a = done[0] if done else winners[0]
            text = (f"- **{regime}**: the cheapest arm meeting the goal on every seed on both paddings is `{a}` "
                    f"({seeds(a)}), {where(a)}.")
            if winners[0] != a:
                b = winners[0]
                text += f" Cheaper and meeting it so far: `{b}` ({seeds(b)}), {where(b)}."
        else:
            text = f"- **{regime}**: no arm meets the goal on every seed on both paddings."
        base = [_by(rows, regime, BASELINE_ARM, p) for p in PADS]
        if any(r and r["goal_met"] for r in base):  # then the regime's weak phase is not every seed's to fix
            text += (" The unmitigated model meets it on its own in " + ", ".join(
                f"{r['goal_met']}/{r['seeds']} seeds {p.replace('_', '-')}" for r, p in zip(base, PADS) if r) + ".")
        stacked = [(a, b) for a in arms for b in arms if a.startswith(b + "_") and a != b]
        if stacked:
            gains = []
            for a, b in stacked:
                r = [_by(rows, regime, x, "prefix") or {} for x in (a, b)]
                now = f"{r[0]['acc_worst']:.2f}" if r[0].get("learned") else "did not learn"
                gains.append(f"`{a[len(b) + 1:]}` on `{b}`: prefix worst {r[1].get('acc_worst', math.nan):.2f} -> "
                             f"{now}")
            text += " Gate terms stacked on a bridge (mean over the seeds scored): " + "; ".join(gains) + "."
        out.append(text)
    return out


def mechanism_links(comp) -> list[str]:
    """The comparison's mechanism figures (`python -m phasefix.analyze knockout|gates run=<run> padding=both
    out=<out>/mechanism/<regime>-<arm>-s<seed>`), one line per regime in the comparison's order, the unmitigated
    model first: knockout (which residues each KV head carries) and gates (the slots each head reads)."""
    cells = sorted(d.name for d in (comp.out / "mechanism").glob("*") if d.is_dir())
    if not cells:
        return []
    rel = comp.out.relative_to(PROJECT_ROOT / "docs")
    out = ["", "Mechanism (`phasefix.analyze knockout` and `gates`: which residues each KV head carries, which slots "
           "it reads):", ""]
    by_regime = {}
    for name in cells:
        regime, _, rest = name.partition("-")  # neither a regime's nor an arm's name has a '-'
        by_regime.setdefault(regime, []).append(rest)
    regimes = [r.name for r in comp.regimes]
    for regime in sorted(by_regime, key=lambda r: regimes.index(r) if r in regimes else len(regimes)):
        runs = sorted(by_regime[regime], key=lambda r: (not r.startswith(f"{BASELINE_ARM}-"), r))
        out.append(f"- {regime}: " + ", ".join(
            f"`{r}` ([knockout]({rel}/mechanism/{regime}-{r}/knockout.png), "
            f"[gates]({rel}/mechanism/{regime}-{r}/gates.png))" for r in runs))
    return out


def results_page(comparisons: Sequence[str | Path] | None = None) -> str:
    """The page's text (see the module docstring)."""
    from phasefix.study.cells import load_comparison

    paths = [Path(p) for p in comparisons] if comparisons else sorted((PROJECT_ROOT / "comparisons").glob("*.yaml"))
    comps = [load_comparison(p) for p in paths]
    arms = [p.stem for p in sorted((CONF_DIR / "arm").glob("*.yaml"))]
    arms = [BASELINE_ARM] + [a for a in arms if a != BASELINE_ARM]
    known = set(arms)
    head = next((c for c in comps if c.tables), None)
    rows = [r for spec in (head.tables if head else []) for r in _rows(spec)]
    rows = [r for r in rows if r["arm"] in known]
    out = ["# Results", "",
           "Generated by `python -m phasefix.report results=docs/results.md` from the committed tables (each links",
           "below; its `comparison.csv` names every run's command, commit, machine and time). Do not edit by hand;",
           "the dated history of these studies is in docs/notebook/.", "",
           f"**Goal**: on every seed, the worst phase is at least {GOAL_RATIO} x the mean, and the mean is at least "
           "the", "unmitigated model's (same regime, same padding), on prefix and in-sequence filler.", ""]
    if head:
        out += ["## What to use", "",
                "Per regime, the arm that meets the goal on the most seeds at the unmitigated model's cache entries",
                f"per token (`python -m phasefix.fit regime=R arm=A seed=N`; comparisons/{head.path.name} re-runs "
                "them all). Costs", "are per token, summed over layers; the change is against `baseline` "
                "(bytes: bf16 entries).", ""]
        out += answer(rows)
        out += ["", "## Regime x arm", "",
                "Seeds meeting the goal / seeds scored (mean / worst phase, over the seeds that learned).", ""]
        out += matrix(rows, arms)
    for comp in comps:
        if comp is head or comp.out is None or not (comp.out / "decisive.csv").is_file():
            continue
        order = {r.name: i for i, r in enumerate(comp.regimes)}  # the file's order of regimes
        crows = sorted(({**r, "arm": arm_name(r["arm"])} for r in read_table(comp.out / "decisive.csv")),
                       key=lambda r: order.get(r["regime"], len(order)))
        out += ["", f"## {comp.name}: {comp.description}", "",
                f"`python -m phasefix.study spec=comparisons/{comp.path.name}`; table "
                f"[{comp.out.relative_to(PROJECT_ROOT)}]({comp.out.relative_to(PROJECT_ROOT / 'docs')}/decisive.md)"
                + (f"; its cells scored on {comp.per_residue} prompts per residue (rows from other tables: as "
                   "those were)." if comp.per_residue else "."), ""]
        out += verdicts(crows)
        out += ["", "Seeds meeting the goal / seeds scored (mean / worst phase / worst phase other than the boundary, "
                "over the seeds that", "learned); `cost`: compressor MACs and cache bytes per token against "
                "`baseline`.", ""]
        out += matrix(crows, arms, costs=True)
        out += mechanism_links(comp)
        if (comp.out / "stopped.md").is_file():
            out += ["", "Stopped after the first seed:", "", *(comp.out / "stopped.md").read_text().splitlines()]
    out += ["", "## Arms", "", "Each arm is `conf/arm/<name>.yaml` on top of a regime (`conf/regime/`); "
            "S is the regime's stride.", "", "| arm | overrides |", "|---|---|"]
    out += [f"| `{a}` | `{arm_overrides(a)}` |" for a in arms]
    if head:
        out += ["", "## Tables", ""]
        for r in head.regimes:
            links = ", ".join(f"[{Path(t).name}]({Path(t).relative_to('docs')}/comparison.md)" for t in r.tables)
            out.append(f"- {r.name}: {links}")
        if head.out and (head.out / "headline.md").is_file():  # linked, not quoted: the page stays answer-first
            from phasefix.comparison import ARM_NAMES

            rel = head.out.relative_to(PROJECT_ROOT / "docs")
            codes = ", ".join(f"{k} = `{v}`" for k, v in ARM_NAMES.items())
            out += ["", f"The headline table, every padding with training time and lm_loss, as `python -m phasefix.report "
                    f"tables=...` wrote it: [{rel}/headline.md]({rel}/headline.md) (arm codes of that time: {codes})."]
    return "\n".join(out).rstrip() + "\n"


def write_results(path: str | Path, comparisons: Sequence[str | Path] | None = None) -> Path:
    path = Path(path)
    path.write_text(results_page(comparisons))
    return path


__all__ = ["answer", "arm_overrides", "cache_bytes", "matrix", "results_page", "write_results"]
