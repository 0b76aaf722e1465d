"""Review of issue 10 (chains, tips, digests, keys, signatures): one test per defect found,
each an expected failure until it is fixed (strict: a fix turns it into a failure to
remove the mark)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from logsync.errors import PeerTooLargeError
from logsync.replica import mint_replica_id
from logsync.store import Store
from logsync.store.schema import INSERT_EVENT
from tests.test_engine import FakePeer
from tests.test_signatures import Relay, append, pull


def raw_insert(store: Store, op: dict) -> None:
    """Write an op into the store's file as another program would (MemPalace's own
    writer or its sync): the events row only, no logsync_chain entry, no signature."""
    row = (op["id"], op["type"], op["stream"], op["room"], op.get("topic"), op["from_agent"],
           op.get("to_agent"), op.get("correlation_id"), op.get("branch"),
           op.get("base_commit"), op.get("status"), op.get("body") or "", op["created_at"],
           json.dumps(op.get("metadata") or {}), op["origin_replica"], op["origin_seq"],
           op["hlc"])
    conn = sqlite3.connect(store.db_path, timeout=5)
    try:
        with conn:
            conn.execute(INSERT_EVENT, row)
    finally:
        conn.close()


def divergences(store: Store) -> list[dict]:
    return [c for c in store.list_conflicts(1000) if c["kind"] == "divergence"]


def with_keys(extra: dict[str, str], vector: dict[str, int] | None = None) -> Any:
    """A tamper that adds origin keys (and vector entries) to the vector answer."""
    def tamper(request: Any, body: Any) -> Any:
        if request.path == "/sync/version_vector":
            body["logsync"].setdefault("keys", {}).update(extra)
            body["version_vector"].update(vector or {})
        return body
    return tamper


def restore(tmp_path: Path, name: str) -> Store:
    shutil.rmtree(tmp_path / name)
    shutil.copytree(tmp_path / "backup", tmp_path / name)
    return Store.open(tmp_path / name)


# ── 1. own-origin recovery stops at the first page after a re-used slot ──────────────


def test_own_recovery_goes_past_the_first_page_after_a_reused_slot(tmp_path):
    b = Store.open(tmp_path / "b")
    append(b, 2)
    b.close()
    shutil.copytree(tmp_path / "b", tmp_path / "backup")
    b = Store.open(tmp_path / "b")
    append(b, 8, "lost")                                    # b: 1..10
    a = Store.open(tmp_path / "a")
    pull(a, Relay(b), page_limit=3)                         # a signed page end every 3 ops
    b.close()
    b = restore(tmp_path, "b")                              # back to 1..2
    append(b, 1, "re-minted")                               # 3' re-uses a slot
    for _ in range(3):                                      # pages of 3 ops (or > 5000)
        pull(b, Relay(a), page_limit=3)
    assert b.version_vector()[b.replica_id] == 10           # 4..10 recovered
    assert b.append_event("task.note", "s", "r", "lead")["origin_seq"] == 11


# ── 2. own ops a logsync relay cannot prove: no record, slots re-used ────────────────


def test_own_ops_seen_unproven_on_a_logsync_relay_are_not_reused(tmp_path):
    p = Store.open(tmp_path / "p")
    append(p, 2)
    p.close()
    shutil.copytree(tmp_path / "p", tmp_path / "backup")
    p = Store.open(tmp_path / "p")
    append(p, 3, "lost")                                    # p: 1..5
    hub = Store.open(tmp_path / "hub")
    pull(hub, Relay(p))
    relay = Store.open(tmp_path / "relay")
    pull(relay, FakePeer(hub))                              # via a hub: no signatures
    assert relay.version_vector()[p.replica_id] == 5
    p.close()
    p = restore(tmp_path, "p")                              # back to 1..2
    pull(p, Relay(relay))                                   # sees 3..5, cannot prove them
    assert p.append_event("task.note", "s", "r", "lead")["origin_seq"] == 6


# ── 3. a chain left behind by another writer: a false divergence ─────────────────────


def test_ops_written_by_another_program_are_not_a_divergence(tmp_path):
    x, a, b = (Store.open(tmp_path / n) for n in ("x", "a", "b"))
    append(x, 3)
    pull(a, Relay(x))
    append(x, 1, "late")
    pull(b, Relay(x))                                       # b: x 1..4 via logsync
    fourth = x.list_ops(x.replica_id, 3, 1)[0]
    raw_insert(a, fourth)                                   # a: x 4 by MemPalace's sync
    assert a.version_vector()[x.replica_id] == 4
    pull(a, Relay(b))                                       # same history on both
    assert divergences(a) == []


# ── 4. own ops written by another program are not served until a restart ────────────


def test_own_ops_written_by_another_program_reach_logsync_peers(tmp_path):
    s, a = Store.open(tmp_path / "s"), Store.open(tmp_path / "a")
    append(s, 3)
    op = s.list_ops(s.replica_id, 2, 1)[0]
    op = dict(op, id="evt_by_mempalace_1", origin_seq=4, body="by mempalace",
              hlc=str(int(op["hlc"][:13]) + 1) + op["hlc"][13:])
    raw_insert(s, op)
    assert s.version_vector()[s.replica_id] == 4
    pull(a, Relay(s))
    pull(a, Relay(s))
    assert a.version_vector()[s.replica_id] == 4


# ── 5. a non-iterable artifact_ids under a signed origin escapes the round ───────────


def test_a_non_list_artifact_ids_under_a_signed_origin_stays_with_its_origin(trio_plus):
    a, r, c = trio_plus

    def tamper(request: Any, body: Any) -> Any:
        if request.path == "/sync/ops" and request.params.get("origin") == a.replica_id \
                and body.get("events"):
            body["events"][0]["artifact_ids"] = 5
        return body
    pull(c, Relay(r, tamper))                               # must not raise
    assert c.version_vector().get(r.replica_id) == 2        # the other origin went on
    assert c.version_vector().get(a.replica_id, 0) == 0


@pytest.fixture
def trio_plus(tmp_path: Path) -> tuple[Store, Store, Store]:
    a, r, c = (Store.open(tmp_path / n) for n in ("a", "r", "c"))
    append(a, 5)
    pull(r, Relay(a))
    append(r, 2, "relay's own")
    return a, r, c


# ── 6. a relay's key for a self-certifying id wins over the certifying key ───────────


def test_a_certifying_key_is_not_preempted_by_a_relay(tmp_path):
    n, m, a = (Store.open(tmp_path / x) for x in ("n", "m", "a"))
    append(n, 3)
    pull(m, Relay(n))
    junk = os.urandom(32).hex()
    pull(a, Relay(m, with_keys({n.replica_id: junk})))    # first sight: the relay's key
    pull(a, Relay(n))                                       # the id certifies this key
    assert a.public_keys()[n.replica_id] == n.public_key
    assert a.version_vector().get(n.replica_id) == 3


# ── 7. any peer may publish a key for an origin that never had one ───────────────────


def test_a_third_party_key_does_not_cut_off_an_unsigned_origin(tmp_path):
    h = Store.open(tmp_path / "h", replica_id=mint_replica_id())   # upstream-style id
    append(h, 3)
    b, m, a = (Store.open(tmp_path / x) for x in ("b", "m", "a"))
    pull(b, FakePeer(h))                                    # via a hub: h stays unsigned
    pull(m, FakePeer(h))
    pull(a, Relay(m, with_keys({h.replica_id: os.urandom(32).hex()})))
    pull(a, Relay(b))                                       # an honest logsync relay
    assert a.version_vector().get(h.replica_id) == 3


# ── 8. keys for origins nobody holds: pinned and re-advertised, without bound ────────


def test_keys_of_origins_without_ops_are_not_pinned(tmp_path):
    b, a = Store.open(tmp_path / "b"), Store.open(tmp_path / "a")
    append(b, 1)
    junk = {mint_replica_id(): os.urandom(32).hex() for _ in range(200)}
    zero = dict.fromkeys(list(junk)[:100], 0)               # half claimed with no ops
    pull(a, Relay(b, with_keys(junk, zero)))
    assert set(a.public_keys()) <= {a.replica_id, b.replica_id}


# ── 9. a signed origin cannot move in pages of fewer than 64 ops from a relay ────────


class TightRelay(Relay):
    """A relay whose pages of more than 40 ops pass the puller's byte bound (large ops)."""

    def __call__(self, request: Any) -> Any:
        if request.path == "/sync/ops" and int(request.params.get("limit", 500)) > 40:
            raise PeerTooLargeError("peer relay: the answer is past the byte bound",
                                    peer="relay")
        return super().__call__(request)


@pytest.mark.xfail(strict=True, reason=(
    "known limit, RFC 004 Appendix B item 2: a relay holds signatures only at checkpoints (every "
    "64th op) and at the ends of the pages it pulled, so a puller whose pages must stay "
    "under 64 ops (here: its byte bound) finds no page of a signed origin that ends at a "
    "signed op from that relay; the origin stops there (unsigned_page) and moves only "
    "through the author or a hub. Closing it needs every signature on the wire"
))
def test_a_signed_origin_moves_in_pages_smaller_than_a_checkpoint(tmp_path):
    a, r, p = (Store.open(tmp_path / n) for n in ("a", "r", "p"))
    append(a, 100)
    pull(r, Relay(a))                                       # r: signatures at 64 and 100
    for _ in range(5):
        pull(p, TightRelay(r))
    assert p.version_vector().get(a.replica_id) == 100


# ── 10. a relay smuggles the genuine metadata in `metadata_json` and alters `metadata` ─


def test_a_relay_cannot_alter_metadata_behind_a_metadata_json_key(tmp_path):
    a, r, c = (Store.open(tmp_path / n) for n in ("a", "r", "c"))
    a.append_event("task.ask", "s", "r", "alice", body="pay", metadata={"amount": 10})
    pull(r, Relay(a))

    def smuggle(request: Any, body: Any) -> Any:
        if request.path == "/sync/ops" and body.get("events"):
            op = body["events"][0]
            op["metadata_json"] = json.dumps(op["metadata"])
            op["metadata"] = {"amount": 10_000}
        return body
    pull(c, Relay(r, smuggle))
    held = c.list_ops(a.replica_id, 0, 10)
    assert [op["metadata"] for op in held] in ([], [{"amount": 10}])
