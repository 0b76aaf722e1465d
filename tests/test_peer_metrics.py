"""Per-peer Prometheus metrics on `/metrics` (issue 11, item 5): the collector over peer
entries (labels, absent-until-contacted, ISO times as unix seconds, cumulative histogram
buckets), then a real daemon whose peer is stopped and started again."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from logsync.peerstate import PAGE_BUCKETS, PeerState
from logsync.server.peermetrics import PeerCollector, cumulative_buckets, iso_to_unix
from tests.test_daemon import Daemon, free_port, peer, run, wait_for
from tests.test_statuspage import stop_all

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def scrape(entries: list[dict[str, Any]]) -> tuple[str, Samples]:
    registry = CollectorRegistry()
    registry.register(PeerCollector(lambda: entries))
    text = generate_latest(registry).decode()
    return text, samples(text)


def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


def entry(name: str, url: str, **over: Any) -> dict[str, Any]:
    state = PeerState(name=name, url=url)
    for field, value in over.items():
        setattr(state, field, value)
    return state.as_upstream_peer_entry({"rep_" + "a" * 32: 5})


def test_a_contacted_peer_has_every_series() -> None:
    state = PeerState(name="b", url="http://127.0.0.1:9", reachable=True,
                      last_success_at=1_767_225_720.0,  # 2026-01-01T00:02:00Z
                      last_error_at=1_767_225_660.0, rounds_ok=2, rounds_failed=1,
                      total_pulled_events=12,
                      remote_version_vector={"rep_" + "b" * 32: 4, "rep_" + "a" * 32: 2})
    for _ in range(2):
        state.record_pages([0.001, 0.02, 0.02, 3.0, 60.0])
    _, got = scrape([state.as_upstream_peer_entry({"rep_" + "b" * 32: 1,
                                                    "rep_" + "a" * 32: 5})])
    assert got[key("logsync_peer_up", peer="b")] == 1.0
    assert got[key("logsync_peer_ops_behind", peer="b")] == 3.0
    assert got[key("logsync_peer_ops_ahead", peer="b")] == 3.0
    assert got[key("logsync_peer_last_success_timestamp_seconds", peer="b")] == 1_767_225_720.0
    assert got[key("logsync_peer_last_error_timestamp_seconds", peer="b")] == 1_767_225_660.0
    assert got[key("logsync_peer_consecutive_failures", peer="b")] == 0.0
    assert got[key("logsync_rounds_total", peer="b", result="ok")] == 2.0
    assert got[key("logsync_rounds_total", peer="b", result="failed")] == 1.0
    assert got[key("logsync_peer_applied_ops_total", peer="b")] == 12.0
    assert got[key("logsync_applied_ops_total")] == 12.0
    # two rounds of 5 pages: <=0.005: 2, <=0.025: 4 more, <=5.0: 2 more, above 10: 2
    buckets = {bound: got[key("logsync_page_seconds_bucket", peer="b", le=bound)]
               for bound in ("0.005", "0.025", "2.5", "5.0", "10.0", "+Inf")}
    assert buckets == {"0.005": 2.0, "0.025": 6.0, "2.5": 6.0, "5.0": 8.0, "10.0": 8.0,
                       "+Inf": 10.0}
    assert got[key("logsync_page_seconds_count", peer="b")] == 10.0
    assert got[key("logsync_page_seconds_sum", peer="b")] == pytest.approx(2 * 63.041)
    assert got[key("logsync_peer_info", peer="b", url="http://127.0.0.1:9",
                   replica_id="")] == 1.0


def test_a_failed_peer_is_down_and_a_never_contacted_one_has_no_up_series() -> None:
    down = entry("down", "http://127.0.0.1:9", reachable=False, rounds_failed=3,
                 consecutive_failures=3)
    fresh = entry("fresh", "http://127.0.0.1:10")
    _, got = scrape([down, fresh])
    assert got[key("logsync_peer_up", peer="down")] == 0.0
    assert got[key("logsync_rounds_total", peer="down", result="failed")] == 3.0
    assert got[key("logsync_peer_consecutive_failures", peer="down")] == 3.0
    assert key("logsync_peer_up", peer="fresh") not in got
    assert key("logsync_peer_ops_behind", peer="fresh") not in got  # no vector seen yet
    assert key("logsync_peer_ops_ahead", peer="fresh") not in got
    assert key("logsync_peer_last_success_timestamp_seconds", peer="fresh") not in got
    assert got[key("logsync_rounds_total", peer="fresh", result="ok")] == 0.0
    assert got[key("logsync_peer_info", peer="fresh", url="http://127.0.0.1:10",
                   replica_id="")] == 1.0


def test_labels_never_carry_a_token_or_userinfo() -> None:
    unnamed = entry("http://user:pw@127.0.0.1:9/?token=abc", "http://user:pw@127.0.0.1:9/?token=abc",
                    reachable=True)
    unnamed["token"] = "abc"
    text, got = scrape([unnamed])
    assert "abc" not in text and "user" not in text and "pw@" not in text
    assert got[key("logsync_peer_up", peer="http://127.0.0.1:9/?token=***")] == 1.0


def test_no_provider_and_odd_entries_give_no_peer_series() -> None:
    registry = CollectorRegistry()
    registry.register(PeerCollector(None))
    got = samples(generate_latest(registry).decode())
    assert got == {key("logsync_applied_ops_total"): 0.0}
    _, odd = scrape([{"name": "x", "reachable": "yes", "we_lack": True, "totals": "none",
                      "page_seconds": {"buckets": [1.0], "counts": [1], "sum": 1.0}}])
    assert key("logsync_peer_up", peer="x") not in odd
    assert key("logsync_peer_ops_behind", peer="x") not in odd
    assert key("logsync_page_seconds_count", peer="x") not in odd
    assert odd[key("logsync_rounds_total", peer="x", result="ok")] == 0.0


def test_iso_to_unix() -> None:
    assert iso_to_unix("1970-01-01T00:00:00Z") == 0.0
    assert iso_to_unix("2026-01-01T00:00:00Z") == 1_767_225_600.0
    for bad in (None, "", "2026-01-01", "2026-01-01T00:00:00+00:00", 5, "soon"):
        assert iso_to_unix(bad) is None


def test_cumulative_buckets() -> None:
    counts = [1] * (len(PAGE_BUCKETS) + 1)
    got = cumulative_buckets({"buckets": list(PAGE_BUCKETS), "counts": counts, "sum": 2.0})
    assert got is not None
    buckets, total = got
    assert [value for _, value in buckets] == [float(n) for n in range(1, len(counts) + 1)]
    assert buckets[-1][0] == "+Inf" and buckets[0][0] == "0.005" and total == 2.0
    for bad in (None, {}, {"buckets": [1.0], "counts": [1], "sum": 0.0},
                {"buckets": [1.0], "counts": [1, "x"], "sum": 0.0},
                {"buckets": [1.0], "counts": [1, 2], "sum": None}):
        assert cumulative_buckets(bad) is None


# ---------------------------------------------------------------- real processes


def peer_sample(daemon: Daemon, name: str, **labels: str) -> float | None:
    answer = daemon.get("/metrics")
    assert answer.status_code == 200, answer.text
    return samples(answer.text).get(key(name, **labels))


def test_peer_up_follows_a_real_peer_stopped_and_started_again(tmp_path: Path) -> None:
    started: list[Daemon] = []
    try:
        b = Daemon(tmp_path / "b", free_port(), "tok-b", interval=0.5)
        started.append(b)
        a = Daemon(tmp_path / "a", free_port(), "tok-a", interval=0.5)
        started.append(a)
        for n in range(2):
            run(a.palace, "append", "--type", "note", "--stream", "main", "--room", "lobby",
                "--from-agent", "alice", "--body", f"a {n}")
        run(b.palace, "append", "--type", "note", "--stream", "main", "--room", "lobby",
            "--from-agent", "bob", "--body", "b 0")
        peer(a, b)

        wait_for(lambda: peer_sample(a, "logsync_peer_up", peer="b") == 1.0, 30,
                 'logsync_peer_up{peer="b"} never became 1', a)
        assert peer_sample(a, "logsync_peer_ops_ahead", peer="b") == 2.0  # b never pulls
        assert peer_sample(a, "logsync_peer_ops_behind", peer="b") == 0.0
        assert (peer_sample(a, "logsync_peer_applied_ops_total", peer="b") or 0) >= 1.0
        assert (peer_sample(a, "logsync_page_seconds_count", peer="b") or 0) >= 1.0
        success = peer_sample(a, "logsync_peer_last_success_timestamp_seconds", peer="b")
        assert success is not None and abs(success - time.time()) < 60
        failed_before = peer_sample(a, "logsync_rounds_total", peer="b", result="failed")
        assert failed_before is not None

        b.stop()
        wait_for(lambda: peer_sample(a, "logsync_peer_up", peer="b") == 0.0, 30,
                 'logsync_peer_up{peer="b"} never became 0 after b stopped', a)
        failed_after = peer_sample(a, "logsync_rounds_total", peer="b", result="failed")
        assert failed_after is not None and failed_after > failed_before

        b = Daemon(tmp_path / "b", b.port, "tok-b", interval=0.5)
        started.append(b)
        wait_for(lambda: peer_sample(a, "logsync_peer_up", peer="b") == 1.0, 60,
                 'logsync_peer_up{peer="b"} never came back to 1 after b restarted', a)
    finally:
        stop_all(started)
