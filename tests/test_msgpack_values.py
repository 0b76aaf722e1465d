"""A peer whose msgpack answers hold values JSON cannot: non-text map keys, msgpack
timestamps and extension values, bytes, anywhere in a vector or a page. The round ends
as a report or one PeerError, never another exception; and the same refused op sent
again counts in its one quarantine row, as it did when msgpack-python decoded answers.
"""

from __future__ import annotations

import datetime
import math
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest

from logsync.errors import PeerError
from logsync.responder import LOGSYNC_SERVER, Profile, answer
from logsync.store import Store
from tests.test_client import run_round

DT = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
Mutate = Callable[[str, dict], None]


def on_ops(change: Callable[[dict], None]) -> Mutate:
    def mutate(path: str, body: dict) -> None:
        if path == "/sync/ops":
            for event in body.get("events", []):
                change(event)
    return mutate


def on_vector(change: Callable[[dict], None]) -> Mutate:
    def mutate(path: str, body: dict) -> None:
        if path == "/sync/version_vector":
            change(body)
    return mutate


def _logsync_part(body: dict, change: Callable[[dict], None]) -> None:
    if isinstance(body.get("logsync"), dict):
        change(body["logsync"])


MUTATIONS: dict[str, Mutate] = {
    "meta-int-key": on_ops(lambda e: e.__setitem__("metadata", {1: "x"})),
    "meta-nested-int-key": on_ops(lambda e: e.__setitem__("metadata", {"a": {1: 2}})),
    "meta-tuple-key": on_ops(lambda e: e.__setitem__("metadata", {(1, 2): "x"})),
    "meta-none-key": on_ops(lambda e: e.__setitem__("metadata", {None: "x"})),
    "meta-nan-key": on_ops(lambda e: e.__setitem__("metadata", {math.nan: "x"})),
    "meta-datetime": on_ops(lambda e: e.__setitem__("metadata", {"a": DT})),
    "meta-ext": on_ops(lambda e: e.__setitem__("metadata", {"a": msgpack.ExtType(5, b"z")})),
    "meta-bytes": on_ops(lambda e: e.__setitem__("metadata", {"a": b"z"})),
    "body-datetime": on_ops(lambda e: e.__setitem__("body", DT)),
    "topic-ext": on_ops(lambda e: e.__setitem__("topic", msgpack.ExtType(5, b""))),
    "artifact-ids-datetime": on_ops(lambda e: e.__setitem__("artifact_ids", [DT])),
    "event-tuple-key": on_ops(lambda e: e.__setitem__((1, 2), "x")),
    "seq-datetime": on_ops(lambda e: e.__setitem__("origin_seq", DT)),
    "id-bytes": on_ops(lambda e: e.__setitem__("id", b"evt")),
    "vector-int-key": on_vector(lambda b: b["version_vector"].__setitem__(5, 3)),
    "vector-tuple-key": on_vector(lambda b: b["version_vector"].__setitem__((1, 2), 3)),
    "vector-datetime-value": on_vector(
        lambda b: b["version_vector"].update(dict.fromkeys(b["version_vector"], DT))),
    "top-int-key": on_vector(lambda b: b.__setitem__(1, 2)),
    "advert-int-key": on_vector(lambda b: _logsync_part(b, lambda x: x.update({1: 2}))),
    "tips-int-key": on_vector(lambda b: _logsync_part(
        b, lambda x: x.__setitem__("tips", {1: [1, "00" * 32]}))),
    "replica-id-ext": on_vector(lambda b: b.__setitem__("replica_id", msgpack.ExtType(1, b""))),
}
PROFILES = {"server": LOGSYNC_SERVER,
            "msgpack-only": Profile(extensions=("msgpack",), max_page=500)}


class HostilePeer:
    """The responder's honest answers, altered by `mutate`, sent as msgpack."""

    def __init__(self, store: Store, profile: Profile, mutate: Mutate) -> None:
        self.store, self.profile, self.mutate = store, profile, mutate

    def __call__(self, request: httpx.Request) -> httpx.Response:
        status, body = answer(self.store, request.url.path, dict(request.url.params),
                              profile=self.profile)
        if status != 200 or not isinstance(body, dict):
            return httpx.Response(status, json=body)
        self.mutate(request.url.path, body)
        return httpx.Response(200, content=msgpack.packb(body, datetime=True),
                              headers={"content-type": "application/msgpack"})


@pytest.fixture
def stores(tmp_path: Path) -> Any:
    source, target = Store.open(tmp_path / "s"), Store.open(tmp_path / "t")
    yield source, target
    source.close()
    target.close()


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", MUTATIONS)
def test_hostile_values_end_as_a_report_or_one_peer_error(stores: Any, name: str,
                                                          profile: str) -> None:
    source, target = stores
    for i in range(3):
        source.append_event("task.ask", "s", "r", "alice", body=f"op {i}")
    try:
        report = run_round(target, HostilePeer(source, PROFILES[profile], MUTATIONS[name]))
    except PeerError as exc:
        assert "\n" not in str(exc) and " at 0x" not in str(exc), str(exc)
        return
    assert report is not None
    assert target.counts()["events"] in (0, 3)  # all of the origin, or none of it


@pytest.mark.parametrize("name", ["meta-ext", "topic-ext"])
def test_a_refused_op_sent_again_counts_in_its_one_quarantine_row(stores: Any,
                                                                 name: str) -> None:
    source, target = stores
    source.append_event("task.ask", "s", "r", "alice", body="op")
    for _ in range(4):
        run_round(target, HostilePeer(source, LOGSYNC_SERVER, MUTATIONS[name]))
    rows = sqlite3.connect(target.db_path).execute(
        "SELECT count(*), sum(times_seen) FROM logsync_quarantine").fetchone()
    assert rows == (1, 4)
