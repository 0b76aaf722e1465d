"""Derived views (logsync/views.py): the owed set, R3 claim winners, presence, and their CLI.

The rules come from RFC 003 §3.3, §7.3, §7.4 and §7.12; the views must not depend on the
order events arrived in when every event carries an HLC (a hypothesis property).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from logsync import views
from logsync.cli import cli
from logsync.store import Store

REP_A = "rep_" + "a" * 32
REP_B = "rep_" + "b" * 32


def ev(event_id: str, seq: int, *, hlc: str | None = "auto", **fields: Any) -> dict[str, Any]:
    """An event dict in the store's read shape; hlc 'auto' derives one from seq."""
    stamp = f"{1_790_000_000_000 + seq * 10:013d}-000000-{REP_A}" if hlc == "auto" else hlc
    base = {
        "id": event_id, "seq": seq, "origin_replica": REP_A, "origin_seq": seq, "hlc": stamp,
        "type": "task.request", "stream": "s", "room": "r", "topic": None,
        "from_agent": "boss@a", "to_agent": "pi@b", "correlation_id": None, "branch": None,
        "base_commit": None, "status": "open", "artifact_ids": [], "body": "",
        "created_at": "2026-09-01T00:00:00Z", "metadata": {},
    }
    base.update(fields)
    return base


def stamp(ms: int, replica: str = REP_A, counter: int = 0) -> str:
    return f"{ms:013d}-{counter:06x}-{replica}"


def owed_ids(events: list[dict[str, Any]], agent: str = "pi@b") -> list[str]:
    return [e["id"] for e in views.owed(events, agent)]


# ── owed ──────────────────────────────────────────────────────────────


def test_a_directed_open_ask_is_owed_until_a_later_terminal_reply_joins_it() -> None:
    ask = ev("ask", 1, correlation_id="c1")
    assert owed_ids([ask]) == ["ask"]
    ready = ev("r1", 2, type="task.reply", from_agent="pi@b", to_agent="boss@a",
               correlation_id="c1", status="ready")
    assert owed_ids([ask, ready]) == ["ask"], "a non-terminal reply does not clear"
    done = ev("r2", 3, type="task.reply", from_agent="pi@b", to_agent="boss@a",
              correlation_id="c1", status="applied")
    assert owed_ids([ask, ready, done]) == []


def test_an_ack_joined_by_ack_of_clears_an_ask_without_a_correlation_id() -> None:
    ask = ev("ask", 1)
    ack = ev("ack", 2, type="event.ack", from_agent="pi@b", to_agent="boss@a",
             correlation_id="ask", status="failed", metadata={"ack_of": "ask"})
    assert owed_ids([ask, ack]) == []


def test_broadcasts_own_asks_and_non_open_events_are_never_owed() -> None:
    events = [
        ev("broadcast", 1, to_agent="*"),
        ev("mine", 2, from_agent="pi@b", to_agent="pi@b"),
        ev("report", 3, status="applied"),
        ev("nobody", 4, to_agent=None),
        ev("other", 5, to_agent="codex@c"),
    ]
    assert owed_ids(events) == []
    assert owed_ids(events, "codex@c") == ["other"]


def test_a_terminal_reply_clears_only_asks_before_it_not_a_later_ask_on_the_thread() -> None:
    first = ev("first", 1, correlation_id="c1")
    reply = ev("reply", 2, type="task.reply", from_agent="pi@b", correlation_id="c1",
               status="applied")
    later = ev("later", 3, correlation_id="c1")
    assert owed_ids([first, reply, later]) == ["later"]


def test_order_is_by_hlc_not_by_local_arrival_seq() -> None:
    """RFC 003 §7.3: on a mesh the reply can arrive (lower seq) before the ask it answers."""
    reply = ev("reply", 1, hlc=stamp(2000, REP_B), type="task.reply", from_agent="pi@b",
               correlation_id="c1", status="applied", origin_replica=REP_B)
    ask = ev("ask", 2, hlc=stamp(1000), correlation_id="c1")
    assert owed_ids([reply, ask]) == []
    stale = ev("stale", 3, hlc=stamp(500, REP_B), type="task.reply", from_agent="pi@b",
               correlation_id="c2", status="applied")
    newer_ask = ev("newer", 4, hlc=stamp(900), correlation_id="c2")
    assert owed_ids([stale, newer_ask]) == ["newer"], "a reply with an older HLC clears nothing"


def test_seq_is_the_fallback_only_when_a_side_has_no_hlc() -> None:
    ask = ev("ask", 5, hlc=None, correlation_id="c1")
    earlier_reply = ev("r", 3, hlc=stamp(9_999_999_999_999), type="task.reply",
                       from_agent="pi@b", correlation_id="c1", status="applied")
    assert owed_ids([earlier_reply, ask]) == ["ask"], "seq 3 < 5 decides, not the HLC"
    later_reply = dict(earlier_reply, id="r2", seq=7)
    assert owed_ids([earlier_reply, ask, later_reply]) == []
    ask_with_hlc = ev("ask2", 9, hlc=stamp(1000), correlation_id="c3")
    reply_without = ev("r3", 10, hlc=None, type="task.reply", from_agent="pi@b",
                       correlation_id="c3", status="blocked")
    assert owed_ids([ask_with_hlc, reply_without]) == []


def test_owed_by_agent_agrees_with_owed_for_every_agent() -> None:
    events = [ev("a1", 1, to_agent="x@1"), ev("a2", 2, to_agent="y@2", correlation_id="c"),
              ev("r", 3, from_agent="y@2", correlation_id="c", status="superseded"),
              ev("a3", 4, to_agent="x@1", from_agent="y@2")]
    everyone = views.owed_by_agent(events)
    assert {a: [e["id"] for e in items] for a, items in everyone.items()} == {"x@1": ["a1", "a3"]}
    assert owed_ids(events, "y@2") == []


# ── claims (R3) ───────────────────────────────────────────────────────


def test_the_earliest_claim_by_hlc_wins_whatever_the_arrival_order() -> None:
    late = ev("late", 1, hlc=stamp(2000), status="claimed", from_agent="pi@b",
              correlation_id="part-1")
    early = ev("early", 2, hlc=stamp(1000, REP_B), status="claimed", from_agent="codex@c",
               correlation_id="part-1", origin_replica=REP_B)
    other = ev("other", 3, hlc=stamp(500), status="claimed", correlation_id="part-2")
    result = views.claims([late, early, other], "part-1")
    assert result["winner"]["id"] == "early"
    assert [c["id"] for c in result["claims"]] == ["early", "late"]
    assert {k: w["id"] for k, w in views.claim_winners([late, early, other]).items()} == \
        {"part-1": "early", "part-2": "other"}


def test_equal_physical_time_is_broken_by_counter_then_replica_id() -> None:
    a = ev("a", 1, hlc=stamp(1000, REP_B, 0), status="claimed", correlation_id="p")
    b = ev("b", 2, hlc=stamp(1000, REP_A, 1), status="claimed", correlation_id="p",
           from_agent="x@y")
    c = ev("c", 3, hlc=stamp(1000, REP_A, 0), status="claimed", correlation_id="p",
           from_agent="z@y")
    assert views.claims([a, b, c], "p")["winner"]["id"] == "c"


def test_claims_without_hlc_rank_after_and_one_agent_counts_once() -> None:
    no_hlc = ev("old", 1, hlc=None, status="claimed", correlation_id="p",
                created_at="2020-01-01T00:00:00Z")
    with_hlc = ev("new", 2, hlc=stamp(5000), status="claimed", correlation_id="p",
                  from_agent="pi@b")
    again = ev("again", 3, hlc=stamp(6000), status="claimed", correlation_id="p",
               from_agent="pi@b")
    result = views.claims([no_hlc, again, with_hlc], "p")
    assert result["winner"]["id"] == "new"
    assert [c["id"] for c in result["claims"]] == ["new", "old"]
    assert views.claims([], "p") == {"correlation_id": "p", "winner": None, "claims": [],
                                     "must_yield": []}


def test_a_loser_must_yield_until_it_writes_superseded_after_its_claim() -> None:
    """R3's loser step as a view: every replica holding the same events names the same
    losers still to yield, whatever the arrival order."""
    win = ev("win", 1, status="claimed", correlation_id="p", from_agent="pi@a")
    lose = ev("lose", 2, status="claimed", correlation_id="p", from_agent="pi@b")
    early = ev("early", 0, hlc=stamp(1_790_000_000_000 - 5), status="superseded",
               correlation_id="p", from_agent="pi@b")  # before its claim: no yield
    other = ev("other", 4, status="superseded", correlation_id="q", from_agent="pi@b")
    assert [c["id"] for c in views.claims([lose, win, early, other], "p")["must_yield"]] == [
        "lose"]
    done = ev("done", 3, status="superseded", correlation_id="p", from_agent="pi@b")
    for order in ([win, lose, done], [done, lose, win]):
        assert views.claims(order, "p")["must_yield"] == []


def test_an_expired_ask_is_apart_from_the_owed_ones_and_a_bad_time_never_expires() -> None:
    """R2 as a view: `metadata.expires_at` at or before `now` moves an owed ask apart."""
    asks = [ev("gone", 1, metadata={"expires_at": "2026-12-01T00:00:00Z"}),
            ev("edge", 2, metadata={"expires_at": "2026-12-01T12:00:00Z"}),
            ev("live", 3, metadata={"expires_at": "2026-12-02T00:00:00Z"}),
            ev("bad", 4, metadata={"expires_at": "tomorrow"}),
            ev("none", 5)]
    live, gone = views.split_expired(views.owed(asks, "pi@b"), "2026-12-01T12:00:00Z")
    assert [e["id"] for e in gone] == ["gone", "edge"]
    assert [e["id"] for e in live] == ["live", "bad", "none"]


# ── presence (R5) ─────────────────────────────────────────────────────


def test_presence_is_the_newest_event_per_agent_by_hlc() -> None:
    events = [
        ev("x2", 1, hlc=stamp(3000), from_agent="x@1", type="note"),
        ev("x1", 2, hlc=stamp(1000), from_agent="x@1"),
        ev("y0", 3, hlc=None, from_agent="y@2", created_at="2026-01-01T00:00:00Z"),
        ev("y1", 4, hlc=None, from_agent="y@2", created_at="2026-02-01T00:00:00Z"),
        ev("z0", 5, hlc=None, from_agent="z@3", created_at="2030-01-01T00:00:00Z"),
        ev("z1", 6, hlc=stamp(1), from_agent="z@3"),
    ]
    seen = views.presence(events)
    assert list(seen) == ["x@1", "y@2", "z@3"]
    assert seen["x@1"]["event_id"] == "x2" and seen["x@1"]["type"] == "note"
    assert seen["x@1"]["events"] == 2
    assert seen["y@2"]["event_id"] == "y1"
    assert seen["z@3"]["event_id"] == "z1", "an event with an HLC beats any without"


def test_happened_after() -> None:
    a, b = ev("a", 1, hlc=stamp(1)), ev("b", 2, hlc=stamp(2))
    assert views.happened_after(b, a) and not views.happened_after(a, b)
    assert views.happened_after(dict(a, hlc=None, seq=5), b)


# ── order independence (hypothesis) ───────────────────────────────────

AGENTS = ["a@1", "b@2", "c@3"]


@st.composite
def event_logs(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(st.integers(1, 25))
    events = []
    for i in range(count):
        events.append(ev(
            f"e{i}", i + 1, hlc=stamp(1000 + draw(st.integers(0, 50)), REP_A, i),
            from_agent=draw(st.sampled_from(AGENTS)),
            to_agent=draw(st.sampled_from([*AGENTS, "*", None])),
            status=draw(st.sampled_from(["open", "claimed", "applied", "failed", "ready"])),
            correlation_id=draw(st.sampled_from(["c1", "c2", None])),
            metadata={"ack_of": f"e{draw(st.integers(0, count))}"} if draw(st.booleans()) else {},
        ))
    return events


@settings(max_examples=150, deadline=None)
@given(event_logs(), st.randoms(use_true_random=False))
def test_views_do_not_depend_on_arrival_order(events: list[dict[str, Any]], rnd: Any) -> None:
    """Two replicas holding the same events (same HLCs) in any arrival order agree."""
    shuffled = [dict(e) for e in events]
    rnd.shuffle(shuffled)
    for index, event in enumerate(shuffled):
        event["seq"] = index + 1
    for agent in AGENTS:
        assert owed_ids(events, agent) == owed_ids(shuffled, agent)
    same = {k: w["id"] for k, w in views.claim_winners(events).items()}
    assert same == {k: w["id"] for k, w in views.claim_winners(shuffled).items()}
    assert views.presence(events) == views.presence(shuffled)


# ── the CLI ───────────────────────────────────────────────────────────


def _palace_with_work(palace: Path) -> dict[str, str]:
    with Store.open(palace) as store:
        ask = store.append_event("task.request", "proj", "tasks", "boss@a", to_agent="pi@b",
                                 correlation_id="c1", status="open", body="do it")
        other = store.append_event("task.request", "proj", "tasks", "boss@a", to_agent="pi@b",
                                   status="open", body="and this")
        store.ack_event(other["id"], "pi@b", status="applied")
        first = store.append_event("task.claim", "proj", "claims", "pi@b",
                                   correlation_id="part-7", status="claimed")
        store.append_event("task.claim", "proj", "claims", "codex@c", correlation_id="part-7",
                           status="claimed")
    return {"ask": ask["id"], "claim": first["id"]}


def _run(palace: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--palace", str(palace), *args])


def test_owed_cli_text_and_json(tmp_path: Path) -> None:
    palace = tmp_path / "palace"
    ids = _palace_with_work(palace)
    result = _run(palace, "owed", "--agent", "pi@b", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["count"] == 1 and payload["owed"][0]["id"] == ids["ask"]
    text = _run(palace, "owed", "--agent", "pi@b")
    assert text.exit_code == 0 and "owes 1 reply" in text.output and ids["ask"] in text.output
    assert "owes nothing" in _run(palace, "owed", "--agent", "nobody@x").output


def test_claims_cli_names_the_earliest_claim(tmp_path: Path) -> None:
    palace = tmp_path / "palace"
    ids = _palace_with_work(palace)
    payload = json.loads(_run(palace, "claims", "part-7", "--json").output)
    assert payload["winner"]["id"] == ids["claim"] and payload["count"] == 2
    text = _run(palace, "claims", "part-7").output
    assert "won by pi@b" in text
    assert "No claims on part-9" in _run(palace, "claims", "part-9").output


def test_presence_cli(tmp_path: Path) -> None:
    palace = tmp_path / "palace"
    _palace_with_work(palace)
    payload = json.loads(_run(palace, "presence", "--json").output)
    assert [a["agent"] for a in payload["agents"]] == ["boss@a", "codex@c", "pi@b"]
    assert payload["agents"][2]["type"] == "task.claim"
    assert "codex@c" in _run(palace, "presence").output


def test_view_commands_report_usage_errors_in_one_line(tmp_path: Path) -> None:
    result = _run(tmp_path / "p", "owed", "--agent", "  ", "--json")
    assert result.exit_code == 1
    assert json.loads(result.output) == {"error": "--agent must name an agent, e.g. pi@laptop"}
    missing = _run(tmp_path / "p", "owed")
    assert missing.exit_code != 0 and "Traceback" not in missing.output
