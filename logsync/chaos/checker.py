"""The checker: judges the final state of every replica against the acknowledged history.

It reads each replica's SQLite file directly (logsync's store and the hub's file have the
same upstream tables), so it needs no network and no cooperation from the processes.
Rows are compared *canonically*: every column but the local ``seq``/rowid, each value
rendered by SQLite's ``quote()`` (type and bytes exact), events by id, the artifacts that
events reference, and the ``event_artifacts`` pairs. What it checks, per run:

1. every acknowledged append is on every replica, hub included, with the acknowledged
   ``(origin, origin_seq)`` (else *lost*, or *divergent* when the key differs), and so is
   the artifact it acknowledged (a patch, or the hub's artifact named by the append);
   no append the CLI reported *failed* is on any replica (a failed op did not happen);
   no ``event_artifacts`` row names an artifact the replica does not hold (a link whose
   artifact is missing everywhere would otherwise compare equal everywhere);
2. per replica, each origin's seqs are a prefix of what its author holds, and a logsync
   author's own seqs are gap-free from 1 (a hub's may have gaps: RFC 004 §6.2);
3. no duplicated ids, ``(origin, origin_seq)`` keys, or workload ops (one op tag, two events);
4. canonical rows and vectors identical across replicas, byte for byte (else *divergent*);
5. no conflict or quarantine rows unless the faults were expected to make some, and then
   some are there;
6. ``PRAGMA integrity_check`` is ``ok`` everywhere;
7. the time from the heal to convergence (``wait_converged``).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

EVENT_COLUMNS = ("id", "type", "stream", "room", "topic", "from_agent", "to_agent",
                 "correlation_id", "branch", "base_commit", "status", "body", "created_at",
                 "metadata_json", "origin_replica", "origin_seq", "hlc")
ARTIFACT_COLUMNS = ("id", "kind", "sha256", "size_bytes", "content", "created_by",
                    "created_at", "metadata_json", "origin_replica")
OP_TAG = "chaos_op"  # the metadata key naming the workload op that wrote an event
SHOWN = 20  # how many items of each kind a verdict lists


@dataclass
class Replica:
    """One replica's canonical state."""

    name: str
    kind: str
    replica_id: str
    events: dict[str, str] = field(default_factory=dict)  # id -> canonical row
    keys: dict[str, tuple[str, int]] = field(default_factory=dict)  # id -> (origin, seq)
    seqs: dict[str, list[int]] = field(default_factory=dict)  # origin -> seqs ascending
    artifacts: dict[str, str] = field(default_factory=dict)  # referenced id -> row
    links: list[str] = field(default_factory=list)
    dangling: list[str] = field(default_factory=list)  # "event|artifact" links, no artifact
    unreferenced: int = 0
    duplicate_keys: list[str] = field(default_factory=list)
    op_tags: Counter[str] = field(default_factory=Counter)
    conflicts: list[str] = field(default_factory=list)
    quarantine: list[str] = field(default_factory=list)
    integrity: str = ""
    error: str = ""

    def digest(self) -> str:
        h = hashlib.sha256()
        for part in (self.events, self.artifacts):
            for key in sorted(part):
                h.update(part[key].encode("utf-8", "surrogatepass") + b"\n")
        for pair in self.links:
            h.update(pair.encode() + b"\n")
        return h.hexdigest()

    @property
    def vector(self) -> dict[str, int]:
        return {origin: seqs[-1] for origin, seqs in self.seqs.items() if seqs}


def _quoted(columns: Iterable[str]) -> str:
    return " || '|' || ".join(f"quote({c})" for c in columns)


def read_replica(name: str, kind: str, palace: Path, *, deep: bool = True) -> Replica:
    """Read one palace's ``logstream.sqlite3`` (a query-only connection, bounded waits)."""
    try:
        replica_id = json.loads((palace / "replica.json").read_text())["replica_id"]
    except (OSError, ValueError, KeyError):
        replica_id = ""
    replica = Replica(name=name, kind=kind, replica_id=replica_id)
    try:
        conn = sqlite3.connect(f"file:{palace / 'logstream.sqlite3'}?mode=rw", uri=True,
                               timeout=10.0)
    except sqlite3.Error as exc:
        replica.error = f"cannot open: {exc}"
        return replica
    try:
        conn.execute("PRAGMA query_only = ON")
        _read_rows(conn, replica)
        if deep:
            _read_ledgers(conn, replica)
            replica.integrity = str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    except sqlite3.Error as exc:
        replica.error = f"cannot read: {exc}"
    finally:
        conn.close()
    return replica


def _read_rows(conn: sqlite3.Connection, r: Replica) -> None:
    seen_keys: Counter[tuple[str, int]] = Counter()
    query = (f"SELECT id, origin_replica, origin_seq, metadata_json, {_quoted(EVENT_COLUMNS)} "
             "FROM events ORDER BY origin_replica, origin_seq")
    for event_id, origin, seq, metadata, row in conn.execute(query):
        r.events[event_id] = row
        r.keys[event_id] = (origin, seq)
        seen_keys[(origin, seq)] += 1
        r.seqs.setdefault(origin, []).append(seq)
        if OP_TAG in (metadata or ""):
            try:
                tag = json.loads(metadata).get(OP_TAG)
            except (ValueError, AttributeError):
                tag = None
            if tag:
                r.op_tags[str(tag)] += 1
    r.duplicate_keys = [f"{o}#{s}" for (o, s), n in seen_keys.items() if n > 1]
    r.links = [f"{e}|{a}" for e, a in conn.execute(
        "SELECT event_id, artifact_id FROM event_artifacts ORDER BY event_id, artifact_id")]
    query = (f"SELECT id, {_quoted(ARTIFACT_COLUMNS)} FROM artifacts WHERE id IN "
             "(SELECT artifact_id FROM event_artifacts)")
    r.artifacts = dict(conn.execute(query).fetchall())
    r.dangling = [f"{e}|{a}" for e, a in conn.execute(
        "SELECT event_id, artifact_id FROM event_artifacts WHERE artifact_id NOT IN "
        "(SELECT id FROM artifacts) ORDER BY event_id, artifact_id")]
    total = conn.execute("SELECT count(*) FROM artifacts").fetchone()[0]
    r.unreferenced = int(total) - len(r.artifacts)


def _read_ledgers(conn: sqlite3.Connection, r: Replica) -> None:
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for table, out in (("logsync_conflicts", r.conflicts), ("logsync_quarantine", r.quarantine)):
        if table in tables:
            out += [f"{kind}: {origin}#{seq} {reason}"[:300] for kind, origin, seq, reason in
                    conn.execute(f"SELECT kind, origin_replica, origin_seq, reason FROM {table}")]


@dataclass
class Acked:
    """One acknowledged append: the CLI returned success with this id and key."""

    id: str
    origin: str
    origin_seq: int
    node: str
    tag: str = ""
    artifact: str = ""  # the artifact the op acknowledged with the event ("" if none)


@dataclass
class Verdict:
    ok: bool = True
    replicas: list[str] = field(default_factory=list)
    acknowledged: int = 0
    lost: list[dict[str, Any]] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    divergent: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    ledgers: dict[str, list[str]] = field(default_factory=dict)
    integrity: dict[str, str] = field(default_factory=dict)
    converged: bool = False
    convergence_s: float | None = None
    problems: list[str] = field(default_factory=list)

    def fail(self, sentence: str) -> None:
        self.ok = False
        self.problems.append(sentence)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def converged(replicas: list[Replica], acked: Iterable[Acked]) -> bool:
    """Same canonical rows everywhere, no link without its artifact, and every acknowledged
    id (and acknowledged artifact) among them."""
    if (any(r.error or r.dangling for r in replicas)
            or len({r.digest() for r in replicas}) != 1):
        return False
    return all(a.id in replicas[0].events
               and (not a.artifact or a.artifact in replicas[0].artifacts) for a in acked)


def wait_converged(read: Callable[[], list[Replica]], acked: list[Acked], *, timeout: float,
                   poll: float = 0.5, since: float | None = None) -> float | None:
    """Seconds from ``since`` (a ``time.monotonic()``; default: now) until ``read()`` shows
    convergence, or None when ``timeout`` seconds of waiting (from now) did not see it."""
    began = time.monotonic()
    origin = began if since is None else min(since, began)
    while True:
        if converged(read(), acked):
            return time.monotonic() - origin
        if time.monotonic() - began > timeout:
            return None
        time.sleep(poll)


def check(replicas: list[Replica], acked: list[Acked], *, failed: Iterable[str] = (),
          expected_ledgers: bool = False) -> Verdict:
    """The verdict over fully read replicas (``read_replica(..., deep=True)``); ``failed``
    are the tags of the ops the CLI reported failed: none may be stored anywhere."""
    v = Verdict(replicas=[r.name for r in replicas], acknowledged=len(acked))
    for r in replicas:
        if r.error:
            v.fail(f"{r.name}: {r.error}")
    _check_acked(v, replicas, acked)
    _check_failed(v, replicas, failed)
    _check_dangling(v, replicas)
    _check_prefixes(v, replicas)
    _check_duplicates(v, replicas)
    _check_identical(v, replicas)
    for r in replicas:
        v.integrity[r.name] = r.integrity
        if r.integrity != "ok" and not r.error:
            v.fail(f"{r.name}: PRAGMA integrity_check says {r.integrity[:200]!r}")
        if r.conflicts or r.quarantine:
            v.ledgers[r.name] = (r.conflicts + r.quarantine)[:SHOWN]
    if v.ledgers and not expected_ledgers:
        v.fail(f"conflict or quarantine rows where no fault should make any: {v.ledgers}")
    if expected_ledgers and not v.ledgers:
        v.fail("the faults should have left conflict or quarantine rows, and none are there")
    return v


def _check_acked(v: Verdict, replicas: list[Replica], acked: list[Acked]) -> None:
    for a in acked:
        missing = [r.name for r in replicas if a.id not in r.events]
        wrong = [r.name for r in replicas
                 if a.id in r.events and r.keys[a.id] != (a.origin, a.origin_seq)]
        no_artifact = [r.name for r in replicas if a.artifact and a.id in r.events and (
            a.artifact not in r.artifacts or f"{a.id}|{a.artifact}" not in r.links)]
        if missing or no_artifact:
            lost: dict[str, Any] = {"id": a.id, "origin": a.origin, "origin_seq": a.origin_seq,
                                    "appended_on": a.node, "missing_on": missing}
            if no_artifact:
                lost.update(artifact=a.artifact, artifact_missing_on=no_artifact)
            v.lost.append(lost)
        if wrong:
            v.divergent.append(f"{a.id}: acknowledged as {a.origin}#{a.origin_seq}, "
                               f"held under another key on {wrong}")
    if v.lost:
        v.fail(f"{len(v.lost)} acknowledged append(s) lost, e.g. {v.lost[:3]}")
    if v.divergent:
        v.fail(f"{len(v.divergent)} acknowledged append(s) under another key: "
               f"{v.divergent[:3]}")


def _check_failed(v: Verdict, replicas: list[Replica], failed: Iterable[str]) -> None:
    tags = set(failed)
    stored = {tag: [r.name for r in replicas if r.op_tags.get(tag)] for tag in sorted(tags)}
    stored = {tag: names for tag, names in stored.items() if names}
    if stored:
        shown = dict(list(stored.items())[:3])
        v.fail(f"{len(stored)} append(s) the CLI reported failed are stored (op tag: "
               f"replicas): {shown}")


def _check_dangling(v: Verdict, replicas: list[Replica]) -> None:
    dangling = {r.name: r.dangling[:3] for r in replicas if r.dangling}
    if dangling:
        total = sum(len(r.dangling) for r in replicas)
        v.fail(f"{total} event_artifacts row(s) name an artifact the replica does not hold "
               f"(event|artifact): {dangling}")


def _check_prefixes(v: Verdict, replicas: list[Replica]) -> None:
    authors = {r.replica_id: r for r in replicas if r.replica_id}
    for r in replicas:
        for origin, seqs in r.seqs.items():
            author = authors.get(origin)
            if author is None:
                continue
            own = author.seqs.get(origin, [])
            if author is r and author.kind == "logsync" and seqs != list(range(1, len(seqs) + 1)):
                v.gaps.append(f"{r.name}: its own origin is not gap-free from 1 "
                              f"({_first_gap(seqs)})")
            top = seqs[-1]
            expected = [s for s in own if s <= top]
            if seqs != expected:
                v.gaps.append(f"{r.name}: origin {origin} ({author.name}) is not a prefix of "
                              f"the author's: {len(seqs)} held up to #{top}, author has "
                              f"{len(expected)} there ({_first_gap(seqs, expected)})")
    if v.gaps:
        v.fail(f"{len(v.gaps)} per-origin prefix violation(s): {v.gaps[:3]}")


def _first_gap(seqs: list[int], expected: list[int] | None = None) -> str:
    want = expected if expected is not None else list(range(1, len(seqs) + 1))
    for held, wanted in zip(seqs, want, strict=False):
        if held != wanted:
            return f"first difference at #{wanted}, holds #{held}"
    return f"lengths {len(seqs)} and {len(want)}"


def _check_duplicates(v: Verdict, replicas: list[Replica]) -> None:
    for r in replicas:
        v.duplicated += [f"{r.name}: key {k} held twice" for k in r.duplicate_keys]
        v.duplicated += [f"{r.name}: workload op {tag} stored {n} times"
                         for tag, n in r.op_tags.items() if n > 1]
    if v.duplicated:
        v.fail(f"{len(v.duplicated)} duplicate(s): {v.duplicated[:3]}")


def _check_identical(v: Verdict, replicas: list[Replica]) -> None:
    if len({r.digest() for r in replicas}) <= 1:
        return
    every = set().union(*(r.events for r in replicas))
    differing = []
    for event_id in sorted(every):
        rows = {r.events.get(event_id) for r in replicas}
        if None not in rows and len(rows) > 1:
            differing.append(event_id)
    for event_id in differing:
        versions = len({r.events[event_id] for r in replicas})
        v.divergent.append(f"event {event_id}: {versions} different rows across replicas")
    arts = set().union(*(r.artifacts for r in replicas))
    for art in sorted(arts):
        rows = {r.artifacts.get(art) for r in replicas}
        if None not in rows and len(rows) > 1:
            v.divergent.append(f"artifact {art}: different rows across replicas")
    missing = {r.name: len(every - set(r.events)) for r in replicas if every - set(r.events)}
    vectors = {r.name: r.vector for r in replicas}
    detail = f"events missing per replica {missing}" if missing else "same ids"
    v.fail(f"replicas differ ({detail}; {len(differing)} event(s) with different rows); "
           f"vectors equal: {len({json.dumps(x, sort_keys=True) for x in vectors.values()}) == 1}")
