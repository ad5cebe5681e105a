"""Every number the README and docs/ quote rests on a committed table (issue 18): each MLflow run id they cite (an
8-hex-digit id in backticks, as `phasefix.report` prints it) appears in a committed `docs/figures/**/comparison.csv`,
which holds the run's command, commit, machine and time (a study's trials.csv or a report under studies/ is not
enough: the reader of docs/ looks in docs/figures)."""
import csv
import re

from phasefix.paths import PROJECT_ROOT

RUN_ID = re.compile(r"`([0-9a-f]{8})`")


def committed_run_ids() -> set[str]:
    ids: set[str] = set()
    for path in PROJECT_ROOT.glob("docs/figures/**/comparison.csv"):
        for row in csv.DictReader(open(path, newline="")):
            ids.add(row["run_id"])
    return ids


def test_every_run_id_the_docs_quote_is_in_a_committed_table():
    ids = committed_run_ids()
    assert len(ids) > 100  # the committed tables were found
    missing = {}
    for doc in [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]:
        quoted = set(RUN_ID.findall(doc.read_text()))
        lost = sorted(i for i in quoted if not any(full.startswith(i) for full in ids))
        if lost:
            missing[doc.name] = lost
    assert not missing, f"run ids quoted but in no committed docs/figures/**/comparison.csv: {missing}"


def test_every_quote_in_the_docs_is_its_file_as_the_report_wrote_it():
    """A `<!-- quote: PATH -->` block in README.md or docs/ holds exactly the committed file it names (what
    `phasefix.report ... into=DOC` writes there), so no quoted figure is a copy by hand that drifted."""
    from phasefix.quotes import quote_text, quotes

    seen = 0
    for doc in [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for path, start, end in quotes(doc):
            assert path.is_file(), f"{doc.name} quotes {path}, which is not committed"
            assert text[start:end] == quote_text(path.read_text()), \
                f"{doc.name}'s quote of {path} differs from the file: rerun its phasefix.report command with into="
            seen += 1
    assert seen >= 1  # docs/results.md quotes its headline


def test_results_are_generated_and_open_with_the_answer():
    """docs/results.md is the page `phasefix.report results=docs/results.md` writes from the committed tables (no
    hand-copied figures), at most ~150 lines; its first table is the answer (regime, arm to use, seeds, costs); every
    table it links is committed."""
    from phasefix.results import results_page

    results = (PROJECT_ROOT / "docs" / "results.md").read_text()
    assert results == results_page(), "docs/results.md is stale: python -m phasefix.report results=docs/results.md"
    assert len(results.splitlines()) <= 150
    first_table = results[results.index("\n|") + 1:].splitlines()
    assert first_table[0].startswith("| regime | use | seeds meeting the goal")
    assert "| w4s4 | `bridge_gate_diversity` | 3/3, 3/3 |" in results
    for link in set(re.findall(r"\]\((figures/[^)]+)\)", results)):
        assert (PROJECT_ROOT / "docs" / link).is_file(), link
