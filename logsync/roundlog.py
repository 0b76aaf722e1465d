"""What the daemon logs about a peer's round: one line per fact, the facts of one round
bounded (a hostile vector must not flood the log), and a standing fact said once (the
skipped origins when they change, the ledgers when they gain a row)."""

from __future__ import annotations

import logging

from logsync.engine import RoundReport
from logsync.store.ledgers import LedgerTops

log = logging.getLogger("logsync.daemon")

LOGGED_ORIGIN_FAILURES = 3  # per round; the rest are counted in one line


def named(peer: str, message: str) -> str:
    """One mention of the peer: messages from the engine and client already start with it."""
    prefix = f"peer {peer}: "
    return message if message.startswith(prefix) else prefix + message


def log_failure(peer: str, exc: Exception, kind: str) -> None:
    """A failed round in one line; our own bug's traceback at DEBUG."""
    if kind == "internal":
        log.warning("peer %s: internal error %s: %s (traceback at DEBUG)", peer,
                    type(exc).__name__, exc)
        log.debug("peer %s: traceback", peer, exc_info=exc)
    else:
        log.warning("%s", named(peer, str(exc)))


class RoundLog:
    """The lines after a round that ended. A conflict seen again only bumps its
    counter, so the ledger line is logged when the ledgers' newest rows
    (`Store.ledger_tops`, read after the round) moved since this peer's last line: a fork
    a peer serves every round is logged once, and each peer that brought a new row says
    so."""

    def __init__(self) -> None:
        self._logged_tops: dict[str, LedgerTops] = {}  # peer -> tops at its last line

    def ended(self, peer: str, report: RoundReport, *, skipped_changed: bool,
              ledger_tops: LedgerTops | None = None) -> None:
        if skipped_changed and report.skipped_line():
            log.warning("%s", named(peer, str(report.skipped_line())))
        if report.applied:
            log.info("peer %s: +%d events, +%d artifacts", peer, report.applied,
                     report.artifacts)
        failed = sorted(report.failed_origins().items())
        for origin, reason in failed[:LOGGED_ORIGIN_FAILURES]:
            log.warning("%s", named(peer, f"origin {origin}: {reason}"))
        if len(failed) > LOGGED_ORIGIN_FAILURES:
            log.warning("peer %s: %d more origins failed this round (see `logsync status`)",
                        peer, len(failed) - LOGGED_ORIGIN_FAILURES)
        if (report.conflicts or report.quarantined) and self._moved(peer, ledger_tops):
            log.warning("peer %s: %d conflicts and %d quarantined ops recorded (see `logsync "
                        "conflicts` and `logsync quarantine`)", peer, report.conflicts,
                        report.quarantined)

    def _moved(self, peer: str, tops: LedgerTops | None) -> bool:
        if tops is None:  # not read: say it rather than miss it
            return True
        before, self._logged_tops[peer] = self._logged_tops.get(peer), tops
        return before != tops
