"""The snapshot download's sink (`logsync/snapshot/download.py`): the file is hashed and
written on a thread of its own, in order, with a bounded backlog; a write that fails
stops the download with that error (no traceback from the thread, nothing half-checked).
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from logsync.errors import PeerProtocolError
from logsync.fetchpolicy import PeerDeadlineError
from logsync.snapshot import download
from logsync.snapshot.download import Receiver, _Sink

REPLICA = "rep_0123456789ab"


def _wire(data: bytes, *, sha: str | None = None) -> bytes:
    preamble = {"format": "logsync-snapshot-1", "replica_id": REPLICA, "vector": {REPLICA: 3},
                "size": len(data), "sha256": sha or hashlib.sha256(data).hexdigest()}
    return json.dumps(preamble).encode() + b"\n" + data


def receive(wire: bytes, size: int, dest: Path) -> dict[str, Any]:
    """The wire bytes fed `size` at a time, as `download_snapshot` feeds a response."""
    receiver = Receiver(dest, 10**9, "GET", "p", 30.0)
    with receiver:
        for i in range(0, len(wire), size):
            receiver.feed(wire[i:i + size])
    return receiver.finish()


def test_the_file_arrives_whole_and_in_order_through_a_slow_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(download, "MAX_QUEUED", 3000)  # the backlog bound is reached
    data = bytes(range(256)) * 400
    slow_write = _Sink._run

    def slowly(self: _Sink) -> None:
        time.sleep(0.05)
        slow_write(self)

    monkeypatch.setattr(_Sink, "_run", slowly)
    dest = tmp_path / "snap"
    preamble = receive(_wire(data), 997, dest)
    assert preamble["size"] == len(data) and dest.read_bytes() == data


@pytest.mark.timeout(60)
def test_a_preamble_dripped_a_byte_a_read_is_parsed_and_bounded_in_linear_work(
        tmp_path: Path) -> None:
    """Each read's bytes are searched once: the preamble so far was copied and searched
    again at every read (a peer dripping 1 MiB of it a byte a read: half a TB of
    copying). A byte-a-read preamble still parses; the 1 MiB one is refused."""
    data = b"snapshot bytes"
    preamble = receive(_wire(data), 1, tmp_path / "a")
    assert preamble["size"] == len(data) and (tmp_path / "a").read_bytes() == data
    receiver = Receiver(tmp_path / "b", 10**9, "GET", "p", 60.0)
    with pytest.raises(PeerProtocolError, match="preamble is longer than"), receiver:
        receiver.feed(b'{"format": "')
        for _ in range(download.MAX_PREAMBLE_BYTES):
            receiver.feed(b"x")


def test_more_or_fewer_bytes_than_announced_are_refused(tmp_path: Path) -> None:
    wire = _wire(b"z" * 5000)
    with pytest.raises(PeerProtocolError, match="sent more than the 5000 bytes"):
        receive(wire + b"!", 700, tmp_path / "a")
    with pytest.raises(PeerProtocolError, match="ended after 4999 of the 5000 bytes"):
        receive(wire[:-1], 700, tmp_path / "b")


def test_a_download_past_its_deadline_stops(tmp_path: Path) -> None:
    receiver = Receiver(tmp_path / "d", 10**9, "GET", "p", 0.0)
    with pytest.raises(PeerDeadlineError, match=r"fell behind: 0 bytes of the file in \d+ s"), \
            receiver:
        time.sleep(0.01)
        receiver.feed(_wire(b"q" * 10))


def test_a_large_announced_size_buys_a_dripping_peer_no_time(tmp_path: Path) -> None:
    """The pace is counted on the bytes written, not on the size announced: a peer that
    announces 512 MiB and sends a byte at a time is cut once its first seconds are up
    (0.3 s here; 60 s in use), not after the 512 s its announcement would have bought."""
    head = _wire(b"")
    preamble = json.loads(head)
    preamble["size"] = 512 * 1024 * 1024
    receiver = Receiver(tmp_path / "d", 10**10, "GET", "p", 0.3)
    began = time.monotonic()
    with pytest.raises(PeerDeadlineError, match=r"fell behind: \d+ bytes of the file in"), \
            receiver:
        receiver.feed(json.dumps(preamble).encode() + b"\n")
        for _ in range(100):  # bounded: the pace cuts it after a few drops
            time.sleep(0.05)
            receiver.feed(b"x")
    assert time.monotonic() - began < 2


def test_a_wrong_digest_is_refused_after_the_whole_file(tmp_path: Path) -> None:
    data = b"x" * 10_000
    with pytest.raises(PeerProtocolError, match="SHA-256"):
        receive(_wire(data, sha="0" * 64), 1000, tmp_path / "s")


class _FullDisk:
    def __init__(self, room: int) -> None:
        self.room = room

    def write(self, chunk: bytes) -> None:
        if len(chunk) > self.room:
            raise OSError(28, "No space left on device")
        self.room -= len(chunk)

    def flush(self) -> None:
        pass


def test_a_failed_write_stops_the_download_with_its_own_error() -> None:
    sink = _Sink(_FullDisk(2500))
    with pytest.raises(OSError, match="No space left"):
        for _ in range(1000):
            sink.put(b"y" * 1000)
            time.sleep(0.001)
    with pytest.raises(OSError, match="No space left"):
        sink.close()
    assert sink.queued() == 0


def test_close_waits_for_every_chunk() -> None:
    written: list[bytes] = []

    class Out:
        def write(self, chunk: bytes) -> Any:
            time.sleep(0.001)
            written.append(chunk)

        def flush(self) -> None:
            pass

    sink = _Sink(Out())
    for i in range(50):
        sink.put(bytes([i]) * 10)
    digest = sink.close()
    assert b"".join(written) == b"".join(bytes([i]) * 10 for i in range(50))
    assert digest == hashlib.sha256(b"".join(written)).hexdigest()


def test_the_server_counts_the_pace_in_bytes_of_the_file(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A zstd frame is a ninth of its file: a joiner taking 2.25 MiB of file a second
    keeps the pace, though the server sends only a quarter of a MiB a second."""
    import anyio

    from logsync.server import snapshotroute as route

    clock = [0.0]
    monkeypatch.setattr(route, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    frame = io.BytesIO(b"z" * (100 * route.CHUNK))  # 25 MiB sent, one chunk a second

    async def drain(file_per_byte: float) -> int:
        frame.seek(0)
        clock[0], sent = 0.0, 0
        async for chunk in route._body(frame, b"preamble", 0.0, file_per_byte):
            sent += len(chunk)
            clock[0] += 1.0
        return sent

    assert anyio.run(drain, 9.0) == 100 * route.CHUNK + len(b"preamble")
    with pytest.raises(route.SnapshotStreamTimeout):  # counted as sent, it falls behind
        anyio.run(drain, 1.0)


def test_a_sigterm_after_the_commit_point_stops_the_daemon_but_keeps_the_join(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Past `install`'s commit point a SIGTERM no longer ends the join: the daemon is told
    to stop once it returns, and the log says the snapshot was installed."""
    import os
    import signal

    from logsync.snapshot import joining

    def joined_then_stopped(*args: Any, **kwargs: Any) -> Any:
        assert joining._stopping is not None
        joining._stopping.armed = False  # what install does before os.replace
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs here, in this (the main) thread
        return SimpleNamespace(line=lambda: "joined from a snapshot of p")

    monkeypatch.setattr(joining, "join_if_empty", joined_then_stopped)
    before = signal.getsignal(signal.SIGTERM)
    with caplog.at_level("INFO", logger="logsync.snapshot"):
        assert joining.join_before_serving(tmp_path, None) is False
    assert "after the snapshot was installed" in caplog.text
    assert "nothing installed" not in caplog.text
    assert signal.getsignal(signal.SIGTERM) is before and joining._stopping is None


def test_install_disarms_the_stop_before_its_commit_point(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM landing as the rename runs is taken as a request, not raised mid-commit."""
    import os
    import signal
    import sqlite3

    from logsync.snapshot import joining

    db, candidate = tmp_path / "store.sqlite3", tmp_path / "candidate.sqlite3"
    for path in (db, candidate):
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE events (id TEXT)")
        conn.close()
    real_replace = os.replace

    def replace_signalled(src: Any, dst: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs here
        real_replace(src, dst)

    stop = joining._StopOnSignal()
    monkeypatch.setattr(joining, "_stopping", stop)
    monkeypatch.setattr(joining.os, "replace", replace_signalled)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        joining.install(candidate, db)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stop.requested and not candidate.exists()
