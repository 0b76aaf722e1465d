"""`outbox.Outbox`: what a change stream owes one subscriber, and when (one rule for the
daemon's stream and the simulator)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from logsync.ids import is_replica_id
from logsync.outbox import MAX_DIRECT, MAX_OWED, Outbox, direct_header, parse_direct

OWN, SUB = "rep_" + "0" * 32, "rep_" + "5" * 32
X, Y, Z = ("rep_" + c * 32 for c in "abc")


def never(origin: str, top: int) -> bool:
    return False


def test_an_own_op_goes_at_once_then_a_window_gathers_the_next() -> None:
    box = Outbox(OWN, pages=True, coalesce=0.02)
    box.add(OWN, 1, 1, now=10.0)
    write = box.take(10.0, never)
    assert write is not None and write.pages == {OWN: (0, 1)} and not write.named
    box.add(OWN, 2, 2, now=10.005)
    box.add(OWN, 3, 3, now=10.010)
    assert box.due() == 10.02 and box.take(10.01, never) is None  # within the window
    write = box.take(10.02, never)
    assert write is not None and write.pages == {OWN: (1, 3)}  # one page: ops 2..3
    assert box.due() is None


def test_an_origin_the_subscriber_streams_directly_is_named_late_or_with_an_eager_write():
    box = Outbox(OWN, frozenset({X}), pages=True, coalesce=0.02, lazy=1.0)
    box.add(X, 1, 4, now=0.0)
    assert box.due() == 1.0 and box.take(0.5, never) is None
    write = box.take(1.0, never)
    assert write is not None and write.named == {X: 4} and not write.pages  # alone, late
    box.add(X, 5, 5, now=2.0)
    box.add(Y, 1, 1, now=2.1)  # an eager op: the lazy name rides on its write
    write = box.take(2.1, never)
    assert write is not None and write.pages == {Y: (0, 1)} and write.named == {X: 5}


def test_the_publishers_own_ops_are_eager_even_if_named_direct() -> None:
    box = Outbox(OWN, frozenset({OWN}), pages=True)
    box.add(OWN, 1, 1, now=0.0)
    write = box.take(0.0, never)
    assert write is not None and write.pages == {OWN: (0, 1)}


def test_without_pages_eager_ops_are_named() -> None:
    box = Outbox(OWN, pages=False)
    box.add(X, 3, 7, now=0.0)
    write = box.take(0.0, never)
    assert write is not None and write.named == {X: 7} and not write.pages


def test_what_the_subscriber_holds_is_left_out_when_the_write_is_built() -> None:
    box = Outbox(OWN, frozenset({Z}), pages=True)
    box.add(X, 1, 3, now=0.0)
    box.add(Y, 1, 2, now=0.0)
    box.add(Z, 1, 9, now=0.0)
    held = {X: 3, Z: 9}  # learnt after the adds (a frame, a pull): still counts
    write = box.take(0.0, lambda o, t: held.get(o, 0) >= t)
    assert write is not None and write.pages == {Y: (0, 2)} and not write.named
    box.add(X, 4, 4, now=1.0)
    write = box.take(1.0, lambda o, t: True)
    assert write is not None and not write  # all held: nothing to send, nothing owed
    assert box.due() is None


def test_owed_origins_are_bounded_by_owing_a_full_round() -> None:
    box = Outbox(OWN, pages=True)
    for i in range(MAX_OWED + 5):
        box.add(f"rep_{i:032x}", 1, 1, now=0.0)
    assert len(box.eager_owed) + len(box.lazy_owed) <= MAX_OWED
    write = box.take(0.0, never)
    assert write is not None and write.more
    assert box.due() is None and not box.overflow


def test_the_direct_header_is_bounded_and_checked() -> None:
    assert parse_direct(None, is_replica_id) == frozenset()
    assert parse_direct(f"{X},{Y}", is_replica_id) == frozenset({X, Y})
    too_many = ",".join(f"rep_{i:032x}" for i in range(MAX_DIRECT + 1))
    assert parse_direct(too_many, is_replica_id) == \
        f"{MAX_DIRECT + 1} direct origins named; at most {MAX_DIRECT} are taken"
    assert parse_direct(f"{X},nope", is_replica_id) == "direct origin 'nope' is not a replica id"
    assert direct_header([X, None, Y, X, SUB], SUB) == f"{X},{Y}"


ORIGINS = [OWN, X, Y, Z]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(ORIGINS), st.integers(1, 3), st.floats(0, 0.05),
                          st.booleans()), max_size=40),
       st.sets(st.sampled_from(ORIGINS)), st.booleans(), st.dictionaries(
           st.sampled_from(ORIGINS), st.integers(0, 60)))
def test_no_op_is_dropped_unless_the_subscriber_holds_it(
        steps: list, direct: set, pages: bool, held: dict) -> None:
    """Whatever the timing: every op added is, by a take at its due time, written (a page
    reaching it or a name at least as high), known held when the write was built, or
    covered by `more` (a full round)."""
    assert _dropped(Outbox, steps, direct, pages, held) == []


class _ForgetsLazy(Outbox):
    """A planted defect: a write that carries pages forgets the lazy names owed."""

    def take(self, now, holds):  # type: ignore[no-untyped-def]
        write = super().take(now, holds)
        if write is not None and write.pages:
            write.named = {o: t for o, t in write.named.items() if o not in self.direct}
        return write


def test_the_check_catches_an_outbox_that_forgets_what_it_owes() -> None:
    steps = [(X, 1, 0.0, False), (OWN, 1, 0.0, True)]
    assert _dropped(Outbox, steps, {X}, True, {}) == []
    assert _dropped(_ForgetsLazy, steps, {X}, True, {}) == [(X, 1)]


def _dropped(kind: type[Outbox], steps: list, direct: set, pages: bool,
             held: dict) -> list[tuple[str, int]]:
    """(origin, top) pairs neither written, nor held, nor covered by `more`."""
    box = kind(OWN, frozenset(direct), pages=pages, coalesce=0.02, lazy=0.5)
    tops: dict[str, int] = {}
    covered: dict[str, int] = {}
    now = 0.0

    def holds(origin: str, top: int) -> bool:
        return held.get(origin, 0) >= top

    def drain(at: float) -> None:
        write = box.take(at, holds)
        if write is None:
            return
        if write.more:
            covered.update({o: 10**9 for o in ORIGINS})
        for origin, (after, top) in write.pages.items():
            assert after < top and after + 1 <= tops[origin]
            covered[origin] = max(covered.get(origin, 0), top)
        for origin, top in write.named.items():
            covered[origin] = max(covered.get(origin, 0), top)

    for origin, count, gap, take in steps:
        now += gap
        first = tops.get(origin, 0) + 1
        tops[origin] = first + count - 1
        box.add(origin, first, tops[origin], now)
        if take:
            drain(now)
    due = box.due()
    if due is not None:
        drain(max(due, now))
    assert box.due() is None
    return [(o, t) for o, t in tops.items() if covered.get(o, 0) < t and not holds(o, t)]
