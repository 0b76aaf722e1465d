"""Change notifications: what the daemon takes from a peer's event stream."""

from __future__ import annotations

import json

import pytest

from logsync.watch import frame_position

ORIGIN = "rep_" + "a" * 32


def test_a_frame_names_its_origin_and_origin_seq() -> None:
    data = json.dumps({"id": "evt_1", "origin_replica": ORIGIN, "origin_seq": 12, "body": "x"})
    assert frame_position(" " + data) == (ORIGIN, 12)


@pytest.mark.parametrize("data", [
    "not json", "[1, 2]", json.dumps({"origin_replica": ORIGIN}),
    json.dumps({"origin_replica": ORIGIN, "origin_seq": "12"}),
    json.dumps({"origin_replica": 5, "origin_seq": 12}),
    json.dumps({"origin_replica": ORIGIN, "origin_seq": True}),
])
def test_a_frame_without_a_usable_position_asks_for_a_full_round(data: str) -> None:
    assert frame_position(data) == (None, None)
