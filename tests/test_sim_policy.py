"""The simulator runs the client's request policy (`fetchpolicy.FetchPolicy`), not an
imitation: a 503 is retried after the jittered wait, never before its Retry-After; a
failed round is next tried no sooner than the hint; the hub's concurrency caps hold."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest

from logsync.fetchpolicy import UPSTREAM_CONCURRENCY
from logsync.sim import parse_scenario, run_scenario

OVERLOAD = """
name = "overload"
duration = "30s"
[nodes]
count = 3
[sync]
interval = "1s"
timeout = "2s"
attempts = 3
[[workload]]
rate = 10
until = "20s"
[[fault]]
kind = "overload"
node = "n1"
at = "2s"
until = "12s"
{retry_after}
[expect]
converge_within = "25s"
"""

RETRY = re.compile(r"^(\d+) sync (n\d) retries (\S+) on (n\d) \(attempt (\d+)\) in (\d+)us$")
FAILED = re.compile(r"^(\d+) sync (n\d) round \w+ <- (n\d) failed .* next=([\d.]+)$")


def run(retry_after: str) -> tuple[object, list[str]]:
    sink = io.StringIO()
    text = OVERLOAD.format(retry_after=f'retry_after = "{retry_after}"' if retry_after else "")
    report = run_scenario(parse_scenario(text, source="overload.toml").with_seed(3),
                          trace_sink=sink)
    return report, sink.getvalue().splitlines()


def retries_to(lines: list[str], peer: str) -> list[int]:
    return [int(m.group(6)) for line in lines if (m := RETRY.match(line)) and m.group(4) == peer]


def test_a_503_is_retried_never_before_its_retry_after_and_the_mesh_converges() -> None:
    report, lines = run("3s")
    waits = retries_to(lines, "n1")
    assert waits, "the overloaded node's 503s were never retried"
    assert min(waits) >= 3_000_000
    failed = [(int(m.group(1)), float(m.group(4))) for line in lines
              if (m := FAILED.match(line)) and m.group(3) == "n1"]
    assert failed, "no round against the overloaded node failed"
    assert all(next_due * 1e6 >= at + 3_000_000 - 1 for at, next_due in failed)
    assert report.ok, report.text()


def test_without_retry_after_the_jittered_wait_is_shorter() -> None:
    """The planted contrast: the same run without the hint retries sooner, so the check
    above is about the hint and not about the backoff alone."""
    _, lines = run("")
    waits = retries_to(lines, "n1")
    assert waits and min(waits) < 3_000_000


def test_batches_keep_to_the_peers_concurrency_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most `FetchPolicy.batch_concurrency` batch requests are in flight at once to a
    MemPalace hub (no extensions), across all the origins of a round, as the client's one
    limiter per peer allows; the rest go out as answers come back."""
    from logsync.sim import driver as driver_mod
    from logsync.sim.rounds import Run

    hub_batches: list[int] = []  # requests in each batch to a hub
    in_flight: list[int] = []  # requests in flight to a hub, after every send
    real_issue, real_pump = driver_mod.Driver._issue, driver_mod.Driver._pump

    def issue(self: driver_mod.Driver, run: Run, flow: Any, step: object) -> None:
        real_issue(self, run, flow, step)
        if flow.batch and not run.report.extensions:
            hub_batches.append(len(flow.requests))

    def pump(self: driver_mod.Driver, run: Run) -> None:
        real_pump(self, run)
        if not run.report.extensions:
            in_flight.append(run.batch_in_flight)

    monkeypatch.setattr(driver_mod.Driver, "_issue", issue)
    monkeypatch.setattr(driver_mod.Driver, "_pump", pump)
    text = """
name = "batch"
duration = "10s"
[nodes]
count = 3
upstream = ["n1"]
[sync]
interval = "2s"
[[workload]]
rate = 80
mix = { patch = 1.0 }
"""
    report = run_scenario(parse_scenario(text, source="batch.toml").with_seed(5))
    assert max(hub_batches) > UPSTREAM_CONCURRENCY, hub_batches
    assert max(in_flight) == UPSTREAM_CONCURRENCY
    assert report.ok, report.text()


def test_prefetched_pages_are_taken_across_artifact_batches_and_leave_nothing_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review findings: an artifact batch dropped the page prefetched meanwhile (the client
    keeps it), and a prefetch taken after its answer came stayed in `by_mid` for good."""
    from logsync.sim import driver as driver_mod

    drivers: list[driver_mod.Driver] = []
    adopted: list[bool] = []
    real_init, real_adopt = driver_mod.Driver.__init__, driver_mod.Driver._adopt

    def init(self: driver_mod.Driver, sim: Any) -> None:
        real_init(self, sim)
        drivers.append(self)

    def adopt(self: driver_mod.Driver, run: Any, flow: Any, prefetch: Any) -> None:
        adopted.append(prefetch.reply is not None)
        real_adopt(self, run, flow, prefetch)

    monkeypatch.setattr(driver_mod.Driver, "__init__", init)
    monkeypatch.setattr(driver_mod.Driver, "_adopt", adopt)
    text = """
name = "prefetch"
duration = "12s"
[nodes]
count = 3
[sync]
interval = "2s"
page_limit = 5
extensions = false
pages = false  # every op pulled (page frames would carry them)
[[workload]]
rate = 60
until = "8s"
mix = { patch = 1.0 }
[expect]
converge_within = "10s"
"""
    report = run_scenario(parse_scenario(text, source="prefetch.toml").with_seed(2))
    assert report.ok, report.text()
    assert sum(adopted) > 20, f"prefetched pages taken after their answer: {sum(adopted)}"
    (driver,) = drivers
    assert all(not run.over for run, _ in driver.by_mid.values()), "by_mid leaks finished runs"
