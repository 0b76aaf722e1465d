"""The hostile corpus itself (`logsync.hostile`): valid where it must be, hostile where
it must be, and every page-level mutation refused by the one remote-op validator."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import msgpack
import pytest

from logsync import hostile, model, remoteops
from logsync.errors import PeerProtocolError, ValidationError
from logsync.hostile import GOOD_ORIGIN, MODES, Scene, Stream
from logsync.wire import parse_page


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_mode_serves_the_good_origin_honestly(mode: str) -> None:
    scene = Scene.build(mode, victims=(hostile.bad_origin(40),))
    vector = scene.answer("/sync/version_vector", {}).body["version_vector"]
    assert vector[GOOD_ORIGIN] == hostile.GOOD_COUNT
    page = scene.answer("/sync/ops", {"origin": GOOD_ORIGIN, "after": "0", "limit": "500"})
    events = parse_page(page.body, "p", GOOD_ORIGIN, 0, 500).events
    assert [e["origin_seq"] for e in events] == list(range(1, hostile.GOOD_COUNT + 1))
    for event in events:
        assert list(event)[: len(model.EVENT_KEYS)] == list(model.EVENT_KEYS)
        remoteops.validate_remote_event(event)


@pytest.mark.parametrize("name", sorted(hostile.OP_MUTATIONS))
def test_every_op_mutation_is_refused_by_the_validator(name: str) -> None:
    op = hostile.OP_MUTATIONS[name](hostile.make_event(GOOD_ORIGIN, 1))
    outcome: list[BaseException] = []

    def check() -> None:  # a worker thread, as apply runs in one
        try:
            remoteops.validate_remote_event(op)
        except BaseException as exc:  # noqa: BLE001 - recorded and judged below
            outcome.append(exc)

    worker = threading.Thread(target=check)
    worker.start()
    worker.join(30)
    assert outcome and isinstance(outcome[0], ValidationError), outcome


@pytest.mark.parametrize("seq", [2**62 + 1, 2**63, 2**64 - 1])
def test_overflowing_seqs_are_refused_by_the_validator(seq: int) -> None:
    with pytest.raises(ValidationError):
        remoteops.validate_remote_event(
            hostile.overflow_seq(hostile.make_event(GOOD_ORIGIN, 1), seq))


@pytest.mark.parametrize("variant", ["seq_zero", "seq_negative", "seq_float", "seq_bool",
                                     "seq_string", "backwards"])
def test_every_bad_page_is_refused_before_the_store(variant: str) -> None:
    origin = hostile.bad_origin(0)
    page = {"origin": origin, "events": hostile.bad_page(variant, hostile.chain(origin, 3))}
    with pytest.raises(PeerProtocolError):
        parse_page(page, "p", origin, 0, 500)


def test_numeric_twins_are_equal_values_but_other_bytes() -> None:
    for value in hostile.NUMERIC_METADATA:
        twin = hostile.numeric_twin(value)
        assert twin == value
        assert json.dumps(twin) != json.dumps(value)


def test_the_encoders_carry_any_depth_and_the_largest_integers() -> None:
    deep = hostile.deep_metadata(hostile.make_event(GOOD_ORIGIN, 1))
    assert json.loads(hostile.to_json({"n": 1, "e": [None, True, 1.5, "x"]})) == \
        {"n": 1, "e": [None, True, 1.5, "x"]}
    text = hostile.to_json(deep)
    assert text.count(b'{"a":') == 989
    packed = hostile.to_msgpack({"v": 2**64 - 1, "m": -(2**63), "e": [deep]})
    assert len(packed) > 990
    with pytest.raises(OverflowError):
        hostile.to_msgpack({"v": 2**64})
    small = {"a": [1, -5, 300, -300, 2**40, "é", {"b": None}], "t": True, "f": 0.25}
    assert msgpack.unpackb(hostile.to_msgpack(small), raw=False) == small


def test_bombs_are_inside_the_cap_and_say_what_they_are() -> None:
    for stream in (hostile.msgpack_bomb(hostile.BAD_ORIGIN),
                   hostile.json_bomb(hostile.BAD_ORIGIN)):
        assert isinstance(stream, Stream)
        assert 55_000_000 < stream.length < 64 * 1024 * 1024
    small = hostile.msgpack_bomb(hostile.BAD_ORIGIN, 4)
    decoded = msgpack.unpackb(small.prefix + small.fill * 4, raw=False)
    assert decoded["events"] == [[], [], [], []]


@pytest.mark.parametrize("kind", hostile.SIM_KINDS)
def test_every_sim_kind_alters_an_honest_answer(kind: str) -> None:
    requester = hostile.bad_origin(7)
    own = hostile.chain(requester, 3, metadata={"n": 1})
    body: dict[str, Any] = {"origin": requester, "events": [dict(e) for e in own],
                            "count": 3}
    vector = {"replica_id": hostile.PEER_ID, "version_vector": {requester: 3}}
    rng = random.Random(7)
    done = (hostile.tamper_vector(kind, vector, rng, requester) if kind in
            hostile.VECTOR_KINDS else None)
    done = done or hostile.tamper_page(kind, body, {"origin": requester, "after": "0"}, rng,
                                       requester)
    assert done, kind
    # json text, not equality: a numeric fork is equal in value and differs in bytes
    assert (hostile.to_json(body["events"]) != hostile.to_json(own)
            or vector["version_vector"] != {requester: 3})
