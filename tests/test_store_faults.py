"""Local store faults (issue 8, findings 3 and 17): a full disk, immutable files, corrupt
pages and read-only opens. Each fault is one StoreError sentence naming the file and the
cause; `health_problem()` names it while it lasts and returns None once it is fixed."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from logsync.errors import StoreError
from logsync.store import Store
from logsync.store.core import DB_FILENAME
from logsync.store.faults import StoreNeedsWrite
from tests.conftest import mounted_tmpfs, unavailable

PY = [sys.executable, "-m", "logsync"]


def fill(store: Store, count: int, body: str = "x" * 2000) -> None:
    for _ in range(count):
        store.append_event("note", "main", "lobby", "alice", body=body)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (root only), unmounted afterwards."""
    with mounted_tmpfs(tmp_path / "small", "2m") as mount:
        yield mount


def test_disk_full_is_a_store_error_and_health_recovers(tmpfs: Path) -> None:
    palace = tmpfs / "palace"
    store = Store.open(palace)
    try:
        fill(store, 5)
        filler = tmpfs / "filler"
        with open(filler, "wb") as out:  # take all but a little of the space
            try:
                while True:
                    out.write(b"\0" * 65536)
                    out.flush()
            except OSError:
                pass
        with pytest.raises(StoreError) as caught:
            fill(store, 2000, body="y" * 20_000)
        message = str(caught.value)
        assert "cannot" in message and str(store.db_path) in message
        assert "disk is full" in message
        assert "rollback" not in message.lower()
        assert store.health_problem() is not None
        assert "disk is full" in store.health_problem()
        assert len(store.list_events(limit=500)) >= 5  # reads still work
        filler.unlink()
        assert store.health_problem() is None
        fill(store, 1)
    finally:
        store.close()


def test_a_failed_statement_after_sqlite_rolled_back_is_one_store_error(
        tmp_path: Path) -> None:
    """The finding's second bug: ROLLBACK after SQLite already rolled back raised
    'cannot rollback - no transaction is active' instead of the real cause."""
    store = Store.open(tmp_path / "p")
    try:
        with pytest.raises(StoreError, match="disk is full"), store._atomic(durable=True) as conn:
            conn.execute("ROLLBACK")  # what SQLite does by itself on SQLITE_FULL
            raise sqlite3.OperationalError("database or disk is full")
        fill(store, 1)  # the writer is usable afterwards
    finally:
        store.close()


def _corrupt(db: Path) -> None:
    size = db.stat().st_size
    with open(db, "r+b") as handle:
        for offset in range(size // 3, 2 * size // 3, 4096 * 7):
            handle.seek(offset)
            handle.write(os.urandom(4096))


def test_corrupt_pages_are_found_at_open_with_the_recovery_line(tmp_path: Path) -> None:
    palace = tmp_path / "palace"
    with Store.open(palace) as store:
        fill(store, 400)
    _corrupt(palace / DB_FILENAME)
    with pytest.raises(StoreError) as caught:
        Store.open(palace)
    message = str(caught.value)
    assert f"the store file {palace / DB_FILENAME} is corrupt" in message
    assert "logsync --palace NEW init && logsync --palace NEW sync --peer URL" in message
    assert "\n" not in message


def test_reads_of_corrupt_pages_are_store_errors(tmp_path: Path) -> None:
    palace = tmp_path / "palace"
    with Store.open(palace) as store:
        fill(store, 400)
    _corrupt(palace / DB_FILENAME)
    try:
        store = Store.open(palace, check=False)
    except StoreError:
        return  # the schema page itself was hit: also one sentence
    try:
        with pytest.raises(StoreError, match="corrupt|malformed"):
            for _ in store.iter_events():
                pass
        problem = store.health_problem()
        assert problem is not None and "corrupt" in problem
    finally:
        store.close()


def test_cli_reports_a_corrupt_store_in_one_line(tmp_path: Path) -> None:
    palace = tmp_path / "palace"
    with Store.open(palace) as store:
        fill(store, 400)
    _corrupt(palace / DB_FILENAME)
    done = subprocess.run([*PY, "--palace", str(palace), "list"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("Error: ")
    assert "corrupt" in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------- read-only (17)


def _chattr(flag: str, *paths: Path) -> None:
    done = subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True, text=True)
    if done.returncode != 0:
        unavailable(f"chattr {flag} is not supported here: {done.stderr.strip()}")


@pytest.fixture
def immutable_palace(tmp_path: Path) -> Iterator[Path]:
    if shutil.which("chattr") is None:
        unavailable("chattr(1) is not installed")
    palace = tmp_path / "palace"
    with Store.open(palace) as store:
        fill(store, 3)
    files = [palace / name for name in os.listdir(palace)]
    _chattr("+i", *files)
    try:
        _chattr("+i", palace)
        try:
            yield palace
        finally:
            subprocess.run(["chattr", "-i", str(palace)], check=False)
    finally:
        subprocess.run(["chattr", "-i", *map(str, files)], check=False)


def test_an_immutable_store_is_listed_read_only_and_refuses_writes(
        immutable_palace: Path) -> None:
    with Store.open(immutable_palace, read_only=True) as store:
        assert len(store.list_events()) == 3
        assert store.counts()["events"] == 3
        with pytest.raises(StoreError, match="read-only"):
            fill(store, 1)
    with pytest.raises(StoreError) as caught:  # a writable open: one sentence, no traceback
        with Store.open(immutable_palace) as store:
            fill(store, 1)
    assert str(immutable_palace) in str(caught.value)


def test_cli_read_commands_work_on_an_immutable_store(immutable_palace: Path) -> None:
    for args in (["list"], ["info"], ["status"], ["conflicts"], ["quarantine"],
                 ["presence"], ["wait", "--timeout-ms", "0"]):
        done = subprocess.run([*PY, "--palace", str(immutable_palace), *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (args, done.stderr)
        assert "Traceback" not in done.stderr
    append = subprocess.run([*PY, "--palace", str(immutable_palace), "append", "--type", "n",
                             "--stream", "s", "--room", "r", "--from-agent", "a"],
                            capture_output=True, text=True, timeout=60)
    assert append.returncode == 1 and append.stderr.startswith("Error: ")
    assert append.stderr.count("\n") == 1


def test_a_read_only_open_never_migrates_or_creates(tmp_path: Path) -> None:
    with pytest.raises(StoreNeedsWrite, match="no store at"):
        Store.open(tmp_path / "none", read_only=True)
    assert not (tmp_path / "none").exists()
    palace = tmp_path / "old"
    palace.mkdir()
    conn = sqlite3.connect(palace / DB_FILENAME)
    conn.execute("CREATE TABLE events (id TEXT PRIMARY KEY, type TEXT, stream TEXT, "
                 "created_at TEXT)")  # an early logstream's: before the provenance columns
    conn.commit()
    conn.close()
    (palace / "replica.json").write_text('{"replica_id": "rep_' + "a" * 32 + '"}')
    with pytest.raises(StoreNeedsWrite, match="needs a schema migration"):
        Store.open(palace, read_only=True)
    conn = sqlite3.connect(palace / DB_FILENAME)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert tables == {"events"}


def test_open_never_chmods_an_existing_directory(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    Store.open(shared).close()
    assert shared.stat().st_mode & 0o777 == 0o755
    fresh = tmp_path / "fresh"
    Store.open(fresh).close()
    assert fresh.stat().st_mode & 0o777 == 0o700


def test_health_names_files_made_immutable_mid_run_and_recovers(tmp_path: Path) -> None:
    if shutil.which("chattr") is None:
        unavailable("chattr(1) is not installed")
    palace = tmp_path / "palace"
    store = Store.open(palace)
    files = [palace / name for name in os.listdir(palace)]
    try:
        fill(store, 2)
        _chattr("+i", *files)
        try:
            with pytest.raises(StoreError) as caught:
                fill(store, 1)
            assert str(store.db_path) in str(caught.value)
            problem = store.health_problem()
            assert problem is not None and str(store.db_path) in problem
            assert "read-only" in problem or "I/O error" in problem
        finally:
            subprocess.run(["chattr", "-i", *map(str, files)], check=False)
        assert store.health_problem() is None
        fill(store, 1)
        assert store.counts()["events"] == 3
    finally:
        store.close()


def test_a_store_file_deleted_under_an_open_store_is_named_and_never_made_again(
        tmp_path: Path) -> None:
    """`rm logstream.sqlite3*` under a running daemon: a reader opened in a new thread made
    an empty, table-less store there (the CLI then advised `logsync init`), while writes
    went on to the deleted file. Now the open store says what happened, and no later
    connection creates a file."""
    import threading

    store = Store.open(tmp_path / "p")
    try:
        store.append_event("note", "s", "r", "a@b", body="x")
        assert store.file_replaced() is None and store.health_problem() is None
        for path in (tmp_path / "p").glob(DB_FILENAME + "*"):
            path.unlink()
        sentence = store.file_replaced()
        assert sentence is not None and "was deleted or replaced while it was open" in sentence
        assert store.health_problem() == sentence
        failures: list[BaseException] = []

        def read() -> None:  # a thread of its own: a new reader connection
            try:
                store.version_vector()
            except BaseException as exc:  # noqa: BLE001 - what the thread saw
                failures.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(timeout=30)
        assert len(failures) == 1 and isinstance(failures[0], StoreError), failures
        assert not (tmp_path / "p" / DB_FILENAME).exists()
    finally:
        store.close()


def test_a_store_file_replaced_under_an_open_store_is_named(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "p")
    try:
        shutil.copy(store.db_path, tmp_path / "copy")
        os.replace(tmp_path / "copy", store.db_path)
        assert "was deleted or replaced" in (store.file_replaced() or "")
    finally:
        store.close()


def test_temp_files_a_killed_writer_left_go_at_the_next_writable_open(tmp_path: Path) -> None:
    """`reidentify` or a peers.json save killed between write and rename leaves
    `.<name>.<8 random characters>.tmp` behind: an old one of the identity files goes at
    the next writable open, of peers.json at its next save; a fresh one (a live
    writer's) stays, and so does anything else (a palace may be a shared directory)."""
    import os
    import time

    from logsync import peers

    Store.open(tmp_path).close()
    old = tmp_path / ".logsync-signing-key.next.abc12_yz.tmp"
    old_peers = tmp_path / ".peers.json.0a1b2c3d.tmp"
    fresh = tmp_path / ".replica.json.def456gh.tmp"
    others = [tmp_path / ".tmp", tmp_path / ".notes.md.abcdefgh.tmp",
              tmp_path / ".replica.json.tmp"]
    for path in (old, old_peers, fresh, *others):
        path.write_text("x")
    an_hour_ago = time.time() - 3600
    for path in (old, old_peers, *others):
        os.utime(path, (an_hour_ago, an_hour_ago))
    with Store.open(tmp_path, read_only=True):
        pass
    assert old.exists()  # a read-only open writes nothing, removes nothing
    Store.open(tmp_path).close()
    assert not old.exists() and fresh.exists() and old_peers.exists()
    peers.add_peer(tmp_path, "desk", "http://127.0.0.1:9", None)
    assert not old_peers.exists()
    assert all(path.exists() for path in others)
