"""Every number the README and docs/ quote rests on a committed table (issue 18): each MLflow run id they cite (an
8-hex-digit id in backticks, as `phasefix.report` prints it) appears in a committed `docs/figures/**/comparison.csv`,
which holds the run's command, commit, machine and time (a study's trials.csv or a report under studies/ is not
enough: the reader of docs/ looks in docs/figures)."""
import csv
import re
import subprocess

from phasefix.paths import PROJECT_ROOT

RUN_ID = re.compile(r"`([0-9a-f]{8})`")


def documents() -> list:
    """README.md and every Markdown page under docs/ (the notebook included), not the tables a report wrote under
    docs/figures/ (those are checked against their own comparison.csv by the report)."""
    docs = PROJECT_ROOT / "docs"
    return [PROJECT_ROOT / "README.md",
            *sorted(p for p in docs.rglob("*.md") if not p.is_relative_to(docs / "figures"))]


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
    for doc in documents():
        quoted = set(RUN_ID.findall(doc.read_text()))
        lost = sorted(i for i in quoted if not any(full.startswith(i) for full in ids))
        if lost:
            missing[str(doc.relative_to(PROJECT_ROOT))] = lost
    assert not missing, f"run ids quoted but in no committed docs/figures/**/comparison.csv: {missing}"


def test_every_quote_in_the_docs_is_its_file_as_the_report_wrote_it():
    """A `<!-- quote: PATH -->` block in README.md or docs/ holds exactly the committed file it names (what
    `phasefix.report ... into=DOC` writes there), so no quoted figure is a copy by hand that drifted."""
    from phasefix.quotes import quote_text, quotes

    seen = 0
    for doc in documents():
        text = doc.read_text()
        for path, start, end in quotes(doc):
            assert path.is_file(), f"{doc.name} quotes {path}, which is not committed"
            assert text[start:end] == quote_text(path.read_text()), \
                f"{doc.name}'s quote of {path} differs from the file: rerun its phasefix.report command with into="
            seen += 1
    assert seen >= 1  # docs/evaluate.md quotes its table


def test_results_and_the_readme_are_generated_and_open_with_the_answer(tmp_path):
    """docs/results.md and the README's arm list are what `python -m phasefix.results` writes from the committed
    tables (no hand-copied figures), at most 150 and 120 lines; the page's first table is the answer (regime, the arm
    the verdict recommends, its rate, its cost), the second the candidates on fewer seeds; with today's tables they
    name `spread` for w4s4_inseqfirst (first table) and records64 (either: the free arm, meeting the goal on every
    seed scored); every table it links is committed."""
    from phasefix.results import README_END, README_START, generate, with_readme_part

    page, part, fig = generate()
    results = (PROJECT_ROOT / "docs" / "results.md").read_text()
    readme = (PROJECT_ROOT / "README.md").read_text()
    assert results == page, "docs/results.md is stale: python -m phasefix.results"
    assert readme == with_readme_part(readme, part), "README.md's arm list is stale: python -m phasefix.results"
    assert readme.count(README_START) == readme.count(README_END) == 1
    assert len(results.splitlines()) <= 150 and len(readme.splitlines()) <= 120
    tables = [t.splitlines() for t in re.findall(r"(?:^\|.*\n)+", results, flags=re.M)]
    first_table, candidates = tables[0], tables[1]
    assert first_table[0].startswith("| regime | use | seeds meeting the goal")
    assert candidates[0].startswith("| regime | candidate | seeds meeting the goal")
    rated = {"w4s4_inseqfirst": first_table, "records64": first_table + candidates}  # records64: < 8 seeds so far
    for regime, lines in rated.items():
        assert any(re.match(rf"\| {regime} \| `spread` \| (\d+) of \1 seeds \(95% CI", line) for line in lines)
    spread = [line for line in part.splitlines() if line.startswith("- **`arm=spread`** (MACs same, bytes same) in ")]
    assert {r for line in spread for r in ("records64", "w4s4_inseqfirst") if r in line} == {"records64",
                                                                                         "w4s4_inseqfirst"}
    assert not re.search(r"\b\d+ ?/ ?\d+\b", part)  # a rate is "k of n seeds (95% CI lo-hi)", never "3/3" alone
    if fig is not None:  # the README's picture is drawn from its committed runs, byte for byte
        from phasefix import plots
        from phasefix.results import FIGURE, FIGURE_DIR

        plots.save(fig, tmp_path / FIGURE)
        assert (tmp_path / FIGURE).read_bytes() == (FIGURE_DIR / FIGURE).read_bytes(), "python -m phasefix.results"
    for link in set(re.findall(r"\]\((figures/[^)]+)\)", results)):
        assert (PROJECT_ROOT / "docs" / link).is_file(), link


# --- references resolve, no machine paths (issue 52) ---

MACHINE_PATHS = ("/" + "work/", "/" + "root/")  # the development machines' roots, spelt so that this file has neither
RAW_PROVENANCE = re.compile(r"(docs/figures|studies/reports)/.+\.csv")  # run tables as a command wrote them, paths and all
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
SECTION_REF = re.compile(r"science\.md,?\s+(?:§|sections?\s+)(\d+)(?:\s*(?:-|–|and)\s*§?(\d+))?")


def committed_files() -> list:
    """The files of the repository as committed (a clean clone has exactly these): `git ls-files`."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=PROJECT_ROOT, capture_output=True, check=True).stdout
    return [PROJECT_ROOT / name for name in out.decode().split("\0") if name]


def text_of(path):
    """A file's text, or None for a binary file (an image, a database)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_no_machine_path_in_a_committed_file():
    """A clone lives anywhere: nothing committed names a development machine's directory, except the raw provenance
    a command wrote (the tables and logs of docs/figures/ and studies/reports/: which store, which checkout a run
    came from)."""
    found = []
    for path in committed_files():
        rel = path.relative_to(PROJECT_ROOT).as_posix()
        if RAW_PROVENANCE.fullmatch(rel) or not path.is_file():
            continue
        text = text_of(path)
        for number, line in enumerate((text or "").splitlines(), 1):
            if any(p in line for p in MACHINE_PATHS):
                found.append(f"{rel}:{number}")
    assert not found, f"machine paths ({MACHINE_PATHS}) committed; write <worktree>, $PWD or a placeholder: {found}"


def science_sections() -> set:
    text = (PROJECT_ROOT / "docs" / "science.md").read_text()
    return {int(n) for n in re.findall(r"^## (\d+)\. ", text, flags=re.M)}


def test_every_relative_link_in_the_docs_resolves():
    """Every [text](target) in README.md and docs/ that is not a web address names a committed file or folder."""
    broken = []
    for doc in documents():
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # https:, mailto:, an anchor in the same page
            path = (doc.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{doc.relative_to(PROJECT_ROOT)}: {target}")
    assert not broken, f"links to files that do not exist: {broken}"


def test_every_science_section_reference_resolves():
    """docs/science.md exists, and every "science.md §N" (or "§N-§M", "section N") in a committed text file names a
    numbered section of it (`## N. ...`)."""
    sections = science_sections()
    assert {1, 2, 3, 4, 5, 6, 7} <= sections
    bad, seen = [], 0
    for path in committed_files():
        text = text_of(path) if path.is_file() and path.suffix in {".md", ".py", ".yaml", ".yml", ".toml"} else None
        for match in SECTION_REF.finditer(text or ""):
            numbers = {int(n) for n in match.groups() if n}
            seen += 1
            if not numbers <= sections:
                bad.append(f"{path.relative_to(PROJECT_ROOT)}: {match.group(0)}")
    assert seen >= 20  # the code and the docs cite it
    assert not bad, f"references to sections docs/science.md does not have ({sorted(sections)}): {bad}"
