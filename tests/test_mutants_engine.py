"""Mutants of logsync/engine.py that tests/test_engine.py let live (issue 9,
scripts/mutation.py).

The round is sans-IO, so these tests drive it against a synthetic world: a peer whose
origins hold ops 1..top (generated on demand, so a 50 000-op cap costs no database) and
a local store that records what it applies. Faults are scripted per origin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logsync import engine
from logsync.effects import ApplyPage, MissingArtifacts, ReadOwnSeen, ReadVector
from logsync.engine import (
    Batch,
    Extensions,
    OriginProgress,
    Request,
    RoundReport,
    error_kind,
    missing_ranges,
    pull_origin,
    pull_round,
    referenced_artifacts,
    targeted_origin,
)
from logsync.errors import (
    PeerError,
    PeerProtocolError,
    PeerTooLargeError,
    PeerTransientError,
    StoreError,
    ValidationError,
)
from logsync.store.apply import ApplyResult


def rid(n: int) -> str:
    return f"rep_{n:032x}"


OWN = rid(0xA0)
PEER_ID = rid(0xB0)
LARGE = {"extensions": ["large_pages"], "max_page": 5000}


class World:
    """A peer serving ops 1..served[origin] per origin (its vector says `tops`) and a
    local store holding `held`. `faults[origin]` lists errors to raise, one per ops
    request, before serving; `absent` artifacts 404."""

    def __init__(self, tops: dict[str, int], held: dict[str, int] | None = None, *,
                 served: dict[str, int] | None = None, advert: dict | None = None,
                 artifacts_per_op: int = 0, absent: set[str] | None = None,
                 too_large_above: int | None = None,
                 names: Callable[[int], Any] | None = None) -> None:
        self.tops = dict(tops)
        self.served = dict(served or tops)
        self.held = dict(held or {})
        self.advert = advert
        self.artifacts_per_op = artifacts_per_op
        self.absent = set(absent or ())
        self.too_large_above = too_large_above
        self.names = names  # seq -> the op's artifact_ids, instead of artifacts_per_op
        self.faults: dict[str, list[Exception]] = {}
        self.steps: list[Any] = []
        self.applied: dict[str, list[int]] = {}

    # the peer
    def peer(self, request: Request) -> Any:
        if request.path == "/sync/version_vector":
            body: dict[str, Any] = {"replica_id": PEER_ID, "version_vector": dict(self.tops)}
            if self.advert is not None:
                body["logsync"] = self.advert
            return body
        if request.path == "/sync/artifact":
            art_id = request.params["id"]
            if art_id in self.absent:
                if request.missing_ok:
                    return None
                raise PeerProtocolError(f"GET /sync/artifact: 404 for {art_id}", peer="p")
            return {"artifact": {"id": art_id}}
        assert request.path == "/sync/ops", request
        origin, after, limit = (request.params[k] for k in ("origin", "after", "limit"))
        faults = self.faults.get(origin)
        if faults:
            raise faults.pop(0)
        if self.too_large_above is not None and limit > self.too_large_above:
            raise PeerTooLargeError("answer too large", peer="p")
        top = self.served.get(origin, 0)
        events = [self.op(origin, s) for s in range(after + 1, min(after + limit, top) + 1)]
        return {"events": events}

    def op(self, origin: str, seq: int) -> dict[str, Any]:
        arts = [f"art_{origin[-4:]}_{seq}_{i}" for i in range(self.artifacts_per_op)]
        if self.names is not None:
            arts = self.names(seq)
        return {"origin_replica": origin, "origin_seq": seq, "artifact_ids": arts}

    # the local store
    def store(self, effect: Any) -> Any:
        if isinstance(effect, ReadVector):
            return dict(self.held)
        if isinstance(effect, ReadOwnSeen):
            return self.held.get(OWN, 0)
        if isinstance(effect, MissingArtifacts):
            return list(effect.ids)
        assert isinstance(effect, ApplyPage)
        origin = effect.events[0]["origin_replica"]
        held = self.held.get(origin, 0)  # an op at or below it (the overlap) is a duplicate
        seqs = [e["origin_seq"] for e in effect.events if e["origin_seq"] > held]
        self.applied.setdefault(origin, []).extend(seqs)
        self.held[origin] = max([held, *seqs])
        return ApplyResult(applied=len(seqs), duplicates=len(effect.events) - len(seqs),
                           high_water={origin: self.held[origin]})

    # the driver
    def run(self, gen: Any, *, throw_batch_failure: bool = False,
            batch_answer: Callable[[Batch, list], Any] | None = None) -> Any:
        """Drive a round: store effects here, requests to the peer; what either raises
        is thrown into the round. A Batch is answered by a list (a failed request by its
        PeerError), or the first failure is thrown in (`throw_batch_failure`)."""
        try:
            step = next(gen)
            while True:
                self.steps.append(step)
                try:
                    if isinstance(step, ReadVector | ReadOwnSeen | MissingArtifacts | ApplyPage):
                        answer: Any = self.store(step)
                    elif isinstance(step, Batch):
                        answer = [self._outcome(r) for r in step.requests]
                        failed = [a for a in answer if isinstance(a, PeerError)]
                        if throw_batch_failure and failed:
                            raise failed[0]
                        if batch_answer is not None:
                            answer = batch_answer(step, answer)
                    else:
                        answer = self.peer(step)
                except Exception as exc:  # noqa: BLE001 - the round decides what it means
                    step = gen.throw(exc)
                    continue
                step = gen.send(answer)
        except StopIteration as stop:
            return stop.value

    def _outcome(self, request: Request) -> Any:
        try:
            return self.peer(request)
        except PeerError as exc:
            return exc

    def batches(self) -> list[Batch]:
        return [s for s in self.steps if isinstance(s, Batch)]

    def ops_requests(self) -> list[Request]:
        out: list[Request] = []
        for step in self.steps:
            requests = step.requests if isinstance(step, Batch) else (step,)
            out += [r for r in requests if isinstance(r, Request) and r.path == "/sync/ops"]
        return out


def round_of(world: World, **options: Any) -> RoundReport:
    throw = options.pop("throw_batch_failure", False)
    batch_answer = options.pop("batch_answer", None)
    return world.run(pull_round(OWN, "p", **options), throw_batch_failure=throw,
                     batch_answer=batch_answer)


# ── missing_ranges: what a round asks for ─────────────────────────────

vectors = st.dictionaries(st.sampled_from([rid(n) for n in (0x10, 0xA0, 0xF0)]),
                          st.integers(0, 6), max_size=3)


@settings(max_examples=300, deadline=None)
@given(vectors, vectors, st.integers(0, 8))
def test_missing_ranges_asks_each_origin_for_exactly_what_the_peer_has_more_of(
    local: dict[str, int], remote: dict[str, int], own_seen: int
) -> None:
    """Every origin the peer holds more of, in origin order, from what we hold up to the
    peer's top; our own origin from the start only when the peer shows more than we have
    ever seen (held, or refused)."""
    ranges = missing_ranges(local, remote, OWN, own_seen)
    expected = []
    for origin in sorted(remote):
        held = local.get(origin, 0)
        if remote[origin] > held:
            whole = origin == OWN and remote[origin] > max(held, own_seen)
            expected.append((origin, 0 if whole else held, remote[origin]))
    assert ranges == expected
    assert all(after < top for _, after, top in ranges)


def test_an_origin_the_peer_has_less_of_is_not_asked_for() -> None:
    other = rid(0xF0)  # sorts after OWN
    assert missing_ranges({other: 5, OWN: 4}, {other: 3, OWN: 2}, OWN) == []
    world = World({other: 3}, {other: 5})
    report = round_of(world)
    assert world.ops_requests() == [] and report.origins == {}


def test_our_own_origin_lost_in_a_restore_is_asked_for_from_the_start() -> None:
    assert missing_ranges({}, {OWN: 3}, OWN) == [(OWN, 0, 3)]
    assert missing_ranges({OWN: 2}, {OWN: 5}, OWN, 3) == [(OWN, 0, 5)]
    assert missing_ranges({OWN: 2}, {OWN: 5}, OWN, 7) == [(OWN, 2, 5)]
    other = rid(0xF0)
    assert missing_ranges({other: 2}, {other: 5}, OWN, 0) == [(other, 2, 5)]


# ── the round's options ───────────────────────────────────────────────


def test_round_options_are_keyword_only() -> None:
    """A positional page_limit (or a flag in the wrong place) is refused, not taken as
    something else."""
    with pytest.raises(TypeError):
        pull_round(OWN, "p", 5)  # type: ignore[misc]
    with pytest.raises(TypeError):
        targeted_origin("p", OWN, 3, Extensions(), RoundReport(peer="p"), 5)  # type: ignore[misc]
    progress = OriginProgress(origin=OWN, start=0, target=3, reached=0)
    with pytest.raises(TypeError):
        pull_origin("p", progress, Extensions(), 5, False, RoundReport(peer="p"),  # type: ignore[misc]
                    {"events": []})


@pytest.mark.parametrize("bad", [True, "5", 0, 2.5])
def test_a_page_limit_that_is_not_a_positive_integer_is_refused(bad: Any) -> None:
    world = World({rid(1): 3})
    with pytest.raises(ValidationError, match="page_limit"):
        round_of(world, page_limit=bad)
    assert world.ops_requests() == []


def test_a_small_page_limit_asks_a_large_pages_peer_in_upstream_form() -> None:
    """The large_pages extension is asked for only when a page above 500 is asked."""
    world = World({rid(1): 5}, advert=LARGE)
    round_of(world, page_limit=100)
    (request,) = world.ops_requests()
    assert request.params == {"origin": rid(1), "after": 0, "limit": 100}


# ── first pages side by side ──────────────────────────────────────────


def test_an_unbatched_round_never_yields_a_batch() -> None:
    world = World({rid(n): 2 for n in (1, 2, 3)})
    report = round_of(world)
    assert world.batches() == []
    assert report.total("applied") == 6


def test_a_batched_round_fetches_first_pages_four_origins_at_a_time() -> None:
    world = World({rid(n): 2 for n in range(1, 8)})  # seven origins
    report = round_of(world, batch_artifacts=True)
    assert [len(b.requests) for b in world.batches()] == [4, 3]
    assert report.total("applied") == 14


def test_two_origins_are_fetched_side_by_side() -> None:
    world = World({rid(1): 2, rid(2): 2})
    round_of(world, batch_artifacts=True)
    assert [len(b.requests) for b in world.batches()] == [2]


def test_first_pages_of_a_later_chunk_are_batched_while_one_op_of_budget_is_left() -> None:
    world = World({rid(n): 1 for n in range(1, 7)})  # 4 + 2 origins, one op each
    report = round_of(world, batch_artifacts=True, report=RoundReport(peer="p", ops_budget=5))
    assert [len(b.requests) for b in world.batches()] == [4, 2]
    assert report.total("applied") == 5
    assert report.capped


def test_no_first_pages_are_fetched_when_the_budget_ends_at_a_chunk_boundary() -> None:
    origins = [rid(n) for n in range(1, 7)]  # 4 + 2 origins, one op each
    world = World(dict.fromkeys(origins, 1))
    report = round_of(world, batch_artifacts=True, report=RoundReport(peer="p", ops_budget=4))
    assert [len(b.requests) for b in world.batches()] == [4]
    assert len(world.ops_requests()) == 4
    assert [report.origins[o].stop_reason for o in origins[4:]] == [engine.STOP_CAPPED] * 2


def test_no_first_pages_are_fetched_once_the_round_budget_is_spent() -> None:
    """Prefetched first pages can overspend the budget (a first page is asked at the full
    limit): the origins after that are capped without a request."""
    origins = [rid(n) for n in range(1, 9)]  # 4 + 4 origins, three ops each
    world = World(dict.fromkeys(origins, 3))
    report = round_of(world, batch_artifacts=True, report=RoundReport(peer="p", ops_budget=2))
    assert [len(b.requests) for b in world.batches()] == [4]
    asked = {r.params["origin"] for r in world.ops_requests()}
    assert asked == set(origins[:4])
    assert [report.origins[o].stop_reason for o in origins[4:]] == [engine.STOP_CAPPED] * 4
    assert report.ops_budget < 0 and report.total("applied") == 3


def test_a_driver_that_throws_the_first_failure_of_a_batch_in_gets_each_origin_asked_alone(
) -> None:
    """A driver may throw a Batch's first failure in instead of answering with a list:
    the round then asks each origin of the chunk on its own, so the fault stays with its
    origin (rule 6)."""
    good, bad = rid(1), rid(2)
    world = World({good: 3, bad: 3})
    world.faults[bad] = [PeerProtocolError("broken page", peer="p")] * 2
    report = round_of(world, batch_artifacts=True, throw_batch_failure=True)
    assert [len(b.requests) for b in world.batches()] == [2]
    assert report.origins[good].applied == 3
    assert report.origins[bad].failed
    assert report.failed_origins().keys() == {bad}


def test_a_batch_of_first_pages_answered_with_too_few_answers_is_a_driver_bug() -> None:
    world = World({rid(1): 3, rid(2): 3})
    with pytest.raises(ValueError):
        round_of(world, batch_artifacts=True, batch_answer=lambda batch, answers: answers[:1])


# ── per-origin and per-round caps ─────────────────────────────────────


@pytest.mark.parametrize(("start", "page_limit"), [(0, None), (1000, None), (1000, 300)])
def test_one_origin_takes_at_most_fifty_thousand_ops_of_a_round(
    start: int, page_limit: int | None
) -> None:
    """Counted from what we held when the round began, whatever the page size (the last
    page asks only for what is left of the share)."""
    origin = rid(1)
    world = World({origin: start + 60_000}, {origin: start})
    report = round_of(world, page_limit=page_limit)
    progress = report.origins[origin]
    assert progress.reached == start + 50_000
    assert progress.applied == 50_000
    assert progress.stop_reason == engine.STOP_CAPPED


def test_a_full_page_above_256_ops_is_not_a_short_page() -> None:
    origin = rid(1)
    world = World({origin: 700})
    progress = round_of(world).origins[origin]
    assert (progress.reached, progress.pages, progress.stop_reason) == (
        700, 2, engine.STOP_CAUGHT_UP)


def test_pages_counts_every_ops_page_answered() -> None:
    origin = rid(1)
    world = World({origin: 5})
    progress = round_of(world, page_limit=2).origins[origin]
    assert progress.pages == 3 == len(world.ops_requests())


def test_a_peer_serving_beyond_its_vector_is_caught_up_at_the_first_page_past_it() -> None:
    """The peer's vector said 3; its store grew to 10 before the page was asked: the page
    (5 ops) reaches past the target, and the origin is caught up, not pulled on."""
    origin = rid(1)
    world = World({origin: 3}, served={origin: 10})
    progress = round_of(world, page_limit=5).origins[origin]
    assert (progress.reached, progress.stop_reason) == (5, engine.STOP_CAUGHT_UP)
    assert len(world.ops_requests()) == 1


# ── too large, transient failures ─────────────────────────────────────


def test_too_large_answers_halve_the_page_down_to_one_op() -> None:
    origin = rid(1)
    world = World({origin: 3}, too_large_above=1)
    progress = round_of(world, page_limit=4).origins[origin]
    assert [r.params["limit"] for r in world.ops_requests()][:3] == [4, 2, 1]
    assert (progress.reached, progress.failed) == (3, False)


def transient() -> PeerTransientError:
    return PeerTransientError("connection reset", peer="p")


def test_three_transient_failures_in_a_row_after_a_success_end_the_round() -> None:
    origins = [rid(n) for n in range(1, 5)]
    world = World(dict.fromkeys(origins, 1))
    for origin in origins[1:]:
        world.faults[origin] = [transient()]
    with pytest.raises(PeerTransientError):
        round_of(world, report=(report := RoundReport(peer="p")))
    assert report.origins[origins[0]].applied == 1
    assert all(report.origins[o].failed for o in origins[1:])


def test_a_success_between_transient_failures_starts_the_count_again() -> None:
    origins = [rid(n) for n in range(1, 6)]
    world = World(dict.fromkeys(origins, 1))
    for n in (0, 1, 3, 4):
        world.faults[origins[n]] = [transient()]
    report = round_of(world)
    assert report.origins[origins[2]].applied == 1
    assert report.failed_origins().keys() == {origins[n] for n in (0, 1, 3, 4)}


def test_after_the_peer_counts_as_gone_every_further_transient_failure_ends_the_round() -> None:
    """Targeted pulls share one report (client.run_targeted): once three origins failed
    transiently in a row, a fourth failing origin of the same round ends it too."""
    report = RoundReport(peer="p")
    origins = [rid(n) for n in range(1, 5)]
    world = World(dict.fromkeys(origins, 1))
    outcomes = []
    for origin in origins:
        world.faults[origin] = [transient()]
        try:
            world.run(targeted_origin("p", origin, 1, Extensions(), report, held=0))
            outcomes.append("survived")
        except PeerTransientError:
            outcomes.append("ended")
    assert outcomes == ["survived", "survived", "ended", "ended"]


def test_error_kind_names_store_faults_and_our_own_bugs() -> None:
    assert error_kind(StoreError("disk full")) == "store"
    assert error_kind(ValueError("bug")) == "internal"
    assert error_kind(PeerTransientError("reset", peer="p")) == "transport"


# ── targeted pulls and pull_origin on their own ───────────────────────


def test_a_targeted_pull_below_what_we_hold_asks_nothing() -> None:
    origin = rid(1)
    world = World({origin: 3}, {origin: 5})
    report = RoundReport(peer="p")
    progress = world.run(targeted_origin("p", origin, 3, Extensions(), report))
    assert progress.stop_reason == engine.STOP_CAUGHT_UP
    assert world.ops_requests() == []


def test_a_targeted_pull_fetches_artifacts_one_request_at_a_time_by_default() -> None:
    origin = rid(1)
    world = World({origin: 2}, artifacts_per_op=2)
    report = RoundReport(peer="p")
    progress = world.run(targeted_origin("p", origin, 2, Extensions(), report, held=0))
    assert progress.applied == 2
    assert world.batches() == []
    assert sum(1 for s in world.steps if isinstance(s, Request)
               and s.path == "/sync/artifact") == 4


@pytest.mark.parametrize(("reached", "target"), [(100_000, 100_000), (100_001, 100_000)])
def test_an_empty_page_at_or_past_the_target_is_caught_up(reached: int, target: int) -> None:
    origin = rid(1)
    world = World({origin: target}, {origin: reached}, served={origin: reached})
    progress = OriginProgress(origin=origin, start=reached, target=target, reached=reached)
    world.run(pull_origin("p", progress, Extensions(), 500, False, RoundReport(peer="p")))
    assert (progress.pages, progress.stop_reason) == (1, engine.STOP_CAUGHT_UP)


# ── artifacts ─────────────────────────────────────────────────────────


@pytest.mark.parametrize("batched", [False, True])
def test_an_artifact_the_peer_lacks_is_absent_not_a_failure(batched: bool) -> None:
    """Artifact requests are missing_ok: the peer's 404 is an answer, the op is left to
    the store (which quarantines it), and the origin goes on."""
    origin = rid(1)
    world = World({origin: 2}, artifacts_per_op=1, absent={f"art_{origin[-4:]}_1_0"})
    progress = round_of(world, batch_artifacts=batched).origins[origin]
    assert (progress.failed, progress.artifacts_missing, progress.reached) == (False, 1, 2)


@pytest.mark.parametrize("answer", [
    lambda batch, answers: answers[:-1],
    lambda batch, answers: answers + [None],
    lambda batch, answers: tuple(answers),
    lambda batch, answers: None,
])
def test_an_artifact_batch_must_be_answered_by_a_list_of_its_length(answer: Callable) -> None:
    origin = rid(1)
    world = World({origin: 1}, artifacts_per_op=3)

    def answer_artifacts(batch: Batch, answers: list) -> Any:
        if batch.requests[0].path == "/sync/artifact":
            return answer(batch, answers)
        return answers

    with pytest.raises(RuntimeError, match="must answer a Batch"):
        round_of(world, batch_artifacts=True, batch_answer=answer_artifacts)


# ── how many artifacts a page may name ────────────────────────────────


def test_referenced_artifacts_stops_at_the_op_that_passes_the_cap() -> None:
    """First-seen order, no repeats, and no further ops read once past `cap` (an op that
    brings the count exactly to the cap is not past it)."""
    events = [{"artifact_ids": [f"a{n}", f"b{n}", "a0"]} for n in range(5)]
    assert referenced_artifacts(events, cap=4) == ["a0", "b0", "a1", "b1", "a2", "b2"]
    assert referenced_artifacts(events, cap=100) == [
        x for n in range(5) for x in (f"a{n}", f"b{n}")]


def test_a_page_naming_exactly_ten_thousand_artifacts_is_taken_whole() -> None:
    origin = rid(1)
    world = World({origin: 100}, artifacts_per_op=100)
    progress = round_of(world, page_limit=100, batch_artifacts=True).origins[origin]
    assert [r.params["limit"] for r in world.ops_requests()] == [100]
    assert (progress.applied, progress.failed) == (100, False)
    assert sum(len(b.requests) for b in world.batches()) == 10_000


def test_a_page_naming_one_artifact_more_is_too_large_and_asked_again_smaller() -> None:
    origin = rid(1)

    def names(seq: int) -> list[str]:
        return [f"art_{seq}_{i}" for i in range(101 if seq == 1 else 100)]

    world = World({origin: 100}, names=names)
    progress = round_of(world, page_limit=100, batch_artifacts=True).origins[origin]
    assert [r.params["limit"] for r in world.ops_requests()] == [100, 50, 50]
    assert (progress.applied, progress.failed) == (100, False)


def test_artifact_requests_go_out_256_at_a_time() -> None:
    origin = rid(1)
    world = World({origin: 3}, artifacts_per_op=200)
    round_of(world, batch_artifacts=True)
    artifact_batches = [len(b.requests) for b in world.batches()
                        if b.requests[0].path == "/sync/artifact"]
    assert artifact_batches == [256, 256, 88]


@pytest.mark.parametrize(("ids", "fetched"), [
    ([f"art_{i}" for i in range(256)], 256),  # as many as an op may name
    ([f"art_{i}" for i in range(257)], 0),  # more: left to the store, which quarantines
    ("art_1", 0),  # not a list
    (None, 0),
])
def test_only_a_well_formed_artifact_list_is_fetched(ids: Any, fetched: int) -> None:
    origin = rid(1)
    world = World({origin: 1}, names=lambda seq: ids)
    round_of(world)
    assert sum(1 for s in world.steps
               if isinstance(s, Request) and s.path == "/sync/artifact") == fetched
