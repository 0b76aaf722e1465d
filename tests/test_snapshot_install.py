"""What a join leaves in the palace (RFC 004 §9.6): the store's own file in WAL mode and
nothing beside it, so the first open after install rewrites nothing."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_snapshot import FakePeer, build, content

from logsync.peers import Peer
from logsync.snapshot.joining import join_if_empty
from logsync.store import Store
from logsync.store.core import DB_FILENAME


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Store]:
    store = build(tmp_path / "source", 60, patches=2)
    yield store
    store.close()


@pytest.fixture
def peer(source: Store) -> Iterator[FakePeer]:
    fake = FakePeer(source)
    yield fake
    fake.server.close()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_installed_store_is_in_wal_mode_and_its_first_open_rewrites_nothing(
        source: Store, peer: FakePeer, tmp_path: Path) -> None:
    joiner = tmp_path / "joiner"
    assert join_if_empty(joiner, [Peer(url=peer.server.url)]) is not None
    db = joiner / DB_FILENAME
    assert sorted(p.name for p in joiner.iterdir()) == sorted(
        [DB_FILENAME, "logsync-signing-key", "replica.json"])  # no -wal, -shm or temp file
    assert db.read_bytes()[18:20] == b"\x02\x02"  # the header's WAL read/write versions
    before = _digest(db)
    with Store.open(joiner, check=False) as store:
        assert store._read("PRAGMA journal_mode")[0][0] == "wal"
    assert _digest(db) == before
    conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    assert content(joiner) == content(source.palace)
