"""Per-peer Prometheus metrics, built at scrape time from the peer state provider's entries
(`PeerState.as_upstream_peer_entry`), so `/metrics` says what `/sync/peers` and the status
page say: whether each peer answered its last round, how far apart we are both ways, how
rounds went, and how long a page takes to fetch and apply.

A peer never contacted yet has no `logsync_peer_up` sample (nor lag nor last-success
samples): 0 would claim a failure that has not happened. `logsync_peer_info` (always 1)
lists every configured peer, contacted or not. Store counts (conflicts, quarantined) are
`logsync_store_*`, from `common._StoreCollector`; they are not repeated here.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from logsync.server.common import PeerStateProvider
from logsync.server.routes import _public_peer

ISO_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def iso_to_unix(text: object) -> float | None:
    """Unix seconds of a peer entry's `YYYY-MM-DDTHH:MM:SSZ` (UTC); None for anything else."""
    if not isinstance(text, str):
        return None
    try:
        return float(calendar.timegm(time.strptime(text, ISO_FORMAT)))
    except ValueError:
        return None


def peer_label(entry: Mapping[str, Any]) -> str:
    """The `peer` label: its name, else its (redacted) URL -- never a token."""
    public = _public_peer(entry)
    for key in ("name", "url"):
        value = public.get(key)
        if isinstance(value, str) and value:
            return value
    return "unnamed"


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def cumulative_buckets(page_seconds: object) -> tuple[list[tuple[str, float]], float] | None:
    """Prometheus buckets (cumulative, ending with +Inf) and the sum from an entry's
    `page_seconds` (`buckets`: upper bounds; `counts`: per bucket, one more than the bounds,
    the last one above the last bound). None when the shape is not that."""
    if not isinstance(page_seconds, Mapping):
        return None
    bounds, counts = page_seconds.get("buckets"), page_seconds.get("counts")
    total = _number(page_seconds.get("sum"))
    if not isinstance(bounds, list) or not isinstance(counts, list) or total is None:
        return None
    numbers = [_number(b) for b in bounds]
    values = [_number(c) for c in counts]
    if len(values) != len(numbers) + 1 or None in numbers or None in values:
        return None
    out: list[tuple[str, float]] = []
    running = 0.0
    for bound, count in zip([*numbers, None], values, strict=True):
        running += count or 0.0
        out.append(("+Inf" if bound is None else floatToGoString(bound), running))
    return out, total


class PeerCollector:
    """The per-peer families, read from the provider at each scrape (a worker thread)."""

    def __init__(self, provider: PeerStateProvider | None) -> None:
        self._provider = provider

    def describe(self) -> list[Metric]:
        return list(self._families([]))

    def collect(self) -> Iterable[Metric]:
        raw = self._provider() if self._provider is not None else []
        entries = [e for e in raw or [] if isinstance(e, Mapping)]
        return self._families(entries)

    @staticmethod
    def _families(entries: list[Mapping[str, Any]]) -> list[Metric]:
        peer = ["peer"]
        info = GaugeMetricFamily("logsync_peer_info", "every configured peer (always 1), "
                                 "contacted or not", labels=["peer", "url", "replica_id"])
        up = GaugeMetricFamily("logsync_peer_up", "1 if the peer's last round succeeded, 0 "
                               "if it failed; absent until the first round ends", labels=peer)
        behind = GaugeMetricFamily("logsync_peer_ops_behind", "ops the peer holds that we do "
                                   "not (we_lack), from its last vector", labels=peer)
        ahead = GaugeMetricFamily("logsync_peer_ops_ahead", "ops we hold that the peer does "
                                  "not (they_lack), from its last vector", labels=peer)
        success = GaugeMetricFamily("logsync_peer_last_success_timestamp_seconds", "unix time "
                                    "of the peer's last successful round", labels=peer)
        failure = GaugeMetricFamily("logsync_peer_last_error_timestamp_seconds", "unix time "
                                    "of the peer's last failed round", labels=peer)
        streak = GaugeMetricFamily("logsync_peer_consecutive_failures", "rounds failed in a "
                                   "row since the last success", labels=peer)
        rounds = CounterMetricFamily("logsync_rounds", "pull rounds with this peer by result "
                                     "(ok or failed)", labels=["peer", "result"])
        applied_by_peer = CounterMetricFamily("logsync_peer_applied_ops", "ops pulled from "
                                              "this peer and applied", labels=peer)
        applied = CounterMetricFamily("logsync_applied_ops", "ops pulled from every peer and "
                                      "applied (the sum over configured peers)")
        pages = HistogramMetricFamily("logsync_page_seconds", "seconds from a page's request "
                                      "to the end of its apply", labels=peer)
        total_applied = 0.0
        for entry in entries:
            name = peer_label(entry)
            public = _public_peer(entry)
            info.add_metric([name, str(public.get("url") or ""),
                             str(public.get("replica_id") or "")], 1.0)
            reachable = entry.get("reachable")
            if isinstance(reachable, bool):
                up.add_metric([name], 1.0 if reachable else 0.0)
            for family, key in ((behind, "we_lack"), (ahead, "they_lack"),
                                (streak, "consecutive_failures")):
                value = _number(entry.get(key))
                if value is not None:
                    family.add_metric([name], value)
            for family, key in ((success, "last_success_at"), (failure, "last_error_at")):
                stamp = iso_to_unix(entry.get(key))
                if stamp is not None:
                    family.add_metric([name], stamp)
            totals = entry.get("totals") if isinstance(entry.get("totals"), Mapping) else {}
            for result, key in (("ok", "rounds_ok"), ("failed", "rounds_failed")):
                rounds.add_metric([name, result], _number(totals.get(key)) or 0.0)
            pulled = _number(totals.get("pulled_events")) or 0.0
            applied_by_peer.add_metric([name], pulled)
            total_applied += pulled
            histogram = cumulative_buckets(entry.get("page_seconds"))
            if histogram is not None:
                pages.add_metric([name], histogram[0], histogram[1])
        applied.add_metric([], total_applied)
        return [info, up, behind, ahead, success, failure, streak, rounds, applied_by_peer,
                applied, pages]
