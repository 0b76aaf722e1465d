"""Invariant 5 where histories part (`logsync/sim/forks.py`): in the scenarios that fork an
origin for good (a fork relayed through a third replica, clones at equal height), every
replica that met another history records it, and the check fails when the engine keeps
a divergence to itself (planted defects). One seed each, quickly; more seeds are slow
tests in test_sim_library.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from logsync import engine
from logsync.sim import load_scenario
from logsync.sim.checks import Snapshot
from logsync.sim.report import SimReport
from logsync.sim.runner import Simulation
from logsync.store import chainreads

LIBRARY = Path(__file__).resolve().parents[1] / "simulations"
STRONG = "recorded no divergence or fork of it"


def simulate(name: str, tmp_path: Path, seed: int = 1) -> tuple[SimReport, Simulation]:
    sim = Simulation(load_scenario(LIBRARY / f"{name}.toml").with_seed(seed), tmp_path)
    sim.take_backups()
    return sim.run(), sim


def snaps_of(sim: Simulation) -> dict[str, Snapshot]:
    assert sim.final is not None
    return {snap.node: snap for snap in sim.final.snaps}


def history(snap: Snapshot, origin: str) -> list[str]:
    return [snap.by_key[(origin, s)]["id"] for s in range(1, snap.vector.get(origin, 0) + 1)]


def conflicts_of(snap: Snapshot, origin: str) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for row in snap.conflicts:
        if row.get("origin_replica") == origin:
            kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
    return kinds


def test_a_fork_relayed_through_a_third_replica_is_recorded_where_it_is_met(
        tmp_path: Path) -> None:
    """x, restored from an old copy, re-mints its lost slots; b takes that history from
    x; a, which never talks to x, keeps the old one and meets the new only through b."""
    report, sim = simulate("relayed-fork", tmp_path)
    assert report.ok and report.convergence_s is not None, report.text()
    snaps, origin = snaps_of(sim), sim.nodes["x"].replica_id
    old, new = history(snaps["a"], origin), history(snaps["x"], origin)
    assert history(snaps["c"], origin) == old and history(snaps["b"], origin) == new
    parted = next(i for i, (o, n) in enumerate(zip(old, new, strict=False)) if o != n) + 1
    assert 1 < parted <= min(len(old), len(new)), "two histories of x, sharing a prefix"
    assert "x" not in sim.nodes["a"].pulls_from and origin in sim.nodes["a"].compared["b"]
    for name, snap in snaps.items():
        kinds = conflicts_of(snap, origin)
        assert origin in snap.recorded and kinds.get("fork", 0) > 0, (name, kinds)
    # a and b each found it by the chain: a divergence at the first seq where they part
    for name in ("a", "b"):
        found = [r["origin_seq"] for r in snaps[name].conflicts
                 if r["kind"] == "divergence" and r.get("origin_replica") == origin]
        assert parted in found, (name, found, parted)
    assert report.lost > 0, "neither side took the other's history"


def test_clones_at_equal_height_record_the_fork_on_every_replica_that_met_it(
        tmp_path: Path) -> None:
    report, sim = simulate("clones", tmp_path)
    assert report.ok and report.convergence_s is not None, report.text()
    snaps, origin = snaps_of(sim), sim.nodes["n0"].replica_id
    assert sim.nodes["n3"].replica_id == origin, "the clone writes as n0's replica"
    histories = {name: tuple(history(snap, origin)) for name, snap in snaps.items()}
    assert len(set(histories.values())) > 1, histories
    for name, snap in snaps.items():
        node = sim.nodes[name]
        met = [peer for peer in node.pulls_from if histories[peer] != histories[name]
               and origin in node.compared.get(peer, {})]
        if met:
            assert origin in snap.recorded, (name, met)
            assert conflicts_of(snap, origin).get("fork", 0) > 0, name
    assert report.conflict_kinds.get("divergence", 0) > 0


def test_a_store_that_records_no_divergence_fails_invariant_5(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted defect: the divergence is found but nothing is written to the ledger."""
    monkeypatch.setattr(chainreads, "record_divergence", lambda conn, **found: 0)
    report, _ = simulate("relayed-fork", tmp_path)
    assert not report.ok
    strong = [v for v in report.violations if v.invariant == 5 and STRONG in v.text]
    assert strong, report.text()


def test_a_round_that_skips_the_tip_comparison_fails_invariant_5(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted defect: the engine never compares the tips of origins the peer is not ahead
    on. The replica behind still finds the fork when it pulls (so some replica records
    every slot, and the weaker check of old passes), but b, ahead on x's origin, meets a's
    history at every full round and never records it: only 'met means recorded' sees it."""
    def no_comparison(*args: Any, **kwargs: Any) -> Any:
        yield from ()

    monkeypatch.setattr(engine, "_compare_tips", no_comparison)
    report, _ = simulate("relayed-fork", tmp_path)
    assert not report.ok
    fives = [v.text for v in report.violations if v.invariant == 5]
    assert fives and all(STRONG in text for text in fives), report.text()
    assert any(text.startswith("b holds origin") for text in fives), fives
