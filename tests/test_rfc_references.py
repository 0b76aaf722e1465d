"""docs/rfc-004.md names the test behind every normative rule; keep those names real.

The RFC cites tests as `tests/<path>.py::<name>` (or `::Class::method`, or a
parametrized test's base name with or without `[id]`). A rename or a deleted
test would silently orphan a rule, so this test parses every cited file with
`ast` and fails, listing each reference that no longer resolves. It also keeps
the RFC from quietly shedding its references, and checks that the README links it.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RFC = ROOT / "docs" / "rfc-004.md"
README = ROOT / "README.md"
MIN_DISTINCT_TESTS = 40
REFERENCE_RE = re.compile(
    r"tests/[A-Za-z0-9_/]+\.py(?:::[A-Za-z_][A-Za-z0-9_]*)+(?:\[[^\]\s`]*\])?"
)
SECTIONS = (
    "Identities", "The op envelope", "Version vectors", "The pull protocol", "Apply rules",
    "Derived views", "Security", "Failure modes", "Open questions", "Compatibility matrix",
)


def references(text: str) -> set[str]:
    """Every cited `tests/...py::name`, parametrization ids stripped."""
    return {re.sub(r"\[.*\]$", "", match) for match in REFERENCE_RE.findall(text)}


@cache
def defined_tests(path: Path) -> frozenset[str]:
    """`name` for module-level test functions and `Class::name` for test methods."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, functions) and node.name.startswith("test"):
            found.add(node.name)
        elif isinstance(node, ast.ClassDef):
            found.update(
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, functions) and item.name.startswith("test")
            )
    return frozenset(found)


def unresolved(refs: set[str]) -> list[str]:
    """The references whose file or test function does not exist, each with why."""
    missing = []
    for ref in sorted(refs):
        file_part, _, name = ref.partition("::")
        path = ROOT / file_part
        if not path.is_file():
            missing.append(f"{ref} (no file {file_part})")
        elif name not in defined_tests(path):
            missing.append(f"{ref} (no test {name!r} in {file_part})")
    return missing


def rfc_text() -> str:
    assert RFC.is_file(), f"{RFC} is missing"
    return RFC.read_text(encoding="utf-8")


def test_every_test_the_rfc_names_exists() -> None:
    missing = unresolved(references(rfc_text()))
    assert not missing, "docs/rfc-004.md names tests that do not exist:\n  " + "\n  ".join(missing)


def test_the_rfc_keeps_its_references() -> None:
    refs = references(rfc_text())
    assert len(refs) >= MIN_DISTINCT_TESTS, (
        f"docs/rfc-004.md cites {len(refs)} distinct tests; at least {MIN_DISTINCT_TESTS} "
        "are expected (a rule lost its test reference?)"
    )


def test_the_rfc_has_its_ten_parts() -> None:
    headings = [line for line in rfc_text().splitlines() if line.startswith("## ")]
    absent = [name for name in SECTIONS if not any(name in h for h in headings)]
    assert not absent, f"docs/rfc-004.md lacks the sections {absent}"


def test_the_readme_links_the_rfc() -> None:
    assert "](docs/rfc-004.md)" in README.read_text(encoding="utf-8"), (
        "README.md does not link docs/rfc-004.md"
    )


def test_the_checker_itself_resolves_and_rejects(tmp_path: Path) -> None:
    """The parser must see functions, methods and parametrized ids, and flag the rest."""
    cited = references(
        "see `tests/test_hlc.py::test_same_millisecond_bumps_the_counter`, "
        "tests/test_model.py::test_append_event_refuses[type-Task.Note] and "
        "tests/test_nope.py::test_x, tests/test_hlc.py::test_gone."
    )
    assert cited == {
        "tests/test_hlc.py::test_same_millisecond_bumps_the_counter",
        "tests/test_model.py::test_append_event_refuses",
        "tests/test_nope.py::test_x",
        "tests/test_hlc.py::test_gone",
    }
    assert unresolved(cited) == [
        "tests/test_hlc.py::test_gone (no test 'test_gone' in tests/test_hlc.py)",
        "tests/test_nope.py::test_x (no file tests/test_nope.py)",
    ]
    sample = tmp_path / "sample.py"
    sample.write_text("class TestA:\n    def test_m(self):\n        pass\n"
                      "async def test_b():\n    pass\ndef helper():\n    pass\n")
    assert defined_tests(sample) == {"TestA::test_m", "test_b"}
