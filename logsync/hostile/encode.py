"""Answers and streams, and encoders that go where the standard ones refuse (any depth)."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from logsync.hostile.ops import (
    JSON,
    MSGPACK,
)

# ── answers and streams ──────────────────────────────────────────────


@dataclass(frozen=True)
class Stream:
    """A response only a real socket can give; the test server performs it.

    kinds: `drip` (declared `length`, one byte of `fill` every `interval` s),
    `bytes` (`length` bytes: `prefix` then `fill` repeated, in `chunk`-byte writes,
    then `suffix`), `chunked` (the same bytes as HTTP/1.1 chunks of `chunk` bytes each,
    written 64 KiB of the wire at a time: one read of the client's HTTP parser yields
    each chunk on its own), `reset` (close with RST before any answer), `sse`
    (`frames`, and any the scene adds later, then pings every `interval` s until the
    client leaves).
    """

    kind: str
    length: int = 0
    fill: bytes = b""
    prefix: bytes = b""
    suffix: bytes = b""
    chunk: int = 1 << 20
    interval: float = 0.0
    frames: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: tuple[tuple[str, str], ...] = JSON
    body: Any = None  # dict/list (JSON, or msgpack when asked), bytes, or a Stream

    def encoded(self, msgpack: bool = False) -> tuple[tuple[tuple[str, str], ...], bytes]:
        """(headers, bytes). A 200 object goes out as msgpack when the request asked
        for it (as a logsync server does) unless an integer does not fit in 64 bits."""
        if isinstance(self.body, bytes):
            return self.headers, self.body
        if msgpack and self.status == 200 and self.headers == JSON:
            try:
                return MSGPACK, to_msgpack(self.body)
            except OverflowError:
                pass
        return self.headers, to_json(self.body)


# Encoders without a depth limit: a hostile answer may nest deeper than the stdlib
# encoders (or msgpack's 511) allow, and must still reach the victim intact.


class _Literal(str):
    """Text already encoded (punctuation) on the JSON encoder's stack."""


def to_json(value: Any) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode(
            "utf-8", "surrogatepass")
    except RecursionError:
        pass
    parts: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Literal):
            parts.append(str(item))
        elif isinstance(item, dict):
            parts.append("{")
            stack.append(_Literal("}"))
            pairs = list(item.items())
            for index in range(len(pairs) - 1, -1, -1):
                key, val = pairs[index]
                stack.append(val)
                stack.append(_Literal(json.dumps(str(key), ensure_ascii=False) + ":"))
                if index:
                    stack.append(_Literal(","))
        elif isinstance(item, list | tuple):
            parts.append("[")
            stack.append(_Literal("]"))
            for index in range(len(item) - 1, -1, -1):
                stack.append(item[index])
                if index:
                    stack.append(_Literal(","))
        else:
            parts.append(json.dumps(item, ensure_ascii=False))
    return "".join(parts).encode("utf-8", "surrogatepass")


def to_msgpack(value: Any) -> bytes:
    """msgpack of JSON-shaped values, any depth; OverflowError past 64-bit integers."""
    out = bytearray()
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if item is None:
            out += b"\xc0"
        elif item is True or item is False:
            out += b"\xc3" if item else b"\xc2"
        elif isinstance(item, int):
            out += _msgpack_int(item)
        elif isinstance(item, float):
            out += b"\xcb" + struct.pack(">d", item)
        elif isinstance(item, str):
            raw = item.encode("utf-8", "surrogatepass")
            out += _msgpack_head(len(raw), 0xA0, 32, b"\xd9", b"\xda", b"\xdb") + raw
        elif isinstance(item, list | tuple):
            out += _msgpack_head(len(item), 0x90, 16, None, b"\xdc", b"\xdd")
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            out += _msgpack_head(len(item), 0x80, 16, None, b"\xde", b"\xdf")
            for key, val in reversed(list(item.items())):
                stack.append(val)
                stack.append(str(key))
        else:
            raise TypeError(f"cannot encode {type(item).__name__} as msgpack")
    return bytes(out)


def _msgpack_int(n: int) -> bytes:
    if 0 <= n < 128:
        return bytes([n])
    if -32 <= n < 0:
        return struct.pack(">b", n)
    if 0 <= n < 2**64:
        return b"\xcf" + struct.pack(">Q", n)
    if -(2**63) <= n < 0:
        return b"\xd3" + struct.pack(">q", n)
    raise OverflowError(f"{n} does not fit in msgpack's 64-bit integers")


def _msgpack_head(n: int, fix: int, fix_limit: int, one: bytes | None, two: bytes,
                  four: bytes) -> bytes:
    if n < fix_limit:
        return bytes([fix | n])
    if one is not None and n < 256:
        return one + bytes([n])
    if n < 65536:
        return two + struct.pack(">H", n)
    return four + struct.pack(">I", n)


def sse_frame(event: Mapping[str, Any]) -> bytes:
    return (f"id: {event.get('id')}\nevent: logstream\n"
            f"data: {json.dumps(event, ensure_ascii=False)}\n\n").encode()
