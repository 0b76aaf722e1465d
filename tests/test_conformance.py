"""`logsync conformance` (issue 14, item 4): a real daemon passes every applicable check,
each planted deviation (tests/deviant_peer.py) fails the check of its own RFC 004 section
while the same wrapper without a deviation passes, and hostile peers end the run in
bounded time with one line (exit 2)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import httpx
import msgpack
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from logsync.conformance import reads
from logsync.conformance.context import status_problem
from logsync.conformance.probe import Reply, decoded
from logsync.conformance.report import (
    EXIT_FAIL,
    EXIT_PASS,
    EXIT_UNUSABLE,
    FAIL,
    NA,
    PASS,
    SECTIONS,
    Report,
)
from logsync.conformance.runner import run_conformance
from logsync.errors import ValidationError
from logsync.server.app import create_app
from logsync.store import Store
from tests.conftest import RemoteKit
from tests.deviant_peer import (
    NO_BUDGET,
    NO_STREAM,
    OFF_BY_ONE,
    REVERSED,
    TAMPERED_ARTIFACT,
    UPSTREAM_ERRORS,
    WRONG_DIGEST,
    DeviantPeer,
    captured,
    hostile_peer,
)
from tests.test_daemon import PY, Daemon, free_port
from tests.test_server import LiveServer

TOKEN = "tok-conformance"
OWN_OPS, REMOTE_OPS = 230, 120


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A palace with two origins: 230 own ops (some naming artifacts) and 120 relayed."""
    palace = tmp_path_factory.mktemp("conformance") / "palace"
    with Store.open(palace) as store:
        arts = [store.put_artifact("note", f"artifact {i} ✓\r\n", "kit") for i in range(3)]
        for i in range(OWN_OPS):
            named = [arts[i % 3]["id"]] if i % 40 == 0 else None
            store.append_event("task.note", "proj", "room", "agent", body=f"op {i} — ü",
                               artifact_ids=named, metadata={"i": i, "f": 2.5})
        kit = RemoteKit()
        store.apply_remote(kit.chain(kit.origin(7), REMOTE_OPS), [])
    return palace


# Deviations tests/deviant_peer.py has no mode for, planted by `Broken` below.
UNKNOWN_404 = "unknown_404"  # §7.2: an origin not held is 404, not an empty page
NO_DEFAULT_AFTER = "no_default_after"  # §7.2: a missing or empty `after` is taken as 1
OVERSTATED = "overstated"  # §6: the vector's entry of the own origin is 7 above its top
MSGPACK_UNASKED = "msgpack_unasked"  # §7: /sync/ops answers msgpack to a JSON-only request
UTF16 = "utf16"  # §7: /sync/ops answers JSON in UTF-16 (labelled utf-8)
NO_CONTENT_TYPE = "no_content_type"  # §7: /sync/ops answers without a Content-Type
NAN = "nan"  # §7: /sync/ops answers hold a NaN (not JSON)
OPEN_OPS = "open_ops"  # §7 rule 2: only /sync/version_vector checks the token
OPEN_SNAPSHOT = "open_snapshot"  # §7 rule 2: /sync/snapshot (the whole store) is open
FORBIDDEN = "forbidden"  # §7 rule 1: every answer 403 (a Host or Origin refused)
ZSTD_OTHER = "zstd_other"  # D5: the page coded when asked is another page
SLOW = "slow"  # conforming, but every /sync/ops answer takes 2.5 s
SLOW_S = 2.5


class Broken:
    """Wraps an ASGI app to break one rule tests/deviant_peer.py has no mode for: the
    request changed on the way in, or the whole answer (status, headers, bytes) on the
    way out. Only `/sync/*` is touched."""

    def __init__(self, app: Any, mode: str) -> None:
        self.app = app
        self.mode = mode

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/sync/"):
            await self.app(scope, receive, send)
            return
        scope = self._request(scope, path)
        start, whole = await captured(self.app, scope, receive)
        if self.mode == SLOW and path == "/sync/ops":
            await asyncio.sleep(SLOW_S)
        headers = {k.lower(): v for k, v in start.get("headers") or []}
        status, body = self._answer(path, start["status"], headers, whole)
        headers[b"content-length"] = str(len(body)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": list(headers.items())})
        await send({"type": "http.response.body", "body": body})

    def _request(self, scope: dict[str, Any], path: str) -> dict[str, Any]:
        if self.mode == OPEN_OPS and path != "/sync/version_vector" or \
                self.mode == OPEN_SNAPSHOT and path == "/sync/snapshot":
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"authorization"]
            headers.append((b"authorization", f"Bearer {TOKEN}".encode()))
            return dict(scope, headers=headers)
        if self.mode == NO_DEFAULT_AFTER and path == "/sync/ops":
            pairs = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
            if not dict(pairs).get("after"):
                pairs = [(k, v) for k, v in pairs if k != "after"] + [("after", "1")]
            return dict(scope, query_string=urlencode(pairs).encode("latin-1"))
        return scope

    def _answer(self, path: str, status: int, headers: dict[bytes, bytes],
                body: bytes) -> tuple[int, bytes]:
        if self.mode == FORBIDDEN:
            return 403, b'{"error": "forbidden", "reason": "host not allowed"}'
        if self.mode == ZSTD_OTHER and headers.get(b"content-encoding") == b"zstd":
            data = json.loads(zstandard.ZstdDecompressor().decompressobj().decompress(body))
            data["events"][0]["body"] += " (only in the coded page)"
            return status, zstandard.ZstdCompressor().compress(
                json.dumps(data, ensure_ascii=False).encode("utf-8"))
        json_ok = status == 200 and headers.get(b"content-type", b"").startswith(
            b"application/json")
        if not json_ok:
            return status, body
        data = json.loads(body)
        if self.mode == OVERSTATED and path == "/sync/version_vector":
            data["version_vector"][data["replica_id"]] += 7
        elif path != "/sync/ops":
            return status, body
        elif self.mode == UNKNOWN_404 and not data["events"]:
            return 404, b'{"error": "not_found", "reason": "origin not found"}'
        elif self.mode == MSGPACK_UNASKED:
            headers[b"content-type"] = b"application/msgpack"
            return status, msgpack.packb(data)
        elif self.mode == UTF16:
            return status, body.decode("utf-8").encode("utf-16")
        elif self.mode == NO_CONTENT_TYPE:
            del headers[b"content-type"]
            return status, body
        elif self.mode == NAN:
            data["took_ms"] = float("nan")
        else:
            return status, body
        return status, json.dumps(data, ensure_ascii=False).encode("utf-8")


@pytest.fixture
def served(populated: Path, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """`serve(deviation)`: the populated palace (a copy) behind a DeviantPeer on uvicorn;
    `broken` wraps that in `Broken(mode)`, `empty` serves a palace holding no ops."""
    palace = tmp_path / "palace"
    shutil.copytree(populated, palace)
    live: list[LiveServer] = []

    def serve(deviation: str | None, *, broken: str | None = None, empty: bool = False,
              **settings: int) -> str:
        served_palace = tmp_path / "empty" if empty else palace
        app = create_app(store_factory=lambda: Store.open(served_palace), token=TOKEN,
                         **settings)
        app = DeviantPeer(app, deviation)
        if broken is not None:
            app = Broken(app, broken)
        server = LiveServer(app).__enter__()
        live.append(server)
        return server.url

    yield serve
    for server in live:
        server.__exit__(None, None, None)


def failed_checks(report) -> set[tuple[str, str]]:
    return {(o.section, o.check) for o in report.failures()}


def test_a_logsync_daemon_passes_every_applicable_check(populated: Path,
                                                         tmp_path: Path) -> None:
    palace = tmp_path / "daemon"
    shutil.copytree(populated, palace)
    daemon = Daemon(palace, free_port(), TOKEN)
    try:
        done = subprocess.run([*PY, "conformance", daemon.url, "--token", TOKEN, "--writable",
                               "--json"], capture_output=True, text=True, timeout=120)
    finally:
        daemon.stop()
    payload = json.loads(done.stdout)
    assert (done.returncode, payload["failures"]) == (EXIT_PASS, []), done.stdout
    verdicts = {s["section"]: s["verdict"] for s in payload["sections"]}
    assert set(verdicts.values()) <= {PASS, NA}
    for section in ("§3", "§4", "§5", "§6", "§7.1", "§7.2", "§7.3", "§7.4", "§7.5", "§7.6",
                    "§7.7", "§8", "§8.1", "§11", "§12", "§13"):
        assert verdicts[section] == PASS, (section, payload)
    checks = {(c["section"], c["check"]): c["verdict"] for s in payload["sections"]
              for c in s["checks"]}
    for must in (("§7.2", "after-offset"), ("§7.2", "empty-above-top"),
                 ("§7.3", "artifact-sha256"), ("§7.4", "digests-match"),
                 ("§7.4", "tips-match"), ("§8.1", "page-byte-budget"),
                 ("§8", "msgpack-same-events"), ("§7.5", "pushed-served-verbatim"),
                 ("§12", "token-required"), ("§12", "wrong-token-refused"),
                 ("§7.2", "zstd-same-bytes"),
                 ("§7.2", "unknown-origin-empty"), ("§7.2", "defaults"),
                 ("§6", "vector-top-held")):
        assert checks[must] == PASS, must
    assert checks[("§7.5", "append")] == NA  # RFC 004 has no HTTP append
    with Store.open(palace, read_only=True) as store:  # --writable pushed one new origin
        assert len(store.version_vector()) == 3


def vector_of(url: str) -> dict:
    return httpx.get(url + "/sync/version_vector", timeout=5,
                     headers={"Authorization": f"Bearer {TOKEN}"}).json()["version_vector"]


def test_the_wrapper_without_a_deviation_passes_and_reads_change_nothing(served) -> None:
    url = served(None)
    before = vector_of(url)
    report = run_conformance(url, TOKEN)
    assert (report.exit_code(), report.failures()) == (EXIT_PASS, [])
    assert vector_of(url) == before  # without --writable the kit only reads
    verdicts = {o.check: o.verdict for o in report.outcomes if o.section == "§7.5"}
    assert verdicts == {"append": NA, "push-applied": NA}  # not asked to write


def test_a_small_page_byte_budget_bounds_the_whole_answer(served) -> None:
    """§8: with max_page_bytes 2048 every large page, inline artifacts and chain included,
    is within 2048 bytes unless it holds one op; the pages are many and short."""
    report = run_conformance(served(None, max_page_bytes=2048), TOKEN)
    checks = {(o.section, o.check): o for o in report.outcomes}
    assert checks[("§8.1", "page-byte-budget")].verdict == PASS, report.lines()
    assert not [o for o in report.failures() if o.section in ("§7.2", "§8", "§8.1")], \
        report.lines()


def test_a_peer_without_a_change_stream_conforms_with_the_stream_not_applicable(
        served) -> None:
    """RFC 004 §7.7: a peer SHOULD serve the stream; one that answers 404 is not failed."""
    report = run_conformance(served(NO_STREAM), TOKEN)
    verdicts = {(o.section, o.check): o.verdict for o in report.outcomes}
    assert report.exit_code() == 0, report.lines()
    assert verdicts[("§7.7", "stream-opens")] == "n/a"


@pytest.mark.parametrize(("deviation", "caught"), [
    (REVERSED, ("§7.2", "page-order-and-after")),
    (OFF_BY_ONE, ("§7.2", "after-offset")),
    (NO_BUDGET, ("§8.1", "page-byte-budget")),
    (UPSTREAM_ERRORS, ("§11", "negative-after")),
    (WRONG_DIGEST, ("§7.4", "digests-match")),
    (TAMPERED_ARTIFACT, ("§7.3", "artifact-sha256")),
])
def test_each_planted_deviation_fails_in_its_own_section(served, deviation: str,
                                                         caught: tuple[str, str]) -> None:
    report = run_conformance(served(deviation), TOKEN)
    failed = failed_checks(report)
    assert report.exit_code() == EXIT_FAIL
    assert caught in failed, report.lines()
    assert {section for section, _ in failed} == {caught[0]}, report.lines()
    (sentence,) = [o.sentence for o in report.failures() if (o.section, o.check) == caught]
    assert "\n" not in sentence
    if deviation == OFF_BY_ONE:
        assert ("§7.2", "page-order-and-after") in failed  # the walk's second page too
    if deviation == UPSTREAM_ERRORS:
        assert ("§11", "unauthorized-shape") in failed
        assert "error table" in sentence


@pytest.mark.parametrize("kind", ["garbage", "endless", "silent", "drip", "header_drip"])
def test_a_hostile_peer_ends_in_bounded_time_with_one_line(kind: str) -> None:
    with hostile_peer(kind) as url:
        done = subprocess.run([*PY, "conformance", url, "--timeout", "0.5"],
                              capture_output=True, text=True, timeout=30)
    assert done.returncode == EXIT_UNUSABLE, done.stdout + done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "cannot be checked" in lines[0], lines
    assert "Traceback" not in done.stderr


def test_an_unreachable_peer_and_a_wrong_token_are_exit_2(served) -> None:
    port = free_port()  # nothing listens there
    assert run_conformance(f"http://127.0.0.1:{port}", None).exit_code() == EXIT_UNUSABLE
    report = run_conformance(served(None), "wrong-token")
    assert report.exit_code() == EXIT_UNUSABLE
    assert "401" in (report.unusable or "")


def test_the_cli_prints_one_line_per_failure_under_its_section(served) -> None:
    done = subprocess.run([*PY, "conformance", served(UPSTREAM_ERRORS), "--token", TOKEN],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_FAIL, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("§11 ")))
    assert lines[header].split()[2] == FAIL
    assert lines[header + 1].startswith("      FAIL negative-after: /sync/ops?")
    assert lines[-1].endswith("failed") and done.stderr == ""


def test_a_spent_request_budget_ends_the_run_incomplete_not_failed(served) -> None:
    """The kit's own limits are not the peer's fault: a spent budget makes the run
    incomplete (exit 2, one line naming the request not made), with no failure (it was
    a §-less FAIL with exit 1, found by a reviewer)."""
    report = run_conformance(served(None), TOKEN, max_requests=10)
    assert (report.exit_code(), report.failures(), report.requests) == (EXIT_UNUSABLE, [], 10)
    assert report.incomplete is not None and "budget of 10 requests" in report.incomplete
    assert report.as_dict()["incomplete"] == report.incomplete
    (line,) = [line for line in report.lines() if line.startswith("incomplete: ")]
    assert line.endswith("the checks after it were not made")
    assert "all applicable checks pass" not in report.lines()


def test_a_slow_peer_cut_by_the_kits_deadline_is_incomplete_not_failed(served) -> None:
    """A request the kit's --deadline cut short (its --timeout would have let it finish)
    is the run's limit, not a §7.2 timeout of the peer (found by a reviewer)."""
    report = run_conformance(served(None, broken=SLOW), TOKEN, deadline=1.5, timeout=10)
    assert (report.exit_code(), report.failures()) == (EXIT_UNUSABLE, []), report.lines()
    assert report.incomplete is not None
    assert "the kit's deadline passed during GET /sync/ops" in report.incomplete
    assert report.lines()[-1].startswith("incomplete: ")


def test_a_slow_peer_past_the_request_timeout_is_still_failed(served) -> None:
    """The other side of the line: past its own --timeout a peer is at fault."""
    # --timeout well above what the vector takes on a loaded machine, well below SLOW_S
    report = run_conformance(served(None, broken=SLOW), TOKEN, timeout=1.0, deadline=8,
                             max_requests=30)
    assert report.exit_code() == EXIT_FAIL, report.lines()
    assert any("/sync/ops" in o.sentence and ("timed out" in o.sentence or
               "did not finish within 1 s" in o.sentence) for o in report.failures()), \
        report.lines()


@pytest.mark.parametrize(("broken", "caught", "words"), [
    # §7.2: an origin the peer does not hold is an empty page, whatever the vector
    (UNKNOWN_404, ("§7.2", "unknown-origin-empty"), "HTTP 404"),
    # §7.2: `after` defaults to 0, also when empty
    (NO_DEFAULT_AFTER, ("§7.2", "defaults"), "starting at origin_seq 2"),
    # §7 rule 2: every route but /healthz needs the token
    (OPEN_OPS, ("§12", "token-required"), "/sync/ops"),
    # ... the snapshot's too (it passed while only the three mandatory routes were asked)
    (OPEN_SNAPSHOT, ("§12", "token-required"), "/sync/snapshot"),
    # D5: a page coded when asked decodes to the plain page's bytes
    (ZSTD_OTHER, ("§7.2", "zstd-same-bytes"), "decodes to other bytes"),
])
def test_each_new_deviation_fails_in_its_own_section(served, broken: str,
                                                     caught: tuple[str, str],
                                                     words: str) -> None:
    """False passes a reviewer found: each broken peer exited 0."""
    report = run_conformance(served(None, broken=broken, empty=broken == UNKNOWN_404), TOKEN)
    failed = failed_checks(report)
    assert report.exit_code() == EXIT_FAIL and caught in failed, report.lines()
    assert {section for section, _ in failed} == {caught[0]}, report.lines()
    (sentence,) = [o.sentence for o in report.failures() if (o.section, o.check) == caught]
    assert words in sentence, sentence


def test_a_vector_overstating_an_origin_beyond_the_walk_fails_section_6(
        served, monkeypatch: pytest.MonkeyPatch) -> None:
    """§6: the vector's entry is an op the peer serves, also for an origin too long to
    walk (here the walk is cut to one page so 230 ops are beyond it)."""
    monkeypatch.setattr(reads, "MAX_WALK_PAGES", 1)
    report = run_conformance(served(None, broken=OVERSTATED), TOKEN)
    (sentence,) = [o.sentence for o in report.failures() if (o.section, o.check) == (
        "§6", "vector-top-held")]
    assert "after=236&limit=1" in sentence and "237" in sentence, sentence


@pytest.mark.parametrize(("broken", "words"), [
    (MSGPACK_UNASKED, "application/msgpack to a request that accepted only application/json"),
    (UTF16, "not UTF-8"),
    (NO_CONTENT_TYPE, "no Content-Type"),
    (NAN, "NaN"),
])
def test_a_json_answer_is_utf8_json_with_its_media_type(served, broken: str,
                                                        words: str) -> None:
    """§7: JSON answers are application/json; charset=utf-8, UTF-8, and JSON (no NaN);
    each deviation passed before (the kit decoded whatever came)."""
    report = run_conformance(served(None, broken=broken), TOKEN)
    assert report.exit_code() == EXIT_FAIL, report.lines()
    first = next(o for o in report.failures() if o.section == "§7.2")
    assert words in first.sentence, first.sentence


@pytest.mark.parametrize(("ctype", "body", "problem"), [
    ("application/json; charset=utf-8", b'{"a": "NaN, Infinity, -Infinity"}', None),
    ("application/json", b'{"a": 1}', None),
    ("application/json; charset=UTF-8", "{\"a\": \"\u00fc\"}".encode(), None),
    ("application/json; charset=iso-8859-1", b'{"a": 1}', "charset"),
    ("application/json", '{"a": "\u00fc"}'.encode("latin-1"), "not UTF-8"),
    ("application/json", '{"a": 1}'.encode("utf-16-le"), "not UTF-8"),
    ("application/json", b'\xef\xbb\xbf{"a": 1}', "byte order mark"),
    ("application/msgpack", msgpack.packb({"a": 1}), "accepted only application/json"),
    ("application/json", b'{"a": -Infinity}', "-Infinity"),
    ("text/plain", b'{"a": 1}', "text/plain"),
])
def test_answers_are_decoded_strictly_in_one_place(ctype: str, body: bytes,
                                                   problem: str | None) -> None:
    data, found = decoded(ctype, body, "GET /x", "peer", msgpack_asked=False)
    if problem is None:
        assert found is None and isinstance(data, dict)
    else:
        assert found is not None and problem in found, found


def test_a_status_problem_shows_the_body_as_text() -> None:
    body = '{"error": "nope ü"}'.encode()
    reply = Reply(404, "application/json", body, None, None, httpx.Headers())
    sentence = status_problem(reply, "/sync/x")
    assert sentence is not None and "b'" not in sentence and '{"error": "nope ü"}' in sentence


def test_a_url_with_a_user_and_password_is_refused_before_any_request() -> None:
    """httpx would send them as Basic auth in place of the Bearer token."""
    with pytest.raises(ValidationError, match="--token"):
        run_conformance(f"http://u:pw@127.0.0.1:{free_port()}", TOKEN)


def test_a_403_at_the_start_names_host_origin_and_token(served) -> None:
    report = run_conformance(served(None, broken=FORBIDDEN), TOKEN)
    assert report.exit_code() == EXIT_UNUSABLE
    assert report.unusable is not None and "Host" in report.unusable and \
        "§7" in report.unusable, report.unusable


verdicts = st.sampled_from([PASS, FAIL, NA])


@given(st.lists(st.tuples(st.sampled_from(list(SECTIONS)), st.sampled_from("abc"), verdicts,
                          st.text(max_size=20)), max_size=30),
       st.one_of(st.none(), st.text(min_size=1, max_size=20)),
       st.one_of(st.none(), st.text(min_size=1, max_size=20)))
def test_the_exit_code_and_section_verdicts_follow_the_outcomes(outcomes, unusable,
                                                                incomplete) -> None:
    report = Report(peer="p", unusable=unusable, incomplete=incomplete)
    for section, check, verdict, sentence in outcomes:
        report.add(section, check, verdict, sentence)
    failed = any(v == FAIL for _, _, v, _ in outcomes)
    assert report.exit_code() == (EXIT_UNUSABLE if unusable else EXIT_FAIL if failed
                                  else EXIT_UNUSABLE if incomplete else EXIT_PASS)
    for section in SECTIONS:
        mine = {v for s, _, v, _ in outcomes if s == section}
        assert report.section_verdict(section) == (FAIL if FAIL in mine else PASS if PASS in mine
                                                   else NA)
    if unusable is None:
        fail_lines = [line for line in report.lines() if line.startswith("      FAIL ")]
        assert len(fail_lines) == sum(v == FAIL for _, _, v, _ in outcomes)


def test_a_peer_written_to_while_the_kit_runs_is_not_failed(tmp_path: Path) -> None:
    """A live peer grows between the kit's vector read and its walks, offsets and tips:
    ops above the vector read at the start are fine when the peer's vector now holds
    them, and a tip may be above that vector's entry (found by a reviewer: 3 false
    failures)."""
    palace = tmp_path / "live"
    with Store.open(palace) as store:
        for i in range(120):
            store.append_event("t.x", "m", "r", "a@b", body=f"op {i}")
    stop = threading.Event()

    def writer() -> None:
        with Store.open(palace) as store:
            while not stop.is_set():
                store.append_event("t.x", "m", "r", "a@b", body="live")
                time.sleep(0.01)

    app = create_app(store_factory=lambda: Store.open(palace), token=TOKEN)
    with LiveServer(app) as live:
        thread = threading.Thread(target=writer)
        thread.start()
        try:
            report = run_conformance(live.url, TOKEN)
        finally:
            stop.set()
            thread.join(10)
    assert report.exit_code() == 0, [o for o in report.failures()]
