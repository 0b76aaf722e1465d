"""Snapshots sent zstd-compressed (RFC 004 §7.6): asked for by the joiner, the same body as
the plain answer, and every bound of the plain download kept for the decoded bytes.

A hostile or broken server may label anything zstd: a stream that does not decode, one
whose window would take a joiner's memory, one that decodes to far more than it announced
(a bomb), one that decodes to nothing for ever (skippable frames), or another encoding
altogether. Each is refused in one sentence and nothing is installed.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import zstandard

from logsync.errors import PeerProtocolError, PeerTransientError
from logsync.fetchpolicy import PeerDeadlineError
from logsync.peers import Peer
from logsync.server import create_app
from logsync.snapshot.download import Receiver, download_snapshot, open_client
from logsync.snapshot.joining import join_if_empty
from logsync.store import Store
from logsync.zstdcoding import INFLATE_CHUNK, ZSTD_MAX_WINDOW, accepts_zstd, inflate
from tests.test_snapshot import (
    FakePeer,
    ThreadServer,
    content,
    fake,
    snapshot_bytes,
    source,
)

__all__ = ["fake", "source"]  # fixtures shared with tests/test_snapshot.py

REPLICA = "rep_0123456789ab"


def _raw_get(app: Any, accept: str | None) -> tuple[httpx.Headers, bytes]:
    """One `GET /sync/snapshot`: its headers and body exactly as sent (not decoded)."""

    async def go() -> tuple[httpx.Headers, bytes]:
        headers = {} if accept is None else {"Accept-Encoding": accept}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as client, \
                client.stream("GET", "/sync/snapshot", headers=headers) as response:
            assert response.status_code == 200
            return response.headers, b"".join([c async for c in response.aiter_raw()])

    return anyio.run(go)


def test_zstd_is_sent_only_when_asked_and_decodes_to_the_plain_body(source: Store) -> None:
    app = create_app(source)
    try:
        plain_headers, plain = _raw_get(app, "identity")
        headers, packed = _raw_get(app, "gzip, zstd")
        declined_headers, declined = _raw_get(app, "zstd;q=0")
    finally:
        app.state.logsync.close()
    assert "content-encoding" not in plain_headers
    assert int(plain_headers["content-length"]) == len(plain)
    assert headers["content-encoding"] == "zstd"
    assert int(headers["content-length"]) == len(packed)
    assert "accept-encoding" in headers["vary"].lower()
    # one frame holding preamble and copy, within the joiner's window: what a decoder
    # that takes one frame only (httpx 0.28's, a stock decompressobj) reads whole
    assert b"".join(inflate(_chunks(packed), "GET", "p")) == plain
    one_frame = zstandard.ZstdDecompressor().decompressobj()
    assert one_frame.decompress(packed) == plain and one_frame.unused_data == b""
    assert zstandard.get_frame_parameters(packed).content_size == len(plain)
    assert len(packed) < len(plain) // 2
    assert "content-encoding" not in declined_headers and declined == plain


def test_a_stock_http_client_decodes_the_zstd_body_as_the_server_sends_it(
        source: Store) -> None:
    """httpx 0.28's decoder takes a second frame only within the chunk that ended the
    first: a body sent over a real connection as a preamble frame and then the copy's
    failed with 'cannot use a decompressobj multiple times'."""
    app = create_app(source)
    server = ThreadServer(app)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            packed = client.get("/sync/snapshot", headers={"Accept-Encoding": "zstd"})
            plain = client.get("/sync/snapshot", headers={"Accept-Encoding": "identity"})
    finally:
        server.close()
        app.state.logsync.close()
    assert packed.headers["content-encoding"] == "zstd"
    assert packed.content == plain.content


def test_the_copy_is_compressed_once_and_every_joiner_gets_that_frame(
        source: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import logsync.snapshot.making as making

    made: list[int] = []
    real = making.digest_and_compress
    monkeypatch.setattr(making, "digest_and_compress",
                        lambda *a, **k: made.append(1) or real(*a, **k))
    app = create_app(source)
    try:
        answers = [_raw_get(app, "zstd")[1] for _ in range(3)]
        frames = [p for p in source.palace.iterdir() if p.name.endswith(".zst")]
        assert len(frames) == 1
        assert frames[0].stat().st_mode & 0o777 == 0o600  # private, like the copy
        frame = frames[0].read_bytes()
    finally:
        app.state.logsync.close()
    assert made == [1]  # one copy, one compression, three downloads
    assert answers[0] == answers[1] == answers[2] and answers[0].endswith(frame)
    assert not [p for p in source.palace.iterdir() if p.name.endswith(".zst")]


def test_a_copy_whose_frame_cannot_be_written_is_served_as_it_is(
        source: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        tmp_path: Path) -> None:
    """Compression is an optimisation: a full disk while writing the frame costs the
    joiner the plain file, never the snapshot, and leaves no partial frame behind."""
    import errno

    import logsync.snapshot.making as making

    writes = 0

    class FullDisk:
        """The frame's file: its disk fills at the second write."""

        def __init__(self, path: Path) -> None:
            self.real = path.open("wb")

        def write(self, data: bytes) -> int:
            nonlocal writes
            writes += 1
            if writes >= 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.real.write(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

    real_init = making._Packed.__init__

    def packed_on_a_full_disk(self: Any, copy: Path, size: int) -> None:
        real_init(self, copy, size)
        self._out.close()
        self._out = FullDisk(self.path)
        self._writer = making.compressor(size).stream_writer(
            self._out, size=size, closefd=False, write_size=4096)

    monkeypatch.setattr(making._Packed, "__init__", packed_on_a_full_disk)
    app = create_app(source)
    try:
        headers, body = _raw_get(app, "zstd")
        assert not [p for p in source.palace.iterdir() if p.name.endswith(".zst")]
    finally:
        app.state.logsync.close()
    assert writes >= 2
    assert "content-encoding" not in headers and int(headers["content-length"]) == len(body)
    line, _, data = body.partition(b"\n")
    assert hashlib.sha256(data).hexdigest() == json.loads(line)["sha256"]
    assert any("could not be compressed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("value", "wanted"), [
    ("zstd", True), ("gzip, zstd;q=0.5", True), ("ZSTD ; q=1", True), ("zstd;q=0", False),
    ("zstd;q=0.000", False), ("zstd;q=x", False), ("identity", False), ("", False),
    ("br, gzip", False), ("zstdx", False), ("zstd;level=3;q=0", False),
    ("zstd;q=inf", False), ("zstd;q=1e9", False), ("zstd;q=1.5", False),
    ("zstd;q=1.000", True), ("zstd;q=0.001", True), ("zstd ;Q=0", False),
])
def test_accept_encoding_is_read_as_http_says(value: str, wanted: bool) -> None:
    assert accepts_zstd(value) is wanted


def test_zstd_listed_on_a_second_accept_encoding_line_counts(source: Store) -> None:
    async def go() -> httpx.Headers:
        app = create_app(source)
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://127.0.0.1") as client:
                request = client.build_request("GET", "/sync/snapshot", headers=[
                    ("Accept-Encoding", "gzip"), ("Accept-Encoding", "zstd")])
                response = await client.send(request, stream=True)
                await response.aclose()
                return response.headers
        finally:
            app.state.logsync.close()

    assert anyio.run(go)["content-encoding"] == "zstd"


def test_a_server_never_compresses_past_the_joiner_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Level 1 uses a 512 KiB window; a higher level set by a maintainer would ask for up
    to 128 MiB, which every joiner refuses: the server caps it."""
    import logsync.zstdcoding as coding

    monkeypatch.setattr(coding, "ZSTD_LEVEL", 22)
    assert zstandard.ZstdCompressionParameters.from_level(
        22, source_size=10**9).window_log > ZSTD_MAX_WINDOW.bit_length() - 1
    encoder = coding.compressor(10**9).compressobj(size=10**9)
    head = encoder.compress(b"x" * 1000) + encoder.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    assert zstandard.get_frame_parameters(head).window_size == ZSTD_MAX_WINDOW


def test_a_join_takes_the_compressed_answer_and_ends_identical(
        source: Store, fake: FakePeer, tmp_path: Path) -> None:
    sent: list[str | None] = []
    inner = fake.inner

    async def record(scope: Any, receive: Any, send: Any) -> None:
        async def spy(message: dict) -> None:
            if message["type"] == "http.response.start" and scope["path"] == "/sync/snapshot":
                found = dict(message["headers"]).get(b"content-encoding")
                sent.append(found.decode() if found else None)
            await send(message)
        await inner(scope, receive, spy)

    fake.inner = record
    joiner = tmp_path / "joiner"
    joined = join_if_empty(joiner, [Peer(url=fake.server.url)], say=pytest.fail)
    assert joined is not None and sent == ["zstd"]
    assert content(joiner) == content(source.palace)


@pytest.mark.parametrize(("label", "body", "named"), [
    ("gzip", None, "sent a 'gzip'-encoded answer although zstd or identity was asked for"),
    ("zstd", b"\x00not zstd at all" * 64, "its zstd stream does not decode"),
    ("zstd", "truncated", "ended after"),
], ids=["other-encoding", "garbage", "truncated"])
def test_a_bad_encoding_is_refused_in_one_line_and_nothing_is_installed(
        source: Store, fake: FakePeer, tmp_path: Path, label: str, body: Any,
        named: str) -> None:
    plain = snapshot_bytes(source)
    packed = zstandard.ZstdCompressor(level=1).compress(plain)
    fake.body = {None: packed, "truncated": packed[: len(packed) * 2 // 3]}.get(body, body)
    fake.headers = [(b"content-encoding", label.encode())]
    said: list[str] = []
    joiner = tmp_path / "joiner"
    assert join_if_empty(joiner, [Peer(url=fake.server.url)], say=said.append) is None
    assert len(said) == 1 and named in said[0] and "\n" not in said[0], said
    with Store.open(joiner) as store:
        assert store.latest_event_id() is None


def _preamble(size: int, sha: str = "0" * 64) -> bytes:
    return json.dumps({"format": "logsync-snapshot-1", "replica_id": REPLICA,
                       "vector": {REPLICA: 3}, "size": size, "sha256": sha}).encode() + b"\n"


def _chunks(data: bytes, size: int = 65536) -> Iterator[bytes]:
    return (data[i:i + size] for i in range(0, len(data), size))


def test_a_bomb_is_decoded_a_bounded_chunk_at_a_time_and_refused_past_its_size(
        tmp_path: Path) -> None:
    zeros = 256 * 1024 * 1024
    writer = zstandard.ZstdCompressor(level=1).compressobj()
    bomb = writer.compress(_preamble(4096)) + b"".join(
        writer.compress(bytes(8 * 1024 * 1024)) for _ in range(zeros // (8 * 1024 * 1024)))
    bomb += writer.flush()
    assert len(bomb) < 64 * 1024  # 256 MiB of zeros in a few KiB
    pulled = []
    for out in inflate(_chunks(bomb), "GET", "p"):
        pulled.append(len(out))
        if len(pulled) == 3:
            break  # lazy: nothing past what was asked for was decoded
    assert max(pulled) <= INFLATE_CHUNK
    receiver = Receiver(tmp_path / "bomb", 10**9, "GET", "p", 30.0)
    with pytest.raises(PeerProtocolError, match="sent more than the 4096 bytes"), receiver:
        for out in inflate(_chunks(bomb), "GET", "p"):
            receiver.feed(out)


def test_a_window_past_the_joiner_cap_is_refused() -> None:
    params = zstandard.ZstdCompressionParameters.from_level(1, window_log=27)
    wide = zstandard.ZstdCompressor(compression_params=params).compressobj()
    data = wide.compress(b"x" * 1000) + wide.flush()  # size unknown: the window stays
    assert zstandard.get_frame_parameters(data).window_size > ZSTD_MAX_WINDOW
    with pytest.raises(PeerProtocolError, match="zstd stream does not decode"):
        list(inflate(_chunks(data), "GET", "p"))


def test_frames_one_after_another_decode_as_one_body(tmp_path: Path) -> None:
    data = bytes(range(256)) * 300
    wire = _preamble(len(data), hashlib.sha256(data).hexdigest()) + data
    packer = zstandard.ZstdCompressor(level=3)
    frames = b"".join(packer.compress(wire[i:i + 5000]) for i in range(0, len(wire), 5000))
    receiver = Receiver(tmp_path / "frames", 10**9, "GET", "p", 30.0)
    with receiver:
        for out in inflate(_chunks(frames, 777), "GET", "p"):
            receiver.feed(out)
    assert receiver.finish()["size"] == len(data)
    assert (tmp_path / "frames").read_bytes() == data


def test_a_stream_that_decodes_to_nothing_still_meets_the_deadline(tmp_path: Path) -> None:
    skippable = struct.pack("<II", 0x184D2A50, 4096) + bytes(4096)  # decodes to no byte

    def for_ever() -> Iterator[bytes]:
        while True:
            time.sleep(0.001)
            yield skippable

    receiver = Receiver(tmp_path / "never", 10**9, "GET", "p", 0.3)
    began = time.monotonic()
    with pytest.raises(PeerDeadlineError, match="fell behind"), receiver:
        for out in inflate(receiver.timed(for_ever()), "GET", "p"):
            receiver.feed(out)
    assert time.monotonic() - began < 10


@pytest.mark.parametrize("announced", [True, False], ids=["after-preamble", "before"])
def test_a_stream_that_decodes_to_nothing_ends_at_a_byte_count_too(
        tmp_path: Path, announced: bool) -> None:
    """Skippable frames after (or instead of) a small file: the bytes on the wire are
    capped by what the file may decode to, long before the deadline."""
    data = b"x" * 1000
    head = zstandard.ZstdCompressor(level=1).compress(
        _preamble(len(data), hashlib.sha256(data).hexdigest()) + data) if announced else b""
    skippable = struct.pack("<II", 0x184D2A50, 65536) + bytes(65536)
    sent = 0

    def for_ever() -> Iterator[bytes]:
        nonlocal sent
        yield head
        while sent < 10**9:  # bounded: the cap stops it after a few MiB
            sent += len(skippable)
            yield skippable

    receiver = Receiver(tmp_path / "never", 10**12, "GET", "p", 600.0)  # a 1 TB byte cap
    began = time.monotonic()
    with pytest.raises(PeerProtocolError, match=r"sent more than \d+ bytes on the wire"), \
            receiver:
        for out in inflate(receiver.timed(for_ever()), "GET", "p"):
            receiver.feed(out)
    assert receiver.encoded_cap() < 5 * 1024 * 1024 and sent < 6 * 1024 * 1024
    assert time.monotonic() - began < 30


def test_once_announced_the_wire_cap_is_the_announced_size(tmp_path: Path) -> None:
    """After a preamble announcing 1000 bytes, junk on the wire is refused at about
    2 MiB, below the ~4 MiB allowed before any preamble."""
    receiver = Receiver(tmp_path / "small", 10**12, "GET", "p", 600.0)
    junk = bytes(65536)

    def wire() -> Iterator[bytes]:
        yield _preamble(1000)
        for _ in range(10**5):  # bounded: the cap stops it after ~32 chunks
            yield junk

    early = receiver.encoded_cap()
    with pytest.raises(PeerProtocolError, match="a stream of the announced size"), receiver:
        for chunk in receiver.timed(wire()):
            receiver.feed(chunk[:0] if receiver.preamble else chunk)  # the junk: not fed
    assert receiver.preamble is not None and receiver.preamble["size"] == 1000
    assert receiver.encoded_cap() < 2.1 * 1024 * 1024 < early
    assert receiver.received < 2.2 * 1024 * 1024


def test_a_legitimate_stream_fits_the_encoded_cap(tmp_path: Path) -> None:
    """Incompressible bytes are what zstd expands most: they still fit, before the
    preamble is known as after."""
    import os

    data = os.urandom(6 * 1024 * 1024)
    wire = zstandard.ZstdCompressor(level=1).compress(
        _preamble(len(data), hashlib.sha256(data).hexdigest()) + data)
    assert len(wire) > len(data)
    receiver = Receiver(tmp_path / "random", len(data), "GET", "p", 60.0)
    with receiver:
        for out in inflate(receiver.timed(_chunks(wire)), "GET", "p"):
            receiver.feed(out)
    assert receiver.finish()["size"] == len(data) and receiver.received == len(wire)


def test_a_download_of_skippable_frames_over_http_ends_at_its_deadline(tmp_path: Path) -> None:
    """The same through `download_snapshot` and a real socket: what arrives is timed, not
    only what it decodes to."""
    skippable = struct.pack("<II", 0x184D2A50, 4096) + bytes(4096)
    stop = time.monotonic() + 20

    async def endless(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-encoding", b"zstd")]})
        while time.monotonic() < stop:  # bounded: the test ends long before
            await send({"type": "http.response.body", "body": skippable, "more_body": True})
            await anyio.sleep(0.005)
        await send({"type": "http.response.body", "body": b""})

    server = ThreadServer(endless)
    try:
        began = time.monotonic()
        with open_client(server.url, None) as http, \
                pytest.raises(PeerDeadlineError, match="fell behind"):
            download_snapshot(http, tmp_path / "never", 10**9, name="p", base_deadline_s=0.5)
        assert time.monotonic() - began < 10
    finally:
        server.close()


def test_a_corrupt_file_is_the_reason_given_whatever_the_other_checks_raise(
        source: Store, fake: FakePeer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's integrity check runs beside the proof and the signature check; when it
    fails, that is the refusal, even if a check beside it raised too (on a file that is
    not sound, anything may raise)."""
    from logsync.snapshot import SnapshotRefused, joining

    def corrupt(path: Path) -> None:
        time.sleep(0.2)  # ends after the checks beside it
        raise SnapshotRefused("it fails SQLite's integrity check (planted)")

    def raises(*args: Any) -> Any:
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(joining, "check_integrity", corrupt)
    monkeypatch.setattr(joining, "verify_kept_signatures", raises)
    said: list[str] = []
    joiner = tmp_path / "joiner"
    assert join_if_empty(joiner, [Peer(url=fake.server.url)], say=said.append) is None
    assert len(said) == 1 and "integrity check (planted)" in said[0], said


def test_a_snapshot_the_disk_cannot_hold_is_refused_before_a_byte_is_written(
        source: Store, fake: FakePeer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A few KiB of zstd may announce (and decode to) the whole 64 GiB cap: the room is
    checked against the announced size first, and the join falls back to the pull."""
    from logsync.snapshot import download

    real = download.shutil.disk_usage

    def nearly_full(path: Any) -> Any:
        usage = real(path)
        return usage._replace(free=download.SPARE_DISK_BYTES + 1000)

    monkeypatch.setattr(download.shutil, "disk_usage", nearly_full)
    said: list[str] = []
    joiner = tmp_path / "joiner"
    assert join_if_empty(joiner, [Peer(url=fake.server.url)], say=said.append) is None
    assert len(said) == 1 and "snapshot does not fit on the disk of" in said[0], said
    assert said[0].endswith("; pulling op by op instead")
    assert not [p for p in joiner.iterdir() if p.name.startswith(".logsync-snapshot-join-")]


def test_a_coded_refusal_of_a_snapshot_keeps_its_reason(tmp_path: Path) -> None:
    """A snapshot's refusal coded as its file would be: the joiner says why."""
    said = json.dumps({"error": "busy", "reason": "a snapshot is being made; try in 5 s"})
    coded = zstandard.ZstdCompressor().compress(said.encode())

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("503 Service Unavailable", [
            ("Content-Type", "application/json"), ("Content-Encoding", "zstd"),
            ("Content-Length", str(len(coded)))])
        return [coded]

    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://peer") as http, \
            pytest.raises(PeerTransientError,
                          match=r"answered 503: a snapshot is being made; try in 5 s$"):
        download_snapshot(http, tmp_path / "snap", 1 << 20, name="peer")
    assert not (tmp_path / "snap").exists()
