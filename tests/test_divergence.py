"""Divergence is never silent (issue 10, item 2): chain tips in the vector answer,
`prev` on pages, the `/sync/digests` search, and the overlap-by-one against a peer
without chains. Each case: a conflict is recorded in one round, nothing is overwritten."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsync.divergence import probes
from logsync.engine import pull_round
from logsync.replica import mint_replica_id
from logsync.responder import LOGSYNC_SERVER, UPSTREAM_HUB, answer
from logsync.store import Store
from tests.test_engine import FakePeer, comparable, drive

CHAIN_ADVERT = {"version": "t", "extensions": list(LOGSYNC_SERVER.extensions),
                "max_page": 5000, "max_page_bytes": 2**40}


class ChainPeer(FakePeer):
    """A logsync peer (every extension, chain tips included)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.profile = LOGSYNC_SERVER

    def digest_requests(self) -> int:
        return sum(1 for r in self.log if r.path == "/sync/digests")


def append(store: Store, count: int, tag: str) -> None:
    for i in range(count):
        store.append_event("task.ask", "s", "r", "alice", body=f"{tag} {i}")


def origin_ops(store: Store) -> list[dict]:
    return store.list_ops(store.replica_id, 0, 10_000, max_limit=10_000)


def restored_copy(source: Path, target: Path, replica_id: str | None = None) -> Store:
    """A palace copied file by file (a backup), reopened: same replica id, same ops."""
    shutil.copytree(source, target)
    if replica_id is None:
        replica_id = json.loads((target / "replica.json").read_text())["replica_id"]
    return Store.open(target, replica_id=replica_id)


def conflicts(store: Store, kind: str) -> list[dict]:
    return [c for c in store.list_conflicts(1000) if c["kind"] == kind]


def pull(store: Store, peer: FakePeer) -> Any:
    return drive(pull_round(store.replica_id, "peer-x", batch_artifacts=False), peer, store)


def backup_then_remint(tmp_path: Path, *, total: int, kept: int, reminted: int
                       ) -> tuple[Store, Store, Store]:
    """X writes `kept` ops, is backed up, writes up to `total`; A pulls all of them.
    Then X is restored from the backup and re-mints `reminted` new ops."""
    x = Store.open(tmp_path / "x")
    append(x, kept, "x")
    x.close()
    shutil.copytree(tmp_path / "x", tmp_path / "backup")
    x = Store.open(tmp_path / "x")
    append(x, total - kept, "x-late")
    a = Store.open(tmp_path / "a")
    assert pull(a, ChainPeer(x)).total("applied") == total
    x.close()
    restored = restored_copy(tmp_path / "backup", tmp_path / "x2")
    append(restored, reminted, "re-minted")
    return a, x, restored


def test_a_reminted_backup_is_found_through_a_page_prev(tmp_path):
    a, _, x2 = backup_then_remint(tmp_path, total=5, kept=2, reminted=4)  # x2: 1-2, 3'-6'
    before = comparable(a)
    report = pull(a, ChainPeer(x2))
    progress = report.origins[x2.replica_id]
    assert progress.diverged_at == 3
    assert progress.applied == 0
    assert comparable(a) == before                       # nothing overwritten, 6' not taken
    (found,) = conflicts(a, "divergence")
    assert found["origin_seq"] == 3
    local, remote = found["local"], found["remote"]
    assert local["op"]["body"] == "x-late 0" and remote["op"]["body"] == "re-minted 0"
    assert local["digest"] != remote["digest"]
    forks = conflicts(a, "fork")
    assert sorted(c["origin_seq"] for c in forks) == [4, 5]  # both versions of each
    again = pull(a, ChainPeer(x2))                          # a repeat bumps, never adds
    assert again.origins[x2.replica_id].diverged_at == 3
    assert len(conflicts(a, "divergence")) == 1 and len(conflicts(a, "fork")) == 2


def test_a_reminted_backup_at_equal_height_is_found_through_the_tips(tmp_path):
    a, _, x2 = backup_then_remint(tmp_path, total=5, kept=2, reminted=3)  # x2: 1-2, 3'-5'
    assert a.version_vector()[x2.replica_id] == x2.version_vector()[x2.replica_id] == 5
    before = comparable(a)
    report = pull(a, ChainPeer(x2))
    assert report.origins[x2.replica_id].diverged_at == 3
    assert comparable(a) == before
    assert [c["origin_seq"] for c in conflicts(a, "divergence")] == [3]


def test_the_peer_that_restored_finds_the_divergence_too(tmp_path):
    """Found from both sides: the restored palace pulling from a replica that kept the
    old history records it as well (its own origin: a recorded conflict, no overwrite)."""
    a, _, x2 = backup_then_remint(tmp_path, total=5, kept=2, reminted=3)
    before = comparable(x2)
    pull(x2, ChainPeer(a))
    assert comparable(x2) == before
    assert conflicts(x2, "divergence") or conflicts(x2, "fork")


def test_a_reminted_tip_is_seen_against_a_peer_without_extensions(tmp_path):
    """A MemPalace hub has no chain: the first page overlaps ours by one op, and the op
    at our top compared byte for byte shows the fork."""
    a, _, x2 = backup_then_remint(tmp_path, total=5, kept=2, reminted=4)
    before = comparable(a)
    hub = FakePeer(x2)                                     # upstream-shaped: no extensions
    report = pull(a, hub)
    first = hub.ops_requests()[0].params
    assert first["after"] == 4 and "ext" not in first      # our top 5, overlapped by one
    assert comparable(a) == before                         # 6' not spliced onto our 5
    assert [c["origin_seq"] for c in conflicts(a, "fork")] == [5]
    assert report.origins[x2.replica_id].conflicts == 1


def test_a_relayed_fork_is_found_one_hop_away(tmp_path):
    """B took the forked history from the restored X; A kept the old one. When A and B
    meet (neither is X), the tips show it."""
    a, _, x2 = backup_then_remint(tmp_path, total=5, kept=2, reminted=3)
    b = Store.open(tmp_path / "b")
    pull(b, ChainPeer(x2))
    assert b.version_vector()[x2.replica_id] == 5
    pull(a, ChainPeer(b))
    pull(b, ChainPeer(a))
    for store in (a, b):
        assert [c["origin_seq"] for c in conflicts(store, "divergence")] == [3]


def writing_clones(tmp_path: Path) -> tuple[Store, Store, Store]:
    """Two palaces copied from one backup of three ops, each writing two more, and a
    third replica that has pulled neither."""
    a = Store.open(tmp_path / "a")
    append(a, 3, "a")
    a.close()
    one = restored_copy(tmp_path / "a", tmp_path / "one")
    two = restored_copy(tmp_path / "a", tmp_path / "two")
    append(one, 2, "one")
    append(two, 2, "two")
    third = Store.open(tmp_path / "third")
    return one, two, third


def test_clones_at_equal_height_that_both_write_are_found(tmp_path):
    """Two palaces copied from one backup both write: each new op is a fork of the other."""
    one, two, third = writing_clones(tmp_path)
    pull(third, ChainPeer(one))
    report = pull(third, ChainPeer(two))
    assert report.origins[one.replica_id].diverged_at == 4
    assert {c["origin_seq"] for c in conflicts(third, "fork")} == {5}


def test_a_peer_serving_the_origin_as_its_own_with_another_history_is_named_a_clone(tmp_path):
    """The peer is the origin: its history and ours of it differ, so one identity runs in
    two palaces, and the remedy is named (the sentence listed three causes and none)."""
    one, two, third = writing_clones(tmp_path)
    pull(third, ChainPeer(one))
    drive(pull_round(third.replica_id, two.replica_id, batch_artifacts=False), ChainPeer(two),
          third)
    (found,) = conflicts(third, "divergence")
    assert "serves origin" in found["reason"] and "two palaces run under one identity" in \
        found["reason"] and "logsync reidentify --yes" in found["reason"], found["reason"]


def test_digests_answers_the_chain_at_each_seq_and_refuses_bad_input(tmp_path):
    store = Store.open(tmp_path / "s")
    append(store, 4, "s")
    origin = store.replica_id
    status, body = answer(store, "/sync/digests", {"origin": origin, "at": "0,2,4,9"},
                          profile=LOGSYNC_SERVER)
    assert status == 200
    seqs = [row[0] for row in body["digests"]]
    assert seqs == [0, 2, 4, 9]
    assert body["digests"][2][1] == store.chain_digest(origin, 4).hex()
    assert body["digests"][3][1] is None                   # above the tip: unknown
    for params, words in [
        ({"origin": "nope", "at": "1"}, "origin='nope' is not a replica id"),
        ({"origin": origin, "at": ""}, "must list 1 to 64 seqs"),
        ({"origin": origin, "at": ",".join(["1"] * 65)}, "must list 1 to 64 seqs"),
        ({"origin": origin, "at": "x"}, "is not an integer"),
        ({"origin": origin, "at": "-1"}, "must hold seqs in 0.."),
    ]:
        status, body = answer(store, "/sync/digests", params, profile=LOGSYNC_SERVER)
        assert status == 400 and body["error"] == "bad_request", (params, body)
        assert words in body["reason"], (params, body)
    status, _ = answer(store, "/sync/digests", {"origin": origin, "at": "1"},
                       profile=UPSTREAM_HUB)
    assert status == 404                                   # a hub has no such route


def test_tips_are_advertised_only_by_a_chain_profile(tmp_path):
    store = Store.open(tmp_path / "s")
    append(store, 3, "s")
    _, body = answer(store, "/sync/version_vector", {}, profile=LOGSYNC_SERVER)
    tip = body["logsync"]["tips"][store.replica_id]
    assert tip == [3, store.chain_digest(store.replica_id, 3).hex()]
    _, hub = answer(store, "/sync/version_vector", {}, profile=UPSTREAM_HUB)
    assert "logsync" not in hub


def test_probes_are_evenly_spaced_inside_the_interval():
    assert probes(0, 2) == [1]
    assert probes(0, 1) == []
    points = probes(10, 1000)
    assert len(points) == 32 and points == sorted(points)
    assert 10 < points[0] and points[-1] < 1000


@st.composite
def histories(draw: Any) -> tuple[int, int, int, int]:
    common = draw(st.integers(0, 120))
    fork = common + 1
    return common, fork, draw(st.integers(0, 60)), draw(st.integers(0, 60))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=histories())
def test_divergence_anywhere_is_found_within_log2_digest_requests(tmp_path_factory, shape):
    """Random common prefix, random heights past the fork on each side: the first
    divergent seq is found, with at most ~log2(length) + 2 digest requests."""
    common, fork, extra_a, extra_b = shape
    root = tmp_path_factory.mktemp("div")
    origin = mint_replica_id()
    one = Store.open(root / "o1", replica_id=origin)
    append(one, common, "common")
    one.close()
    two = restored_copy(root / "o1", root / "o2", origin)
    one = Store.open(root / "o1", replica_id=origin)
    append(one, 1 + extra_a, "one")                       # both hold the fork seq
    append(two, 1 + extra_b, "two")
    a, b = Store.open(root / "a"), Store.open(root / "b")
    a.apply_remote(origin_ops(one))
    b.apply_remote(origin_ops(two))
    before = comparable(a)
    peer = ChainPeer(b)
    report = pull(a, peer)
    length = max(common + 1 + extra_a, common + 1 + extra_b)
    assert report.origins[origin].diverged_at == fork
    assert peer.digest_requests() <= math.log2(length) + 2
    assert comparable(a) == before
    assert [c["origin_seq"] for c in conflicts(a, "divergence")] == [fork]
    for store in (one, two, a, b):
        store.close()
