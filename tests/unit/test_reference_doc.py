"""docs/reference.md is generated, current, and lists every registered name and every config field.

A name nobody can look up is a trap, and so is a reference that drifted from the code: the
file must be exactly what ``python -m rl_train.reference_doc`` writes, and, checked against the
registries and the config tree directly (not through the generator), it must hold one line per
registered name and one row per config field.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rl_train import reference_doc, reference_names
from rl_train.config import describe_fields
from rl_train.registry import registries

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
TABLES = {reference_names._title(kind): registry.names() for kind, registry in registries().items()}
"""Heading -> the names the registry holds, read from the registries, not through the generator."""


def test_the_reference_is_what_the_generator_writes() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == reference_doc.render(), (
        f"{REFERENCE} is stale: run `{reference_doc.COMMAND}` and commit the result"
    )


def documented(title: str) -> list[str]:
    """Names of the ``- `name`: ...`` lines under the ``### title (...)`` heading."""
    section = REFERENCE.read_text(encoding="utf-8").split("## Registered names", 1)[1].split("\n## ", 1)[0]
    block = section.split(f"\n### {title} (", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"^- `([^`]+)`: \S", block, re.M)


@pytest.mark.parametrize("title", list(TABLES))
def test_every_registered_name_has_one_line(title: str) -> None:
    assert sorted(documented(title)) == sorted(TABLES[title])


def test_every_config_field_has_a_row() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    missing = [path for path, _, _ in describe_fields() if f"\n| `{path}` | " not in text]
    assert not missing, f"{REFERENCE.name} lacks rows for: {missing}"


def test_a_name_registered_without_a_description_stops_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    tools = registries()["tool"]
    monkeypatch.setattr(type(tools), "describe", lambda self: {name: "" for name in self.names()})
    with pytest.raises(ValueError, match="registered without a description"):
        reference_names.registry_sections()


def test_check_fails_on_a_stale_file_and_names_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "reference.md"
    out.write_text("# Reference\n\nwritten by hand\n", encoding="utf-8")
    assert reference_doc.main(["--check", "--out", str(out)]) == 1
    assert "python -m rl_train.reference_doc" in capsys.readouterr().err
    assert reference_doc.main(["--out", str(out)]) == 0
    assert reference_doc.main(["--check", "--out", str(out)]) == 0
