"""The per-origin hash chain (issue 10, item 1): `logsync/chain.py` and `logsync_chain`.

The canonical encoding is pinned by a golden vector; every store's chain equals an
independent recomputation from what it serves (`list_ops` + artifact hashes); replicas
that pulled the same ops in any order and batching hold identical chains; one byte
changed in an op or an artifact changes the digest there and after; a store without the
table (or with a chain left behind by another writer) is brought up to date at open; a
real MemPalace 3.11 still reads and appends to a store carrying the table.
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from conftest import CountingIds, FakeClock, RemoteKit, origin_id
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsync import chain
from logsync.errors import ValidationError
from logsync.store import DB_FILENAME, Store
from logsync.store.faults import StoreNeedsWrite

KIT = RemoteKit()

# ── the golden vector ─────────────────────────────────────────────────

GOLDEN_EVENT: dict[str, Any] = {
    "id": "evt_20260702T032443_02ce0c31acdb",
    "seq": 41,  # local: not part of the envelope
    "origin_replica": "rep_0123456789ab",
    "origin_seq": 7,
    "hlc": "1782962683000-00002a-rep_0123456789ab",
    "type": "patch.ready",
    "stream": "projekt/bücher",
    "room": "patches",
    "topic": "",  # absent, spelled as upstream may store it
    "from_agent": "coder ✓",
    "to_agent": "lead",
    "correlation_id": None,
    "branch": "fix/ß",
    "base_commit": "deadbeef",
    "status": "ready",
    "artifact_ids": ["art_b", "art_a"],  # any order in, sorted out
    "body": 'line 1\r\nsays "hi"\t\\ \u2028 \x7f',
    "created_at": "2026-07-02T03:24:43Z",
    "metadata": {"z": [1, 2.5, 1e16, -0.0, None, True], "a": {"é": "ü"}, "n": 10**20},
}
GOLDEN_SHAS = ["b" * 64, None]  # art_b held with that hash, art_a not held
GOLDEN_CANONICAL_HEX = (
    "7b22617274696661637473223a5b5b226172745f61222c6e756c6c5d2c5b226172745f62222c22626262"
    "626262626262626262626262626262626262626262626262626262626262626262626262626262626262"
    "62626262626262626262626262626262626262225d5d2c22626173655f636f6d6d6974223a2264656164"
    "62656566222c22626f6479223a226c696e6520315c725c6e73617973205c2268695c225c745c5c20e280"
    "a8207f222c226272616e6368223a226669782fc39f222c22636f7272656c6174696f6e5f6964223a6e75"
    "6c6c2c22637265617465645f6174223a22323032362d30372d30325430333a32343a34335a222c226672"
    "6f6d5f6167656e74223a22636f64657220e29c93222c22686c63223a2231373832393632363833303030"
    "2d3030303032612d7265705f303132333435363738396162222c226964223a226576745f323032363037"
    "3032543033323434335f303263653063333161636462222c226d65746164617461223a7b2261223a7b22"
    "c3a9223a22c3bc227d2c226e223a3130303030303030303030303030303030303030302c227a223a5b31"
    "2c322e352c31652b31362c2d302e302c6e756c6c2c747275655d7d2c226f726967696e5f7265706c6963"
    "61223a227265705f303132333435363738396162222c226f726967696e5f736571223a372c22726f6f6d"
    "223a2270617463686573222c22737461747573223a227265616479222c2273747265616d223a2270726f"
    "6a656b742f62c3bc63686572222c22746f5f6167656e74223a226c656164222c22746f706963223a6e75"
    "6c6c2c2274797065223a2270617463682e7265616479227d"
)
GOLDEN_D0_HEX = "951edc3b69998533ca9ff33d9880a80cbd49a096033ab35493089dfd42a2ef6a"
GOLDEN_D1_HEX = "d47f54fe98d7409dfdc68058d43c77a7afa1df1db3d07514d1965b028a38ef86"


def test_canonical_bytes_golden_vector() -> None:
    canonical = chain.canonical_op(GOLDEN_EVENT, GOLDEN_SHAS)
    assert canonical.hex() == GOLDEN_CANONICAL_HEX
    d0 = chain.chain_start(GOLDEN_EVENT["origin_replica"])
    assert d0.hex() == GOLDEN_D0_HEX
    assert chain.next_digest(d0, canonical).hex() == GOLDEN_D1_HEX
# The same bytes as text (for a reader; the hex above is what is pinned):
# {"artifacts":[["art_a",null],["art_b","bbbb…bbbb"]],"base_commit":"deadbeef",
#  "body":"line 1\r\nsays \"hi\"\t\\ <U+2028 raw> <U+007F raw>","branch":"fix/ß",
#  "correlation_id":null,"created_at":"2026-07-02T03:24:43Z","from_agent":"coder ✓",
#  "hlc":"1782962683000-00002a-rep_0123456789ab","id":"evt_20260702T032443_02ce0c31acdb",
#  "metadata":{"a":{"é":"ü"},"n":100000000000000000000,"z":[1,2.5,1e+16,-0.0,null,true]},
#  "origin_replica":"rep_0123456789ab","origin_seq":7,"room":"patches","status":"ready",
#  "stream":"projekt/bücher","to_agent":"lead","topic":null,"type":"patch.ready"}
# (no whitespace between tokens; the line breaks here are only for the comment)


def test_served_and_stored_shapes_encode_alike() -> None:
    """An op as served (metadata a dict) and as stored (metadata_json in the store's own
    spelling, artifact ids sorted, "" read as absent) give the same bytes."""
    stored = {k: v for k, v in GOLDEN_EVENT.items() if k != "metadata"}
    stored["metadata_json"] = (
        '{"a": {"\u00e9": "\u00fc"}, "n": 100000000000000000000, '
        '"z": [1, 2.5, 1e+16, -0.0, null, true]}'
    )
    stored["artifact_ids"] = ["art_a", "art_b"]
    stored["topic"] = None
    assert chain.canonical_op(stored, [None, "b" * 64], stored=True).hex() == \
        GOLDEN_CANONICAL_HEX
    for bad_text in ("not json", "[1, 2]", None):
        assert chain.canonical_op({**stored, "metadata_json": bad_text}, [None, "b" * 64],
                                  stored=True) == (
            chain.canonical_op({**GOLDEN_EVENT, "metadata": {}}, GOLDEN_SHAS)
        )


def test_canonical_covers_every_authored_field_and_no_local_one() -> None:
    base = chain.canonical_op(GOLDEN_EVENT, GOLDEN_SHAS)
    assert chain.canonical_op({**GOLDEN_EVENT, "seq": 99999}, GOLDEN_SHAS) == base
    changes: dict[str, Any] = {
        "id": "evt_20260702T032443_02ce0c31acdc", "origin_replica": "rep_0123456789ac",
        "origin_seq": 8, "hlc": "1782962683001-00002a-rep_0123456789ab",
        "type": "patch.readz", "stream": "projekt/bücheR", "room": "patchez", "topic": "t",
        "from_agent": "coder ✔", "to_agent": "leaD", "correlation_id": "c", "branch": "fix/s",
        "base_commit": "deadbeeF", "status": "open", "body": GOLDEN_EVENT["body"] + " ",
        "created_at": "2026-07-02T03:24:44Z", "metadata": {**GOLDEN_EVENT["metadata"], "n": 1},
    }
    assert set(changes) | {"seq", "artifact_ids"} == set(GOLDEN_EVENT)
    for key, value in changes.items():
        assert chain.canonical_op({**GOLDEN_EVENT, key: value}, GOLDEN_SHAS) != base, key
    assert chain.canonical_op(GOLDEN_EVENT, ["c" * 64, None]) != base  # artifact content
    assert chain.canonical_op(GOLDEN_EVENT, ["b" * 64, "a" * 64]) != base  # now held
    renamed = {**GOLDEN_EVENT, "artifact_ids": ["art_b", "art_c"]}
    assert chain.canonical_op(renamed, GOLDEN_SHAS) != base
    for bad in ({"origin_seq": True}, {"origin_seq": "7"}, {"id": None}):
        with pytest.raises(ValueError):
            chain.canonical_op({**GOLDEN_EVENT, **bad}, GOLDEN_SHAS)
    with pytest.raises(ValueError):
        chain.canonical_op(GOLDEN_EVENT, ["b" * 64])
    with pytest.raises(ValueError):
        chain.canonical_op({**GOLDEN_EVENT, "metadata": {"x": float("nan")}}, GOLDEN_SHAS)


def test_equal_bodies_under_two_origins_never_share_a_digest() -> None:
    a, b = origin_id(1), origin_id(2)
    assert chain.chain_start(a) != chain.chain_start(b)
    same = chain.canonical_op(GOLDEN_EVENT, GOLDEN_SHAS)
    assert chain.chain_digests(a, [same]) != chain.chain_digests(b, [same])
    assert chain.chain_start(a) == hashlib.sha256(b"logsync-chain-v1\x00" + a.encode()).digest()


# ── a store's chain against an independent recomputation ──────────────


def chain_rows(store: Store) -> list[tuple[str, int, bytes]]:
    conn = sqlite3.connect(store.db_path)
    try:
        rows = conn.execute(
            "SELECT origin, origin_seq, digest FROM logsync_chain ORDER BY origin, origin_seq"
        ).fetchall()
    finally:
        conn.close()
    return [(o, s, bytes(d)) for o, s, d in rows]


def expected_rows(store: Store) -> list[tuple[str, int, bytes]]:
    """The chain recomputed from what the store serves: `list_ops` pages and the sha256
    of each named artifact's content (None when the store does not hold it)."""
    out = []
    for origin in sorted(store.version_vector()):
        prev, after = chain.chain_start(origin), 0
        while ops := store.list_ops(origin, after, 500):
            for op in ops:
                shas = []
                for art_id in op["artifact_ids"]:
                    art = store.get_artifact(art_id)
                    shas.append(None if art is None else hashlib.sha256(
                        art["content"].encode("utf-8")).hexdigest())
                prev = chain.next_digest(prev, chain.canonical_op(op, shas))
                out.append((origin, op["origin_seq"], prev))
            after = ops[-1]["origin_seq"]
    return out


def assert_chain_sound(store: Store) -> list[tuple[str, int, bytes]]:
    rows = chain_rows(store)
    assert rows == expected_rows(store)
    for origin, seq, digest in rows:
        assert store.chain_digest(origin, seq) == digest
    for origin in store.version_vector():
        last = [r for r in rows if r[0] == origin][-1]
        assert store.chain_tip(origin) == (last[1], last[2])
    return rows


def open_store(root: Path, name: str, clock: FakeClock | None = None) -> Store:
    return Store.open(root / name, wall_ms=clock or FakeClock(), new_id=CountingIds(name[:1]))


def author(store: Store, rng: random.Random, count: int, clock: FakeClock) -> None:
    for i in range(count):
        clock.advance(rng.randint(0, 1500))
        art_ids = []
        if rng.random() < 0.3:
            art_ids = [store.put_artifact("patch", f"+ line {rng.random()}\n", "coder")["id"]
                       for _ in range(rng.randint(1, 2))]
        store.append_event(
            "task.note", "proj", rng.choice(["r1", "r2"]), f"agent-{i % 3}",
            to_agent=rng.choice([None, "lead"]), body=f"body {i} ✓ {rng.random()}",
            metadata=rng.choice([None, {"k": [i, 0.5, "ü"]}]), artifact_ids=art_ids[::-1],
            status=rng.choice([None, "open"]),
        )


def pull(dst: Store, src: Store, origin: str, limit: int, after: int | None = None) -> None:
    """One page of `origin` from src into dst, with the artifacts it names."""
    start = dst.version_vector().get(origin, 0) if after is None else after
    ops = src.list_ops(origin, start, limit)
    arts = src.get_artifacts({a for op in ops for a in op["artifact_ids"]})
    dst.apply_remote(ops, arts)


def sync_all(stores: list[Store]) -> None:
    for _ in range(len(stores)):
        for dst in stores:
            for src in stores:
                for origin in src.version_vector():
                    while src.version_vector()[origin] > dst.version_vector().get(origin, 0):
                        pull(dst, src, origin, 500)


def test_local_appends_chain_as_recomputed(tmp_path: Path) -> None:
    clock = FakeClock()
    with open_store(tmp_path, "a", clock) as store:
        author(store, random.Random(1), 25, clock)
        rows = assert_chain_sound(store)
        assert len(rows) == 25 and store.chain_tip(store.replica_id)[0] == 25
        assert store.chain_digest(store.replica_id, 26) is None
        assert store.chain_tip(origin_id(5)) is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), n_stores=st.integers(2, 3),
       steps=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2),
                                st.integers(1, 7), st.booleans()), max_size=25))
def test_replicas_that_pulled_the_same_ops_hold_identical_chains(
    tmp_path_factory: pytest.TempPathFactory, seed: int, n_stores: int,
    steps: list[tuple[int, int, int, int, bool]],
) -> None:
    """Random authoring on 2-3 stores, random pulls (pages of random size, re-deliveries
    from below the vector), then full sync: every chain row is identical everywhere and
    equals the recomputation, at every step on every store."""
    root = tmp_path_factory.mktemp("replicas")
    rng = random.Random(seed)
    clock = FakeClock()
    stores = [open_store(root, f"{'abc'[i]}", clock) for i in range(n_stores)]
    try:
        for i, store in enumerate(stores):
            author(store, rng, rng.randint(1, 6) + i, clock)
        for writer, dst_i, src_i, limit, redeliver in steps:
            src, dst = stores[src_i % n_stores], stores[dst_i % n_stores]
            if writer == 0:
                author(src, rng, 1, clock)
            origins = sorted(src.version_vector())
            if dst is src or not origins:
                continue
            origin = rng.choice(origins)
            held = dst.version_vector().get(origin, 0)
            pull(dst, src, origin, limit, rng.randint(0, held) if redeliver else None)
            assert_chain_sound(dst)
        sync_all(stores)
        rows = [assert_chain_sound(s) for s in stores]
        assert all(r == rows[0] for r in rows[1:])
        assert len(rows[0]) == sum(stores[0].version_vector().values())
    finally:
        for store in stores:
            store.close()


def test_an_origin_with_gaps_chains_over_them(tmp_path: Path) -> None:
    """Upstream origins may skip seqs: each op chains from the highest held seq below."""
    origin = origin_id(7)
    ops = [KIT.op(origin, s) for s in (1, 2, 5, 9)]
    with open_store(tmp_path, "g") as store:
        store.apply_remote(ops[:3])
        store.apply_remote(ops[3:])
        rows = assert_chain_sound(store)
    assert [r[1] for r in rows] == [1, 2, 5, 9]
    canon = [chain.canonical_op(op, []) for op in ops]
    assert [r[2] for r in rows] == chain.chain_digests(origin, canon)


# ── tampering: one byte anywhere changes the digest there and after ───

FIELD_EDITS = {
    "id": lambda v: v[:-1] + ("x" if v[-1] != "x" else "y"),
    "type": lambda v: v + "x",
    "stream": lambda v: v[:-1] + "X",
    "room": lambda v: v[:-1] + "X",
    "topic": lambda v: "t",
    "from_agent": lambda v: v[:-1] + "X",
    "to_agent": lambda v: "lead",
    "correlation_id": lambda v: "c",
    "branch": lambda v: "b",
    "base_commit": lambda v: "f",
    "status": lambda v: "open",
    "body": lambda v: v[:-1] + "X",
    "created_at": lambda v: v[:3] + ("7" if v[3] != "7" else "8") + v[4:],
    "hlc": lambda v: v[:12] + ("9" if v[12] != "9" else "8") + v[13:],
    "metadata": lambda v: {**v, "n": v["n"] + 1},
}


@pytest.mark.parametrize("field", sorted(FIELD_EDITS))
def test_one_changed_field_changes_the_digest_there_and_after(tmp_path: Path, field: str) -> None:
    origin, k = origin_id(3), 3
    ops = KIT.chain(origin, 6)
    with open_store(tmp_path, "o") as honest:
        honest.apply_remote(ops)
        good = chain_rows(honest)
    forged = [dict(op) for op in ops]
    forged[k - 1][field] = FIELD_EDITS[field](forged[k - 1][field])
    with open_store(tmp_path, "f") as other:
        result = other.apply_remote(forged)
        assert result.applied == 6, result
        bad = assert_chain_sound(other)
    assert bad[: k - 1] == good[: k - 1]
    assert all(b[2] != g[2] for b, g in zip(bad[k - 1 :], good[k - 1 :], strict=True))


def test_one_changed_artifact_content_changes_the_digest_there_and_after(tmp_path: Path) -> None:
    origin, k = origin_id(4), 2
    real = KIT.artifact("+ the real patch\n", art_id="art_shared_1")
    fake = KIT.artifact("+ the real patcH\n", art_id="art_shared_1")
    ops = KIT.chain(origin, 5)
    ops[k - 1]["artifact_ids"] = ["art_shared_1"]
    digests = []
    for name, art in (("r", real), ("f", fake)):
        with open_store(tmp_path, name) as store:
            assert store.apply_remote(ops, [art]).applied == 5
            digests.append(assert_chain_sound(store))
    good, bad = digests
    assert bad[: k - 1] == good[: k - 1]
    assert all(b[2] != g[2] for b, g in zip(bad[k - 1 :], good[k - 1 :], strict=True))


# ── the migration: backfill and repair at open ────────────────────────


def build_mixed(root: Path) -> tuple[Path, list[tuple[str, int, bytes]]]:
    """A store with local ops (some naming artifacts) and two remote origins."""
    clock = FakeClock()
    with open_store(root, "src", clock) as src:
        author(src, random.Random(5), 12, clock)
    with open_store(root, "m", clock) as store:
        author(store, random.Random(6), 9, clock)
        with Store.open(root / "src") as src:
            pull(store, src, src.replica_id, 7)
            pull(store, src, src.replica_id, 500)
        store.apply_remote([KIT.op(origin_id(8), s) for s in (1, 3, 4)])
        rows = assert_chain_sound(store)
    assert len({r[0] for r in rows}) == 3
    return root / "m", rows


def raw(palace: Path, *statements: tuple[str, tuple[Any, ...]]) -> None:
    conn = sqlite3.connect(palace / DB_FILENAME)
    with conn:
        for sql, params in statements:
            conn.execute(sql, params)
    conn.close()


def test_a_store_from_before_the_chain_is_backfilled_on_open(tmp_path: Path) -> None:
    palace, rows = build_mixed(tmp_path)
    raw(palace, ("DROP TABLE logsync_chain", ()))
    with pytest.raises(StoreNeedsWrite, match="logsync_chain"):
        Store.open(palace, read_only=True)
    with Store.open(palace) as store:
        assert chain_rows(store) == rows
    with Store.open(palace, read_only=True) as store:
        assert chain_rows(store) == rows


def test_a_chain_left_behind_by_another_writer_is_repaired(tmp_path: Path) -> None:
    """Entries missing at the tail or in the middle, a wrong digest at the tail, or an
    event another program appended without one: the open (or the next write of that
    origin) brings the chain back to the recomputation."""
    palace, rows = build_mixed(tmp_path)
    origins = sorted({r[0] for r in rows})
    raw(palace,
        ("DELETE FROM logsync_chain WHERE origin = ? AND origin_seq > 5", (origins[0],)),
        ("DELETE FROM logsync_chain WHERE origin = ? AND origin_seq = 2", (origins[1],)))
    with Store.open(palace) as store:
        assert chain_rows(store) == rows
        own = store.replica_id
    mine = [r for r in rows if r[0] == own]
    raw(palace, ("INSERT INTO events (id, type, stream, room, from_agent, body, created_at, "
                 "metadata_json, origin_replica, origin_seq, hlc) VALUES ('evt_by_hub_1', "
                 "'turn.mempalace', 's', 'r', 'mp', '', '2026-07-02T03:30:00Z', '{}', ?, ?, ?)",
                 (own, mine[-1][1] + 1, f"1782963000000-000000-{own}")))
    with Store.open(palace) as store:  # repaired at open
        fixed = assert_chain_sound(store)
        assert len(fixed) == len(rows) + 1
    raw(palace, ("INSERT INTO events (id, type, stream, room, from_agent, body, created_at, "
                 "metadata_json, origin_replica, origin_seq, hlc) VALUES ('evt_by_hub_2', "
                 "'turn.mempalace', 's', 'r', 'mp', '', '2026-07-02T03:30:01Z', '{}', ?, ?, ?)",
                 (own, mine[-1][1] + 2, f"1782963001000-000000-{own}")))
    with Store.open(palace, check=False) as store:
        raw(palace, ("DELETE FROM logsync_chain WHERE origin = ? AND origin_seq >= ?",
                     (own, mine[-1][1] + 1)))
        store.append_event("after.hub", "s", "r", "ls")  # the write path repairs the origin
        assert len(assert_chain_sound(store)) == len(rows) + 3


def test_a_fresh_store_and_a_backfilled_one_agree(tmp_path: Path) -> None:
    """A replica that pulled everything and a copy of the source that lost its chain."""
    palace, rows = build_mixed(tmp_path)
    with Store.open(palace) as source, open_store(tmp_path, "fresh") as fresh:
        sync_all([fresh, source])
        assert assert_chain_sound(fresh) == rows
    raw(palace, ("DROP TABLE logsync_chain", ()))
    with Store.open(palace) as store:
        assert chain_rows(store) == rows


# ── MemPalace 3.11 opens, reads and appends to a store with the chain ─


@pytest.mark.interop
def test_mempalace_reads_and_appends_to_a_chained_store(tmp_path: Path) -> None:
    from interop.hub import MemPalaceCli, ensure_mempalace

    mp = MemPalaceCli(ensure_mempalace(), tmp_path / "home")
    (tmp_path / "home").mkdir()
    palace, rows = build_mixed(tmp_path)
    listed = mp.list_events(palace)
    assert len(listed) == len(rows)
    mp.append(palace, type="turn.mempalace", stream="s", room="r", from_agent="mp")
    assert len(mp.list_events(palace)) == len(rows) + 1
    with Store.open(palace) as store:
        fixed = assert_chain_sound(store)
    assert len(fixed) == len(rows) + 1 and set(rows) <= set(fixed)


_label = st.one_of(st.none(), st.just(""), st.text(min_size=1, max_size=12))
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                               max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.text(max_size=20), min_size=8, max_size=8),
       labels=st.lists(_label, min_size=6, max_size=6),
       body=st.one_of(st.none(), st.text(max_size=40)),
       seq=st.integers(1, 2**62),
       metadata=st.dictionaries(st.text(max_size=6), _json_value, max_size=4),
       arts=st.dictionaries(st.from_regex(r"art_[a-z0-9]{1,6}", fullmatch=True),
                            st.one_of(st.none(), st.from_regex(r"[0-9a-f]{64}", fullmatch=True)),
                            max_size=3))
def test_the_key_by_key_writer_is_json_dumps_of_the_whole_object(
    texts: list[str], labels: list[str | None], body: str | None, seq: int,
    metadata: dict[str, Any], arts: dict[str, str | None],
) -> None:
    """The rule as the docstring states it, computed the slow way, for any values."""
    event: dict[str, Any] = dict(zip(chain.REQUIRED_TEXT, texts, strict=True))
    event.update(zip(chain.OPTIONAL_TEXT, labels, strict=True))
    event.update(body=body, origin_seq=seq, metadata=metadata, artifact_ids=list(arts)[::-1])
    reference = {k: event[k] for k in chain.REQUIRED_TEXT}
    reference.update({k: event[k] or None for k in chain.OPTIONAL_TEXT})
    reference.update(body=body or "", origin_seq=seq, metadata=metadata,
                     artifacts=[[a, arts[a]] for a in sorted(arts)])
    assert list(sorted(reference)) == list(chain.CANONICAL_KEYS)
    expected = json.dumps(reference, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8", "surrogatepass")
    shas = [arts[a] for a in event["artifact_ids"]]
    assert chain.canonical_op(event, shas) == expected
    stored = {**event, "metadata_json": json.dumps(metadata, sort_keys=True, ensure_ascii=False)}
    del stored["metadata"]
    assert chain.canonical_op(stored, shas, stored=True) == expected


def test_long_metadata_is_encoded_alike_but_never_cached() -> None:
    """A peer sending many distinct 64 KiB metadata objects must not grow the metadata
    cache by their size: only texts up to CACHED_METADATA_CHARS are kept."""
    from logsync import chain as chain_mod

    chain_mod._compact_cached.cache_clear()
    short = json.dumps({"b": 1, "a": [1, 2]})
    long = json.dumps({"k": "x" * (chain_mod.CACHED_METADATA_CHARS + 10), "a": 1})
    assert chain_mod.compact_metadata(short) == '{"a":[1,2],"b":1}'
    assert chain_mod.compact_metadata(long) == json.dumps(
        json.loads(long), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert chain_mod._compact_cached.cache_info().currsize == 1


_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
_metadata = st.dictionaries(
    st.text(max_size=8),
    st.recursive(_json_scalars, lambda inner: st.lists(inner, max_size=3)
                 | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8),
    max_size=4)
_optional = st.one_of(st.none(), st.just(""), st.text(min_size=1, max_size=10).filter(
    lambda t: t.strip() == t and "\x00" not in t))


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(metadata=_metadata, topic=_optional, status=_optional, body=st.text(max_size=40),
       with_artifact=st.booleans())
def test_an_op_as_served_chains_to_the_digest_stored_from_its_row(
    tmp_path_factory: Any, metadata: dict, topic: Any, status: Any, body: str,
    with_artifact: bool,
) -> None:
    """A verified page's digests, computed from the ops as served, are stored in place of
    the store's own computation from their rows (`extend_chains(known=...)`): the two
    must be the same bytes for any op a store accepts."""
    store = Store.open(tmp_path_factory.mktemp("served") / "p")
    try:
        ids = [store.put_artifact("note", "patch " + body, "alice")["id"]] if with_artifact \
            else []
        op = store.append_event("task.ask", "s", "r", "alice", body=body, metadata=metadata,
                                topic=topic or None, status=status or None, artifact_ids=ids)
    except ValidationError:  # the validator refused the generated op: nothing to check
        store.close()
        return
    served = store.list_ops(store.replica_id, 0, 1)[0]
    shas = [store.get_artifact(a)["sha256"] for a in served["artifact_ids"]]
    served_roundtrip = json.loads(json.dumps(served))  # as a puller decodes it
    digest = chain.next_digest(chain.chain_start(store.replica_id),
                               chain.canonical_op(served_roundtrip, shas))
    assert digest == store.chain_digest(store.replica_id, op["origin_seq"])
    store.close()


_any_value = st.one_of(
    st.text(max_size=12), st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2),
    st.none(), st.just(""), st.integers(-3, 3), st.booleans(), st.floats(allow_nan=False),
    st.binary(max_size=3))
@st.composite
def _row_args(draw: Any) -> tuple:
    """A row a store could hold, with up to three of its values replaced by odd ones."""
    values = [draw(st.text(max_size=8)) for _ in range(13)]
    values += ["{}", draw(st.text(max_size=8)), draw(st.integers(0, 2**70)),
               draw(st.text(max_size=8))]
    for at in draw(st.lists(st.integers(0, 16), max_size=3)):
        values[at] = draw(_any_value)
    return tuple(values)


def _outcome(fn: Any, args: tuple, artifacts: dict) -> Any:
    try:
        return fn(*args, artifacts)
    except (TypeError, ValueError) as exc:  # the same kind of refusal, not its words
        return type(exc)


_odd_scalar = st.one_of(st.none(), st.text(max_size=6), st.binary(max_size=3),
                       st.floats(), st.just(1e16), st.integers(-3, 3), st.booleans())
_artifacts = st.one_of(
    st.just({}),
    st.dictionaries(st.text(max_size=6), st.one_of(st.none(), st.text(max_size=6)), max_size=3),
    st.dictionaries(st.one_of(st.text(max_size=6), st.binary(max_size=3), st.integers(0, 3)),
                    st.one_of(_odd_scalar, st.lists(_odd_scalar, max_size=2),
                              st.dictionaries(st.text(max_size=3), _odd_scalar, max_size=2)),
                    max_size=3))


@settings(max_examples=400, deadline=None)
@given(args=_row_args(), artifacts=_artifacts)
def test_the_fast_writer_gives_the_reference_bytes_or_its_error(args: tuple,
                                                                artifacts: dict) -> None:
    """`canonical_row` (msgspec) against `canonical_row_reference` (the standard library)
    for values of any type: text with lone surrogates, numbers, bytes, bools in text
    fields; artifact ids and sha256s of any type (bytes, NaN, 1e16, nested objects).
    Each gives the same bytes, or both refuse."""
    assert _outcome(chain.canonical_row, args, artifacts) == \
        _outcome(chain.canonical_row_reference, args, artifacts)


def test_the_fast_writer_escapes_every_code_point_as_json_dumps() -> None:
    every = "".join(map(chr, [*range(0xD800), *range(0xE000, 0x110000)]))
    args = ("id", "t", "s", "r", every, "a", None, None, None, None, None, every, "c", "{}",
            "o", 1, "h")
    assert chain.canonical_row(*args, {}) == chain.canonical_row_reference(*args, {})
    assert chain._Canonical.__struct_fields__ == chain.CANONICAL_KEYS


def test_a_msgspec_that_escapes_otherwise_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The import-time probe: this msgspec writes the reference's bytes; one that escaped
    U+2028 (as some JSON writers do) or wrote ``/`` as ``\\/`` would be refused, and the
    reference would write every op."""
    assert chain._FAST and chain._fast_writes_the_reference()
    real = chain._encode_canonical
    for other in (lambda v: real(v).replace("\u2028".encode(), b"\\u2028"),
                  lambda v: real(v).replace(b"/", b"\\/"),
                  lambda v: real(v).replace(b"\x7f", b"\\u007f")):
        monkeypatch.setattr(chain, "_encode_canonical", other)
        assert not chain._fast_writes_the_reference()
    monkeypatch.setattr(chain, "_FAST", False)
    args = ("id", "t", "s", "r", None, "a", None, None, None, None, None, "b\u2028", "c", "{}",
            "o", 1, "h")
    assert chain.canonical_row(*args, {}) == chain.canonical_row_reference(*args, {})
