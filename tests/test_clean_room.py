"""RFC 004 is enough to write a peer: a clean-room peer (tests/clean_room/peer.py, written
from the RFC text alone, no `logsync` import) passes `logsync conformance` and is pulled
by `logsync sync` verbatim, with nothing refused and every chain and signature verified.

Both programs run as real processes on loopback; the peer is always stopped.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clean_room.authoring import Store
from tests.procs import stop_process

ROOT = Path(__file__).resolve().parent.parent
LOGSYNC = [str(Path(sys.executable).with_name("logsync"))]
OPS, SEED, BUDGET = 700, 11, 262_144  # a budget small enough to cut pages and artifacts
IMPLEMENTED = ("§3", "§4", "§5", "§6", "§7.1", "§7.2", "§7.3", "§7.4", "§7.7", "§8", "§8.1",
               "§11", "§12", "§13")


class Peer:
    """The clean-room peer as a child process on a free loopback port."""

    def __init__(self, *extra: str):
        self.token = secrets.token_hex(16)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.clean_room.peer", "--port", "0", "--token",
             self.token, "--ops", str(OPS), "--seed", str(SEED),
             "--max-page-bytes", str(BUDGET), *extra],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(30)
        if not line or not line[0].strip():
            self.stop()
            raise RuntimeError(f"the clean-room peer did not start: {self.proc.stderr.read()}")
        self.info = json.loads(line[0])
        self.url = f"http://127.0.0.1:{self.info['port']}"

    def stop(self) -> None:
        stop_process(self.proc)
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def peer_without_bigint() -> Iterator[Peer]:
    p = Peer("--no-bigint")
    try:
        yield p
    finally:
        p.stop()


def logsync(*args: str, palace: Path | None = None, ok=(0,)) -> subprocess.CompletedProcess:
    pre = ["--palace", str(palace)] if palace else []
    done = subprocess.run(LOGSYNC + pre + list(args), capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode in ok, (args, done.returncode, done.stdout[-2000:], done.stderr)
    return done


def conformance(p: Peer) -> tuple[int, dict]:
    done = logsync("conformance", p.url, "--token", p.token, "--json", ok=(0, 1, 2))
    return done.returncode, json.loads(done.stdout)


def test_the_clean_room_peer_passes_conformance(peer_without_bigint: Peer) -> None:
    code, report = conformance(peer_without_bigint)
    verdicts = {s["section"]: s["verdict"] for s in report["sections"]}
    failed = [c for s in report["sections"] for c in s["checks"] if c["verdict"] == "fail"]
    assert code == 0 and report["exit_code"] == 0, failed
    assert set(verdicts.values()) <= {"pass", "n/a"}, verdicts
    assert all(verdicts.get(s) == "pass" for s in IMPLEMENTED), verdicts


def test_a_metadata_integer_beyond_64_bits_passes_conformance(peer: Peer) -> None:
    """RFC 004 §8 item 3: a page msgpack cannot encode (an integer beyond 64 bits) falls
    back to JSON, and the kit takes that."""
    code, report = conformance(peer)
    failed = [c for s in report["sections"] for c in s["checks"] if c["verdict"] == "fail"]
    assert code == 0, failed


def test_a_planted_wrong_prev_fails_conformance() -> None:
    """The checker can fail: the same peer with every page's chain.prev wrong."""
    p = Peer("--plant", "prev")
    try:
        code, report = conformance(p)
    finally:
        p.stop()
    failed = {c["section"] for s in report["sections"] for c in s["checks"]
              if c["verdict"] == "fail"}
    assert code == 1 and "§7.4" in failed, report


@pytest.mark.parametrize(("plant", "check"), [("sigs", ("§12", "signatures-verify")),
                                             ("tips", ("§7.4", "tips-match"))])
def test_conformance_finds_planted_signature_and_tip_defects(plant: str,
                                                            check: tuple[str, str]) -> None:
    """Signatures on pages and in `tip_sigs` are verified over the chain (§10.3, §12.2),
    and tips are checked on every chained origin, walked to its top or not."""
    p = Peer("--plant", plant, "--no-bigint")
    try:
        code, report = conformance(p)
    finally:
        p.stop()
    failed = {(c["section"], c["check"]) for s in report["sections"] for c in s["checks"]
              if c["verdict"] == "fail"}
    assert code == 1 and check in failed, failed


def test_a_planted_bad_signature_is_refused_by_sync(tmp_path: Path) -> None:
    """The sync assertions can fail: wrong signatures stop both signed origins."""
    p = Peer("--plant", "sigs")
    try:
        logsync("init", str(tmp_path / "p"))
        done = logsync("sync", "--peer", p.url, "--token", p.token, "--pull-only", "--json",
                       palace=tmp_path / "p", ok=(1,))  # stopped origins: exit 1
        [report] = json.loads(done.stdout)
    finally:
        p.stop()
    stops = [d["stop_reason"] for d in report["per_origin_detail"].values()]
    assert report["quarantined"] == 2 and report["pulled_events"] < OPS, report
    assert stops.count("store stopped this origin: bad_signature") == 2, stops
    assert len(report["stopped_origins"]) == 2, report


def all_events(palace: Path) -> list[dict]:
    """Every event of the palace in local order, through `logsync list` (500 a call)."""
    events: list[dict] = []
    for _ in range(OPS // 500 + 2):
        cursor = ["--since-event-id", events[-1]["id"]] if events else []
        page = json.loads(logsync("list", "--order", "asc", "--limit", "500", "--json",
                                  *cursor, palace=palace).stdout)["events"]
        if not page:
            break
        events += page
    return events


def test_logsync_sync_pulls_every_op_of_the_clean_room_peer_verbatim(
        peer: Peer, tmp_path: Path) -> None:
    palace = tmp_path / "palace"
    logsync("init", str(palace), "--json")
    pull = ["sync", "--peer", peer.url, "--token", peer.token, "--pull-only", "--json"]
    [first] = json.loads(logsync(*pull, palace=palace).stdout)
    assert first["peer_replica"] == peer.info["replica_id"]
    assert first["pulled_events"] == OPS
    assert (first["conflicts"], first["quarantined"], first["failed_origins"]) == (0, 0, {})
    # the byte budget cut pages, and inline artifacts it left out were fetched one by one
    assert all(d["stop_reason"] == "caught up" and d["reached"] == d["target"]
               for d in first["per_origin_detail"].values()), first["per_origin_detail"]
    assert max(d["pages"] for d in first["per_origin_detail"].values()) > 1

    info = json.loads(logsync("info", "--json", palace=palace).stdout)
    assert info["version_vector"] == peer.info["vector"]
    assert (info["events"], info["conflicts"], info["quarantined"]) == (OPS, 0, 0)
    signed = {o: s["state"] for o, s in info["signing"].items()}
    assert sorted(signed.values()) == ["signed", "signed", "unsigned"], signed

    store = Store(OPS, SEED)  # the peer's own ops, authored again from the same seed
    served = {(e["origin_replica"], e["origin_seq"]): e for e in store.timeline}
    pulled = all_events(palace)
    assert len(pulled) == OPS
    for event in pulled:
        want = served[(event["origin_replica"], event["origin_seq"])]
        assert list(event) == list(want)
        assert {**event, "seq": 0} == {**want, "seq": 0}

    verified = logsync("verify", palace=palace).stdout  # exit 0: every chain verifies
    assert verified.count("chain ok") == 3, verified
    assert f"artifacts {len(store.artifacts)} ok" in verified, verified

    [again] = json.loads(logsync(*pull, palace=palace).stdout)
    assert (again["pulled_events"], again["conflicts"], again["quarantined"]) == (0, 0, 0)
