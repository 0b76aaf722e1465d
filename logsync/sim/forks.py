"""Invariant 5 where histories part (issue 10): a replica that met another history of an
origin must have recorded it, and a fleet that holds two histories has settled once no
replica is merely behind another.

Since the chain (engine rule 8), a puller that finds a peer holding another history of
an origin records a `divergence` (and a `fork` per differing op it holds) and never
builds on the other copy: that origin stops for it, for good. After a restore or a clone
the fleet therefore ends with several histories of one origin, each held by some
replicas, and version vectors that need not agree. What the simulator demands:

- *Settled* (the end of the liveness phase when a scenario can fork, `settled`): every
  node is up; on every origin no node is behind another on the same history (it would
  still catch up); and every node whose history of an origin differs from that of a
  logsync peer it pulls from has compared that origin with it since both held the slots
  where they differ (so the final checks can ask that it recorded them).
- *Met means recorded* (`check_met`, a final check): for every (origin, origin_seq) two
  nodes hold with different content, if node N completed a round that compared that
  origin's chain with node M's, and the round began after N held its version and M held
  its version (`SimNode.held_since`), N must have recorded a `divergence` or `fork` of
  that origin. Which origins a round compared is `compared_origins`, from its report.
- A slot some node lacks while another holds it is explained only if the node lacking
  it recorded a divergence or fork of that origin (`checks.check_fleet`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Collection, Iterable
from typing import Any

from logsync.report import RoundReport
from logsync.sim.node import SimNode
from logsync.wire import EXT_CHAIN

Report = Callable[[int, str], None]
KINDS = ("divergence", "fork")  # the conflict kinds that record another history
RECORDED_SQL = ("SELECT DISTINCT origin_replica FROM logsync_conflicts WHERE kind IN "
                f"({', '.join(repr(k) for k in KINDS)}) AND origin_replica IS NOT NULL")


def recorded_origins(store: Any) -> set[str]:
    """The origins this store recorded a divergence or fork of (the whole ledger, read
    on its own read-only connection: the store's listing stops at 500 rows)."""
    conn = sqlite3.connect(f"{store.db_path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return {str(row[0]) for row in conn.execute(RECORDED_SQL)}
    finally:
        conn.close()


def compared_origins(report: RoundReport, held_back: Collection[str], *, full: bool) -> set[str]:
    """The origins a successful round compared with the peer's chain (engine rule 8):
    an origin pulled with `prev` on its page (something applied or refused), one whose
    divergence was searched out, and, in a full round, every origin the peer advertised
    that it is not ahead on (its tip equalled ours, or there would be a progress entry),
    but those held back. Nothing against a peer that does not speak `chain`."""
    if EXT_CHAIN not in report.extensions:
        return set()
    out: set[str] = set()
    for origin, p in report.origins.items():
        touched = p.reached > p.start or p.applied + p.duplicates + p.conflicts + p.quarantined
        if not p.failed and (p.diverged_at is not None or touched):
            out.add(origin)
    if full:
        local = report.local_vector_before
        out.update(o for o, top in report.remote_vector.items()
                   if o not in report.origins and o not in held_back
                   and 0 < top <= local.get(o, 0))
    return out


def _histories(node: SimNode) -> dict[str, list[str]]:
    """Origin -> the ids of the ops the node holds at seqs 1, 2, ... (its history)."""
    out: dict[str, list[str]] = {}
    for (origin, seq), (op_id, _) in sorted(node.held_since.items()):
        ops = out.setdefault(origin, [])
        if seq == len(ops) + 1:
            ops.append(op_id)
    return out


def settled(nodes: Iterable[SimNode]) -> bool:
    """The liveness phase's end when histories may part: every node is up; on every origin
    no node is behind another on the same history (it would still catch up); and every node
    whose history of an origin differs from a logsync peer's (one it pulls from) began a
    round comparing that origin with the peer after both held every slot where they differ
    (so it met, and recorded, all of it). Read from the nodes' `held_since`, not the stores."""
    fleet = list(nodes)
    if not all(n.up for n in fleet):
        return False
    by_name = {n.name: n for n in fleet}
    histories = {n.name: _histories(n) for n in fleet}
    for origin in sorted({o for h in histories.values() for o in h}):
        held = {name: h.get(origin, []) for name, h in histories.items()}
        for low in held.values():
            for high in held.values():
                if len(low) < len(high) and high[:len(low)] == low:
                    return False  # behind on the same history: it will catch up
        for node in fleet:
            for name in node.pulls_from:
                if not by_name[name].logsync:
                    continue  # a hub without chains cannot show a deeper fork
                mine, theirs = held[node.name], held[name]
                apart = [seq for seq, (a, b) in enumerate(zip(mine, theirs, strict=False),
                                                          start=1) if a != b]
                if apart and not _met(node, by_name[name], origin, apart):
                    return False  # it will meet the other history at its next full round
    return True


def _met(node: SimNode, peer: SimNode, origin: str, seqs: list[int]) -> bool:
    """Whether a round of `node` compared `origin` with `peer` after both held these slots."""
    began = node.compared.get(peer.name, {}).get(origin)
    held = [n.held_since.get((origin, s)) for s in seqs for n in (node, peer)]
    return began is not None and all(held) and began >= max(h[1] for h in held if h)


def check_met(snaps: list[Any], nodes: dict[str, SimNode], keys: Iterable[tuple[str, int]],
              report: Report) -> int:
    """Met means recorded (the module docstring), over the final snapshots
    (`checks.Snapshot`) at the slots where they differ; returns how many (node, peer,
    origin) were found silent."""
    silent: set[tuple[str, str, str]] = set()
    for key in sorted(keys):
        holders = [s for s in snaps if key in s.by_key]
        for mine in holders:
            for theirs in holders:
                if mine is theirs or mine.by_key[key] == theirs.by_key[key]:
                    continue
                origin = key[0]
                if origin in mine.recorded or (mine.node, theirs.node, origin) in silent:
                    continue
                node = nodes[mine.node]
                if not _met(node, nodes[theirs.node], origin, [key[1]]):
                    continue
                silent.add((mine.node, theirs.node, origin))
                began = node.compared[theirs.node][origin]
                report(5, f"{mine.node} holds origin {origin[:12]} seq {key[1]} as "
                          f"{mine.by_key[key]['id']} and {theirs.node} as "
                          f"{theirs.by_key[key]['id']}; a round of {mine.node} from "
                          f"{theirs.node} that began at t={began / 1e6:.6f}s, after both "
                          f"were held, compared that origin, but {mine.node} recorded no "
                          "divergence or fork of it")
    return len(silent)
