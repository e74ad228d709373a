"""Every requirement id the code cites is defined in docs/design.md.

The code cites ids (``R-2.6``, a section ``R-8``, and the router-replay sources ``R2`` / ``R3``
of R-4.8) to say which requirement a line serves; an id defined nowhere in the repository
sends the reader to a document they cannot open. docs/design.md defines an id on a line that
starts with it in bold (``- **R-2.6** ...``) or on a section heading (``## R-8 ...``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "design.md"
CITING = ("src", "tests", "scripts", "configs")
SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".md", ".txt"}
CITED = re.compile(r"\bR-\d+(?:\.\d+)?\b|\bR\d\b")
"""A requirement (R-7.2), a section (R-8), or a router-replay source (R2, R3)."""
DEFINED = re.compile(r"^(?:#+ |- \*\*)(R-\d+(?:\.\d+)?|R\d)\b", re.M)


def cited_ids(texts: Iterable[str]) -> set[str]:
    return {match for text in texts for match in CITED.findall(text)}


def defined_ids(design: str) -> set[str]:
    return set(DEFINED.findall(design))


def _citing_texts() -> dict[Path, str]:
    return {
        path: path.read_text(encoding="utf-8")
        for folder in CITING
        for path in sorted((REPO / folder).rglob("*"))
        if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts
    }


def test_every_cited_id_is_defined_in_the_design() -> None:
    defined = defined_ids(DESIGN.read_text(encoding="utf-8"))
    undefined = {
        f"{path.relative_to(REPO)}: {sorted(ids - defined)}"
        for path, text in _citing_texts().items()
        if (ids := cited_ids([text])) - defined
    }
    assert not undefined, "ids cited but not defined in docs/design.md:\n" + "\n".join(sorted(undefined))


def test_the_code_cites_ids_and_each_is_defined_once() -> None:
    """The scan finds the citations there are (so an empty scan cannot pass), and no id is
    defined twice (two meanings for one id)."""
    assert {"R-2.6", "R-9.3", "R-8", "R2", "R3"} <= cited_ids(_citing_texts().values())
    definitions = DEFINED.findall(DESIGN.read_text(encoding="utf-8"))
    assert sorted({d for d in definitions if definitions.count(d) > 1}) == []


def test_the_patterns_tell_a_citation_from_a_definition() -> None:
    design = (
        "# Design\n\n## R-8 Weight sync\n\n- **R-8.2** Buckets ...\n- **R3** rollout's routes\nsee R-9.1\n"
    )
    assert defined_ids(design) == {"R-8", "R-8.2", "R3"}
    assert cited_ids(["replay (R-7.2, R-8); R3: routes; not R22, IR2 or R-"]) == {"R-7.2", "R-8", "R3"}
