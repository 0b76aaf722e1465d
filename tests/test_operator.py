"""The operator's CLI (issue 11, item 6): `conflicts` filters and `conflicts review`,
`quarantine --origin` and `quarantine retry`, through click's CliRunner.

`logsync conflicts` alone still lists; --origin and --kind filter (a bad value is one
sentence naming it and, for a kind, the allowed ones); review marks by id or --all, all or
nothing, and a marked conflict seen again stays marked; an older store without the
`reviewed_at` column is read as it is and migrated by a writable open; retry reports per
origin, in text and JSON, with hostile reasons shown on one line.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import RemoteKit

from logsync.cli import cli
from logsync.store import DB_FILENAME, Store
from logsync.store.ledgers import CONFLICT_KINDS, quarantine_row, record_quarantine

KIT = RemoteKit()
ONE, TWO = KIT.origin(1), KIT.origin(2)


def run(palace: Path, *args: str) -> Result:
    result = CliRunner().invoke(cli, ["--palace", str(palace), *args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    return result


def as_json(palace: Path, *args: str) -> Any:
    result = run(palace, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def one_sentence(result: Result, *fragments: str) -> None:
    assert result.exit_code == 1 and result.stdout == "", result.output
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("Error: ")
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


FIRST_PAGE = [KIT.op(ONE, 1), KIT.op(ONE, 2), KIT.op(TWO, 1)]
SECOND_PAGE = [KIT.op(ONE, 2, body="other"), KIT.op(TWO, 1, body="other")]


@pytest.fixture
def palace(tmp_path: Path) -> Path:
    """Three conflicts: a fork of each origin and an artifact; one held op of each."""
    path = tmp_path / "p"
    with Store.open(path) as store:
        art = KIT.artifact("a\n", art_id="art_1")
        store.apply_remote(FIRST_PAGE, [art])
        store.apply_remote(SECOND_PAGE, [KIT.artifact("b\n", art_id="art_1")])
        store.apply_remote([KIT.op(ONE, 3, artifact_ids=["art_nope"]),
                            KIT.op(TWO, 2, body="nul\x00")])
        assert store.counts() == {"events": 3, "artifacts": 1, "conflicts": 3,
                                  "quarantined": 2}
    return path


def ids_of(rows: list[dict[str, Any]]) -> list[int]:
    return sorted(r["id"] for r in rows)


# ── conflicts: listing and filters ────────────────────────────────────


def test_conflicts_alone_lists_and_filters_select(palace: Path) -> None:
    every = as_json(palace, "conflicts")["conflicts"]
    assert sorted(r["kind"] for r in every) == ["artifact", "fork", "fork"]
    assert all(r["reviewed_at"] is None for r in every)
    assert [r["origin_replica"] for r in as_json(palace, "conflicts", "--origin", ONE)[
        "conflicts"]] == [ONE]
    forks = as_json(palace, "conflicts", "--kind", "fork")["conflicts"]
    assert sorted(r["origin_replica"] for r in forks) == [ONE, TWO]
    both = as_json(palace, "conflicts", "--kind", "artifact", "--origin", TWO)
    assert both == {"conflicts": [], "count": 0}
    text = run(palace, "conflicts").stdout.splitlines()
    assert sorted(int(line[1:line.index("]")]) for line in text) == ids_of(every)


@pytest.mark.parametrize("args", [
    ["conflicts", "--kind", "forks"],
    ["conflicts", "review", "--all", "--kind", "forks"],
])
def test_a_bad_kind_is_one_sentence_naming_it_and_the_kinds(palace: Path,
                                                            args: list[str]) -> None:
    one_sentence(run(palace, *args), "--kind 'forks' is not a conflict kind",
                 *CONFLICT_KINDS)
    assert "forks" in json.loads(run(palace, *args, "--json").stdout)["error"]


@pytest.mark.parametrize("args", [
    ["conflicts", "--origin", "rep_x"], ["quarantine", "--origin", "rep_x"],
    ["quarantine", "retry", "--origin", "rep_x"],
    ["conflicts", "review", "--all", "--origin", "rep_x"],
])
def test_a_bad_origin_is_one_sentence_naming_it(palace: Path, args: list[str]) -> None:
    one_sentence(run(palace, *args), "--origin 'rep_x' is not a replica id")


def test_every_kind_the_code_records_is_a_known_kind() -> None:
    """The kinds --kind accepts are the ones apply.py and chainreads.py write."""
    import re

    from logsync.store import apply, chainreads
    written = set()
    for module in (apply, chainreads):
        source = Path(module.__file__).read_text(encoding="utf-8")
        written |= set(re.findall(r'_record\(s, "([a-z_]+)"', source))
        written |= set(re.findall(r'conflict_row\(\s*now, "([a-z_]+)"', source))
        written |= set(re.findall(r'_conflict\(state, "([a-z_]+)"', source))
    assert written == set(CONFLICT_KINDS)


# ── conflicts review ──────────────────────────────────────────────────


def test_review_by_id_marks_those_and_they_stop_counting(palace: Path) -> None:
    forks = as_json(palace, "conflicts", "--kind", "fork")["conflicts"]
    target = forks[0]["id"]
    done = as_json(palace, "conflicts", "review", str(target))
    assert done == {"reviewed": 1, "already_reviewed": 0, "ids": [target]}
    rows = {r["id"]: r for r in as_json(palace, "conflicts")["conflicts"]}
    assert rows[target]["reviewed_at"] is not None
    assert [i for i, r in rows.items() if r["reviewed_at"]] == [target]
    unreviewed = as_json(palace, "conflicts", "--unreviewed")["conflicts"]
    assert target not in ids_of(unreviewed) and len(unreviewed) == 2
    line = next(x for x in run(palace, "conflicts").stdout.splitlines()
                if x.startswith(f"[{target}]"))
    assert "(reviewed)" in line
    with Store.open(palace) as store:
        assert store.counts(unreviewed=True)["conflicts_unreviewed"] == 2
        store.apply_remote(SECOND_PAGE)                # the same conflicts seen again
        again = {r["id"]: r for r in store.list_conflicts()}
        assert again[target]["times_seen"] == 2 and again[target]["reviewed_at"]
        assert store.counts(unreviewed=True)["conflicts_unreviewed"] == 2
    conn = sqlite3.connect(palace / DB_FILENAME)
    with conn:
        conn.execute("UPDATE logsync_conflicts SET reviewed_at = 'first' WHERE id = ?",
                     (target,))
    conn.close()
    second = as_json(palace, "conflicts", "review", str(target))
    assert (second["reviewed"], second["already_reviewed"]) == (0, 1)
    marks = {r["id"]: r["reviewed_at"] for r in as_json(palace, "conflicts")["conflicts"]}
    assert marks[target] == "first"                    # the first mark stays


def test_review_all_takes_the_filters(palace: Path) -> None:
    done = as_json(palace, "conflicts", "review", "--all", "--kind", "fork", "--origin", TWO)
    assert done == {"reviewed": 1, "already_reviewed": 0}
    left = as_json(palace, "conflicts", "--unreviewed")["conflicts"]
    assert sorted((r["kind"], r["origin_replica"]) for r in left) == [
        ("artifact", None), ("fork", ONE)]
    text = run(palace, "conflicts", "review", "--all")
    assert text.stdout.strip() == "marked 2 conflicts reviewed (1 already were)"
    assert as_json(palace, "conflicts", "--unreviewed")["count"] == 0


def test_review_errors_are_one_sentence_and_mark_nothing(palace: Path) -> None:
    first = ids_of(as_json(palace, "conflicts")["conflicts"])[0]
    one_sentence(run(palace, "conflicts", "review", str(first), "999"),
                 "conflict 999 does not exist", "nothing was marked")
    one_sentence(run(palace, "conflicts", "review", str(first), "--all"), "not both")
    one_sentence(run(palace, "conflicts", "review"), "--all")
    one_sentence(run(palace, "conflicts", "review", str(first), "--kind", "fork"),
                 "--origin and --kind")
    assert as_json(palace, "conflicts", "--unreviewed")["count"] == 3


def test_an_older_store_is_read_as_it_is_and_migrated_by_a_write(palace: Path) -> None:
    conn = sqlite3.connect(palace / DB_FILENAME)
    with conn:
        conn.execute("ALTER TABLE logsync_conflicts DROP COLUMN reviewed_at")
    conn.close()
    with Store.open(palace, read_only=True) as reader:    # no migration needed to read
        assert reader.counts(unreviewed=True)["conflicts_unreviewed"] == 3
        assert all(r["reviewed_at"] is None for r in reader.list_conflicts())
        assert len(reader.list_conflicts(unreviewed=True)) == 3
    listed = as_json(palace, "conflicts", "--unreviewed")
    assert listed["count"] == 3
    done = as_json(palace, "conflicts", "review", "--all")   # a writable open migrates
    assert done["reviewed"] == 3
    with Store.open(palace, read_only=True) as reader:
        assert reader.counts(unreviewed=True)["conflicts_unreviewed"] == 0


# ── quarantine ────────────────────────────────────────────────────────


def test_quarantine_lists_one_origin(palace: Path) -> None:
    rows = as_json(palace, "quarantine", "--origin", ONE)["quarantined"]
    assert [(r["origin_replica"], r["origin_seq"]) for r in rows] == [(ONE, 3)]
    assert as_json(palace, "quarantine")["count"] == 2


def test_retry_reports_per_origin_in_json_and_text(palace: Path) -> None:
    with Store.open(palace) as store:
        store.apply_remote([], [KIT.artifact("late\n", art_id="art_nope")])
    out = as_json(palace, "quarantine", "retry")
    by_origin = {o["origin"]: o for o in out["origins"]}
    assert (by_origin[ONE]["applied"], by_origin[ONE]["still_held"]) == (1, 0)
    assert (by_origin[TWO]["applied"], by_origin[TWO]["still_held"]) == (0, 1)
    (held,) = by_origin[TWO]["held"]
    assert held["origin_seq"] == 2 and "body" in held["reason"]
    assert out["totals"] == {"retried": 2, "applied": 1, "already_held": 0, "conflicts": 0,
                             "still_held": 1}
    text = run(palace, "quarantine", "retry").stdout.splitlines()
    assert text[0] == (f"{TWO}: retried 1, applied 0, already held 0, conflicts 0, "
                       "still held 1")
    assert text[1].startswith(f"    [{held['id']}] #2 ") and "body" in text[1]
    assert as_json(palace, "quarantine", "retry", "--origin", ONE)["origins"] == []


def test_retry_text_shows_a_hostile_reason_on_one_line(tmp_path: Path) -> None:
    """A reason kept as it was written (another program's ledger) is escaped and cut."""
    palace = tmp_path / "h"
    with Store.open(palace) as store, store._atomic(durable=True) as conn:
        record_quarantine(conn, [quarantine_row("t", "event", KIT.op(ONE, 1),
                                                "bad_signature: evil\n\x1b[2J" + "x" * 500)])
    result = run(palace, "quarantine", "retry")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{ONE}: retried 1")
    assert len(lines) == 2 and "\x1b" not in lines[1] and lines[1].endswith("...")


def test_retry_on_an_empty_quarantine_and_a_missing_palace(tmp_path: Path) -> None:
    Store.open(tmp_path / "e").close()
    assert run(tmp_path / "e", "quarantine", "retry").stdout == "no quarantined ops to retry\n"
    one_sentence(run(tmp_path / "none", "quarantine", "retry"), "no palace at")
    assert not (tmp_path / "none").exists()
