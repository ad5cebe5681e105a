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


def test_results_open_with_the_generated_headline():
    """docs/results.md's first table is docs/figures/headline/headline.md as `phasefix.report tables=...` wrote it
    (no hand-copied figures), and every table it names is committed."""
    headline = (PROJECT_ROOT / "docs" / "figures" / "headline" / "headline.md").read_text()
    results = (PROJECT_ROOT / "docs" / "results.md").read_text()
    first_table = results[results.index("\n|") + 1:]
    assert first_table.startswith(headline)
    for table in set(re.findall(r"`(docs/figures/[^`]+)` \|", headline)):
        assert (PROJECT_ROOT / table / "decisive.csv").is_file(), table
