"""docs/rfc-004.md names the test behind every normative rule; keep those names real.

The RFC cites tests as `tests/<path>.py::<name>` (or `::Class::method`, or a
parametrized test's base name with or without `[id]`). A rename or a deleted
test would silently orphan a rule, so this test parses every cited file with
`ast` and fails, listing each reference that no longer resolves. It also keeps
the RFC from quietly shedding its references, checks that the code it names
(`logsync/...` paths, `engine.<function>`, `PeerClient.<method>`) still exists,
and checks that the README links it.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RFC = ROOT / "docs" / "rfc-004.md"
README = ROOT / "README.md"
MIN_DISTINCT_TESTS = 200  # 240 when last revised: losing dozens at once is a mistake
REFERENCE_RE = re.compile(
    r"tests/[A-Za-z0-9_/]+\.py(?:::[A-Za-z_][A-Za-z0-9_]*)+(?:\[[^\]\s`]*\])?"
)
CODE_PATH_RE = re.compile(r"`(logsync/[A-Za-z0-9_/]+(?:\.py)?)`")
CODE_NAME_RE = re.compile(r"`(engine|schedule|wire|PeerClient)\.([A-Za-z_][A-Za-z0-9_]*)`")
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


def code_names(path: Path, owner: str | None = None) -> frozenset[str]:
    """Module-level functions and classes of `path`, or the methods of class `owner`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    body = tree.body
    if owner is not None:
        body = next((n.body for n in body if isinstance(n, ast.ClassDef) and n.name == owner), [])
    return frozenset(node.name for node in body if isinstance(node, kinds))


def missing_code(text: str) -> list[str]:
    """Code the RFC names in backticks that the tree no longer has."""
    missing = [f"{p} (no such path)" for p in sorted(set(CODE_PATH_RE.findall(text)))
               if not (ROOT / p).exists()]
    homes = {"engine": (ROOT / "logsync" / "engine.py", None),
             "schedule": (ROOT / "logsync" / "schedule.py", None),
             "wire": (ROOT / "logsync" / "wire.py", None),
             "PeerClient": (ROOT / "logsync" / "client.py", "PeerClient")}
    for owner, name in sorted(set(CODE_NAME_RE.findall(text))):
        path, cls = homes[owner]
        if name not in code_names(path, cls):
            missing.append(f"{owner}.{name} (not defined in {path.relative_to(ROOT)})")
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


def test_the_code_the_rfc_names_exists() -> None:
    missing = missing_code(rfc_text())
    assert not missing, "docs/rfc-004.md names code that does not exist:\n  " + "\n  ".join(
        missing)


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
    assert missing_code("`logsync/engine.py`, `schedule.choose_targets`, "
                        "`PeerClient.run_targeted`, `logsync/nope.py`, `engine.gone`, "
                        "`PeerClient.gone`") == [
        "logsync/nope.py (no such path)",
        "PeerClient.gone (not defined in logsync/client.py)",
        "engine.gone (not defined in logsync/engine.py)",
    ]
    sample = tmp_path / "sample.py"
    sample.write_text("class TestA:\n    def test_m(self):\n        pass\n"
                      "async def test_b():\n    pass\ndef helper():\n    pass\n")
    assert defined_tests(sample) == {"TestA::test_m", "test_b"}
