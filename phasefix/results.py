"""`python -m phasefix.results`: docs/results.md and the README's recommendation, from the committed tables (no MLflow).

The page answers first: per regime, the arm that the verdict recommends (`phasefix.verdict.recommend`: the highest
95% Wilson lower bound of the share of seeds meeting the goal, then the least cost), over the seeds of every
comparison file that measured the regime (`comparisons/*.yaml`: the headline's `tables:`, each regime's `table:`
folders and each comparison's `out:` folder once it holds a table; a seed scored in two folders counts once, from
the first). Then each comparison's regime x arm matrix, the arm legend (composed from conf/arm/) and the tables.
A regime trained for another number of steps (a comparison's `steps:`) is its own row. Arm codes of tables written
before conf/arm/ existed are shown under today's names (`phasefix.decisive.ARM_NAMES`).
"""
from __future__ import annotations

import functools
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from phasefix import verdict
from phasefix.decisive import ARM_NAMES, arm_name
from phasefix.paths import CONF_DIR, PROJECT_ROOT
from phasefix.tables import CURVES_CSV, folder_members, has_table, read_curves, read_members, read_table, seed_in_name
from phasefix.verdict import BASELINE_ARM, GOAL_RATIO, MIN_SEEDS, Cost, Rate

PADS = ("prefix", "in_sequence")
BYTES_PER_VALUE = 2  # a cache entry's vectors stored in bf16
README_START, README_END = "<!-- results: python -m phasefix.results -->", "<!-- /results -->"
QUICK_START_REGIME = "w4s4"  # the README's quick start and picture: the CPU default's shape, 1,200 steps
FIGURE_DIR = PROJECT_ROOT / "docs" / "figures" / "readme"  # the picture's runs (phasefix.report out=), its PNG
FIGURE = "fix.png"


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


@functools.lru_cache(maxsize=None)  # one Hydra compose per cell, however many rows ask
def cache_bytes(regime: str, arm: str) -> float:
    """Compressed-cache bytes per token of a cell (entries per token x vectors per entry x head_dim, bf16)."""
    from phasefix.cli import compose
    from phasefix.config import model_config

    m = model_config(compose([f"regime={regime}", f"arm={arm}"]))
    return m.cache_entries_per_token() * (1 if m.tied_kv else 2) * m.head_dim * BYTES_PER_VALUE


# ------------------------------------------------------------------------------------------------ the seeds, pooled
@dataclass(frozen=True)
class Regime:
    """A regime as a comparison trains it: its name and, when a comparison changes it, its number of steps."""
    name: str
    steps: int | None = None

    def label(self) -> str:
        return self.name if self.steps is None else f"{self.name} ({self.steps:,} steps)"


def sources(comps) -> list[tuple[str, Regime, set[str]]]:
    """(folder, regime, the regime names to take) of every comparison, in the files' order: the headline's `tables:`,
    each regime's `table:` folders, the comparison's own `out:` folder when it holds a table."""
    out = []
    for comp in comps:
        steps = {r.name: r.steps for r in comp.regimes}
        for spec in comp.tables:
            folder, _, names = spec.partition(":")
            out += [(folder, Regime(n, steps.get(n)), {n}) for n in (names.split("+") if names else steps)]
        out += [(t, Regime(r.name, r.steps), {r.name}) for r in comp.regimes for t in r.tables]
        if comp.out is not None and has_table(comp.out):
            out += [(str(comp.out), Regime(r.name, r.steps), {r.name}) for r in comp.regimes]
    return out


def pooled_members(comps, known_arms: set[str]) -> dict[Regime, list[dict]]:
    """Every committed run (one per run and padding, `tables.folder_members`) of each regime over `sources`, arms by
    today's names (unknown codes left out), each with its seed; a (regime, arm, seed) counts once, from the first
    folder that scored it (a re-scoring listed first stands for the run it re-scored)."""
    read = functools.lru_cache(maxsize=None)(lambda f: folder_members(PROJECT_ROOT / f))
    taken: dict[tuple, str] = {}
    out: dict[Regime, list[dict]] = {}
    for folder, regime, names in sources(comps):
        for m in read(folder):
            arm = arm_name(m["arm"])
            if m["regime"] not in names or arm not in known_arms:
                continue
            seed = seed_in_name(m["run_name"])
            key = (regime, arm, str(seed) if seed is not None else m["run_id"])
            if taken.setdefault(key, m["run_id"]) == m["run_id"]:
                out.setdefault(regime, []).append({**m, "arm": arm, "seed": key[2]})
    return out


def arm_rates(members: Sequence[Mapping]) -> dict[str, tuple[Rate, Cost]]:
    """Per arm of one regime: (k of n seeds meeting the goal on every padding, its cost), the goal's bar the
    unmitigated reference of these members."""
    bars = {p: verdict.reference([m["acc_mean"] for m in members if (m["arm"], m["padding"]) == (BASELINE_ARM, p)],
                                 [m["learned"] for m in members if (m["arm"], m["padding"]) == (BASELINE_ARM, p)])
            for p in PADS}
    seeds: dict[str, dict[str, dict[str, bool]]] = {}
    costs = {}
    for m in members:
        bar = bars.get(m["padding"], math.nan)
        seeds.setdefault(m["arm"], {}).setdefault(m["seed"], {})[m["padding"]] = verdict.member_meets_goal(m, bar)
        costs.setdefault(m["arm"], (m["cache_entries_per_token"], m["compressor_flops_per_token"]))
    return {arm: (Rate(sum(verdict.seed_meets_goal(p) for p in by_seed.values()), len(by_seed)),
                  Cost(cache_bytes(members[0]["regime"], arm), *costs[arm])) for arm, by_seed in seeds.items()}


# ------------------------------------------------------------------------------------------------ the page's parts
def pct(x: float, base: float, digits: int = 1) -> str:
    if not base or math.isclose(x, base, rel_tol=1e-9):
        return "same"
    return f"{100 * (x / base - 1):+.{digits}f}%"


def cost_text(cost: Cost | None, base: Cost | None) -> str:
    """An arm's cost against the unmitigated model: compressor MACs, cache bytes (entries where they differ)."""
    if cost is None or base is None:
        return "-"
    text = f"MACs {pct(cost.macs, base.macs)}, bytes {pct(cost.cache_bytes, base.cache_bytes)}"
    return text + ("" if math.isclose(cost.entries, base.entries) else f", entries {pct(cost.entries, base.entries)}")


def recommendations(pooled: Mapping[Regime, Sequence[Mapping]]) -> list[tuple[Regime, verdict.Recommendation, dict]]:
    """(regime, its recommendation, its arms' rates and costs), regimes in the order the comparisons name them."""
    out = []
    for regime, members in pooled.items():
        arms = arm_rates(members)
        if BASELINE_ARM in arms and len(arms) > 1:
            out.append((regime, verdict.recommend(arms), arms))
    return out


def answer(recs) -> list[str]:
    """The first tables: per regime the recommended arm (rated on MIN_SEEDS+ seeds), its rate, its cost, and the other
    arms that met the goal on every seed scored or are rated on 8+ seeds (with theirs); then the candidates, the
    rule's pick where it has fewer seeds (not yet a recommendation); then the regimes where no arm meets it."""
    header = ("| regime | {} | seeds meeting the goal on both paddings | cost against `baseline` | "
              "other arms: every seed met, or rated on 8+ seeds |")

    def row(regime, rec, arms):
        base = arms[BASELINE_ARM][1]
        also = ", ".join(f"`{a}` ({arms[a][0].k} of {arms[a][0].n}, {cost_text(arms[a][1], base)})"
                         for a in rec.alternatives)
        return (f"| {regime.label()} | `{rec.arm}` | {rec.rate.text(False)} | {cost_text(arms[rec.arm][1], base)} | "
                f"{also or '-'} |")

    rated = [row(*r) for r in recs if r[1].arm is not None and not r[1].rate.provisional]
    fewer = [row(*r) for r in recs if r[1].arm is not None and r[1].rate.provisional]
    none = [r[0].label() for r in recs if r[1].arm is None]
    lines = [header.format("use"), "|---|---|---|---|---|", *rated] if rated else \
        [f"No regime is rated on {MIN_SEEDS}+ seeds yet."]
    if fewer:
        lines += ["", f"Candidates: the rule's pick on fewer than {MIN_SEEDS} seeds (provisional), not yet a "
                  "recommendation.", "",
                  header.format("candidate"), "|---|---|---|---|---|", *fewer]
    if none:
        lines += ["", f"No arm meets the goal on any seed in {', '.join(none)}."]
    return lines


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


def row_cost(rows, regime: str, arm: str) -> Cost | None:
    r = _by(rows, regime, arm, "prefix") or _by(rows, regime, arm, "in_sequence")
    return None if r is None else Cost(cache_bytes(regime, arm), r["cache_entries_per_token"],
                                       r["compressor_flops_per_token"])


def matrix(rows: Sequence[Mapping], arms: Sequence[str], costs: bool = False) -> list[str]:
    """Regime x arm of one table: per padding, its `goal_met` of the seeds scored (mean / worst over learned seeds;
    with `costs`, also the worst phase other than the boundary, and a row of each arm's cost against the baseline)."""
    shown = [a for a in arms if any(r["arm"] == a for r in rows)]
    lines = ["| regime | padding | " + " | ".join(f"`{a}`" for a in shown) + " |",
             "|---|---|" + "---|" * len(shown)]
    for regime in dict.fromkeys(r["regime"] for r in rows):
        for pad in PADS:
            if any(_by(rows, regime, a, pad) for a in shown):
                lines.append(f"| {regime} | {pad} | " + " | ".join(_cell(_by(rows, regime, a, pad), costs)
                                                                  for a in shown) + " |")
        if costs:
            base = row_cost(rows, regime, BASELINE_ARM)
            lines.append(f"| {regime} | cost | " + " | ".join(
                "-" if row_cost(rows, regime, a) is None else cost_text(row_cost(rows, regime, a), base)
                for a in shown) + " |")
    return lines


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


def headline_rows(head, known: set[str]) -> list[dict]:
    rows = []
    for spec in head.tables:
        folder, _, regimes = spec.partition(":")
        wanted = [r for r in regimes.split("+") if r]
        rows += [{**r, "arm": arm_name(r["arm"]), "table": r.get("table") or folder}
                 for r in read_table(PROJECT_ROOT / folder) if not wanted or r["regime"] in wanted]
    return [r for r in rows if r["arm"] in known]


def own_regimes(comp) -> set[str]:
    """The regimes a comparison has trained cells of (rows of its table that name its own folder)."""
    if comp.out is None or not has_table(comp.out):
        return set()
    here = (PROJECT_ROOT / comp.out).resolve()
    return {r["regime"] for r in read_table(comp.out)
            if r.get("table") and (PROJECT_ROOT / r["table"]).resolve() == here}


def pooled_elsewhere(comp, comps) -> dict[str, str]:
    """{regime: the comparison whose section shows it}: the regimes of `comp` that another comparison trains cells
    of while joining `comp`'s folder for them, so that its section pools `comp`'s runs with later seeds."""
    if comp.out is None:
        return {}
    mine, out = (PROJECT_ROOT / comp.out).resolve(), {}
    for other in comps:
        trained = own_regimes(other) if other is not comp else set()
        out.update({r.name: other.name for r in other.regimes
                    if r.name in trained and any((PROJECT_ROOT / t).resolve() == mine for t in r.tables)})
    return out


def comparison_section(comp, arms: Sequence[str], elsewhere: Mapping[str, str] = {}) -> list[str]:
    """A comparison's own table (`out:`): how to re-run it, its matrix with costs, its mechanism figures, and the
    arms its staged rule stopped. A regime in `elsewhere` ({regime: comparison}) is left to that comparison's
    section, which pools these runs with its later seeds (one line says so)."""
    order = {r.name: i for i, r in enumerate(comp.regimes)}  # the file's order of regimes
    rows = sorted(({**r, "arm": arm_name(r["arm"])} for r in read_table(comp.out)),
                  key=lambda r: order.get(r["regime"], len(order)))
    # only the regimes it has trained cells of: a regime whose rows all come from other tables is in their sections
    own = own_regimes(comp) - set(elsewhere)
    rows = [r for r in rows if r["regime"] in own or (not r.get("table") and r["regime"] not in elsewhere)]
    rel = comp.out.relative_to(PROJECT_ROOT / "docs")
    out = ["", f"## {comp.name}: {comp.description}", "",
           f"`python -m phasefix.study spec=comparisons/{comp.path.name}`; table [{comp.out.relative_to(PROJECT_ROOT)}]"
           f"({rel}/decisive.md)" + (f"; its cells scored on {comp.per_residue} prompts per residue (rows from other "
                                     "tables: as those were)." if comp.per_residue else "."),
           "Seeds meeting the goal / seeds scored (mean / worst phase / worst phase other than the boundary, over the "
           "seeds that learned).", ""]
    out += matrix(rows, arms, costs=True)
    moved = {}
    for regime, name in elsewhere.items():
        moved.setdefault(name, []).append(regime)
    out += [""] + [f"{', '.join(regimes)}: in the {name} section, which pools these cells with later seeds."
                   for name, regimes in moved.items()] if moved else []
    out += mechanism_links(comp)
    if (comp.out / "stopped.md").is_file():
        out += ["", f"The arms its staged rule stopped after their first seeds, and why: [stopped.md]({rel}/stopped.md)."]
    return out


def all_arms() -> list[str]:
    """conf/arm/'s arms, the unmitigated one first."""
    return [BASELINE_ARM] + [p.stem for p in sorted((CONF_DIR / "arm").glob("*.yaml")) if p.stem != BASELINE_ARM]


def load(comparisons: Sequence[str | Path] | None = None) -> list:
    """The comparison files (default: comparisons/*.yaml, by name)."""
    from phasefix.study.cells import load_comparison

    paths = [Path(p) for p in comparisons] if comparisons else sorted((PROJECT_ROOT / "comparisons").glob("*.yaml"))
    return [load_comparison(p) for p in paths]


def results_page(comps: Sequence, recs: Sequence) -> str:
    """The page's text (see the module docstring) of the comparisons `comps` and their `recommendations`."""
    arms = all_arms()
    head = next((c for c in comps if c.tables), None)
    out = ["# Results", "",
           "Generated by `python -m phasefix.results` from the committed tables (each links below; its "
           "`comparison.csv` names", "every run's command, commit, machine and time). Do not edit by hand; the dated "
           "history is in docs/notebook/.", "",
           f"**Goal**, per seed: the worst phase is at least {GOAL_RATIO} x the mean and the mean is at least the "
           "unmitigated model's", "(same regime and padding, its learned seeds), on prefix and in-sequence filler. "
           "**Rule**: per regime, the arm whose", "share of seeds meeting the goal has the highest 95% Wilson lower "
           "bound, then the least cost (cache bytes, entries,", f"compressor MACs), over every comparison's seeds; on "
           f"fewer than {MIN_SEEDS} seeds it is provisional (phasefix.verdict).", "",
           "## What to use", "",
           "`python -m phasefix.fit regime=R arm=A seed=N`. Costs are per token, summed over layers, against "
           "`baseline` (bytes: bf16).", ""]
    out += answer(recs)
    if head:
        out += ["", f"## {head.name}: {head.description}", "",
                f"`python -m phasefix.study spec=comparisons/{head.path.name}`. Seeds meeting the goal / seeds scored "
                "(mean / worst phase, over", "the seeds that learned).", ""]
        out += matrix(headline_rows(head, set(arms)), arms)
    for comp in comps:
        if comp is not head and comp.out is not None and has_table(comp.out):
            out += comparison_section(comp, arms, pooled_elsewhere(comp, comps))
    out += ["", "## Arms", "", "The arms named above; each is `conf/arm/<name>.yaml` on top of a regime "
            "(`conf/regime/`, where S is its stride; every arm: `conf/arm/`).", "", "| arm | overrides |", "|---|---|"]
    named = "\n".join(out)  # the arms the page names above (conf/arm/ has more: `--help` lists them all)
    out += [f"| `{a}` | `{arm_overrides(a)}` |" for a in arms if f"`{a}`" in named]
    if head:
        out += ["", "## Tables", ""]
        out.append("The headline's runs, per regime: " + "; ".join(  # one line: the page stays answer-first
            f"{r.name}: " + ", ".join(f"[{Path(t).name}]({Path(t).relative_to('docs')}/comparison.md)"
                                      for t in r.tables) for r in head.regimes) + ".")
        if head.out and (head.out / "headline.md").is_file():  # linked, not quoted: the page stays answer-first
            rel = head.out.relative_to(PROJECT_ROOT / "docs")
            codes = ", ".join(f"{k} = `{v}`" for k, v in ARM_NAMES.items())
            out += ["", f"The headline table, every padding with training time and lm_loss: [{rel}/headline.md]"
                    f"({rel}/headline.md) (arm codes of that time: {codes})."]
    return "\n".join(out).rstrip() + "\n"


# ------------------------------------------------------------------------------------------------ the README's part
def readme_figure(recs, folder: Path = FIGURE_DIR):
    """The README's picture: in QUICK_START_REGIME, the unmitigated run's phase curve beside the recommended arm's,
    from the runs committed in `folder` (its decisive_runs.csv and phase_curves.csv); None when the folder has no
    run of either."""
    from phasefix import plots
    from phasefix.cli import compose

    rec = next((rec for regime, rec, _ in recs if regime == Regime(QUICK_START_REGIME)), None)
    if rec is None or rec.arm is None or not (folder / CURVES_CSV).is_file():
        return None
    members = [m for m in read_members(folder) if m["regime"] == QUICK_START_REGIME]
    runs = {arm: sorted((m for m in members if m["arm"] == arm), key=lambda m: m["run_name"])
            for arm in (BASELINE_ARM, rec.arm)}
    if not all(runs.values()):
        return None
    curves, titles = read_curves(folder), {}
    for arm, ms in runs.items():
        first = next(m for m in ms if m["padding"] == "prefix")
        titles[first["run_id"]] = (f"{QUICK_START_REGIME}, arm={arm} ({first['run_name']})\nprefix padding: mean "
                                   f"{first['acc_mean']:.2f}, worst phase {first['acc_worst']:.2f}")
    shown = {f"{rid} {pad}": curve for (rid, pad), curve in curves.items() if rid in titles}
    return plots.fix_side_by_side(shown, titles, compose([f"regime={QUICK_START_REGIME}"]).model.stride)


def readme_part(recs, figure: bool = False) -> str:
    """The README's list of the arm to use per regime, and its quick start, from the same recommendations as the
    page: one line per (arm, rate, cost), the regimes it is recommended in."""
    import textwrap

    groups: dict[tuple[bool, bool, str, str, str], list[str]] = {}  # rated on 8+ seeds first, then the free arms
    for regime, rec, arms in recs:
        if rec.arm not in (None, BASELINE_ARM):
            mine, base = arms[rec.arm][1], arms[BASELINE_ARM][1]
            key = (rec.rate.provisional, not verdict.free(mine, base), rec.arm, rec.rate.text(False),
                   cost_text(mine, base))
            groups.setdefault(key, []).append(regime.label())
    lines = [*textwrap.wrap("The arm per regime by [docs/results.md](docs/results.md)'s rule (highest Wilson lower "
                            f"bound, then least cost), a recommendation where rated on {MIN_SEEDS}+ seeds:", width=118),
             ""]
    said = False
    for (provisional, _, arm, rate, cost), regimes in sorted(groups.items(), key=lambda kv: kv[0][:2]):
        if provisional and not said:
            lines += ["", f"Candidates, on fewer than {MIN_SEEDS} seeds (provisional), not yet recommendations:"]
            said = True
        lines += textwrap.wrap(f"- **`arm={arm}`** ({cost}) in {', '.join(regimes)}: {'each ' * (len(regimes) > 1)}"
                               f"{rate}", width=118, subsequent_indent="  ")
    none = [regime.label() for regime, rec, _ in recs if rec.arm is None]
    if none:
        lines.append(f"- no arm meets it yet in {', '.join(none)}")
    quick = next(((regime, rec) for regime, rec, _ in recs if regime == Regime(QUICK_START_REGIME)), None)
    if figure:
        lines += ["", f"![{QUICK_START_REGIME}: the unmitigated model's phase curve beside the rule's pick]"
                      f"({FIGURE_DIR.relative_to(PROJECT_ROOT)}/{FIGURE})"]
    if quick and quick[1].arm is not None:
        regime, rec = quick
        lines += ["", "```bash",
                  f"python -m phasefix.fit regime={regime.name} arm={BASELINE_ARM} seed=3   # the regime as it is: "
                  "a weak phase",
                  f"python -m phasefix.fit regime={regime.name} arm={rec.arm} seed=3   # the arm the rule picks",
                  "```"]
    return "\n".join(lines) + "\n"


def with_readme_part(text: str, part: str) -> str:
    """README text with the part between README_START and README_END replaced by `part`."""
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    return text[:start] + "\n" + part + text[end:]


def generate(comparisons: Sequence[str | Path] | None = None, folder: Path = FIGURE_DIR) -> tuple[str, str, object]:
    """(the page, the README's part, its figure or None) of the comparison files, from one set of
    recommendations."""
    comps = load(comparisons)
    recs = recommendations(pooled_members(comps, set(all_arms())))
    fig = readme_figure(recs, folder)
    return results_page(comps, recs), readme_part(recs, figure=fig is not None), fig


def write(page: str | Path = PROJECT_ROOT / "docs" / "results.md", readme: str | Path = PROJECT_ROOT / "README.md",
          comparisons: Sequence[str | Path] | None = None) -> list[Path]:
    """Write the page, the README's part and its figure; returns the files written."""
    from phasefix import plots

    page, readme = Path(page), Path(readme)
    text, part, fig = generate(comparisons)
    page.write_text(text)
    readme.write_text(with_readme_part(readme.read_text(), part))
    if fig is None:
        return [page, readme]
    plots.save(fig, FIGURE_DIR / FIGURE)
    return [page, readme, FIGURE_DIR / FIGURE]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m phasefix.results`: 0 written, 2 an argument (it takes none)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv:
        print(f"python -m phasefix.results takes no argument (got {' '.join(argv)}): it writes docs/results.md and "
              "the README's recommendation from the committed tables", file=sys.stderr)
        return 2
    for path in write():
        size = f"{len(path.read_text().splitlines())} lines" if path.suffix == ".md" else f"{path.stat().st_size:,} bytes"
        print(f"written {path.relative_to(PROJECT_ROOT)} ({size})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
