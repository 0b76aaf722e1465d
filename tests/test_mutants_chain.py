"""Rules of the chain core (issue 10: `logsync/divergence.py`, `logsync/pagechain.py`,
`logsync/store/chainreads.py`) that their mutation run (scripts/mutation.py) showed no
test pinned: the probe points and their count, the search's `lo`/`hi` steps, the bound of
searches per round, which seqs carry signatures (`CHECKPOINT` = 64), the guards on
storing verified signatures, `sign_own_chain` when the tip is signed, and an unsigned
page recording nothing.

The search is sans-IO, so its tests drive the generators with small fakes (two chains
that agree below a fork seq); the store functions run on a real `Store`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from logsync import divergence
from logsync.chain import canonical_op, chain_start, next_digest
from logsync.divergence import (
    MAX_SEARCHES_PER_ROUND,
    OPS_RECORDED,
    PROBES_PER_REQUEST,
    investigate,
    locate,
    probes,
)
from logsync.effects import ReadDigests, ReadOwnSeen, ReadVector, RecordDivergence
from logsync.engine import pull_round
from logsync.errors import PeerProtocolError, StoreError
from logsync.keys import public_key_of, self_certifying_id, sign_digest, verify_digest
from logsync.model import MAX_SEQ
from logsync.pagechain import (
    BAD_SIGNATURE,
    CHAIN_MISMATCH,
    CHECKPOINT,
    MISSING_ARTIFACT,
    UNSIGNED,
    PageProof,
    carries_signature,
    signed_end,
    verify_page,
)
from logsync.report import STOP_DIVERGED, OriginProgress
from logsync.store import Store
from logsync.store.chainreads import (
    MAX_FORKS_RECORDED,
    MAX_KEY_CHANGES_RECORDED,
    _page_shas,
    digests_at,
    sign_own_chain,
    signatures_of,
    tips,
)
from logsync.wire import DIGESTS_PATH, Extensions, Request
from tests.test_signatures import Relay
from tests.test_signatures import append as sig_append
from tests.test_signatures import pull as sig_pull

ORIGIN = "rep_" + "c" * 32
PEER_ID = "rep_" + "d" * 32
CHAIN = Extensions(chain=True)


def rid(n: int) -> str:
    return f"rep_{n:032x}"


def digest(side: str, origin: str, seq: int, fork: int) -> bytes:
    """D(seq) of one side of two histories of `origin` that agree below `fork`."""
    tag = "common" if seq < fork else side
    return hashlib.sha256(f"{tag}/{origin}/{seq}".encode()).digest()


class Forked:
    """Two histories of each origin, agreeing below `forks[origin]`: ours (the store
    effects) and the peer's (its requests). Logs every step the generator yields."""

    def __init__(self, forks: dict[str, int], tops: dict[str, int] | None = None,
                 ops_answer: Any = None) -> None:
        self.forks = forks
        self.tops = tops or {}
        self.ops_answer = ops_answer  # (origin, after) -> the /sync/ops answer
        self.steps: list[Any] = []
        self.recorded: list[RecordDivergence] = []

    def ours(self, origin: str, seq: int) -> bytes:
        return digest("ours", origin, seq, self.forks[origin])

    def theirs(self, origin: str, seq: int) -> bytes:
        return digest("theirs", origin, seq, self.forks[origin])

    def answer(self, step: Any) -> Any:
        if isinstance(step, ReadDigests):
            return [self.ours(o, s) for o, s in step.points]
        if isinstance(step, RecordDivergence):
            self.recorded.append(step)
            return 1 + len(step.remote_ops)
        if isinstance(step, ReadVector):
            return dict(self.tops)
        if isinstance(step, ReadOwnSeen):
            return 0
        assert isinstance(step, Request), step
        if step.path == "/sync/version_vector":
            return {"replica_id": PEER_ID, "version_vector": dict(self.tops),
                    "logsync": {"extensions": ["chain"], "tips": {
                        o: [top, self.theirs(o, top).hex()] for o, top in self.tops.items()}}}
        origin = step.params["origin"]
        if step.path == DIGESTS_PATH:
            seqs = [int(s) for s in step.params["at"].split(",")]
            return {"origin": origin,
                    "digests": [[s, self.theirs(origin, s).hex()] for s in seqs]}
        assert step.path == "/sync/ops", step
        if self.ops_answer is not None:
            return self.ops_answer(origin, step.params["after"])
        return {"events": []}

    def run(self, gen: Any) -> Any:
        try:
            step = next(gen)
            while True:
                self.steps.append(step)
                step = gen.send(self.answer(step))
        except StopIteration as stop:
            return stop.value

    def digest_requests(self) -> list[list[int]]:
        return [[int(s) for s in r.params["at"].split(",")] for r in self.steps
                if isinstance(r, Request) and r.path == DIGESTS_PATH]


def progress_of(origin: str = ORIGIN) -> OriginProgress:
    return OriginProgress(origin=origin, start=0, target=0, reached=0)


# --- divergence.py: probes and the search -------------------------------------------

def test_probes_are_exactly_the_evenly_spaced_interior_seqs() -> None:
    assert PROBES_PER_REQUEST == 32
    assert probes(0, 330) == list(range(10, 330, 10))       # 32 points, 10 apart
    assert probes(1000, 1330) == list(range(1010, 1330, 10))  # the same, shifted by lo
    assert probes(5, 8) == [6, 7]                            # a short span: every seq inside
    assert probes(0, 10) == list(range(1, 10))
    assert probes(0, 33) == list(range(1, 33))               # exactly 32 inside
    assert probes(3, 3) == [] and probes(3, 4) == []


def test_the_search_narrows_to_the_first_differing_probe_and_counts_its_requests() -> None:
    """Each request probes strictly between the last agreeing seq (`lo`) and the first
    differing one (`hi`); the digest requests are counted one per request."""
    world = Forked({ORIGIN: 27_000})
    progress = progress_of()
    found = world.run(locate("p", ORIGIN, 0, 40_000, b"o", b"t", CHAIN, progress))
    assert found == (27_000, world.ours(ORIGIN, 27_000), world.theirs(ORIGIN, 27_000))
    asked = world.digest_requests()
    assert asked[0] == probes(0, 40_000)
    for before, after in zip(asked, asked[1:], strict=False):
        lo = max(p for p in before if p < 27_000)
        hi = min(p for p in before if p >= 27_000)
        assert after == probes(lo, hi)
    assert [len(a) for a in asked] == [32, 32, 32]           # spans 40000 -> 1212 -> 37 -> 1
    assert asked[1] == probes(26_666, 27_878) and asked[2] == probes(26_996, 27_033)
    assert asked[2][:4] == [26_997, 26_998, 26_999, 27_000]
    assert progress.digest_requests == 3
    # each request also reads our digests at exactly its points, nothing else
    reads = [s for s in world.steps if isinstance(s, ReadDigests)]
    assert [[p for _, p in r.points] for r in reads] == asked


def test_a_search_whose_first_probe_differs_stops_there() -> None:
    world = Forked({ORIGIN: 1})
    progress = progress_of()
    found = world.run(locate("p", ORIGIN, 0, 2000, b"o", b"t", CHAIN, progress))
    assert found == (1, world.ours(ORIGIN, 1), world.theirs(ORIGIN, 1))
    assert world.digest_requests() == [probes(0, 2000), probes(0, 60)]
    assert probes(0, 2000)[0] == 60 and probes(0, 60)[0] == 1
    assert progress.digest_requests == 2


def test_a_search_with_nothing_between_lo_and_hi_asks_nothing() -> None:
    for lo, hi in [(0, 1), (4, 5)]:
        world = Forked({ORIGIN: 1})
        progress = progress_of()
        assert world.run(locate("p", ORIGIN, lo, hi, b"o", b"t", CHAIN, progress)) == (
            hi, b"o", b"t")
        assert world.steps == [] and progress.digest_requests == 0


def test_the_divergence_at_the_tip_keeps_the_digests_it_was_given() -> None:
    """All probes agree: the first divergent seq is `hi` itself, with the digests the
    caller passed (from the tips, or read here when the caller had none)."""
    world = Forked({ORIGIN: 9})
    progress = progress_of()
    found = world.run(locate("p", ORIGIN, 0, 9, b"mine", b"their", CHAIN, progress))
    assert found == (9, b"mine", b"their")
    assert world.digest_requests() == [list(range(1, 9))]


def test_a_chain_differing_at_seq_0_is_a_protocol_error_and_seq_1_is_searched() -> None:
    """D(0) is d_0 on every replica: a peer whose chain differs there is lying (nothing
    asked, nothing recorded). From hi = 1 on it is a divergence like any other."""
    world = Forked({ORIGIN: 1})
    progress = progress_of()
    with pytest.raises(PeerProtocolError, match="at origin_seq 0 is not that origin's d_0"):
        world.run(investigate("p", PEER_ID, ORIGIN, 0, None, b"t", CHAIN, progress))
    assert world.steps == [] and world.recorded == []
    assert progress.stop_reason == STOP_DIVERGED and progress.diverged_at is None

    world = Forked({ORIGIN: 1})
    progress = progress_of()
    assert world.run(investigate("p", PEER_ID, ORIGIN, 1, None, b"t", CHAIN, progress)) == 1
    assert world.digest_requests() == [] and progress.diverged_at == 1
    ops = [s for s in world.steps if isinstance(s, Request) and s.path == "/sync/ops"]
    assert [r.params["after"] for r in ops] == [0]
    assert (world.recorded[0].seq, world.recorded[0].local_digest) == (1, world.ours(ORIGIN, 1))


def test_investigate_reads_our_digest_at_hi_only_when_not_given() -> None:
    world = Forked({ORIGIN: 5})
    progress = progress_of()
    theirs = world.theirs(ORIGIN, 5)
    world.run(investigate("p", PEER_ID, ORIGIN, 5, None, theirs, CHAIN, progress))
    assert world.steps[0] == ReadDigests(((ORIGIN, 5),))
    (record,) = world.recorded
    assert (record.seq, record.local_digest, record.remote_digest) == (
        5, world.ours(ORIGIN, 5), theirs)

    world = Forked({ORIGIN: 5})
    world.run(investigate("p", PEER_ID, ORIGIN, 5, b"given", theirs, CHAIN, progress_of()))
    assert isinstance(world.steps[0], Request) and world.steps[0].path == DIGESTS_PATH
    assert ReadDigests(((ORIGIN, 5),)) not in world.steps
    assert world.recorded[0].local_digest == b"given"


def test_a_divergence_at_the_first_op_is_searched_from_seq_0() -> None:
    """The search starts at lo = 0 (D(0) is d_0 on both sides): its first probes are
    1..hi-1, never 0, and the first op itself can be where they part."""
    world = Forked({ORIGIN: 1})
    progress = progress_of()
    theirs = world.theirs(ORIGIN, 5)
    recorded = world.run(investigate("p", PEER_ID, ORIGIN, 5, world.ours(ORIGIN, 5), theirs,
                                     CHAIN, progress))
    assert world.digest_requests() == [[1, 2, 3, 4]]
    assert progress.diverged_at == 1 and progress.digest_requests == 1
    ops = [s for s in world.steps if isinstance(s, Request) and s.path == "/sync/ops"]
    assert [r.params for r in ops] == [{"origin": ORIGIN, "after": 0, "limit": OPS_RECORDED}]
    (record,) = world.recorded
    assert (record.origin, record.seq, record.peer) == (ORIGIN, 1, PEER_ID)
    assert (record.local_digest, record.remote_digest) == (world.ours(ORIGIN, 1),
                                                           world.theirs(ORIGIN, 1))
    assert recorded == 1 and progress.conflicts == 1
    assert progress.stop_reason == (f"{STOP_DIVERGED} from origin_seq 1: recorded, "
                                    "nothing overwritten")


def test_the_peers_ops_must_start_at_the_divergent_seq() -> None:
    """The page of the peer's ops is asked from the first divergent seq; an op below it
    in the answer is a protocol error, not recorded as a fork."""
    op = {"origin_replica": ORIGIN}

    def answer(origin: str, after: int) -> dict:
        assert after == 4
        return {"events": [dict(op, origin_seq=4), dict(op, origin_seq=5)]}
    world = Forked({ORIGIN: 5}, ops_answer=answer)
    with pytest.raises(PeerProtocolError, match="must be an integer above 4"):
        world.run(investigate("p", PEER_ID, ORIGIN, 9, b"o", b"t", CHAIN, progress_of()))
    assert world.recorded == []

    world = Forked({ORIGIN: 5}, ops_answer=lambda o, a: {
        "events": [dict(op, origin_seq=5), dict(op, origin_seq=7)]})
    assert world.run(investigate("p", PEER_ID, ORIGIN, 9, b"o", b"t", CHAIN,
                                 progress_of())) == 3
    assert [e["origin_seq"] for e in world.recorded[0].remote_ops] == [5, 7]


def test_at_most_four_divergent_origins_are_searched_per_round() -> None:
    """Six origins whose tips differ: the first four (sorted) are searched and recorded,
    the other two stop as diverged with no request, found again next round."""
    origins = [rid(n) for n in range(1, 7)]
    world = Forked(dict.fromkeys(origins, 3), tops=dict.fromkeys(origins, 10))
    report = world.run(pull_round(rid(0xAA), "p"))
    assert MAX_SEARCHES_PER_ROUND == divergence.MAX_SEARCHES_PER_ROUND == 4
    assert report.searches == 4
    assert [r.origin for r in world.recorded] == origins[:4]
    assert [r.seq for r in world.recorded] == [3] * 4
    for origin in origins[:4]:
        assert report.origins[origin].diverged_at == 3
    for origin in origins[4:]:
        progress = report.origins[origin]
        assert progress.stop_reason == STOP_DIVERGED and progress.diverged_at is None
        assert progress.digest_requests == 0
    searched = {r.params["origin"] for r in world.steps if isinstance(r, Request)
                and r.path in (DIGESTS_PATH, "/sync/ops")}
    assert searched == set(origins[:4])


# --- pagechain.py: which ops carry signatures, and what a page proves ----------------

KEY = SigningKey(b"\x07" * 32)
PUBLIC = public_key_of(KEY)


def synthetic_op(seq: int, **fields: Any) -> dict[str, Any]:
    """An op as served (only the chain reads it here: no store involved)."""
    return {"id": f"evt_{seq:032x}", "origin_replica": ORIGIN, "origin_seq": seq,
            "hlc": f"{1_700_000_000_000 + seq:013d}-000000-{ORIGIN}", "type": "task.ask",
            "stream": "s", "room": "r", "topic": None, "from_agent": "alice",
            "to_agent": None, "correlation_id": None, "branch": None, "base_commit": None,
            "status": None, "artifact_ids": [], "body": f"op {seq}",
            "created_at": "2026-01-01T00:00:00Z", "metadata": {}} | fields


def signed_chain(ops: list[dict[str, Any]], prev: bytes) -> tuple[dict[int, bytes],
                                                                 dict[int, bytes]]:
    """The digests and the author's signatures of every op, chained from `prev`."""
    digests, sigs = {}, {}
    for op in ops:
        prev = next_digest(prev, canonical_op(op, []))
        digests[op["origin_seq"]] = prev
        sigs[op["origin_seq"]] = sign_digest(KEY, prev)
    return digests, sigs


def test_checkpoints_are_every_64th_seq_and_the_pages_last_op() -> None:
    assert CHECKPOINT == 64
    assert carries_signature(64, 100) and carries_signature(128, 130)
    assert not carries_signature(63, 100) and not carries_signature(65, 100)
    assert not carries_signature(127, 130) and not carries_signature(1, 130)
    assert carries_signature(100, 100) and carries_signature(1, 1)
    assert carries_signature(int("1000"), 1000)           # compared by value
    assert not carries_signature(101, 100)                # not an op of that page


def test_signed_end_keeps_up_to_the_last_signed_op_even_the_first() -> None:
    assert signed_end([1, 2, 3], {1}) == 1
    assert signed_end([1, 2, 3], {2, 3}) == 3                # the last op itself first
    assert signed_end([5, 6, 7], {5, 6}) == 2
    assert signed_end([9], {9}) == 1
    assert signed_end([], set()) == 0


def test_a_page_proof_is_a_frozen_value() -> None:
    proof = PageProof({}, {}, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        proof.digests = {1: b"x"}  # type: ignore[misc]


def test_a_page_keeps_only_the_signatures_at_checkpoints_and_its_last_op() -> None:
    """Signatures at other seqs are neither checked nor kept, even a garbage one."""
    ops = [synthetic_op(s) for s in range(1, 131)]
    start = chain_start(ORIGIN)
    digests, sigs = signed_chain(ops, start)
    sigs[5] = b"\x00" * 64                                  # never looked at
    proof = verify_page(PUBLIC, start, ops, {}, sigs)
    assert isinstance(proof, PageProof)
    assert proof.signatures == {64: sigs[64], 128: sigs[128], 130: sigs[130]}
    assert proof.digests == digests
    assert proof.links[1] == (start, digests[1]) and proof.links[65] == (digests[64],
                                                                       digests[65])


def test_a_bad_signature_names_the_ops_it_covers() -> None:
    """The failing signature covers the ops after the last one that verified."""
    start = chain_start(ORIGIN)
    ops = [synthetic_op(s) for s in range(1, 131)]
    _, sigs = signed_chain(ops, start)
    for altered, (seq, first) in {100: (128, 65), 10: (64, 1), 129: (130, 129)}.items():
        served = [dict(op, body="forged") if op["origin_seq"] == altered else op
                  for op in ops]
        assert verify_page(PUBLIC, start, served, {}, sigs) == (
            BAD_SIGNATURE, seq, f"the origin's signature at origin_seq {seq} does not verify "
            f"over the chain of ops {first}..{seq} as served (one of them altered or "
            "invented, or an artifact's content swapped)")
    # a page from an unaligned offset: covered from its own first op
    digests, sigs = signed_chain(ops, start)
    page = [dict(op, body="forged") if op["origin_seq"] == 61 else op for op in ops[59:70]]
    reason, seq, sentence = verify_page(PUBLIC, digests[59], page, {}, sigs)  # type: ignore[misc]
    assert (reason, seq) == (BAD_SIGNATURE, 64) and "ops 60..64 as served" in sentence


def test_a_page_without_its_end_signature_is_unsigned_at_its_last_seq() -> None:
    start = chain_start(ORIGIN)
    ops = [synthetic_op(s) for s in range(1, 6)]
    _, sigs = signed_chain(ops, start)
    del sigs[5]
    sentence = "the page of a signed origin does not carry the signature of its last op"
    assert verify_page(PUBLIC, start, ops, {}, sigs) == (UNSIGNED, 5, sentence)
    last = dict(ops[-1], origin_seq="5")                    # not a seq at all
    assert verify_page(PUBLIC, start, [*ops[:-1], last], {}, sigs) == (UNSIGNED, 0, sentence)


@pytest.mark.parametrize(("ids", "why"), [
    (None, "artifact_ids is not a list of ids"),
    ("abc", "artifact_ids='abc' is invalid: must be a list of artifact id strings"),
    ([1], "artifact_ids[]=1 is invalid: must be 1-128 chars"),
    (["art_ok", 2], "artifact_ids[]=2 is invalid: must be 1-128 chars"),
    ({"a": 1}, "artifact_ids={'a': 1} is invalid: must be a list of artifact id strings"),
])
def test_artifact_ids_that_are_not_a_list_of_ids_are_a_chain_mismatch(ids: Any,
                                                                        why: str) -> None:
    """The reason an operator reads in the quarantine is the validator's sentence (or
    the failure's own words), never an exception's repr."""
    start = chain_start(ORIGIN)
    ops = [synthetic_op(s) for s in range(1, 4)]
    _, sigs = signed_chain(ops, start)
    ops[1] = dict(ops[1], artifact_ids=ids)
    reason, seq, sentence = verify_page(PUBLIC, start, ops, {}, sigs)  # type: ignore[misc]
    assert (reason, seq) == (CHAIN_MISMATCH, 2)
    assert sentence.startswith("the op cannot be put on the origin's chain: " + why)
    assert "Error(" not in sentence


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_metadata_holding_nan_is_refused_in_the_validators_words(bad: float) -> None:
    """Review 2026-12-03: a page frame's op with NaN metadata was quarantined as
    "...: ValueError('Out of range float values are not JSON compli..."."""
    start = chain_start(ORIGIN)
    ops = [synthetic_op(s) for s in range(1, 4)]
    _, sigs = signed_chain(ops, start)
    ops[1] = dict(ops[1], metadata={"x": bad})
    reason, seq, sentence = verify_page(PUBLIC, start, ops, {}, sigs)  # type: ignore[misc]
    assert (reason, seq) == (CHAIN_MISMATCH, 2)
    assert sentence.endswith("is invalid: must not hold NaN or Infinity (not JSON)")
    assert "Error(" not in sentence and "\n" not in sentence


def test_an_op_naming_an_artifact_nobody_brought_is_missing_at_that_op() -> None:
    start = chain_start(ORIGIN)
    ops = [synthetic_op(s) for s in range(1, 4)]
    _, sigs = signed_chain(ops, start)
    ops[1] = dict(ops[1], artifact_ids=["art_here", "art_gone"])
    sentence = "names artifact 'art_gone', which is not present"
    assert verify_page(PUBLIC, start, ops, {"art_here": "ab" * 32}, sigs) == (
        MISSING_ARTIFACT, 2, sentence)
    ops[1] = dict(ops[1], origin_seq=None)
    assert verify_page(PUBLIC, start, ops, {"art_here": "ab" * 32}, sigs) == (
        MISSING_ARTIFACT, 0, sentence)


def test_an_op_without_an_integer_seq_is_a_chain_mismatch_at_seq_0() -> None:
    start = chain_start(ORIGIN)
    ops = [synthetic_op(s) for s in range(1, 4)]
    _, sigs = signed_chain(ops, start)
    ops[1] = dict(ops[1], origin_seq="2")
    reason, seq, sentence = verify_page(PUBLIC, start, ops, {}, sigs)  # type: ignore[misc]
    assert (reason, seq) == (CHAIN_MISMATCH, 0)
    assert "origin_seq='2' is invalid: must be a positive integer" in sentence


@pytest.mark.parametrize("index", [0, 2])
def test_the_op_that_cannot_be_chained_is_the_one_quarantined(tmp_path: Path,
                                                              index: int) -> None:
    """Not the page's last op: the failing one (`_refuse` finds it by the seq
    `verify_page` names)."""
    a, r, c = (Store.open(tmp_path / n) for n in ("a", "r", "c"))
    sig_append(a, 5)
    sig_pull(r, Relay(a))

    def tamper(request: Request, body: Any) -> Any:
        if request.path == "/sync/ops" and body.get("events"):
            body["events"][index]["body"] = 5
        return body
    report = sig_pull(c, Relay(r, tamper))
    assert report.origins[a.replica_id].applied == 0
    assert report.origins[a.replica_id].quarantined == 1
    (bad,) = c.list_quarantine(10)
    assert bad["origin_seq"] == index + 1 and bad["reason"].startswith(CHAIN_MISMATCH)
    assert "body=5 is invalid: must be a string" in bad["reason"]



# --- store/chainreads.py: digests, tips, signatures, divergence records -------------

def own_store(tmp_path: Path, count: int, name: str = "s") -> Store:
    store = Store.open(tmp_path / name)
    sig_append(store, count)
    return store


def test_digests_at_each_seq_in_order_none_outside_the_chain(tmp_path: Path) -> None:
    s = own_store(tmp_path, 3)
    o, other = s.replica_id, rid(0xEE)
    d = {n: s.chain_digest(o, n) for n in (1, 2, 3)}
    conn = s._reader()
    assert digests_at(conn, o, [0, 1, 3, 4, -1, 2]) == [chain_start(o), d[1], d[3], None, None,
                                                         d[2]]
    assert digests_at(conn, o, [9, 1]) == [None, d[1]]       # one unknown seq ends nothing
    assert digests_at(conn, other, [0, 1, -1]) == [chain_start(other), None, None]


def test_tips_are_given_only_where_the_chain_covers_the_vector(tmp_path: Path) -> None:
    s = own_store(tmp_path, 3)
    o, other = s.replica_id, rid(0xEE)
    tip = (3, s.chain_digest(o, 3))
    conn = s._reader()
    assert tips(conn, {o: 3}) == {o: tip}
    assert tips(conn, {o: 2}) == {o: tip}                    # the chain is ahead: its tip
    assert tips(conn, {o: 4}) == {}                          # behind the vector: no tip
    assert tips(conn, {other: 0}) == {}                      # no chain at all
    assert s.chain_tips() == {o: tip}                        # default: the store's vector
    assert s.chain_tips({}) == {} and s.chain_tips({o: 1}) == {o: tip}


def test_a_divergence_record_holds_both_versions_and_forks_only_differing_ops(
        tmp_path: Path) -> None:
    s = own_store(tmp_path, 6)
    o = s.replica_id
    held = s.list_ops(o, 0, 10)
    theirs = {n: dict(held[n - 1], id=f"evt_theirs_{n}", body=f"theirs {n}") for n in (3, 5)}
    same_4 = dict(held[3])                                   # the same op, on their chain
    hostile = dict(held[5], origin_seq=2**63)                # passes parse_page, not a seq
    recorded = s.record_divergence(origin=o, seq=3, peer="peer-x", local_digest=b"\x01" * 32,
                                   remote_digest=b"\x02" * 32,
                                   remote_ops=[theirs[3], same_4, theirs[5], hostile])
    assert recorded == 2
    (div,) = [c for c in s.list_conflicts(50) if c["kind"] == "divergence"]
    assert (div["origin_seq"], div["item_id"]) == (3, held[2]["id"])    # our op's id
    assert div["local"]["op"]["id"] == held[2]["id"] and div["local"]["digest"] == "01" * 32
    assert div["remote"] == {"op": theirs[3], "digest": "02" * 32, "peer": "peer-x"}
    forks = [c for c in s.list_conflicts(50) if c["kind"] == "fork"]
    assert [(c["origin_seq"], c["remote"]["id"]) for c in forks] == [(5, "evt_theirs_5")]


def test_a_divergence_where_the_peer_has_no_op_at_that_seq(tmp_path: Path) -> None:
    """Their ops start above the divergent seq: the record has no remote op there, and
    every op they have at a seq we hold differently is a fork."""
    s = own_store(tmp_path, 6)
    o = s.replica_id
    held = s.list_ops(o, 0, 10)
    theirs = [dict(held[n - 1], id=f"evt_theirs_{n}", body=f"theirs {n}") for n in (4, 5)]
    hostile = dict(held[5], origin_seq=2**63)
    assert s.record_divergence(origin=o, seq=3, peer="p", local_digest=None, remote_digest=None,
                               remote_ops=[*theirs, hostile]) == 3
    (div,) = [c for c in s.list_conflicts(50) if c["kind"] == "divergence"]
    assert div["remote"]["op"] is None and div["local"]["digest"] is None
    forks = sorted(c["origin_seq"] for c in s.list_conflicts(50) if c["kind"] == "fork")
    assert forks == [4, 5]


def test_a_divergence_at_the_first_op_and_an_op_without_a_valid_seq(tmp_path: Path) -> None:
    s = own_store(tmp_path, 3)
    o = s.replica_id
    held = s.list_ops(o, 0, 10)
    theirs_1 = dict(held[0], id="evt_theirs_1", body="theirs 1")
    for bad_seq in (2**63, 0, -1, None, "2", True):
        bad = dict(held[1], body="no seq", origin_seq=bad_seq)
        assert s.record_divergence(origin=o, seq=1, peer="p", local_digest=None,
                                   remote_digest=None, remote_ops=[theirs_1, bad]) == 1
    (div,) = [c for c in s.list_conflicts(50) if c["kind"] == "divergence"]
    assert div["origin_seq"] == 1 and div["remote"]["op"] == theirs_1
    assert [c for c in s.list_conflicts(50) if c["kind"] == "fork"] == []


def test_a_divergence_at_a_seq_we_do_not_hold_is_named_by_their_op(tmp_path: Path) -> None:
    """Seqs compared by value (a large one parsed from JSON is another int object); the
    record's item is their op's id when it is a valid id, else none."""
    s = own_store(tmp_path, 1)
    o = s.replica_id
    op = json.loads(json.dumps(dict(s.list_ops(o, 0, 1)[0], origin_seq=1000,
                                    id="evt_theirs_1000")))
    assert s.record_divergence(origin=o, seq=int("1000"), peer="p", local_digest=None,
                               remote_digest=None, remote_ops=[op]) == 1
    top = json.loads(json.dumps(dict(op, origin_seq=MAX_SEQ, id="bad id!")))
    assert s.record_divergence(origin=o, seq=MAX_SEQ, peer="p", local_digest=None,
                               remote_digest=None, remote_ops=[top]) == 1
    divs = {c["origin_seq"]: c for c in s.list_conflicts(50) if c["kind"] == "divergence"}
    assert divs[1000]["item_id"] == "evt_theirs_1000" and divs[1000]["remote"]["op"] == op
    assert divs[1000]["local"]["op"] is None
    assert divs[MAX_SEQ]["item_id"] is None and divs[MAX_SEQ]["remote"]["op"] == top


def test_an_invalid_op_at_a_held_seq_is_a_fork_not_an_error(tmp_path: Path) -> None:
    s = own_store(tmp_path, 3)
    o = s.replica_id
    held = s.list_ops(o, 0, 10)
    invalid = dict(held[2], type=5)                          # the validator refuses it
    assert s.record_divergence(origin=o, seq=2, peer="p", local_digest=None,
                               remote_digest=None, remote_ops=[held[1], invalid]) == 2
    (fork,) = [c for c in s.list_conflicts(50) if c["kind"] == "fork"]
    assert fork["origin_seq"] == 3 and fork["remote"] == invalid


def test_at_most_500_forks_are_recorded_per_divergence(tmp_path: Path) -> None:
    s = own_store(tmp_path, 505)
    o = s.replica_id
    held = s.list_ops(o, 0, 505, max_limit=505)
    theirs = [dict(op, id=f"evt_theirs_{op['origin_seq']}", body="theirs") for op in held]
    assert MAX_FORKS_RECORDED == 500
    # the first 500 of their ops are compared: the one at the divergent seq is the
    # divergence record, the other 499 forks
    assert s.record_divergence(origin=o, seq=1, peer="p", local_digest=None,
                               remote_digest=None, remote_ops=theirs[:502]) == 500
    forks = sorted(c["origin_seq"] for c in s.list_conflicts(1000) if c["kind"] == "fork")
    assert forks == list(range(2, 501))


def test_sign_own_chain_does_nothing_while_the_tip_is_signed(tmp_path: Path) -> None:
    top = 2 * CHECKPOINT + 2
    s = own_store(tmp_path, top)
    o = s.replica_id

    def never(digest: bytes) -> bytes:
        raise AssertionError("nothing is signed while the tip is")
    with s._atomic(durable=False) as conn:
        conn.execute("UPDATE logsync_chain SET signature = NULL WHERE origin_seq = ?",
                     (CHECKPOINT,))
        assert sign_own_chain(conn, o, never) == 0
        assert sign_own_chain(conn, rid(0xEE), never) == 0      # no chain at all
    assert s.chain_signature(o, CHECKPOINT) is None
    with s._atomic(durable=False) as conn:
        conn.execute("UPDATE logsync_chain SET signature = NULL WHERE origin_seq IN (?, ?, ?)",
                     (top, top - 1, 1))
        assert sign_own_chain(conn, o, lambda d: sign_digest(s.signing_key, d)) == 2
    assert s.chain_signature(o, 1) is None and s.chain_signature(o, top - 1) is None
    for seq in (CHECKPOINT, top):
        assert verify_digest(s.public_key, s.chain_digest(o, seq), s.chain_signature(o, seq))


def test_signatures_of_any_number_of_seqs(tmp_path: Path) -> None:
    s = own_store(tmp_path, 70)
    o = s.replica_id
    sig = {n: s.chain_signature(o, n) for n in range(1, 71)}
    conn = s._reader()
    assert signatures_of(conn, o, []) == {}
    assert signatures_of(conn, o, [64, 70, 71]) == {64: sig[64], 70: sig[70]}
    assert signatures_of(conn, o, [3, 1]) == {1: sig[1], 3: sig[3]}
    for count in (499, 500, 501, 600):                      # by key or over the range
        assert signatures_of(conn, o, list(range(2, count + 2))) == {
            n: sig[n] for n in range(2, 71)}


def test_a_pages_artifact_shas_prefer_what_is_held(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "s")
    art = s.put_artifact("note", "held content", "alice")
    events = [{"artifact_ids": [art["id"], "art_brought", "art_nobody", 5]}, "not an op",
              {"artifact_ids": "art_not_a_list"}, {"artifact_ids": None}]
    brought = [None, {"id": 5, "sha256": "x"}, {"id": "art_brought", "sha256": "bb"},
               {"id": "art_nobody", "sha256": None}, {"id": art["id"], "sha256": "forged"},
               {"id": "art_unnamed", "sha256": "cc"}]
    assert _page_shas(s._reader(), events, brought) == {
        art["id"]: art["sha256"], "art_brought": "bb", "art_unnamed": "cc"}


def test_a_signed_page_naming_an_artifact_we_hold_is_verified_with_its_sha(
        tmp_path: Path) -> None:
    """The page need not bring an artifact the puller holds: its sha256 comes from the
    store, so the chain (and the signature over it) still checks out."""
    a, c = Store.open(tmp_path / "a"), Store.open(tmp_path / "c")
    art = a.put_artifact("note", "shared content", "alice")
    sig_append(a, 2, artifact_ids=[art["id"]])
    o = a.replica_id
    ops = a.list_ops(o, 0, 10)
    c.pin_keys({o: a.public_key}, o)
    wire = {k: v for k, v in a.get_artifact(art["id"]).items()}
    first = c.apply_chained([ops[0]], [wire], o, 0, chain_start(o),
                            {1: a.chain_signature(o, 1)})
    assert first.applied == 1
    second = c.apply_chained([ops[1]], [], o, 1, a.chain_digest(o, 1),
                             {2: a.chain_signature(o, 2)})
    assert second.applied == 1 and c.list_quarantine(10) == []
    assert c.chain_signature(o, 2) == a.chain_signature(o, 2)


def test_a_verified_signature_is_stored_only_on_the_digest_it_signs(tmp_path: Path) -> None:
    """A restored palace takes its own lost ops back above a slot it re-used: they chain
    from its own op there, so the author's signatures (over the old chain) verify on the
    page but do not fit the digests stored here; they are not stored, and the tip is
    signed anew. Every signature held then verifies over the digest it is stored with."""
    b = own_store(tmp_path, 2, "b")
    b.close()
    shutil.copytree(tmp_path / "b", tmp_path / "backup")
    b = Store.open(tmp_path / "b")
    sig_append(b, 3, "lost")                                # 3, 4, 5
    a = Store.open(tmp_path / "a")
    sig_pull(a, Relay(b))
    o = b.replica_id
    old = {n: a.chain_signature(o, n) for n in (3, 4, 5)}
    b.close()
    shutil.rmtree(tmp_path / "b")
    shutil.copytree(tmp_path / "backup", tmp_path / "b")
    b = Store.open(tmp_path / "b")
    sig_append(b, 1, "re-used")                             # a new op at slot 3
    sig_pull(b, Relay(a))
    assert b.version_vector()[o] == 5
    assert b.chain_signature(o, 5) != old[5]
    for n in range(1, 6):
        signature = b.chain_signature(o, n)
        if signature is not None:
            assert verify_digest(b.public_key, b.chain_digest(o, n), signature), n
    p = Store.open(tmp_path / "p")
    sig_pull(p, Relay(b))
    assert p.version_vector()[o] == 5 and p.list_quarantine(10) == []


def test_a_current_chain_is_read_without_a_write(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Bringing a chain up to date writes; a chain that covers its ops (and, ours, has a
    signed tip) is only read: no write transaction, for our origin, other origins stored
    unsigned (ids sorting below and above ours), or an origin with no ops at all."""
    s = Store.open(tmp_path / "s", replica_id="rep_" + "8" * 32)
    sig_append(s, 300)                                       # seqs past the cached ints
    others = [Store.open(tmp_path / n, replica_id=i) for n, i in
              (("low", "rep_" + "0" * 31 + "1"), ("high", "rep_" + "f" * 32))]
    for other in others:
        sig_append(other, 2)
        s.apply_remote(other.list_ops(other.replica_id, 0, 10))
        assert s.chain_signature(other.replica_id, 2) is None  # remote ops: stored unsigned

    def no_write(**_: Any) -> Any:
        raise AssertionError("a current chain was written to")
    monkeypatch.setattr(s, "_atomic", no_write)
    o, x = s.replica_id, rid(0xEE)
    assert s.chain_digests_at(o, [1, 300]) == [s.chain_digest(o, 1), s.chain_digest(o, 300)]
    for other in others:
        origin = other.replica_id
        assert s.chain_digests_at(origin, [2]) == [other.chain_digest(origin, 2)]
    assert s.chain_digests_at(x, [0, 1]) == [chain_start(x), None]


def test_only_our_own_origin_is_signed_with_our_key(tmp_path: Path) -> None:
    """Ops of another origin applied from a chained page whose key we do not know stay
    unsigned here, whichever way its id sorts against ours."""
    s = Store.open(tmp_path / "s", replica_id="rep_" + "8" * 32)
    sig_append(s, 1)
    for name, origin in (("low", "rep_" + "0" * 31 + "1"), ("high", "rep_" + "f" * 32)):
        other = Store.open(tmp_path / name, replica_id=origin)
        sig_append(other, 3)
        ops = other.list_ops(origin, 0, 10)
        result = s.apply_chained(ops, [], origin, 0, chain_start(origin))
        assert result.applied == 3
        assert [s.chain_signature(origin, n) for n in (1, 2, 3)] == [None] * 3
        assert s.chain_digests_at(origin, [3]) == [other.chain_digest(origin, 3)]
        assert s.chain_signature(origin, 3) is None


def test_our_unsigned_tip_is_signed_before_our_chain_is_compared(tmp_path: Path) -> None:
    s = own_store(tmp_path, 3)
    o = s.replica_id
    with s._atomic(durable=False) as conn:                   # as another program leaves it
        conn.execute("UPDATE logsync_chain SET signature = NULL WHERE origin_seq = 3")
    assert s.chain_digests_at(o, [3]) == [s.chain_digest(o, 3)]
    assert verify_digest(s.public_key, s.chain_digest(o, 3), s.chain_signature(o, 3))


def test_our_own_ops_a_relay_cannot_prove_are_recorded_not_recovered(tmp_path: Path) -> None:
    """A restored palace meets a relay that holds its lost ops without signatures: they
    are recorded as forged_origin, not taken back; the relay that can prove them
    (signatures passed on) gives them back."""
    b = own_store(tmp_path, 2, "b")
    b.close()
    shutil.copytree(tmp_path / "b", tmp_path / "backup")
    b = Store.open(tmp_path / "b")
    sig_append(b, 3, "lost")
    a = Store.open(tmp_path / "a")
    sig_pull(a, Relay(b))
    o = b.replica_id
    b.close()
    shutil.rmtree(tmp_path / "b")
    shutil.copytree(tmp_path / "backup", tmp_path / "b")
    b = Store.open(tmp_path / "b")

    def strip(request: Request, body: Any) -> Any:
        if request.path == "/sync/ops" and isinstance(body.get("chain"), dict):
            body["chain"]["sigs"] = []
        return body
    sig_pull(b, Relay(a, strip))
    assert b.version_vector()[o] == 2
    refused = [c for c in b.list_conflicts(50) if c["kind"] == "forged_origin"]
    assert sorted(c["origin_seq"] for c in refused) == [3, 4, 5]
    sig_pull(b, Relay(a))
    assert b.version_vector()[o] == 5


def test_a_key_change_records_both_keys_and_what_happened(tmp_path: Path) -> None:
    c = Store.open(tmp_path / "c")
    k1, k2, k3, k4 = (public_key_of(SigningKey(bytes([n]) * 32)) for n in (1, 2, 3, 4))
    x, y = rid(0x33), self_certifying_id(k3)
    assert c.pin_keys({x: k1}, x) == {x: "new"}             # from the origin: pinned
    assert c.pin_keys({x: k2}, x) == {x: "changed"}
    assert c.pin_keys({y: k4}, y) == {y: "new"}             # pinned, not certified
    assert c.pin_keys({y: k3}, "peer-z") == {y: "replaced"}  # its id certifies k3
    changes = {r["origin_replica"]: r for r in c.list_conflicts(50)
               if r["kind"] == "key_change"}
    assert changes[x]["local"] == {"public_key": k1.hex()}
    assert changes[x]["remote"] == {"public_key": k2.hex(), "peer": x}
    assert "the held key stays, and ops signed by the other are refused" in \
        changes[x]["reason"]
    assert changes[y]["local"] == {"public_key": k4.hex()}
    assert "the origin's id certifies it, so it replaces the key pinned on first sight" in \
        changes[y]["reason"]
    assert c.public_keys()[x] == k1 and c.public_keys()[y] == k3


def test_keys_already_held_are_not_written_again(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    c = Store.open(tmp_path / "c")
    x = rid(0x33)
    k1 = public_key_of(SigningKey(b"\x01" * 32))
    assert c.pin_keys({x: k1}, x) == {x: "new"}

    def no_write(**_: Any) -> Any:
        raise AssertionError("a held key was written again")
    monkeypatch.setattr(c, "_atomic", no_write)
    assert c.pin_keys({x: bytes(k1), c.replica_id: bytes(c.public_key)}, x) == {
        x: "same", c.replica_id: "same"}


def test_at_most_16_key_changes_are_recorded_per_answer(tmp_path: Path) -> None:
    c = Store.open(tmp_path / "c")
    k2 = public_key_of(SigningKey(b"\x02" * 32))
    origins = [rid(0x100 + n) for n in range(18)]
    for n, origin in enumerate(origins):                     # each its own pinned key
        c.pin_keys({origin: public_key_of(SigningKey(bytes([0x40 + n]) * 32))}, origin)
    assert MAX_KEY_CHANGES_RECORDED == 16
    assert c.pin_keys(dict.fromkeys(origins, k2), "peer-z") == dict.fromkeys(origins, "changed")
    changes = [r for r in c.list_conflicts(50) if r["kind"] == "key_change"]
    assert sorted(r["origin_replica"] for r in changes) == origins[:16]


def test_a_failed_chain_read_is_a_store_error_naming_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = own_store(tmp_path, 1)
    broken = sqlite3.connect(":memory:")
    broken.close()                                           # any use: sqlite3.ProgrammingError
    monkeypatch.setattr(s, "_reader", lambda: broken)
    o = s.replica_id
    for read in (lambda: s.chain_tips({o: 1}), lambda: s.chain_signatures(o, [1])):
        with pytest.raises(StoreError, match=str(s.db_path)):
            read()
