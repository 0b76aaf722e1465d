"""Ops of a signed origin that reached a replica through a MemPalace hub (which cannot
carry signatures) must not stop that origin for every peer that verifies: the relay
adopts the origin's tip signature from any peer that advertises it (`tip_sigs`), and
serves the origin on. Found by the chaos run seed 41 ring/hub: n2 never converged."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from logsync.client import sync_once
from logsync.responder import LOGSYNC_SERVER
from logsync.store import Store
from tests.test_client import URL, StorePeer


def pull(target: Store, source: Store):
    return sync_once(target, URL, "secret",
                     transport=httpx.MockTransport(StorePeer(source, profile=LOGSYNC_SERVER)))


@pytest.fixture
def trio(tmp_path: Path):
    with Store.open(tmp_path / "origin") as origin, Store.open(tmp_path / "relay") as relay, \
            Store.open(tmp_path / "puller") as puller:
        yield origin, relay, puller


def test_a_relay_that_got_a_signed_origin_through_a_hub_adopts_its_tip_signature(trio) -> None:
    origin, relay, puller = trio
    for i in range(3):
        origin.append_event("note", "s", "r", "a", body=f"first {i}")
    pull(puller, origin)  # the puller pins the origin's key and holds 1-3 signed
    for i in range(5):
        origin.append_event("note", "s", "r", "a", body=f"later {i}")
    relay.apply_remote(origin.list_ops(origin.replica_id, 0, 100))  # as a hub hands them on
    assert relay.chain_signatures(origin.replica_id, [8]) == {}
    refused = pull(puller, relay)
    assert puller.version_vector()[origin.replica_id] == 3
    assert "unsigned_page" in refused.origins[origin.replica_id].stop_reason
    # the relay meets the origin (or any peer holding its tip signature): same tip, signed
    met = pull(relay, origin)
    assert met.tip_signatures == 1 and met.applied == 0
    assert set(relay.chain_signatures(origin.replica_id, [8])) == {8}
    healed = pull(puller, relay)
    assert healed.applied == 5 and puller.version_vector()[origin.replica_id] == 8
    assert set(puller.chain_signatures(origin.replica_id, [8])) == {8}


def test_a_tip_signature_that_does_not_verify_or_match_is_not_adopted(trio) -> None:
    origin, relay, puller = trio
    for i in range(4):
        origin.append_event("note", "s", "r", "a", body=f"op {i}")
    relay.apply_remote(origin.list_ops(origin.replica_id, 0, 100))
    digest = relay.chain_digests_at(origin.replica_id, [4])[0]
    good = origin.chain_signatures(origin.replica_id, [4])[4]
    forged = bytes([good[0] ^ 1]) + good[1:]
    o = origin.replica_id
    # no key known yet: nothing is taken, however good the signature
    assert relay.adopt_tip_signatures([(o, 4, digest, good)]) == 0
    relay.pin_keys({o: origin.public_key}, o)
    assert relay.adopt_tip_signatures([(o, 4, digest, forged)]) == 0  # does not verify
    assert relay.adopt_tip_signatures([(o, 4, b"\x00" * 32, good)]) == 0  # not our digest
    assert relay.adopt_tip_signatures([(o, 3, digest, good)]) == 0  # not that seq's digest
    assert relay.chain_signatures(o, [3, 4]) == {}
    assert relay.adopt_tip_signatures([(o, 4, digest, good)]) == 1
    assert relay.adopt_tip_signatures([(o, 4, digest, good)]) == 0  # held already
