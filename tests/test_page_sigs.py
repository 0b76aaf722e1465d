"""A page's `chain.sigs` names only seqs of the page's own ops (`wire.parse_page`): the
rule holds for any page and any named seq, whichever way it is looked up."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from logsync.errors import PeerProtocolError
from logsync.wire import parse_page

ORIGIN = "r" + "0" * 31
PREV = "ab" * 32
SIG = "cd" * 64


def _page(seqs: list[int], sigs: list[list]) -> dict:
    events = [{"origin_replica": ORIGIN, "origin_seq": s} for s in seqs]
    return {"events": events, "chain": {"prev": PREV, "sigs": sigs}}


def _parse(body: dict, after: int) -> dict[int, bytes]:
    page = parse_page(body, "p", ORIGIN, after, 10_000, chain_asked=True)
    return page.signatures


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=60, unique=True),
       st.lists(st.integers(0, 10_001), min_size=1, max_size=4))
def test_a_signature_is_taken_only_for_a_seq_the_page_holds(seqs: list[int],
                                                             named: list[int]) -> None:
    seqs.sort()
    body = _page(seqs, [[n, SIG] for n in named])
    if all(n in seqs for n in named) and len(named) <= len(seqs):
        assert set(_parse(body, seqs[0] - 1)) == set(named)
    else:
        with pytest.raises(PeerProtocolError, match=r"chain\.sigs"):
            _parse(body, seqs[0] - 1)


@pytest.mark.parametrize("named", [0, 1, 4, 6, 8, 9, True, "6", 6.0])
def test_a_seq_between_below_or_above_the_pages_ops_is_refused_in_one_sentence(
        named: object) -> None:
    body = _page([2, 3, 5, 7], [[named, SIG]])
    with pytest.raises(PeerProtocolError) as caught:
        _parse(body, 1)
    assert "expected [seq of the page, <128 hex>]" in str(caught.value)
    assert "\n" not in str(caught.value)
