"""A document's quotes of files a report wrote: between a line `<!-- quote: PATH -->` (PATH relative to the
document's folder, like its links) and a line `<!-- /quote -->` a document holds a file's text as it is, so that
the tables it quotes are the report's own, not copies by hand (`phasefix.report ... into=DOC` rewrites them;
tests/test_docs.py checks every quote in README.md and docs/ against its file)."""
from __future__ import annotations

import re
from pathlib import Path

from phasefix.errors import check

QUOTE_BEGIN, QUOTE_END = re.compile(r"<!-- quote: (\S+) -->"), "<!-- /quote -->"  # a document's quote of a table


def quotes(doc: Path) -> list[tuple[Path, int, int]]:
    """`doc`'s quotes: (the quoted file, resolved against doc's folder; the character span between the line
    `<!-- quote: PATH -->` and its line `<!-- /quote -->`). Checked: each quote closed before the next opens."""
    check(doc.is_file(), "into", str(doc), "is not a file")
    found, opened, offset = [], None, 0
    for number, line in enumerate(doc.read_text().splitlines(keepends=True), 1):
        begin = QUOTE_BEGIN.fullmatch(line.strip())
        if begin or line.strip() == QUOTE_END:
            check(bool(begin) == (opened is None), "into", f"{doc}:{number}",
                  "opens a quote inside a quote" if begin else f"closes a quote that is not open ({QUOTE_END})")
        offset += len(line)
        if begin:
            opened = (doc.parent / begin.group(1), offset)
        elif line.strip() == QUOTE_END:
            found.append((opened[0], opened[1], offset - len(line)))
            opened = None
    check(opened is None, "into", str(doc), f"leaves the quote of {opened and opened[0]} open: add a line {QUOTE_END}")
    return found


def inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def quote_text(text: str) -> str:
    """A file's text as a quote holds it: blank lines around, so that a quoted table stays one table."""
    return "\n" + text.strip("\n") + "\n\n"


def refresh_quotes(doc: Path, folder: Path) -> list[Path]:
    """Rewrite `doc`'s quotes of the files in `folder` with those files (written beside it, then renamed: no
    half-written document). Returns the files quoted."""
    text, done = doc.read_text(), []
    for path, start, end in reversed(quotes(doc)):
        if inside(path, folder):
            check(path.is_file(), "into", str(doc), f"quotes {path}, which the report did not write")
            text, done = text[:start] + quote_text(path.read_text()) + text[end:], [path, *done]
    tmp = doc.with_name(doc.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(doc)
    return done
