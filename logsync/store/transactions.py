"""How `Store` reaches SQLite: one reader connection per thread, one writer, and the
write transaction (`_atomic`), alone or inside a `batch`.

- A write is one `BEGIN IMMEDIATE` transaction, which serialises writers across
  processes. Every SQLite failure but a constraint violation becomes a `StoreError`
  naming the file and the cause.
- A **batch** is one transaction around several remote writes (the pages of one
  stream write: a commit costs about as much as a small page's apply). It commits once
  at its end; a crash before that loses all of it, as it would lose an uncommitted
  transaction. Remote writes fail only on a store fault or a bug (a bad op is
  quarantined, not raised), so a write that fails rolls the whole batch back and the
  batch raises that failure, even if a caller inside swallowed it: the caller never
  takes for applied what was not committed. While a thread holds a batch its reads go
  through the writer connection, so they see the batch's own writes; other threads
  see only what is committed.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from logsync.errors import StoreError, ValidationError
from logsync.store.checkpoints import Checkpointer, LogState
from logsync.store.faults import describe_fault


class Transactions:
    """The connection and transaction methods of `Store` (it provides `_connect`,
    `_writer`, `_write_lock`, `_local`, `_durable`, `read_only`, `db_path`)."""

    db_path: Path
    read_only: bool
    _writer: sqlite3.Connection
    _write_lock: threading.Lock
    _local: threading.local
    _durable: bool
    _autocheckpoint: int  # the writer's `wal_autocheckpoint`, pages
    _checkpointer: Checkpointer
    _connect: Callable[[], sqlite3.Connection]  # `Store`'s: a new connection to the file
    _batch_thread: int | None = None  # the thread whose batch holds the write lock
    _batch_failure: BaseException | None = None  # what ended that batch's transaction

    @contextmanager
    def bulk_writes(self) -> Iterator[None]:
        """Many writes ahead (a pull fetching pages ahead): the log is copied into the
        database by another thread meanwhile, not by the commits (`checkpoints.py`)."""
        if self.read_only:
            yield
            return
        self._checkpointer.enter()
        try:
            yield
        finally:
            self._checkpointer.leave()

    def log_copied(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the copy a bulk left running to end; whether it did
        (a benchmark times a pull until its log is in the database file)."""
        return self._checkpointer.wait(timeout)

    def log_state(self) -> LogState:
        """The write-ahead log as an operator sees it (`checkpoints.LogState`)."""
        return self._checkpointer.state()

    def _in_batch(self) -> bool:
        return self._batch_thread == threading.get_ident()

    def _reader(self) -> sqlite3.Connection:
        """One read connection per thread: WAL readers never block the writer. Inside
        this thread's batch: the writer, which sees the batch's writes."""
        if self._in_batch():
            return self._writer
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction around the remote writes made inside it (module docstring).
        Not durable: remote ops can be pulled again. Re-entrant in its thread."""
        if self._in_batch():
            yield
            if self._batch_failure is not None:  # nothing inside counts as applied
                raise self._batch_failure
            return
        with self._transaction(durable=False):
            self._batch_thread, self._batch_failure = threading.get_ident(), None
            try:
                yield
                failure = self._batch_failure
            finally:
                self._batch_thread, self._batch_failure = None, None
            if failure is not None:  # a write failed and someone swallowed it
                raise failure

    @contextmanager
    def _atomic(self, *, durable: bool) -> Iterator[sqlite3.Connection]:
        """One write transaction, or a write inside this thread's batch: no savepoint
        (one doubles the cost of an insert), so a write that fails there rolls the
        whole batch back, and the batch ends by raising its failure."""
        if not self._in_batch():
            with self._transaction(durable=durable) as conn:
                yield conn
            return
        if durable:  # a local append is the only copy: it never waits in a batch
            raise RuntimeError("a durable write inside a batch of remote writes")
        if self._batch_failure is not None:
            raise self._batch_failure
        conn = self._writer
        try:
            yield conn
        except sqlite3.IntegrityError as exc:
            self._batch_failure = exc
            self._rollback(conn)
            raise
        except sqlite3.Error as exc:
            self._batch_failure = StoreError(describe_fault(self.db_path, "write to", exc))
            self._rollback(conn)
            raise self._batch_failure from None
        except BaseException as exc:
            self._batch_failure = exc
            self._rollback(conn)
            raise

    @contextmanager
    def _transaction(self, *, durable: bool) -> Iterator[sqlite3.Connection]:
        """`BEGIN IMMEDIATE` .. `COMMIT` on the writer. SQLite may have rolled the
        transaction back itself (a full disk does), so ROLLBACK runs only while a
        transaction is still open."""
        if self.read_only:
            raise StoreError(f"cannot write to {self.db_path}: the store was opened read-only")
        with self._write_lock:
            conn = self._writer
            try:
                if self._durable is not durable:  # set only when it changes (per connection)
                    conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
                    self._durable = durable
                pages = self._checkpointer.autocheckpoint()
                if self._autocheckpoint != pages:  # off while in bulk (`checkpoints.py`)
                    conn.execute(f"PRAGMA wal_autocheckpoint={pages}")
                    self._autocheckpoint = pages
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                self._rollback(conn)
                raise StoreError(describe_fault(self.db_path, "write to", exc)) from None
            try:
                yield conn
            except sqlite3.IntegrityError:
                self._rollback(conn)
                raise
            except sqlite3.Error as exc:
                self._rollback(conn)
                raise StoreError(describe_fault(self.db_path, "write to", exc)) from None
            except BaseException:
                self._rollback(conn)
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback(conn)
                raise StoreError(describe_fault(self.db_path, "commit to", exc)) from None
            self._checkpointer.committed(conn)

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        """Roll back what is open; the original failure is the one to report (also when
        the store was closed meanwhile: `in_transaction` then raises too)."""
        with suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        try:
            return self._reader().execute(sql, params).fetchall()
        except OverflowError:
            raise ValidationError(
                "a number in the request is too large: SQLite integers stop at 2**63 - 1"
            ) from None
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as exc:
            raise StoreError(describe_fault(self.db_path, "read", exc)) from None
