"""`Store`: one palace's logstream, a WAL SQLite file with many readers and one writer.

Rules kept here (invariants 1-8 of docs/architecture.md); local writes live in
`writes.py`, reads in `reads.py`, fault sentences in `faults.py`:

- Locally authored events get a gap-free `origin_seq` (max + 1 inside the
  write transaction) and an HLC later than everything stored, committed with
  `synchronous=FULL`: they are the only copy that exists.
- `apply_remote` is one transaction per call, validates every op with the
  same rules as a local append, stores ops verbatim, never overwrites, records
  divergence as a conflict and bad ops in quarantine, and stops only the
  offending origin. Remote pages can be pulled again, so they commit with
  `synchronous=NORMAL`.
- `seq` (the rowid) is local arrival order, the delivery cursor; `hlc` is the
  fleet-wide merge order. Cursors never use HLC.
- A writable open loads (or mints) the palace's signing key (`logsync/keyfile.py`) and
  records its public key for our origin in the keyring; local appends sign their chain
  digests with it. A read-only open only reads the key, if it can.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from logsync import hlc as hlc_mod
from logsync import model
from logsync.errors import (
    ReplicaIdentityError,
    StoreError,
)
from logsync.files import make_private_dir, remove_stale_temps, symlink_loop
from logsync.keyfile import KEY_FILENAME
from logsync.keys import public_key_of, sign_digest
from logsync.replica import (
    PENDING_KEY_FILENAME,
    REPLICA_FILENAME,
    get_replica_id,
    read_replica_id,
)
from logsync.store.apply import ApplyResult, apply_page
from logsync.store.chaining import backfill_chains
from logsync.store.chainreads import ChainViews, sign_own_chain
from logsync.store.checkpoints import DEFAULT_AUTOCHECKPOINT, LOG_FILE_LIMIT, Checkpointer
from logsync.store.faults import (
    BUSY_TIMEOUT_S,
    StoreNeedsWrite,
    _primary,
    corrupt_sentence,
    describe_fault,
)
from logsync.store.keyring import check_own_origin, known_key, record_own_key
from logsync.store.ledgers import check_origin, review_conflicts
from logsync.store.ownkey import key_for_reading, key_for_writing
from logsync.store.reads import Reads
from logsync.store.reidentify import Reidentified, reidentify_store
from logsync.store.retry import RetryReport, retry_quarantine
from logsync.store.schema import (
    HEALTH_UPSERT,
    foreign_database,
    migrate,
    schema_problem,
)
from logsync.store.transactions import Transactions
from logsync.store.writes import LocalWrites

DB_FILENAME = "logstream.sqlite3"
MIN_FREE_BYTES = 64 * 1024  # below this a disk counts as full for health_problem()
# The writer's page cache, KiB (SQLite's default is 2 MiB): a pulled page is one
# transaction of ~10 MB, and at 2 MiB SQLite spilled its dirty pages to the WAL mid-way
# and wrote some again (a page's write: 0.19 s of system time per 20 000 ops, 0.13 here).
WRITER_CACHE_KIB = 16 * 1024


IdFactory = Callable[[str], str]


def default_id_factory(wall_ms: Callable[[], int]) -> IdFactory:
    """Upstream-shaped ids: `evt_YYYYmmddTHHMMSS_<12 hex>`."""

    def new_id(prefix: str) -> str:
        stamp = datetime.fromtimestamp(wall_ms() / 1000, UTC).strftime("%Y%m%dT%H%M%S")
        return f"{prefix}_{stamp}_{secrets.token_hex(6)}"

    return new_id


class Store(Transactions, LocalWrites, Reads, ChainViews):
    """One palace's logstream: a WAL SQLite file, many readers, one writer."""

    def __init__(
        self,
        palace: Path,
        replica_id: str,
        wall_ms: Callable[[], int],
        new_id: IdFactory,
        *,
        read_only: bool = False,
        signing_key: SigningKey | None = None,
    ) -> None:
        self.palace = palace
        self.db_path = palace / DB_FILENAME
        self.replica_id = replica_id
        self.read_only = read_only
        self._wall_ms = wall_ms
        self._new_id = new_id
        self.clock = hlc_mod.HybridLogicalClock(replica_id, wall_ms)
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._conn_lock = threading.Lock()
        self._closed = False
        self._durable = True  # the writer's synchronous=FULL (`_connect`)
        self._autocheckpoint = DEFAULT_AUTOCHECKPOINT
        self._checkpointer = Checkpointer(self._connect, Path(f"{self.db_path}-wal"))
        self._ro_uri = f"{self.db_path.resolve().as_uri()}?mode=ro"
        self.signing_key = signing_key  # never served: only local appends use it
        self.key_problem: str | None = None  # why an open went on without the key file
        self.public_key: bytes | None = None if signing_key is None else public_key_of(
            signing_key
        )
        try:
            self._writer = self._connect()
            self._file_id = _file_id(self.db_path)  # the file every connection opens
            if not read_only:
                self._writer.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
                self._writer.execute(f"PRAGMA journal_size_limit={LOG_FILE_LIMIT}")
            if read_only:
                problem = schema_problem(self._writer)
                if problem is not None:
                    raise StoreNeedsWrite(
                        f"{self.db_path} {problem}, which a read-only open cannot do: "
                        f"set it up once with write access (`logsync init {palace}` as its owner)"
                    )
            else:
                self._migrate()
            if read_only or signing_key is None:  # a keyless open checks as reads do
                check_own_origin(self._writer, replica_id, self.public_key)
            if self.public_key is None:  # read-only without the key file: what we recorded
                self.public_key = known_key(self._writer, replica_id)
            self._observe_stored_max()
        except BaseException:
            self.close()
            raise

    # ── opening and closing ───────────────────────────────────────────

    @classmethod
    def open(
        cls,
        palace: str | os.PathLike[str],
        *,
        wall_ms: Callable[[], int] | None = None,
        new_id: IdFactory | None = None,
        replica_id: str | None = None,
        read_only: bool = False,
        check: bool = True,
        keyless: bool = False,
    ) -> Store:
        """Open (creating if needed) the store in a palace directory.

        ``read_only=True`` opens the file with ``mode=ro`` (falling back to
        ``immutable=1`` when SQLite cannot create its ``-shm`` beside a read-only file):
        no directory is made, nothing is chmod-ed, no migration runs; a store that needs
        one raises ``StoreNeedsWrite`` (a ``StoreError``) in one sentence. Only a palace
        directory created here is made 0700; an existing one keeps its mode.

        ``check=True`` runs ``PRAGMA quick_check(1)`` once at open and raises a
        ``StoreError`` that says how to recover when the file is corrupt. quick_check
        reads every page (it skips only the index-content cross-check of integrity_check):
        measured at 0.1 s for a 200 000-event store (173 MB, warm page cache) and about
        1 ms for a small one, so it runs on every open; ``check=False`` skips it for
        callers that reopen one store in a loop.

        A key file that is missing (while the store records a key of ours), corrupt or
        open to others stops a writable open: signing on with another key would be a
        second identity. A read-only open goes on without it (reads need no key; the
        recorded key stands in) and says why in `key_problem`. ``keyless=True`` (for
        `reidentify`, whose new key replaces it) lets a writable open do the same; that
        store signs nothing.
        """
        palace_path = Path(palace).expanduser()
        wall = wall_ms or hlc_mod.system_wall_ms
        loop = symlink_loop(palace_path, palace_path / DB_FILENAME)
        if loop is not None:
            raise StoreError(f"cannot open the store: {loop}")
        foreign = foreign_database(palace_path / DB_FILENAME)
        if foreign is not None:  # before anything (replica.json, a key) is written beside it
            raise StoreError(foreign)
        if read_only:
            if not (palace_path / DB_FILENAME).is_file():
                raise StoreNeedsWrite(
                    f"there is no store at {palace_path / DB_FILENAME}: create it with "
                    f"`logsync init {palace_path}`"
                )
            try:
                rid = replica_id or read_replica_id(palace_path)
            except ReplicaIdentityError as exc:
                raise StoreError(str(exc)) from None
            if rid is None:
                raise StoreNeedsWrite(
                    f"{palace_path} has no replica.json yet, which a read-only open cannot "
                    f"write: set it up once with write access (`logsync init {palace_path}` as "
                    "its owner)"
                )
            key, key_problem = key_for_reading(palace_path)
        else:
            try:
                make_private_dir(palace_path)  # 0700 if made here; never an existing one
            except OSError as exc:
                blocker = next((p for p in (palace_path, *palace_path.parents)
                                if p.exists() and not p.is_dir()), None)
                why = f"{blocker} is a file, not a directory" if blocker is not None \
                    else exc.strerror or exc
                raise StoreError(f"cannot create palace directory {palace_path}: {why}") \
                    from None
            # the identity files' temps a process killed mid-write (reidentify) left
            remove_stale_temps(palace_path, (REPLICA_FILENAME, KEY_FILENAME,
                                             PENDING_KEY_FILENAME))
            rid = replica_id or get_replica_id(palace_path)
            key, key_problem = key_for_writing(palace_path, palace_path / DB_FILENAME, rid,
                                              keyless)
        try:
            store = cls(
                palace_path, rid, wall, new_id or default_id_factory(wall), read_only=read_only,
                signing_key=key,
            )
        except sqlite3.Error as exc:
            raise StoreError(describe_fault(palace_path / DB_FILENAME, "open", exc)) from None
        store.key_problem = key_problem
        if check:
            try:
                problem = store.corruption()
            except BaseException:
                store.close()
                raise
            if problem is not None:
                store.close()
                raise StoreError(problem)
        if not read_only:
            try:
                store._backfill_chains()
            except BaseException:
                store.close()
                raise
        return store

    def close(self) -> None:
        self._checkpointer.close()  # before its connection goes
        with self._conn_lock:
            self._closed = True
            for conn in self._connections:
                conn.close()
            self._connections.clear()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> sqlite3.Connection:
        if self.read_only:
            conn = self._connect_read_only()
        else:
            # only the first connection may create the file: a later one (a reader in a new
            # thread) would make an empty store where the file was deleted under us
            target = self.db_path if getattr(self, "_file_id", None) is None \
                else f"{self.db_path.resolve().as_uri()}?mode=rw"
            conn = sqlite3.connect(
                target, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                check_same_thread=False, uri=not isinstance(target, Path),
            )
            conn.row_factory = sqlite3.Row
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
            except BaseException:
                conn.close()
                raise
        with self._conn_lock:
            if self._closed:
                conn.close()
                raise StoreError(f"store {self.db_path} is closed")
            self._connections.append(conn)
        return conn

    def _connect_read_only(self) -> sqlite3.Connection:
        """``mode=ro``; ``immutable=1`` when SQLite cannot create the WAL index beside it."""
        last: sqlite3.Error | None = None
        for uri in (self._ro_uri, self._ro_uri + "&immutable=1"):
            conn = sqlite3.connect(
                uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                check_same_thread=False,
            )
            conn.row_factory = sqlite3.Row
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.OperationalError as exc:
                conn.close()
                last = exc
                continue
            return conn
        assert last is not None
        raise last

    # ── health ────────────────────────────────────────────────────────

    def corruption(self) -> str | None:
        """``PRAGMA quick_check(1)``: None when the file is sound, else the recovery line."""
        try:
            rows = self._reader().execute("PRAGMA quick_check(1)").fetchall()
        except sqlite3.Error as exc:
            if _primary(exc) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
                return corrupt_sentence(self.db_path, str(exc))
            raise StoreError(describe_fault(self.db_path, "check", exc)) from None
        verdict = str(rows[0][0]) if rows else "no answer"
        if verdict == "ok":
            return None
        detail = " ".join(verdict.replace("*** in database main ***", "").split())
        return corrupt_sentence(self.db_path, detail[:120])

    def file_replaced(self) -> str | None:
        """One sentence when the store's file was deleted or replaced since the open
        (every write since went to the old file, which nothing will read), else None."""
        if self._file_id is None or _file_id(self.db_path) == self._file_id:
            return None
        return (f"the store file {self.db_path} was deleted or replaced while it was open: "
                "what was written since went to the old file; open the palace again")

    def health_problem(self) -> str | None:
        """A cheap check for a faulted store: one small durable write, free space, and
        ``quick_check(1)``. One sentence naming the problem, or None when healthy."""
        if self.read_only:
            return f"the store {self.db_path} is open read-only"
        replaced = self.file_replaced()
        if replaced is not None:
            return replaced
        try:
            with self._atomic(durable=True) as conn:
                conn.execute(HEALTH_UPSERT, (datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),))
        except StoreError as exc:
            return str(exc)
        try:
            stat = os.statvfs(self.palace)
        except OSError:
            pass
        else:
            free = stat.f_bavail * stat.f_frsize
            if free < MIN_FREE_BYTES:
                return (
                    f"cannot write to {self.db_path}: the disk is full ({free} bytes free, "
                    f"at least {MIN_FREE_BYTES} needed): free some space"
                )
        try:
            return self.corruption()
        except StoreError as exc:
            return str(exc)

    # ── migrations (named, ordered, each idempotent) ──────────────────

    def _migrate(self) -> None:
        """The schema, then our own key's keyring row (refused if another is recorded)."""
        with self._atomic(durable=True) as conn:
            migrate(conn, self.replica_id)
            if self.public_key is not None:
                record_own_key(conn, self.replica_id, self.public_key,
                               model.utc_now_iso(self._wall_ms()))

    def _backfill_chains(self) -> int:
        """The last open step: chain entries for every held op that lacks one (a store
        from before the chain, or ops another program such as a MemPalace hub wrote), in
        bounded batches, one durable transaction; a current store costs a few index seeks
        per origin plus two index-range counts. Returns how many entries were written.
        Then our own ops a page may end at that have no signature are signed
        (`chainreads.sign_own_chain`: nothing to do once the own tip is signed)."""
        with self._atomic(durable=True) as conn:
            written = backfill_chains(conn)
            if self.signing_key is not None:
                key = self.signing_key
                sign_own_chain(conn, self.replica_id, lambda digest: sign_digest(key, digest))
            return written

    def _observe_stored_max(self) -> None:
        """Seed the clock from what is stored, so a restart never ticks backwards."""
        self._catch_up_clock(self._writer)

    def _catch_up_clock(self, conn: sqlite3.Connection) -> int:
        """Absorb the newest stamp within the drift bound and, unconditionally, our own
        newest (ours even if the wall clock has since gone back); return our last seq."""
        ceiling = hlc_mod.drift_ceiling(self._wall_ms())
        top = conn.execute("SELECT max(hlc) FROM events WHERE hlc < ?", (ceiling,)).fetchone()[0]
        if top:
            self.clock.observe(top)
        own = conn.execute(
            "SELECT origin_seq, hlc FROM events WHERE origin_replica = ? "
            "ORDER BY origin_seq DESC LIMIT 1",
            (self.replica_id,),
        ).fetchone()
        if own is None:
            return 0
        self.clock.absorb_own(own["hlc"])
        return int(own["origin_seq"])

    # ── replication ───────────────────────────────────────────────────

    def apply_remote(self, events: Sequence[Any], artifacts: Sequence[Any] = ()) -> ApplyResult:
        """Fold a page of remote ops (and the artifacts they name) in, in one transaction.
        The clock absorbs the stamps it stored at the next local tick (`_catch_up_clock`
        reads the newest stored stamp within the drift bound), not here."""
        with self._atomic(durable=False) as conn:  # no proof: no own op is recovered here
            return apply_page(conn, self.replica_id, events, artifacts, self._wall_ms(),
                              own_verified=self.signing_key is None)

    # ── operator commands (issue 11): thin, the rules live in their modules ──

    def retry_quarantine(self, origin: str | None = None) -> RetryReport:
        """Re-judge held ops by the apply rules, `origin`'s only when given, in one durable
        transaction (`store/retry.py`); `own_verified` as `apply_remote` passes it."""
        checked = None if origin is None else check_origin(origin)
        with self._atomic(durable=True) as conn:
            return retry_quarantine(conn, self.replica_id, self._wall_ms(),
                                    own_verified=self.signing_key is None, origin=checked)

    def review_conflicts(self, ids: Sequence[int] | None, *, origin: str | None = None,
                         kind: str | None = None) -> dict[str, Any]:
        """Mark conflicts reviewed: `ids`, or (None) all the filters select (`ledgers`)."""
        now = model.utc_now_iso(self._wall_ms())
        with self._atomic(durable=True) as conn:
            return review_conflicts(conn, now, ids, origin=origin, kind=kind)

    def reidentify(self, after: Callable[[str], None] | None = None) -> Reidentified:
        """A new replica id and signing key for this palace (`store/reidentify.py`);
        closes this store, which holds the old identity."""
        return reidentify_store(self, after)


# ── argument checks ───────────────────────────────────────────────────


def _file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`; None when there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino
