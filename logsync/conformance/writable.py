"""The checks that write (`--writable`, §7.5): push two ops of a fresh origin the kit
mints in a temporary palace, then read them back through the vector and `/sync/ops`.

The page is the one `logsync sync` pushes (`responder.push_page`: `chain`, signatures,
the artifact inline, the origin's key), so the peer is judged on the documented interface
only. The two ops stay on the peer afterwards: that is what `--writable` allows. Appends
have no HTTP interface in RFC 004 (ops enter a peer through its own writers, a pull, or a
push), so they are not applicable."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from logsync.conformance.context import Run, status_problem
from logsync.conformance.reads import check_page, ops
from logsync.errors import shorten
from logsync.pushed import MAX_PUSH_BYTES
from logsync.responder import json_bytes, push_page
from logsync.store import Store
from logsync.wire import PUSH_PATH

PROBE_OPS = 2


def check_push(run: Run, writable: bool) -> None:
    run.report.not_applicable("§7.5", "append", "RFC 004 has no HTTP append: ops enter a "
                              "peer only through its own writers, a pull, or a push")
    if not writable:
        run.report.not_applicable("§7.5", "push-applied", "not asked to write (--writable)")
        return
    if not run.ext.push:
        run.report.not_applicable("§7.5", "push-applied", "push not advertised (with chain "
                                  "and max_push_bytes)")
        return
    with tempfile.TemporaryDirectory(prefix="logsync-conformance-") as scratch:
        with Store.open(Path(scratch) / "palace") as store:
            origin, ours, content = _author(store)
            page = push_page(store, origin, 0, PROBE_OPS,
                             min(run.ext.max_push_bytes, MAX_PUSH_BYTES), origin)
    if not page.complete:
        run.report.failed("§7.5", "push-applied", f"two small ops do not fit the peer's "
                          f"max_push_bytes={run.ext.max_push_bytes}")
        return
    reply = run.probe.post(PUSH_PATH, page.body)
    problem = status_problem(reply, f"POST {PUSH_PATH} of origin {origin}")
    data: Any = reply.data
    if problem is None and (data.get("origin") != origin or data.get("top") != PROBE_OPS
                            or data.get("applied") != PROBE_OPS):
        problem = (f"POST {PUSH_PATH} of {PROBE_OPS} new ops of origin {origin} answered "
                   f"{shorten(data, 160)}; expected origin {origin}, top and applied "
                   f"{PROBE_OPS}")
    if problem:
        run.report.failed("§7.5", "push-applied", problem)
        return
    run.report.passed("§7.5", "push-applied", f"origin {origin}")
    _read_back(run, origin, ours, content)


def _author(store: Store) -> tuple[str, list[dict[str, Any]], dict[str, str]]:
    """Two ops of the scratch palace's own origin, the second naming an artifact."""
    artifact = store.put_artifact("note", "logsync conformance probe ✓\n", "logsync-conformance")
    store.append_event("conformance.probe", "conformance", "kit", "logsync-conformance",
                       body="first probe op")
    store.append_event("conformance.probe", "conformance", "kit", "logsync-conformance",
                       body="second probe op — ü", artifact_ids=[artifact["id"]])
    origin = store.replica_id
    return origin, store.list_ops(origin, 0, PROBE_OPS), {artifact["id"]: artifact["sha256"]}


def _read_back(run: Run, origin: str, ours: list[dict[str, Any]],
               artifacts: dict[str, str]) -> None:
    """The pushed ops are in the peer's vector and served byte for byte (but `seq`, the
    serving replica's own row number), their artifact with it."""
    reply = run.probe.get("/sync/version_vector")
    held = reply.data.get("version_vector") if isinstance(reply.data, dict) else None
    top = held.get(origin) if isinstance(held, dict) else None
    run.report.add("§7.5", "pushed-in-vector", "pass" if top == PROBE_OPS else "fail",
                   "" if top == PROBE_OPS else f"after the push the peer's version_vector["
                   f"{origin}] is {shorten(top)}; expected {PROBE_OPS}")
    events = check_page(run, ops(run, origin, 0, PROBE_OPS), origin, 0, PROBE_OPS,
                        "page-order-and-after")
    served = [json_bytes({k: v for k, v in e.items() if k != "seq"}) for e in events or []]
    mine = [json_bytes({k: v for k, v in e.items() if k != "seq"}) for e in ours]
    run.report.add("§7.5", "pushed-served-verbatim", "pass" if served == mine else "fail",
                   "" if served == mine else f"/sync/ops?origin={origin} serves "
                   f"{shorten(served[:1] or events, 120)}; the pushed ops were "
                   f"{shorten(mine[:1], 120)}")
    for artifact_id, sha in artifacts.items():
        got = run.probe.get("/sync/artifact", {"id": artifact_id})
        art = got.data.get("artifact") if isinstance(got.data, dict) else None
        ok = got.status == 200 and isinstance(art, dict) and art.get("sha256") == sha
        run.report.add("§7.5", "pushed-artifact-served", "pass" if ok else "fail",
                       "" if ok else f"/sync/artifact?id={artifact_id} (pushed inline) answered "
                       f"HTTP {got.status} {got.text()}")
