"""The store's transaction edges (`store/transactions.py`) that only a failing SQLite
reaches: a write that cannot begin or cannot commit is one `StoreError` sentence naming
the store and leaves nothing half-written; a read that SQLite refuses is a `StoreError`, a
number SQLite cannot hold a `ValidationError`; a batch of remote writes commits as they
do (NORMAL: it can be pulled again), never with a local append's fsync."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from logsync.errors import StoreError, ValidationError
from logsync.store import Store


class FailingWriter:
    """The writer connection, but `fail_on` raises the SQLite error SQLite gives when
    another process holds the write lock (BEGIN) or the disk is full (COMMIT)."""

    def __init__(self, conn: sqlite3.Connection, fail_on: str, error: sqlite3.Error) -> None:
        self._conn, self._fail_on, self._error = conn, fail_on, error
        self.failed = 0

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == self._fail_on:
            self.failed += 1
            raise self._error
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def remote_ops(tmp_path: Path, n: int) -> list[dict[str, Any]]:
    with Store.open(tmp_path / "origin") as origin:
        for i in range(n):
            origin.append_event("note", "s", "r", "me@host", body=f"op {i}")
        return origin.list_ops(origin.replica_id, 0, n)


def test_a_write_that_cannot_begin_is_one_sentence_and_writes_nothing(tmp_path: Path) -> None:
    ops = remote_ops(tmp_path, 3)
    with Store.open(tmp_path / "b") as store:
        real = store._writer
        store._writer = FailingWriter(real, "BEGIN IMMEDIATE",
                                      sqlite3.OperationalError("database is locked"))
        try:
            with pytest.raises(StoreError) as caught:
                store.apply_remote(ops, [])
        finally:
            store._writer = real
        message = str(caught.value)
        assert "database is locked" in message and str(store.db_path) in message
        assert "\n" not in message
        assert store.counts()["events"] == 0
        store.apply_remote(ops, [])  # the writer is usable again
        assert store.counts()["events"] == 3


def test_a_commit_that_fails_rolls_back_and_is_one_sentence(tmp_path: Path) -> None:
    ops = remote_ops(tmp_path, 3)
    with Store.open(tmp_path / "b") as store:
        real = store._writer
        failing = FailingWriter(real, "COMMIT",
                                sqlite3.OperationalError("database or disk is full"))
        store._writer = failing
        try:
            with pytest.raises(StoreError) as caught:
                store.apply_remote(ops, [])
            assert failing.failed == 1
            assert not real.in_transaction  # rolled back, not left open
        finally:
            store._writer = real
        message = str(caught.value)
        assert "disk is full" in message and "commit to" in message and "\n" not in message
        assert store.counts()["events"] == 0 and store.version_vector() == {}
        assert store.apply_remote(ops, []).applied == 3


def test_a_read_sqlite_refuses_is_a_store_error_naming_the_store(tmp_path: Path) -> None:
    with Store.open(tmp_path / "b") as store:
        with pytest.raises(StoreError) as caught:
            store._read("SELECT * FROM no_such_table")
        assert str(store.db_path) in str(caught.value)


def test_a_number_sqlite_cannot_hold_is_a_validation_error(tmp_path: Path) -> None:
    with Store.open(tmp_path / "b") as store:
        with pytest.raises(ValidationError) as caught:
            store.events_after_seq(2**64)
        assert "2**63 - 1" in str(caught.value)


def test_a_batch_commits_as_remote_pages_do(tmp_path: Path) -> None:
    ops = remote_ops(tmp_path, 4)
    with Store.open(tmp_path / "b") as store:
        store.append_event("note", "s", "r", "me@host", body="local first")  # FULL now
        seen: list[str] = []
        store._writer.set_trace_callback(seen.append)
        with store.batch():
            store.apply_remote(ops[:2], [])
            store.apply_remote(ops[2:], [])
        store._writer.set_trace_callback(None)
        assert store.counts()["events"] == 5
        pragmas = [s for s in seen if s.startswith("PRAGMA synchronous=")]
        assert pragmas == ["PRAGMA synchronous=NORMAL"]
        assert seen.count("BEGIN IMMEDIATE") == 1 and seen.count("COMMIT") == 1
