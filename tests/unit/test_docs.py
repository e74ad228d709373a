"""The documents stay what their readers need: a short README for users, results apart from it.

The README once grew a measurement log of 1,362 lines; results now live in
``src/rl_train/bench/RESULTS.md`` (newest figure per benchmark) and their history in git. These
tests hold the sizes, keep the README's "What was verified where" table equal to the one in
docs/verification.md, and check that every file path and link the documents give exists.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
RESULTS = REPO / "src" / "rl_train" / "bench" / "RESULTS.md"
VERIFICATION = REPO / "docs" / "verification.md"
DOCS = [README, RESULTS, *sorted((REPO / "docs").glob("*.md"))]
PATH_IN_CODE = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|sh|yaml|md|png|toml))`")
LINK = re.compile(r"\]\(([^)#\s]+)\)")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_readme_is_at_most_25_kb_and_results_at_most_15_kb() -> None:
    assert README.stat().st_size <= 25_000, f"README.md is {README.stat().st_size} bytes"
    assert RESULTS.stat().st_size <= 15_000, f"{RESULTS.name} is {RESULTS.stat().st_size} bytes"


def test_readme_holds_no_measurement_log() -> None:
    """Figures belong in bench/RESULTS.md: no section of measurements, no log of CI runs."""
    headings = re.findall(r"^#+ (.*)$", _text(README), re.M)
    assert not [h for h in headings if re.search(r"measure|result|benchmark", h, re.I)], headings
    assert not re.search(r"^- `\.ci/run` (in a fresh clone )?at [0-9a-f]{7}", _text(README), re.M)


def table_after(text: str, heading: str) -> list[list[str]]:
    """The rows (cells stripped) of the first Markdown table after ``heading``."""
    section = re.split(rf"^{re.escape(heading)}$", text, maxsplit=1, flags=re.M)[1]
    rows = []
    for line in section.split("\n"):
        if line.startswith("|"):
            rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif rows:
            break
    return rows


def test_readme_verification_table_equals_the_one_in_docs_verification() -> None:
    readme = table_after(_text(README), "## What was verified where")
    summary = table_after(_text(VERIFICATION), "## Summary")
    assert len(readme) > 10
    assert readme == summary, "README.md and docs/verification.md disagree on what was verified where"


def test_table_after_reads_cells_and_stops_at_the_table_end() -> None:
    text = "## T\n\nintro\n\n| a | b \\| c |\n| --- | --- |\n| x | **not run** |\n\n| other |\n"
    assert table_after(text, "## T") == [["a", "b \\| c"], ["---", "---"], ["x", "**not run**"]]


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.relative_to(REPO).as_posix())
def test_every_path_and_link_a_document_gives_exists(doc: Path) -> None:
    """A path is looked up from the repository root, then from src/rl_train (the documents'
    short form), then from the document's own folder; links from the document's folder."""
    text = _text(doc)
    missing = [
        path
        for path in PATH_IN_CODE.findall(text)
        if not any((base / path).exists() for base in (REPO, REPO / "src" / "rl_train", doc.parent))
    ]
    missing += [link for link in LINK.findall(text) if "://" not in link and not (doc.parent / link).exists()]
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


def test_results_has_an_entry_for_every_benchmark() -> None:
    """Each module of src/rl_train/bench is named in RESULTS.md (its figures, or why there are none)."""
    text = _text(RESULTS)
    modules = sorted(p.stem for p in RESULTS.parent.glob("*.py") if p.stem != "__init__")
    assert [m for m in modules if not re.search(rf"\b{m}\b", text)] == []
