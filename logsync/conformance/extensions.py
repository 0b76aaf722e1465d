"""The extension checks (§8, §8.1, §7.4): unknown names ignored, `large_pages` and its
page byte budget, and the `chain` extension's digests, page `prev` and advertised tips,
computed here over the walked ops with `logsync.chain` (the one copy of the canonical
bytes)."""

from __future__ import annotations

from typing import Any

from logsync.chain import canonical_op, chain_digests, chain_start
from logsync.conformance.context import WALK_LIMIT, Run, status_problem
from logsync.conformance.reads import check_page, grew, ops
from logsync.errors import PeerProtocolError, shorten
from logsync.keys import verify_digest
from logsync.responder import MAX_PAGE_BYTES_CEILING
from logsync.wire import (
    ADVERTISED_MAX_PAGE,
    ADVERTISED_MAX_PAGE_BYTES,
    DIGESTS_PATH,
    EXT_CHAIN,
    EXT_INLINE_ARTIFACTS,
    EXT_LARGE_PAGES,
    EXTENSIONS_PARAM,
    MAX_DIGESTS_PER_REQUEST,
    parse_digest,
    parse_digests_answer,
)


def check_extensions(run: Run) -> None:
    origins = run.sound()
    if origins:
        _unknown_ignored(run, origins[0])
    _large_pages(run, origins)
    _chain(run, origins)
    nothing = "no origin with ops was walked without a fault"
    run.unobserved_na("§8", ("unknown-extension-ignored", "msgpack-same-events", "max-page"),
                      nothing)
    run.unobserved_na("§8.1", ("page-byte-budget",), nothing)
    run.unobserved_na("§7.4", ("digests-match", "page-prev"), nothing)
    run.unobserved_na("§7.4", ("tips-match",), "no tip could be read")
    run.unobserved_na("§12", ("signatures-verify",), nothing)


def _unknown_ignored(run: Run, origin: str) -> None:
    """An `ext=` name the peer does not know changes nothing (any peer, a hub too)."""
    asked = {EXTENSIONS_PARAM: "conformance-no-such-extension"}
    events = check_page(run, ops(run, origin, 0, WALK_LIMIT, **asked), origin, 0, WALK_LIMIT,
                        "page-order-and-after")
    if events is not None:
        same = events == run.walked[origin][:WALK_LIMIT]
        run.tally.check("§8", "unknown-extension-ignored", None if same else
                        f"/sync/ops?origin={origin}&ext=conformance-no-such-extension served "
                        "other events than the same request without it")


def _large_pages(run: Run, origins: list[str]) -> None:
    """With `ext=large_pages`: at most `max_page` ops, and every answer within
    `max_page_bytes` (events, inline artifacts and chain together) unless it holds exactly
    one op; a page over an origin with ops above `after` is never empty."""
    advert = run.advert or {}
    if not run.advertises(EXT_LARGE_PAGES):
        run.report.not_applicable("§8", "max-page", "large_pages not advertised")
        run.report.not_applicable("§8.1", "page-byte-budget", "large_pages not advertised")
        return
    max_page, budget = advert.get(ADVERTISED_MAX_PAGE), advert.get(ADVERTISED_MAX_PAGE_BYTES)
    if type(max_page) is not int or type(budget) is not int:
        return  # the advertisement check (§8) named it
    run.tally.check("§8.1", "budget-within-bound", None if budget <= MAX_PAGE_BYTES_CEILING else
                    f"logsync.max_page_bytes={budget} is above {MAX_PAGE_BYTES_CEILING}, half "
                    "of the 64 MiB a puller must take")
    names = [EXT_LARGE_PAGES] + [n for n in (EXT_INLINE_ARTIFACTS, EXT_CHAIN)
                                 if run.advertises(n)]
    asked = {EXTENSIONS_PARAM: ",".join(names)}
    for origin in origins:
        after = 0
        for _ in range(2):  # the first page and the one after it
            reply = ops(run, origin, after, max_page + 1, **asked)
            events = check_page(run, reply, origin, after, max_page, "page-order-and-after",
                                inline_asked=EXT_INLINE_ARTIFACTS in names,
                                chain_asked=EXT_CHAIN in names)
            if events is None:
                break
            where = f"/sync/ops?origin={origin}&after={after}&ext={asked[EXTENSIONS_PARAM]}"
            run.tally.check("§8", "max-page", None if len(events) <= max_page else
                            f"{where} served {len(events)} ops; max_page is {max_page}")
            over = len(reply.body) > budget and len(events) != 1
            run.tally.check("§8.1", "page-byte-budget", None if not over else
                            f"{where} answered {len(reply.body)} bytes holding {len(events)} "
                            f"ops; max_page_bytes is {budget} (only a one-op page may exceed it)")
            if not events:
                if after < run.vector.vector[origin]:
                    run.tally.bad("§8.1", "page-byte-budget", f"{where} served no op below the "
                                  f"origin's vector entry {run.vector.vector[origin]}: a page "
                                  "must always advance")
                break
            after = events[-1]["origin_seq"]


def _chain(run: Run, origins: list[str]) -> None:
    if not run.advertises(EXT_CHAIN):
        for check in ("digests-match", "page-prev", "tips-match"):
            run.report.not_applicable("§7.4", check, "chain not advertised")
        run.report.not_applicable("§12", "signatures-verify", "chain not advertised")
        return
    for origin in origins:
        digests = computed_chain(run, origin)
        if not digests:
            continue
        seqs = sorted(digests)
        _digests_match(run, origin, digests, seqs)
        _page_prev(run, origin, digests, seqs)
        _tip(run, origin, digests)
        _signatures(run, origin, digests)


def computed_chain(run: Run, origin: str) -> dict[int, bytes]:
    """`D(seq)` over the walked ops of `origin` (from its first op), seq 0 included; it
    stops before the first op naming an artifact the kit did not verify."""
    events = run.walked.get(origin, [])
    canonicals: list[bytes] = []
    for event in events:
        ids = event.get("artifact_ids") or []
        if any(a not in run.artifacts for a in ids):
            break
        try:
            canonicals.append(canonical_op(event, [run.artifacts[a] for a in ids]))
        except ValueError as exc:
            run.tally.bad("§4", "canonical-bytes", f"op {event.get('origin_seq')} of {origin} "
                          f"has no canonical bytes: {exc}")
            break
    out = {0: chain_start(origin)}
    for event, digest in zip(events, chain_digests(origin, canonicals), strict=False):
        out[event["origin_seq"]] = digest
    return out


def _digests_match(run: Run, origin: str, digests: dict[int, bytes], seqs: list[int]) -> None:
    """`/sync/digests` at 0 (the chain's start), the first, a middle and the last computed
    seq (and one past the top, which the chain does not reach: null) equals the chain
    computed here."""
    at = sorted({0, seqs[min(1, len(seqs) - 1)], seqs[len(seqs) // 2], seqs[-1]})
    top = run.vector.vector[origin]
    asked = (*at, top + 1)[:MAX_DIGESTS_PER_REQUEST]
    where = f"{DIGESTS_PATH}?origin={origin}&at={','.join(map(str, asked))}"
    reply = run.probe.get(DIGESTS_PATH, {"origin": origin, "at": ",".join(map(str, asked))})
    problem = status_problem(reply, where)
    if problem is None:
        try:
            found = parse_digests_answer(reply.data, run.label, origin, asked)
        except PeerProtocolError as exc:
            problem = str(exc)
        else:
            wrong = [(s, d) for s, d in zip(asked, found, strict=True)
                     if d != digests.get(s) and not (s > top and grew(run, origin, s))]
            if wrong:
                seq, digest = wrong[0]
                problem = (f"{where} gives {digest.hex()[:16] if digest else None}... at seq "
                           f"{seq}; the chain computed over the served ops is "
                           f"{digests[seq].hex()[:16] if seq in digests else None}...")
    run.tally.check("§7.4", "digests-match", problem)


def _page_prev(run: Run, origin: str, digests: dict[int, bytes], seqs: list[int]) -> None:
    """A page asked with `ext=chain` carries `prev`, the chain at `after`."""
    after = seqs[len(seqs) // 2 - 1] if len(seqs) > 2 else 0
    reply = ops(run, origin, after, 1, **{EXTENSIONS_PARAM: EXT_CHAIN})
    if check_page(run, reply, origin, after, 1, "page-order-and-after",
                  chain_asked=True) is None:
        return  # the page's shape (a missing or malformed `prev` too) is §7.2's
    chain = reply.data.get("chain")
    prev = parse_digest(chain.get("prev")) if isinstance(chain, dict) else None
    run.tally.check("§7.4", "page-prev", None if prev == digests[after] else
                    f"/sync/ops?origin={origin}&after={after}&ext=chain has chain.prev "
                    f"{_hex(prev)}; the chain computed at {after} is {_hex(digests[after])}")


def _tip(run: Run, origin: str, digests: dict[int, bytes]) -> None:
    """The advertised tip is `[seq, D(seq)]` with seq at least the vector's entry (the
    store may grow between the two reads): D(seq) as computed when the walk reached it,
    else as the peer's own `/sync/digests` gives it (one request)."""
    top = run.vector.vector[origin]
    tip: Any = run.vector.tips.get(origin)
    tips = (run.advert or {}).get("tips")
    raw = tips.get(origin) if isinstance(tips, dict) else tips
    seq = tip[0] if tip is not None and tip[0] >= top else top
    expected = digests.get(seq) if seq in digests else tip_digest(run, origin, seq)
    if expected is None:
        return
    run.tally.check("§7.4", "tips-match", None if tip == (seq, expected) else
                    f"logsync.tips[{origin}] is {shorten(raw)}; expected [{seq}, "
                    f"{_hex(expected)}] (seq at least the vector's {top})")


def tip_digest(run: Run, origin: str, top: int) -> bytes | None:
    """`D(top)` as the peer's `/sync/digests` answers it, or None (that check names a
    failure of the route)."""
    reply = run.probe.get(DIGESTS_PATH, {"origin": origin, "at": str(top)})
    if status_problem(reply, DIGESTS_PATH) is not None:
        return None
    try:
        return parse_digests_answer(reply.data, run.label, origin, [top])[0]
    except PeerProtocolError:
        return None


def _signatures(run: Run, origin: str, digests: dict[int, bytes]) -> None:
    """§10.3, §12.2: for an origin whose key is advertised, every signature a page
    carries and its `tip_sigs` entry verify over the chain computed here (the tip's
    over the peer's own D(top) when the walk did not reach it)."""
    key = run.vector.keys.get(origin)
    if key is None:
        run.report.not_applicable("§12", "signatures-verify", f"no key advertised for {origin}")
        return
    seqs = sorted(s for s in digests if s)
    if not seqs:
        return
    reply = ops(run, origin, 0, len(seqs), **{EXTENSIONS_PARAM: EXT_CHAIN})
    if check_page(run, reply, origin, 0, len(seqs), "page-order-and-after",
                  chain_asked=True) is None:
        return
    chain = reply.data.get("chain")
    sigs = chain.get("sigs") if isinstance(chain, dict) else None
    problem = None
    for entry in sigs if isinstance(sigs, list) else []:
        seq, sig = (entry + [None, None])[:2] if isinstance(entry, list) else (None, None)
        if type(seq) is int and seq in digests and not verify_digest(
                key, digests[seq], _unhex(sig)):
            problem = (f"/sync/ops?origin={origin}&ext=chain carries a signature at seq {seq} "
                       "that does not verify over the chain of the served ops")
            break
    tip = run.vector.tips.get(origin)
    signed_tip = run.vector.tip_sigs.get(origin)
    if problem is None and signed_tip is not None and tip is not None:
        seq = tip[0]  # the signature is of the advertised tip's digest
        at_tip = digests.get(seq) if seq in digests else tip_digest(run, origin, seq)
        if at_tip is not None and not verify_digest(key, at_tip, signed_tip):
            problem = f"logsync.tip_sigs[{origin}] does not verify over D({seq})"
    run.tally.check("§12", "signatures-verify", problem)


def _unhex(value: Any) -> bytes | None:
    try:
        return bytes.fromhex(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _hex(digest: bytes | None) -> str:
    return f"{digest.hex()[:16]}..." if digest else "null"
