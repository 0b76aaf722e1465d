"""Obtaining the artifacts a page names, sans-IO (engine rules 3 and 7): the ones the
page carries inline, the rest one `/sync/artifact` request each, in bounded batches."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from logsync.effects import MissingArtifacts
from logsync.errors import PeerError, PeerTooLargeError
from logsync.model import MAX_ARTIFACTS_PER_EVENT
from logsync.report import OriginProgress, RoundReport
from logsync.wire import Batch, Extensions, OpsPage, Request, Step, parse_artifact_answer

# Distinct artifacts one page may name before the origin asks for fewer ops (an honest
# full page names a few per op), and artifact requests per Batch step.
MAX_ARTIFACTS_PER_PAGE = 10_000
ARTIFACTS_PER_BATCH = 256


def referenced_artifacts(events: list[dict], cap: int = MAX_ARTIFACTS_PER_PAGE) -> list[str]:
    """Artifact ids the page names, first-seen order, no repeats; malformed lists (not a
    list, longer than an op may name) are left to the store, which quarantines their op.
    Stops once past `cap` distinct ids (the caller refuses such a page), so the work is
    bounded whatever the page holds."""
    seen: dict[str, None] = {}
    for event in events:
        ids = event.get("artifact_ids")
        if ids and isinstance(ids, list) and len(ids) <= MAX_ARTIFACTS_PER_EVENT:
            seen.update((i, None) for i in ids if isinstance(i, str))
            if len(seen) > cap:
                break
    return list(seen)


def obtain_artifacts(
    peer: str,
    page: OpsPage,
    ext: Extensions,
    progress: OriginProgress,
    batch: bool,
    report: RoundReport,
) -> Generator[Step, Any, list[dict]]:
    """The artifacts the page names that the store lacks: inline ones first, the
    rest one `/sync/artifact` request each (404 = absent, left to the store)."""
    wanted = referenced_artifacts(page.events)
    if len(wanted) > MAX_ARTIFACTS_PER_PAGE:  # rule 7: the origin asks for fewer ops
        raise PeerTooLargeError(
            f"peer {peer}: /sync/ops page for origin {page.origin} after {page.after} names "
            f"more than {MAX_ARTIFACTS_PER_PAGE} artifacts", peer=peer)
    missing = list((yield MissingArtifacts(tuple(wanted)))) if wanted else []
    found = [page.inline[i] for i in missing if i in page.inline]
    to_fetch = [i for i in missing if i not in page.inline]
    requests = [
        Request("/sync/artifact", {"id": i}, accept_msgpack=ext.msgpack, missing_ok=True)
        for i in to_fetch
    ]
    report.requests += len(requests)
    if batch and requests:
        answers = []
        for start in range(0, len(requests), ARTIFACTS_PER_BATCH):  # bounded batches
            chunk = tuple(requests[start : start + ARTIFACTS_PER_BATCH])
            got = yield Batch(chunk)
            if not isinstance(got, list) or len(got) != len(chunk):
                raise RuntimeError(f"the driver must answer a Batch of {len(chunk)} with a list")
            answers += got
    else:
        answers = []
        for request in requests:
            answers.append((yield request))
    for artifact_id, answer in zip(to_fetch, answers, strict=True):
        if isinstance(answer, PeerError):
            raise answer
        artifact = parse_artifact_answer(answer, peer, artifact_id)
        if artifact is None:
            progress.artifacts_missing += 1
        else:
            found.append(artifact)
    return found
