"""replica.json: one stable identity per palace, minted once, never a silent
second one (a second identity would fork this replica's op-log provenance).
"""

from __future__ import annotations

import json
import multiprocessing
import re
import threading
from pathlib import Path

import pytest

from logsync.errors import ReplicaIdentityError
from logsync.keys import KEY_FILENAME
from logsync.replica import REPLICA_FILENAME, get_replica_id, is_replica_id, read_replica_id
from logsync.store import Store

NEW_SHAPE = re.compile(r"^rep_[0-9a-f]{32}$")


def test_minted_once_in_the_new_shape_and_stable(tmp_path: Path) -> None:
    first = get_replica_id(tmp_path / "p")
    assert NEW_SHAPE.match(first)
    assert get_replica_id(tmp_path / "p") == first
    on_disk = json.loads((tmp_path / "p" / REPLICA_FILENAME).read_text(encoding="utf-8"))
    assert on_disk == {"replica_id": first}
    # Nothing else but the signing key the id is derived from (no temp files left).
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == [KEY_FILENAME, REPLICA_FILENAME]


def test_distinct_palaces_get_distinct_ids(tmp_path: Path) -> None:
    assert get_replica_id(tmp_path / "a") != get_replica_id(tmp_path / "b")


def test_store_reuses_the_palace_id_across_reopens(tmp_path: Path) -> None:
    with Store.open(tmp_path) as s:
        first = s.replica_id
    with Store.open(tmp_path) as s:
        assert s.replica_id == first
    assert read_replica_id(tmp_path) == first


def test_twelve_hex_ids_from_older_releases_are_accepted(tmp_path: Path) -> None:
    (tmp_path / REPLICA_FILENAME).write_text('{"replica_id": "rep_0123456789ab"}')
    assert get_replica_id(tmp_path) == "rep_0123456789ab"
    assert json.loads((tmp_path / REPLICA_FILENAME).read_text()) == {
        "replica_id": "rep_0123456789ab"
    }


def test_read_returns_none_when_there_is_no_file(tmp_path: Path) -> None:
    assert read_replica_id(tmp_path) is None


@pytest.mark.parametrize(
    "text",
    ["", "{", "not json", "[]", '"rep_0123456789ab"', "{}", '{"id": "rep_0123456789ab"}', "null"],
)
def test_corrupt_file_is_a_clear_error_and_never_replaced(tmp_path: Path, text: str) -> None:
    path = tmp_path / REPLICA_FILENAME
    path.write_text(text)
    with pytest.raises(ReplicaIdentityError, match="is corrupt") as info:
        get_replica_id(tmp_path)
    assert "refusing to mint a second identity" in str(info.value)
    assert str(path) in str(info.value)
    assert path.read_text() == text  # untouched
    with pytest.raises(ReplicaIdentityError):
        Store.open(tmp_path)
    assert path.read_text() == text


@pytest.mark.parametrize(
    "value",
    ["rep_XYZ", "rep_0123456789AB", "0123456789ab", "rep_" + "a" * 31, "rep_" + "a" * 16,
     "rep_" + "a" * 33, 42, None, ""],
)
def test_foreign_shaped_id_is_a_clear_error(tmp_path: Path, value: object) -> None:
    path = tmp_path / REPLICA_FILENAME
    path.write_text(json.dumps({"replica_id": value}))
    with pytest.raises(ReplicaIdentityError) as info:
        get_replica_id(tmp_path)
    message = str(info.value)
    assert repr(value) in message
    assert "'rep_' followed by 12 or 32 lowercase hex digits" in message
    assert "refusing to mint a second identity" in message
    assert json.loads(path.read_text()) == {"replica_id": value}


def test_malformed_mint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ReplicaIdentityError, match="minted replica id 'rep_nope' is malformed"):
        get_replica_id(tmp_path, mint=lambda: "rep_nope")
    assert not (tmp_path / REPLICA_FILENAME).exists()


def test_is_replica_id_shapes() -> None:
    assert is_replica_id("rep_" + "0" * 32)
    assert is_replica_id("rep_" + "f" * 12)
    for bad in ("rep_" + "g" * 32, "REP_" + "0" * 32, "rep_" + "0" * 20, None, 5):
        assert not is_replica_id(bad)


def _race_threads(palace: Path, n: int) -> tuple[list[str], list[BaseException]]:
    barrier = threading.Barrier(n)
    results: list[str] = []
    errors: list[BaseException] = []

    def run() -> None:
        barrier.wait()
        try:
            results.append(get_replica_id(palace))
        except BaseException as exc:  # recorded, asserted by the caller
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    return results, errors


def test_concurrent_first_opens_in_threads_agree_on_one_id(tmp_path: Path) -> None:
    """Threads of one process racing the first open must not fork the identity."""
    for trial in range(25):
        palace = tmp_path / f"t{trial}"
        results, errors = _race_threads(palace, 6)
        assert errors == [], f"trial {trial}: {errors[:2]}"
        final = read_replica_id(palace)
        assert set(results) == {final}, f"trial {trial}"


def _mint_in_child(palace: str, start: object, out: object) -> None:
    start.wait()  # type: ignore[attr-defined]
    out.put(get_replica_id(Path(palace)))  # type: ignore[attr-defined]


def test_concurrent_first_opens_in_processes_agree_on_one_id(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    for trial in range(3):
        palace = tmp_path / f"p{trial}"
        start, out = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_mint_in_child, args=(str(palace), start, out))
                 for _ in range(4)]
        for p in procs:
            p.start()
        start.set()
        ids = [out.get(timeout=20) for _ in procs]
        for p in procs:
            p.join(timeout=20)
            assert p.exitcode == 0
        assert len(set(ids)) == 1
        assert read_replica_id(palace) == ids[0]
