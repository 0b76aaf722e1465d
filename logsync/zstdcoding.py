"""zstd as an HTTP content coding: one rule for snapshots and `/sync/ops` pages.

A server codes an answer only when the request's `Accept-Encoding` lists zstd with a q
above 0, and compresses within a window a receiver accepts. A receiver decodes at most
`INFLATE_CHUNK` bytes at a time, in a window of at most `ZSTD_MAX_WINDOW`, whatever size
a frame header announces (the library's one-shot `decompress` allocates what the header
says, its `max_output_size` notwithstanding): a 10 KB stream that announces 300 MB is
refused at the receiver's bound, never allocated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import zstandard

from logsync.errors import PeerProtocolError, PeerTooLargeError

# The largest zstd window a receiver decodes (its memory for one stream); a server
# compresses within it. zstd's level 1 uses 512 KiB; its default decoder cap is 128 MiB.
ZSTD_MAX_WINDOW = 8 * 1024 * 1024
ZSTD_LEVEL = 1  # ~0.9-1.3 GB/s on one core; a page of text still shrinks 5-30x
INFLATE_CHUNK = 1024 * 1024  # decoded bytes handed on at a time
ZSTD = "zstd"
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")


def accepts_zstd(accept_encoding: str) -> bool:
    """Whether an `Accept-Encoding` value lists zstd with a q above 0 (RFC 9110 §12.5.3:
    q is 0 to 1 with at most three decimals; a malformed q counts as a refusal)."""
    for item in accept_encoding.lower().split(",")[:64]:
        coding, *params = item.split(";")
        if coding.strip() != ZSTD:
            continue
        q = "1"
        for param in params[:8]:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                q = value.strip()
        return _QVALUE.fullmatch(q) is not None and float(q) > 0
    return False


def request_accepts_zstd(headers: Any) -> bool:
    """`accepts_zstd` over every `Accept-Encoding` line of a request (Starlette's
    `Headers`): several lines are one list joined by commas (RFC 9110 §5.3)."""
    return accepts_zstd(",".join(headers.getlist("accept-encoding")))


def compressor(size: int) -> Any:
    """A zstd compressor for one frame of `size` bytes, in a window a receiver accepts."""
    params = zstandard.ZstdCompressionParameters.from_level(ZSTD_LEVEL, source_size=size)
    cap = ZSTD_MAX_WINDOW.bit_length() - 1
    if params.window_log > cap:
        params = zstandard.ZstdCompressionParameters.from_level(
            ZSTD_LEVEL, source_size=size, window_log=cap)
    return zstandard.ZstdCompressor(compression_params=params)


def compress(data: bytes) -> bytes:
    """`data` as one zstd frame (its size in the header), in a window a receiver accepts."""
    return compressor(len(data)).compress(data)  # type: ignore[no-any-return]


def inflate(chunks: Iterator[bytes], where: str, peer: str) -> Iterator[bytes]:
    """The zstd stream `chunks` decoded, at most `INFLATE_CHUNK` bytes at a time; a stream
    that does not decode, or needs a window past `ZSTD_MAX_WINDOW`, is refused in one
    sentence."""
    decoder = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)
    reader = decoder.stream_reader(_ChunkReader(chunks), read_across_frames=True)
    try:
        while out := reader.read(INFLATE_CHUNK):
            yield out
    except zstandard.ZstdError as exc:
        raise PeerProtocolError(f"{where}: its zstd stream does not decode ({exc})",
                                peer=peer) from None


def inflate_capped(body: bytes | bytearray, most: int, where: str, peer: str,
                   take: Callable[[int], None] | None = None) -> bytearray:
    """A whole zstd-coded answer decoded; one that decodes past `most` bytes is refused as
    too large as soon as it passes them (the engine then asks for a smaller page), and so
    is one whose `take(n)` (a shared bound on bytes held) raises."""
    out = bytearray()
    # a copy: views of a bytearray would stop its owner from clearing it after a refusal
    for chunk in inflate(iter((bytes(body),)), where, peer):
        if len(out) + len(chunk) > most:
            raise PeerTooLargeError(
                f"{where} sent a zstd answer that decodes past the {most}-byte cap",
                peer=peer)
        if take is not None:
            take(len(chunk))
        out += chunk
    if len(out) < _first_frame_size(body):  # the decoder ends a cut stream silently
        raise PeerProtocolError(f"{where}: its zstd stream ends inside a frame", peer=peer)
    return out


def _first_frame_size(body: bytes | bytearray) -> int:
    """What the first frame's header announces it decodes to; -1 when it does not say
    (a truncation past the first frame is found by the decoding of what it held)."""
    try:
        return int(zstandard.frame_content_size(bytes(body[:18])))  # a header's most
    except zstandard.ZstdError:
        return -1


class _ChunkReader:
    """`read(size)` over an iterator of byte chunks (what zstd's stream reader pulls);
    slices are views, so a large chunk is copied once, a read's worth at a time."""

    def __init__(self, chunks: Iterator[bytes | bytearray]) -> None:
        self._chunks, self._rest = chunks, memoryview(b"")

    def read(self, size: int = -1) -> bytes:
        while not self._rest:
            chunk = next(self._chunks, None)
            if chunk is None:
                return b""
            self._rest = memoryview(chunk)
        if 0 <= size < len(self._rest):
            out, self._rest = self._rest[:size], self._rest[size:]
        else:
            out, self._rest = self._rest, memoryview(b"")
        return bytes(out)
