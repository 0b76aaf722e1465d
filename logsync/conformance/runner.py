"""One conformance run: read the peer's vector (a peer whose vector cannot be read is
unusable, exit 2), then each stage of checks in RFC order. A request that gets no answer
to judge fails the stage's section with its sentence and the run goes on; the kit's own
deadline or request budget, spent, ends the run there as incomplete (not the peer's
fault: exit 2 unless a check had already failed)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from urllib.parse import urlsplit

from logsync.conformance import (
    DEFAULT_DEADLINE_S,
    DEFAULT_MAX_REQUESTS,
    DEFAULT_TIMEOUT_S,
    extensions,
    reads,
    refusals,
    writable,
)
from logsync.conformance.context import Run, status_problem
from logsync.conformance.probe import OutOfBudget, Probe, ProbeError
from logsync.conformance.report import Report
from logsync.errors import PeerProtocolError, ValidationError
from logsync.peers import redact_url
from logsync.wire import parse_vector_answer


def run_conformance(url: str, token: str | None, *, writable_ok: bool = False,
                    timeout: float = DEFAULT_TIMEOUT_S, deadline: float = DEFAULT_DEADLINE_S,
                    max_requests: int = DEFAULT_MAX_REQUESTS,
                    ca_file: str | None = None) -> Report:
    """Check the peer at `url` (blocking); the report holds every verdict."""
    label = redact_url(url)
    if "@" in urlsplit(url).netloc:  # httpx would send them as Basic, not our Bearer
        raise ValidationError(f"peer url={label} carries a user name or password: pass the "
                              "peer's token with --token instead")
    report = Report(peer=label)
    with Probe(url, token, timeout=timeout, deadline=deadline, max_requests=max_requests,
               ca_file=ca_file, label=label) as probe:
        try:
            run = _start(probe, report)
            if run is not None:
                _stages(run, writable_ok)
        finally:
            report.requests, report.seconds = probe.requests, probe.elapsed
    return report


def _start(probe: Probe, report: Report) -> Run | None:
    where = "/sync/version_vector"
    try:
        reply = probe.get(where)
    except OutOfBudget as exc:
        report.incomplete = str(exc)
        return None
    except ProbeError as exc:
        report.unusable = str(exc)
        return None
    if reply.status == 401:
        report.unusable = f"{where} answered HTTP 401: the token is missing or wrong (--token)"
        return None
    if reply.status == 403:
        report.unusable = (f"{where} answered HTTP 403: the peer refused the request's Host "
                           "or Origin header, or the token (RFC 004 §7 rules 1-2)")
        return None
    problem = status_problem(reply, where)
    if problem is not None:
        report.unusable = problem
        return None
    try:
        vector = parse_vector_answer(reply.data, probe.label)
    except PeerProtocolError as exc:
        report.unusable = str(exc)
        return None
    return Run(probe=probe, report=report, answer=reply.data, vector=vector)


def _stages(run: Run, writable_ok: bool) -> None:
    stages: list[tuple[str, Callable[[Run], None]]] = [
        ("§7.1", reads.check_vector),
        ("§7.2", reads.check_ops),
        ("§7.3", reads.check_artifacts),
        ("§8", extensions.check_extensions),
        ("§11", refusals.check_errors),
        ("§12", refusals.check_auth),
        ("§7.6", refusals.check_snapshot),
        ("§7.7", refusals.check_stream),
        ("§7.5", partial(writable.check_push, writable=writable_ok)),
    ]
    try:
        for section, stage in stages:
            try:
                stage(run)
            except OutOfBudget:
                raise
            except ProbeError as exc:
                run.tally.bad(section, "answered", str(exc))
            except Exception as exc:  # noqa: BLE001 - one stage's surprise, kept in the report
                run.tally.bad(section, "answered", f"the stage stopped on an unexpected "
                              f"{type(exc).__name__} ({exc}): an answer the kit could not "
                              "judge, or a fault of the kit")
    except OutOfBudget as exc:
        run.report.incomplete = str(exc)
    finally:
        run.tally.flush(run.report)
