"""Replication interop with real MemPalace 3.11 hubs (issue 3, interop tests 1-3).

Every node is a real process on loopback: hubs are `mempalace serve`, logsync
nodes are `python -m logsync serve`, one-shot pulls are `logsync sync` and
`mempalace logstream sync`. "Identical" means every event field but `seq`
(each replica's own arrival order), in upstream key order, and every
artifact field including the exact content.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from logsync.store import Store

from .hub import (
    HarnessError,
    ServerProcess,
    Snapshot,
    assert_same_replica_content,
    bulk_specs,
    hub_snapshot,
    logsync_snapshot,
    sample_artifacts,
    sample_events,
    wait_until,
    write_peers_json,
)

if TYPE_CHECKING:
    from .conftest import Lab

pytestmark = pytest.mark.interop

CONVERGE_TIMEOUT_S = 60.0
STATS_KEYS = {"peer_url", "peer_replica", "pulled_events", "pulled_artifacts", "per_origin"}


# ── writers and readers ──────────────────────────────────────────────────


def write_hub_palace(lab: Lab, palace: Path, tag: str, bulk: int = 0) -> None:
    """Upstream-authored content: every field, every artifact kind, acks, bulk."""
    art_ids = [lab.mp.put_artifact(palace, **spec)["id"] for spec in sample_artifacts(tag)]
    events = [lab.mp.append(palace, **spec) for spec in sample_events(tag, art_ids)]
    lab.mp.ack(palace, events[0]["id"], f"coder-{tag}", status="claimed", body="ack ✓")
    if bulk:
        lab.mp.bulk_append(palace, bulk_specs(tag, bulk))


def write_logsync_palace(palace: Path, tag: str, bulk: int = 0) -> None:
    """logsync-authored content through the Store: every field, artifacts, acks, a patch."""
    with Store.open(palace) as store:
        art_ids = [store.put_artifact(**spec)["id"] for spec in sample_artifacts(tag)]
        events = [store.append_event(**spec) for spec in sample_events(tag, art_ids)]
        store.ack_event(events[0]["id"], f"coder-{tag}", status="claimed", body="ack ✓")
        store.submit_patch("--- a\n+++ b\n", f"coder-{tag}", f"stream-{tag}", body="p")
        for spec in bulk_specs(tag, bulk):
            store.append_event(**spec)


def relay_origin(source: Path, target: Path) -> int:
    """Copy every op of `source`'s origin into `target` with apply_remote (a relayed origin)."""
    with Store.open(source) as src, Store.open(target) as dst:
        events = list(src.iter_events())
        artifacts = list(src.iter_artifacts())
        result = dst.apply_remote(events, artifacts)
    assert (result.applied, result.conflicts, result.quarantined) == (len(events), 0, 0)
    return len(events)


def snapshot(lab: Lab, node: ServerProcess) -> Snapshot:
    if node.kind == "hub":
        return hub_snapshot(lab.mp, node.palace, f"hub {node.name}")
    return logsync_snapshot(node.palace, f"logsync {node.name}")


def assert_clean_logsync(palace: Path) -> None:
    """No divergence and nothing quarantined: every op was accepted verbatim."""
    with Store.open(palace) as store:
        counts = store.counts()
        detail = (store.list_conflicts(3), store.list_quarantine(3))
    assert (counts["conflicts"], counts["quarantined"]) == (0, 0), detail


def check_stats(stats: list[dict], peer: ServerProcess, events: int, artifacts: int) -> None:
    """One per-peer entry in the upstream shape with the expected counts."""
    assert len(stats) == 1, stats
    entry = stats[0]
    assert STATS_KEYS <= set(entry), f"stats lack {STATS_KEYS - set(entry)}: {entry}"
    assert not entry.get("error"), entry
    assert entry["peer_replica"] == peer.replica_id()
    got = (entry["pulled_events"], entry["pulled_artifacts"])
    assert got == (events, artifacts), f"pulled {got}, expected {(events, artifacts)}"


def vectors_converged(nodes: list[ServerProcess], origins: int, events: int) -> Callable[[], bool]:
    """All nodes answer the same vector over `origins` origins, and hold `events` events."""

    def check() -> bool:
        try:
            vectors = [node.version_vector() for node in nodes]
        except HarnessError:
            return False
        if any(v != vectors[0] for v in vectors) or len(vectors[0]) != origins:
            return False
        return all(len(snapshot_ids(node)) == events for node in nodes)

    return check


def snapshot_ids(node: ServerProcess) -> set[str]:
    """Event ids a node serves (paged /sync/ops over its vector): cheap, no subprocess."""
    ids: set[str] = set()
    for origin, top in node.version_vector().items():
        after = 0
        for _ in range(1000):
            page = node.get_json("/sync/ops", {"origin": origin, "after": after, "limit": 500})
            if not page["events"]:
                break
            ids.update(e["id"] for e in page["events"])
            after = page["events"][-1]["origin_seq"]
            if after >= top:
                break
    return ids


def describe_vectors(nodes: list[ServerProcess]) -> Callable[[], str]:
    def state() -> str:
        parts = []
        for node in nodes:
            try:
                vector = {k[-6:]: v for k, v in sorted(node.version_vector().items())}
            except HarnessError as exc:
                vector = {"error": str(exc)[:80]}
            parts.append(f"{node.name}={vector}")
        return "; ".join(parts)

    return state


# ── 1: logsync pulls a hub ───────────────────────────────────────────────


def test_logsync_pulls_a_hub_verbatim_and_a_second_sync_pulls_nothing(lab: Lab) -> None:
    """Two origins (one relayed by the hub, one its own with origin_seq gaps), >500 ops."""
    relay_source = lab.hub("source")
    write_hub_palace(lab, relay_source.palace, "src")
    hub_palace = lab.palace("hub")
    write_hub_palace(lab, hub_palace, "hub", bulk=1100)
    pulled = lab.mp.sync(hub_palace, relay_source.url, relay_source.token)
    assert pulled[0]["pulled_events"] == 6 and not pulled[0].get("error"), pulled
    lab.mp.append(hub_palace, type="after.pull", stream="s", room="r", from_agent="hub")
    hub = lab.hub("hub", palace=hub_palace)
    expected = snapshot(lab, hub)
    assert len(expected.events) == 6 + 1100 + 6 + 1 and len(expected.artifacts) == 12

    palace = lab.palace("logsync")
    stats = lab.ls.sync(palace, hub.url, hub.token)
    check_stats(stats, hub, len(expected.events), len(expected.artifacts))
    # sync pulls, then would push: a hub takes no pushes, which the stats say (it must pull)
    assert stats[0]["push"]["supported"] is False and stats[0]["push"]["pushed_events"] == 0
    assert_same_replica_content(expected, logsync_snapshot(palace, "logsync replica"))
    with Store.open(palace) as store:
        assert store.version_vector() == hub.version_vector()
    assert_clean_logsync(palace)

    again = lab.ls.sync(palace, hub.url, hub.token)
    check_stats(again, hub, 0, 0)
    assert_same_replica_content(expected, logsync_snapshot(palace, "logsync after 2nd sync"))


# ── 2: a hub pulls from logsync ──────────────────────────────────────────


def test_hub_pulls_from_a_logsync_daemon_with_its_own_sync(lab: Lab) -> None:
    """`mempalace logstream sync --peer <daemon>`: both origins, >500 ops, byte-exact."""
    other = lab.palace("other-logsync")
    write_logsync_palace(other, "o")
    daemon_palace = lab.palace("daemon")
    write_logsync_palace(daemon_palace, "d", bulk=1100)
    relayed = relay_origin(other, daemon_palace)
    daemon = lab.daemon("daemon", palace=daemon_palace)
    expected = snapshot(lab, daemon)
    assert len(expected.events) == 7 + 1100 + 7 and relayed == 7
    assert len(expected.artifacts) == 14

    hub_palace = lab.palace("hub")
    stats = lab.mp.sync(hub_palace, daemon.url, daemon.token)
    check_stats(stats, daemon, len(expected.events), len(expected.artifacts))
    assert_same_replica_content(expected, hub_snapshot(lab.mp, hub_palace, "hub replica"))

    again = lab.mp.sync(hub_palace, daemon.url, daemon.token)
    check_stats(again, daemon, 0, 0)


def test_hub_with_the_daemon_in_peers_json_converges_on_its_own(lab: Lab) -> None:
    """The hub's own background loop (MEMPALACE_SYNC_INTERVAL=1) keeps up with a daemon."""
    daemon = lab.daemon("daemon")
    write_logsync_palace(daemon.palace, "d1")
    hub_palace = lab.palace("hub")
    write_peers_json(hub_palace, [daemon])
    hub = lab.hub("hub", palace=hub_palace, sync_interval=1)

    nodes = [daemon, hub]
    first = wait_until(
        vectors_converged(nodes, origins=1, events=7),
        timeout=CONVERGE_TIMEOUT_S,
        what="the hub to pull the daemon's first batch",
        state=describe_vectors(nodes),
    )
    write_logsync_palace(daemon.palace, "d2", bulk=600)
    second = wait_until(
        vectors_converged(nodes, origins=1, events=7 + 7 + 600),
        timeout=CONVERGE_TIMEOUT_S,
        what="the hub to pull the daemon's second batch",
        state=describe_vectors(nodes),
    )
    lab.figure(f"hub pulling a daemon via peers.json: {first:.1f} s, then {second:.1f} s")
    assert_same_replica_content(snapshot(lab, daemon), snapshot(lab, hub))
    peers = hub.get_json("/sync/peers")["peers"]
    entry = next(p for p in peers if p["url"] == daemon.url)
    assert entry["replica_id"] == daemon.replica_id() and entry["last_error"] is None, entry


# ── 3: a mesh of two hubs and two daemons ────────────────────────────────


def write_concurrently(lab: Lab, nodes: list[ServerProcess], per_node: int) -> None:
    """One writer thread per node, interleaved with replication; artifacts every other op."""
    errors: list[str] = []

    def hub_writer(node: ServerProcess, rng: random.Random) -> None:
        for i in range(per_node):
            refs = []
            if i % 2 == 0:
                art = lab.mp.put_artifact(node.palace, "note", f"{node.name} #{i} ✓\n", node.name)
                refs = [art["id"]]
            lab.mp.append(node.palace, type="mesh.write", stream="mesh", room=node.name,
                          from_agent=node.name, body=f"{node.name} {i} — ü",
                          metadata={"i": i}, artifact_ids=refs)  # fmt: skip
            threading.Event().wait(rng.uniform(0.0, 0.2))

    def logsync_writer(node: ServerProcess, rng: random.Random) -> None:
        with Store.open(node.palace) as store:
            for i in range(per_node):
                refs = []
                if i % 2 == 0:
                    refs = [store.put_artifact("patch", f"+{node.name} {i}\n", node.name)["id"]]
                store.append_event("mesh.write", "mesh", node.name, node.name,
                                   body=f"{node.name} {i} — ü", metadata={"i": i},
                                   artifact_ids=refs)  # fmt: skip
                threading.Event().wait(rng.uniform(0.0, 0.2))

    def run(node: ServerProcess, seed: int) -> None:
        writer = hub_writer if node.kind == "hub" else logsync_writer
        try:
            writer(node, random.Random(seed))
        except Exception as exc:  # surfaced below, with the node's name
            errors.append(f"{node.name}: {exc!r}")

    threads = [threading.Thread(target=run, args=(n, i)) for i, n in enumerate(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a writer thread did not finish in 120 s"
    assert not errors, errors


def test_mesh_of_two_hubs_and_two_daemons_converges(lab: Lab) -> None:
    hubs = [lab.hub(f"hub{i}", sync_interval=1, start=False) for i in (1, 2)]
    daemons = [lab.daemon(f"ls{i}", start=False) for i in (1, 2)]
    nodes = [*hubs, *daemons]
    for hub in hubs:
        write_peers_json(hub.palace, [n for n in nodes if n is not hub])
    for daemon in daemons:
        for peer in nodes:
            if peer is not daemon:
                lab.ls.peers_add(daemon.palace, peer.name, peer.url, peer.token)
    for node in nodes:
        node.start()

    per_node = 8
    write_concurrently(lab, nodes, per_node)
    took = wait_until(
        vectors_converged(nodes, origins=4, events=4 * per_node),
        timeout=CONVERGE_TIMEOUT_S,
        what="all four nodes to hold the same vector and every event",
        state=describe_vectors(nodes),
        interval=0.5,
    )
    lab.figure(f"2 hubs + 2 daemons converged {took:.1f} s after the last write")
    reference = snapshot(lab, daemons[0])
    assert len(reference.events) == 4 * per_node
    assert len(reference.artifacts) == 4 * (per_node // 2)
    for node in nodes[:3]:
        assert_same_replica_content(reference, snapshot(lab, node))
    for daemon in daemons:
        assert_clean_logsync(daemon.palace)


def test_logsync_sync_from_a_hub_into_an_empty_store_pulls_as_before(lab: Lab) -> None:
    """A hub advertises no `snapshot`: an empty store's `logsync sync` pulls it op by op."""
    hub_palace = lab.palace("hub")
    write_hub_palace(lab, hub_palace, "h", bulk=20)
    hub = lab.hub("hub", palace=hub_palace)
    expected = snapshot(lab, hub)
    palace = lab.palace("empty")
    stats = lab.ls.sync(palace, hub.url, hub.token)
    check_stats(stats, hub, len(expected.events), len(expected.artifacts))
    assert "snapshot" not in stats[0]
    assert_same_replica_content(expected, logsync_snapshot(palace, "logsync replica"))
    assert not [p for p in palace.iterdir() if p.name.startswith(".logsync-snapshot")]
