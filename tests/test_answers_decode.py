"""`answers.decode_answer`: a peer's msgpack answer decodes to what msgpack-python gave
for every well-formed body, and any other bytes end as one sentence naming the peer's
fault, never another exception or an allocation the body's size does not pay for."""

from __future__ import annotations

import resource
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logsync.answers import MAX_CONTAINERS, MSGPACK_TYPE, count_containers, decode_answer
from logsync.errors import PeerProtocolError, PeerTooLargeError

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                     st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=8))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                       max_leaves=30)


def decode(body: bytes) -> Any:
    return decode_answer(MSGPACK_TYPE, body, "peer p: /sync/ops", "p")


@settings(max_examples=300, deadline=None)
@given(value=_values)
def test_a_well_formed_body_decodes_as_msgpack_python_decoded_it(value: Any) -> None:
    body = msgpack.packb(value, use_bin_type=True)
    assert decode(body) == msgpack.unpackb(body, raw=False) == value


@pytest.mark.parametrize("body", [
    b"\xdd\xff\xff\xff\xff",  # an array of 4 294 967 295 items, in 5 bytes
    b"\xdf\xff\xff\xff\xff",  # a map of as many pairs
    b"\xdb\xff\xff\xff\xff",  # a 4 GiB string
    b"\xc6\xff\xff\xff\xff",  # a 4 GiB binary
    b"\xc9\xff\xff\xff\xff\x01",  # a 4 GiB extension
    b"\x91" * 200_000 + b"\xc0",  # nested 200 000 deep
    b"\xc0\xc0",  # trailing bytes
    b"\x81\x81\xa1a\x01\x02",  # a map as a map key
    b"",
], ids=["array32", "map32", "str32", "bin32", "ext32", "deep", "trailing", "map-key", "empty"])
def test_a_malformed_body_is_one_sentence_without_a_large_allocation(body: bytes) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    used = _address_space()
    resource.setrlimit(resource.RLIMIT_AS, (used + 512 * 1024 * 1024, hard))
    try:
        with pytest.raises((PeerProtocolError, PeerTooLargeError)) as refused:
            decode(body)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    message = str(refused.value)
    assert "\n" not in message and message.startswith("peer p: /sync/ops "), message


@settings(max_examples=400, deadline=None)
@given(body=st.binary(max_size=64))
def test_any_bytes_decode_or_are_refused_as_the_peers_fault(body: bytes) -> None:
    try:
        decode(body)
    except (PeerProtocolError, PeerTooLargeError) as exc:
        assert "\n" not in str(exc)


def _address_space() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[0]) * resource.getpagesize()


def test_an_extension_value_decodes_as_msgpack_python_decoded_it() -> None:
    """`ExtType(code, data)`: a stable repr (msgspec's own `Ext` shows its address), so a
    refused op's quarantine payload is the same bytes every time it is sent."""
    body = msgpack.packb({"a": [msgpack.ExtType(5, b"zz")]})
    assert decode(body) == msgpack.unpackb(body, raw=False) == {
        "a": [msgpack.ExtType(5, b"zz")]}
    assert repr(decode(body)) == repr(decode(body))


def test_the_content_type_is_read_before_its_parameters() -> None:
    body = msgpack.packb({"a": 1})
    assert decode_answer("Application/MsgPack; charset=binary", body, "w", "p") == {"a": 1}
    assert decode_answer("application/json; charset=utf-8", b'{"a": 1}', "w", "p") == {"a": 1}


def test_a_malformed_body_names_its_decoder_and_type() -> None:
    with pytest.raises(PeerProtocolError, match=r"malformed application/msgpack body "
                                                r"\(DecodeError\): "):
        decode(b"\xc1")  # never used in msgpack
    with pytest.raises(PeerProtocolError, match=r"malformed JSON body \(JSONDecodeError\)"):
        decode_answer("", b"{", "w", "p")  # no content type: read as JSON


@pytest.mark.parametrize("marker", [0x80, 0x8F, 0x90, 0x9F, 0xDC, 0xDD, 0xDE, 0xDF])
def test_every_msgpack_container_marker_counts(marker: int) -> None:
    assert count_containers(bytes([marker]) * 7, True) == 7
    assert count_containers(bytes([0xA0, 0xC0, 0x7F, marker]), True) == 1


def test_json_counts_arrays_and_objects_together() -> None:
    assert count_containers(b'[{"a": [{}]}, "{["]', False) == 6


def test_the_container_bound_is_inclusive() -> None:
    """Exactly MAX_CONTAINERS passes (here brackets inside one string, which the count
    takes as containers); one more is refused before decoding."""
    half = MAX_CONTAINERS // 2
    exact = b'"' + b"[" * half + b"{" * (MAX_CONTAINERS - half) + b'"'
    assert len(decode_answer("application/json", exact, "w", "p")) == MAX_CONTAINERS
    with pytest.raises(PeerTooLargeError, match=f"up to {MAX_CONTAINERS + 1} arrays"):
        decode_answer("application/json", exact[:-1] + b'{"', "w", "p")
