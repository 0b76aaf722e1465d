"""docs/rfc-004.md names the test behind every normative rule; keep those names real.

The RFC cites tests as `tests/<path>.py::<name>` (or `::Class::method`, or a
parametrized test's base name with or without `[id]`). A rename or a deleted
test would silently orphan a rule, so this test parses every cited file with
`ast` and fails, listing each reference that no longer resolves. It also keeps
the RFC from quietly shedding its references, checks that the code it names
(`logsync/...` paths, `engine.<function>`, `PeerClient.<method>`) still exists,
that it keeps its fixed outline (a conformance kit cites the section numbers) and
its stated word limit, and that the README links it. Every document in `docs/`
must name no commit (history belongs in git), point nowhere outside the
repository, and link only files that exist.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RFC = ROOT / "docs" / "rfc-004.md"
DETAILS = ROOT / "docs" / "rfc-004-details.md"  # normative too: its references are checked
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MIN_DISTINCT_TESTS = 200  # 263 when last revised: losing dozens at once is a mistake
# The RFC is the normative text only (rationale and figures live beside it); its front
# matter states this same limit, so a reader knows it too.
MAX_WORDS = 7_500
LIMIT_LINE_RE = re.compile(r"\*\*Size limit:\*\* this file stays under ([0-9][0-9 ,]*) words")
# Documents that may still name commits, each with why; the owner removes the entry once
# the document is rewritten. Nothing else in docs/ may.
HASH_EXEMPT = {
    "mutation.md": "a mutation-testing report whose rows name the revisions they measured; "
                   "not owned by the RFC",
}
# A commit-looking token: 7-40 lowercase hex digits with at least one digit and one
# letter, standing alone (not part of an identifier such as rep_<hex> or a longer digest).
COMMIT_RE = re.compile(
    r"(?<![0-9A-Za-z_])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
OUTSIDE_RE = re.compile(r"\.\./")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
REFERENCE_RE = re.compile(
    r"tests/[A-Za-z0-9_/]+\.py(?:::[A-Za-z_][A-Za-z0-9_]*)+(?:\[[^\]\s`]*\])?"
)
CODE_PATH_RE = re.compile(r"`(logsync/[A-Za-z0-9_/]+(?:\.py)?)`")
CODE_NAME_RE = re.compile(r"`(engine|schedule|wire|PeerClient)\.([A-Za-z_][A-Za-z0-9_]*)`")
OUTLINE = (
    "1. Introduction", "2. Terminology", "3. Identities", "4. Events and canonical bytes",
    "5. Hybrid logical clocks", "6. Version vectors", "7. Endpoints",
    "8. Extensions and negotiation", "9. The pull round", "10. Applying a page", "11. Errors",
    "12. Security", "13. Versioning", "Appendix A. Requirement map",
    "Appendix B. Compatibility with MemPalace hubs",
)
ENDPOINTS = ("7.1 ", "7.2 ", "7.3 ", "7.4 ", "7.5 ", "7.6 ", "7.7 ")
COMPANIONS = ("rfc-004-details.md", "rfc-004-rationale.md", "measurements.md",
              "requirement-map.md")


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
    for doc in (RFC, DETAILS):
        missing = unresolved(references(doc.read_text(encoding="utf-8")))
        assert not missing, (f"docs/{doc.name} names tests that do not exist:\n  "
                             + "\n  ".join(missing))


def test_the_rfc_keeps_its_references() -> None:
    refs = references(rfc_text())
    assert len(refs) >= MIN_DISTINCT_TESTS, (
        f"docs/rfc-004.md cites {len(refs)} distinct tests; at least {MIN_DISTINCT_TESTS} "
        "are expected (a rule lost its test reference?)"
    )


def test_the_code_the_rfc_names_exists() -> None:
    for doc in (RFC, DETAILS):
        missing = missing_code(doc.read_text(encoding="utf-8"))
        assert not missing, (f"docs/{doc.name} names code that does not exist:\n  "
                             + "\n  ".join(missing))


def test_the_rfc_keeps_its_numbered_outline() -> None:
    """The top-level numbers are fixed: other documents and a conformance kit cite them."""
    text = rfc_text()
    numbered = [line[3:] for line in text.splitlines() if line.startswith("## ")
                and (line[3].isdigit() or line[3:].startswith("Appendix"))]
    assert numbered == list(OUTLINE), (
        f"docs/rfc-004.md's numbered sections are {numbered}; the outline is {list(OUTLINE)}")
    subsections = [line[4:] for line in text.splitlines() if line.startswith("### 7.")]
    absent = [s for s in ENDPOINTS if not any(h.startswith(s) for h in subsections)]
    assert not absent, f"docs/rfc-004.md lacks the endpoint sections {absent}"


def word_count(text: str) -> int:
    return len(text.split())


def stated_limit(text: str) -> int | None:
    """The word limit the RFC's front matter states, or None."""
    match = LIMIT_LINE_RE.search(text)
    return int(re.sub(r"[ ,]", "", match.group(1))) if match else None


def test_the_rfc_stays_within_its_stated_word_limit() -> None:
    text = rfc_text()
    assert stated_limit(text) == MAX_WORDS, (
        f"docs/rfc-004.md's front matter must state its limit as '**Size limit:** this file "
        f"stays under {MAX_WORDS:,} words'".replace(",", " "))
    words = word_count(text)
    assert words <= MAX_WORDS, (
        f"docs/rfc-004.md has {words} words, over its limit of {MAX_WORDS}: move rationale to "
        "docs/rfc-004-rationale.md and figures to docs/measurements.md")


def test_the_rfc_links_its_companions() -> None:
    text = rfc_text()
    absent = [name for name in COMPANIONS if f"]({name})" not in text]
    assert not absent, f"docs/rfc-004.md does not link {absent}"


def commits_named(text: str) -> list[str]:
    """Tokens that look like commit hashes."""
    return COMMIT_RE.findall(text)


def outside_paths(text: str) -> list[str]:
    """Lines that point outside the repository (a `../` path)."""
    return [line.strip() for line in text.splitlines() if OUTSIDE_RE.search(line)]


def broken_links(doc: Path, text: str) -> list[str]:
    """Relative link targets of `doc` that name no file or directory in the repository."""
    broken = []
    for target in LINK_RE.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.exists() or ROOT not in path.parents:
            broken.append(target)
    return broken


def docs() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_no_document_names_a_commit() -> None:
    found = {doc.name: commits_named(doc.read_text(encoding="utf-8")) for doc in docs()
             if doc.name not in HASH_EXEMPT}
    found = {name: hits for name, hits in found.items() if hits}
    assert not found, f"docs name commits (history belongs in git): {found}"


def test_no_document_points_outside_the_repository() -> None:
    found = {doc.name: outside_paths(doc.read_text(encoding="utf-8")) for doc in docs()}
    found = {name: lines for name, lines in found.items() if lines}
    assert not found, f"docs point outside the repository (`../`): {found}"


def test_every_relative_link_in_docs_and_the_readme_resolves() -> None:
    found = {doc.name: broken_links(doc, doc.read_text(encoding="utf-8"))
             for doc in [*docs(), README]}
    found = {name: links for name, links in found.items() if links}
    assert not found, f"links to files that do not exist: {found}"


def test_the_document_checkers_catch_what_they_must(tmp_path: Path) -> None:
    """Planted defects: each checker flags its defect and passes the look-alikes."""
    assert commits_named("fixed in `ae3e1b3`, see 975a85e; at 106a511.") == [
        "ae3e1b3", "975a85e", "106a511"]
    assert commits_named(
        "rep_59afec6145ceb05a9b04c967951dad66 evt_20260921T141320_d5cc2ccf8756 "
        "b0275847cc37e4ecf0407b6c6d913313e3a50b322e11ef59b7d2006e222ac48d 1790000000008 "
        "0xFFFFFF deadbeef 1e+16 -000000-") == []
    assert outside_paths("see ../outside/notes.md\nand docs/x.md") == ["see ../outside/notes.md"]
    doc = tmp_path / "d.md"
    assert broken_links(doc, "[a](nope.md) [b](https://x.org/y) [c](#top)") == ["nope.md"]
    assert broken_links(DOCS / "rfc-004.md", "[r](rfc-004.md#a) [u](../../etc/passwd)") == [
        "../../etc/passwd"]
    assert stated_limit("**Size limit:** this file stays under 7 500 words") == 7500
    assert word_count("a b\n c") == 3


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
