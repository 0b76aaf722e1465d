"""`logsync conformance` (issue 14, item 4): a real daemon passes every applicable check,
each planted deviation (tests/deviant_peer.py) fails the check of its own RFC 004 section
while the same wrapper without a deviation passes, and hostile peers end the run in
bounded time with one line (exit 2)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

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


@pytest.fixture
def served(populated: Path, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """`serve(deviation)`: the populated palace (a copy) behind a DeviantPeer on uvicorn."""
    palace = tmp_path / "palace"
    shutil.copytree(populated, palace)
    live: list[LiveServer] = []

    def serve(deviation: str | None, **settings: int) -> str:
        app = create_app(store_factory=lambda: Store.open(palace), token=TOKEN, **settings)
        server = LiveServer(DeviantPeer(app, deviation)).__enter__()
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
                 ("§12", "token-required")):
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


def test_a_spent_request_budget_stops_the_run_with_one_failure(served) -> None:
    report = run_conformance(served(None), TOKEN, max_requests=10)
    assert report.exit_code() == EXIT_FAIL and report.requests == 10
    (stopped,) = [o for o in report.failures() if "budget of 10 requests" in o.sentence]
    assert stopped.check == "answered" and "stopped there" in stopped.sentence


verdicts = st.sampled_from([PASS, FAIL, NA])


@given(st.lists(st.tuples(st.sampled_from(list(SECTIONS)), st.sampled_from("abc"), verdicts,
                          st.text(max_size=20)), max_size=30),
       st.one_of(st.none(), st.text(min_size=1, max_size=20)))
def test_the_exit_code_and_section_verdicts_follow_the_outcomes(outcomes, unusable) -> None:
    report = Report(peer="p", unusable=unusable)
    for section, check, verdict, sentence in outcomes:
        report.add(section, check, verdict, sentence)
    failed = any(v == FAIL for _, _, v, _ in outcomes)
    assert report.exit_code() == (EXIT_UNUSABLE if unusable else EXIT_FAIL if failed
                                  else EXIT_PASS)
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
