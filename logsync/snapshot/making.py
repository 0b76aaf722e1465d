"""The serving side of `GET /sync/snapshot`: one consistent copy of the store, cached.

The copy is made with SQLite's online backup API from a read connection of its own (one
read transaction, so it is one consistent state; the live file is never streamed), into
a temporary file in the palace directory (private, and on the store's disk). The rows
that are this replica's own (its conflicts, quarantine and health rows) are deleted from
the copy, and its own keyring row stops saying `self`. The copy is served while it is
fresh enough: a snapshot is joined and then tailed by vector (RFC 004 §9.6), so a copy a
few ops behind the store costs its joiner one short pull, while making a new one costs a
full copy. At most one copy, removed when a newer copy replaces it and at close. A
stream already reading a replaced file keeps its open descriptor, so replacing never cuts
a download short.

Once hashed, the copy is compressed behind its preamble into one zstd frame beside it
(level 1, a window a joiner accepts): every joiner that asks for zstd is sent that frame,
so a copy is compressed once, not once per download. A copy whose frame could not be
written (a full disk) is served as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

from logsync.keys import certifies
from logsync.pagechain import CHECKPOINT
from logsync.responder import json_bytes
from logsync.snapshot import LOCAL_ONLY_TABLES, SERVE_PREFIX, SNAPSHOT_FORMAT
from logsync.store.faults import BUSY_TIMEOUT_S
from logsync.zstdcoding import compressor

logger = logging.getLogger("logsync.server")

HASH_CHUNK = 1024 * 1024
# A cached copy is served while the store holds at most this many ops more than it and
# it is at most this old; past either, the next request makes a new one.
STALE_OPS = 2000
STALE_S = 600.0


@dataclass(frozen=True)
class SnapshotFile:
    """One finished copy: where it is, what it holds, and its preamble line."""

    path: Path
    vector: dict[str, int]
    size: int
    sha256: str
    replica_id: str
    made_at: float = field(default_factory=time.monotonic)
    zstd_path: Path | None = None  # preamble and copy as one zstd frame (None: not made)

    def preamble(self) -> bytes:
        return json_bytes({"format": SNAPSHOT_FORMAT, "replica_id": self.replica_id,
                           "vector": self.vector, "size": self.size,
                           "sha256": self.sha256}) + b"\n"

    def remove(self) -> None:
        for path in (self.path, self.zstd_path):
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()


class SnapshotCache:
    """The one cached copy of a store; `current` makes it when the vector moved."""

    def __init__(self, db_path: Path, replica_id: str, *, stale_ops: int = STALE_OPS,
                 stale_s: float = STALE_S) -> None:
        self.db_path = Path(db_path)
        self.replica_id = replica_id
        self.stale_ops, self.stale_s = stale_ops, stale_s
        self._file: SnapshotFile | None = None
        self._lock = threading.Lock()  # guards _file (the route serialises making)
        self._closed = False
        remove_stale(self.db_path.parent, SERVE_PREFIX)

    def current(self, vector: dict[str, int]) -> SnapshotFile:
        """The cached copy if it is fresh enough for a store holding `vector`, else a new
        one (blocking: call from a worker thread; callers serialise, so concurrent
        requests share one copy)."""
        with self._lock:
            held = self._file
        if held is not None and self.fresh(held, vector) and held.path.exists():
            return held
        made = make_copy(self.db_path, self.replica_id)
        with self._lock:
            old, self._file = self._file, made
            if self._closed:
                self._file = None
                old = made
        if old is not None:
            old.remove()
        return made

    def fresh(self, held: SnapshotFile, vector: Mapping[str, int]) -> bool:
        """Whether `held` is a prefix of a store holding `vector`, at most `stale_ops`
        ops behind it (counted by vector, so an upstream origin's gaps count too) and at
        most `stale_s` old."""
        behind = 0
        for origin in held.vector.keys() | vector.keys():
            ours, now = held.vector.get(origin, 0), vector.get(origin, 0)
            if now < ours:
                return False  # not a prefix of the store any more
            behind += now - ours
        return behind <= self.stale_ops and time.monotonic() - held.made_at <= self.stale_s

    def close(self) -> None:
        with self._lock:
            self._closed = True
            held, self._file = self._file, None
        if held is not None:
            held.remove()


def remove_stale(directory: Path, prefix: str) -> None:
    """Temp files of a process that was killed (the name says whose they are)."""
    with contextlib.suppress(OSError):
        for entry in directory.iterdir():
            if entry.name.startswith(prefix):
                with contextlib.suppress(OSError):
                    entry.unlink()


def make_copy(db_path: Path, replica_id: str) -> SnapshotFile:
    """Back the store up into a temp file, scrub what is local, hash it."""
    fd, name = tempfile.mkstemp(prefix=SERVE_PREFIX, suffix=".sqlite3", dir=db_path.parent)
    os.close(fd)
    path = Path(name)
    try:
        source = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True,
                                 timeout=BUSY_TIMEOUT_S)
        target = sqlite3.connect(path, isolation_level=None)
        # A temp file, removed at the next start if a crash leaves it (`remove_stale`):
        # never fsynced, so the copy costs no flush of the whole file to disk.
        target.execute("PRAGMA synchronous=OFF")
        try:
            source.backup(target)  # one step: one read transaction, one consistent state
        finally:
            source.close()
        try:
            scrub(target, replica_id)
            vector = {str(o): int(top) for o, top in target.execute(
                "SELECT origin_replica, max(origin_seq) FROM events "
                "WHERE origin_replica IS NOT NULL GROUP BY origin_replica")}
        finally:
            target.close()
        size, digest, packed = digest_and_compress(
            path, head=lambda size, digest: SnapshotFile(path, vector, size, digest,
                                                         replica_id).preamble())
    except BaseException:
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    return SnapshotFile(path, vector, size, digest, replica_id, zstd_path=packed)


# Signatures other than each origin's checkpoints and its highest signed op: a joiner drops
# them (`checking.prepare`), so the copy leaves them out once instead of every joiner.
STRIP_SIGNATURES_SQL = (
    "UPDATE logsync_chain SET signature = NULL WHERE signature IS NOT NULL "
    "AND origin_seq % ? != 0 AND origin_seq != (SELECT max(c.origin_seq) FROM logsync_chain c "
    "WHERE c.origin = logsync_chain.origin AND c.signature IS NOT NULL)")


def scrub(conn: sqlite3.Connection, replica_id: str) -> None:
    """Delete the source's own rows; its key becomes an ordinary origin key; signatures a
    joiner would drop go."""
    conn.execute("PRAGMA journal_mode=DELETE")  # a plain file: no -wal beside it
    # No journal (none on disk, none in memory: a large copy changes many chain pages):
    # a failure discards the temp copy whole.
    conn.execute("PRAGMA journal_mode=OFF")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN IMMEDIATE")
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for table in LOCAL_ONLY_TABLES:
        if table in tables:
            conn.execute(f"DELETE FROM {table}")
    if "logsync_keys" in tables:
        for origin, key in conn.execute(
                "SELECT origin, public_key FROM logsync_keys WHERE source = 'self'").fetchall():
            kind = "certified" if certifies(str(origin), bytes(key)) else "pinned"
            conn.execute("UPDATE logsync_keys SET source = ? WHERE origin = ?", (kind, origin))
    if "logsync_chain" in tables:  # only the signatures a joiner keeps (as a puller would)
        conn.execute(STRIP_SIGNATURES_SQL, (CHECKPOINT,))
    conn.execute("COMMIT")


def digest_and_compress(path: Path, *, head: Callable[[int, str], bytes] | None = None,
                        compress: bool = True) -> tuple[int, str, Path | None]:
    """(size, SHA-256 hex, `head(size, sha256)` and the file as one zstd frame beside it).

    One frame, not the preamble's and the copy's apart: a Zstandard body may hold several
    (RFC 8878 §3.1), but common HTTP clients decode only the first (httpx 0.28 fails on
    the second). The preamble names the hash, so the file is read twice: hashed, then
    compressed behind it. The frame is None when it cannot be written (it is an
    optimisation: the copy is served as it is); a failure to read the file raises."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    if not compress:
        return size, digest.hexdigest(), None
    prefix = head(size, digest.hexdigest()) if head is not None else b""
    packed = _Packed(path, len(prefix) + size)
    try:
        packed.write(prefix)
        done = len(prefix)
        with path.open("rb") as handle:
            while chunk := handle.read(HASH_CHUNK):
                packed.write(chunk)
                done += len(chunk)
        return size, digest.hexdigest(), packed.finish(done)
    except BaseException:
        packed.discard()
        raise


class _Packed:
    """One zstd frame of `size` bytes, written as they are read; on a write failure it
    stops, logs once and yields None."""

    def __init__(self, copy: Path, size: int) -> None:
        self.path: Path | None = copy.with_name(copy.name + ".zst")
        self._size = size
        try:
            # private like the copy (mkstemp's 0600): the palace may be a shared directory
            self._out: Any = os.fdopen(os.open(self.path, os.O_WRONLY | os.O_CREAT
                                               | os.O_EXCL | os.O_CLOEXEC, 0o600), "wb")
            self._writer = compressor(size).stream_writer(self._out, size=size,
                                                          closefd=False)
        except (OSError, zstandard.ZstdError) as exc:
            self._fail(exc)

    def write(self, chunk: bytes) -> None:
        if self.path is None:
            return
        try:
            self._writer.write(chunk)
        except (OSError, zstandard.ZstdError) as exc:
            self._fail(exc)

    def finish(self, size: int) -> Path | None:
        if self.path is None:
            return None
        if size != self._size:  # the copy changed under us: never serve a frame of another
            self._fail(OSError(f"the copy was {self._size} bytes and then {size}"))
            return None
        try:
            self._writer.flush(zstandard.FLUSH_FRAME)
            self._out.close()
        except (OSError, zstandard.ZstdError) as exc:
            self._fail(exc)
        return self.path

    def discard(self) -> None:
        if self.path is not None:
            self._fail(None)

    def _fail(self, exc: BaseException | None) -> None:
        if exc is not None:
            logger.warning("the snapshot copy could not be compressed (%s): joiners that "
                           "ask for zstd get it as it is", exc)
        out, path, self.path = getattr(self, "_out", None), self.path, None
        if out is not None:
            with contextlib.suppress(OSError):
                out.close()
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
