"""What every check module shares about one run: the probe, the peer's vector answer and
what it advertised, the ops walked so far, and a tally that turns many observations of
one check (every page, every op) into one verdict naming the first problem."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from logsync.conformance.probe import Probe, Reply
from logsync.conformance.report import Report
from logsync.errors import shorten
from logsync.replica import mint_replica_id
from logsync.wire import ADVERTISEMENT_KEY, Extensions, PeerVector

# How much of the peer the read checks look at: a bounded sample, never the whole log.
MAX_ORIGINS = 8  # origins walked (those holding the most ops first)
WALK_LIMIT = 100  # ops per page of the walk (small, so paging itself is exercised)
MAX_WALK_PAGES = 10  # so at most 1 000 ops per origin
MAX_ARTIFACTS = 64  # artifacts fetched one by one


@dataclass
class Tally:
    """Observations of checks, kept in the order first seen: how many were fine, and the
    first problem (one sentence) plus how many more."""

    seen: dict[tuple[str, str], list[Any]] = field(default_factory=dict)

    def _entry(self, section: str, check: str) -> list[Any]:
        return self.seen.setdefault((section, check), [0, None, 0])

    def ok(self, section: str, check: str, times: int = 1) -> None:
        self._entry(section, check)[0] += times

    def bad(self, section: str, check: str, sentence: str) -> None:
        entry = self._entry(section, check)
        if entry[1] is None:
            entry[1] = sentence
        else:
            entry[2] += 1

    def check(self, section: str, check: str, problem: str | None) -> None:
        """`ok` when `problem` is None, else `bad` with it."""
        if problem is None:
            self.ok(section, check)
        else:
            self.bad(section, check, problem)

    def flush(self, report: Report) -> None:
        for (section, check), (good, first, more) in self.seen.items():
            if first is not None:
                report.failed(section, check, first + (f" (and {more} more like it)"
                                                       if more else ""))
            else:
                report.passed(section, check, f"{good} observed")
        self.seen.clear()


@dataclass
class Run:
    """One run against one peer."""

    probe: Probe
    report: Report
    answer: dict[str, Any]  # the decoded vector answer
    vector: PeerVector
    tally: Tally = field(default_factory=Tally)
    walked: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # from after=0
    complete: dict[str, bool] = field(default_factory=dict)  # the walk reached the top
    broken: set[str] = field(default_factory=set)  # origins whose walk met a bad page
    artifacts: dict[str, str] = field(default_factory=dict)  # id -> verified sha256

    @property
    def label(self) -> str:
        return self.probe.label

    @property
    def ext(self) -> Extensions:
        return self.vector.extensions

    @property
    def advert(self) -> dict[str, Any] | None:
        advert = self.answer.get(ADVERTISEMENT_KEY)
        return advert if isinstance(advert, dict) else None

    def advertises(self, name: str) -> bool:
        advert = self.advert
        names = advert.get("extensions") if advert else None
        return isinstance(names, list) and name in names

    def sound(self) -> list[str]:
        """The walked origins whose every page passed: the later checks compare against
        these walks (a broken one is already failed under §7.2, and comparing with it
        would blame other sections for the same fault)."""
        return [o for o in self.origins() if self.walked.get(o) and o not in self.broken]

    def observed(self, section: str, check: str) -> bool:
        """Whether the check has a verdict or an observation yet."""
        return (section, check) in self.tally.seen or any(
            (o.section, o.check) == (section, check) for o in self.report.outcomes)

    def unobserved_na(self, section: str, checks: tuple[str, ...], reason: str) -> None:
        """Each of `checks` that nothing observed is not applicable, for `reason`."""
        for check in checks:
            if not self.observed(section, check):
                self.report.not_applicable(section, check, reason)

    def origins(self) -> list[str]:
        """The origins the read checks walk: those holding the most ops first, bounded."""
        held = sorted(self.vector.vector.items(), key=lambda item: (-item[1], item[0]))
        return [origin for origin, top in held if top > 0][:MAX_ORIGINS]


def fresh_origin() -> str:
    """A well-formed replica id no peer holds: the origin of questions whose answer is an
    empty page (or a refusal) whatever the peer holds."""
    return mint_replica_id()


def status_problem(reply: Reply, what: str, expected: int = 200) -> str | None:
    """Why an answer is not a `expected` JSON object (or msgpack map), or None."""
    if reply.status != expected:
        return f"{what} answered HTTP {reply.status} ({reply.text()}); expected " \
               f"{expected}"
    if reply.problem is not None:
        return f"{what} {reply.problem}"
    if not isinstance(reply.data, dict):
        return f"{what} answered {shorten(reply.data)}, not a JSON object"
    return None
