"""Issue 8: one hostile peer per finding, against a real `logsync serve` and `logsync sync`.

Each test serves one mode of `logsync.hostile` from a real HTTP server on loopback
(`server.HostileServer`) to a victim daemon that lists it in peers.json (pulling
every second) and to a one-shot `logsync sync --peer URL`, then checks the promise
of the issue -- a fault stays with its cause:

- the victim daemon is alive afterwards, and `/healthz` answered within 1 s throughout
  (polled every 100 ms);
- the good origin the same peer serves honestly converged on the victim (and in the
  `sync` palace), however the bad origin misbehaves;
- nothing invalid is stored (read-only SQLite, whole-string ASCII rules);
- a downstream replica pulling from the victim gets everything the victim holds;
- the victim's peak RSS (VmHWM) stays under 300 MB;
- `sync` names the peer once, puts the error on stderr, never prints a traceback.

The per-mode peak RSS and worst `/healthz` latency go to the terminal summary and
to `hostile_figures.json` in pytest's base temp directory.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_daemon import PY, run

from logsync import hostile
from logsync.hostile import GOOD_COUNT, GOOD_ORIGIN, Scene, make_event, sse_frame
from logsync.store import Store

from .conftest import FIGURES
from .harness import (
    HealthWatch,
    Victim,
    conflicts,
    invalid_stored,
    stored_rows,
    wait_until,
)
from .server import HostileServer

MAX_HEALTH_LATENCY_S = 1.0
MAX_RSS_MB = 300.0
HOSTILE_TOKEN = "tok-hostile"


@dataclass
class Case:
    mode: str
    findings: tuple[int, ...]
    sync: str = "either"  # "error": must exit 1; "ok": must exit 0; "either"
    converge: float = 30.0  # seconds for the good origin to reach the victim
    settle: float = 3.0  # more rounds against the bad origin after that
    sync_timeout: float = 90.0
    label: str = ""  # the figures' key (default: the mode)


@dataclass
class Run:
    """What one mode run saw; `problems` collects every broken promise."""

    case: Case
    tmp: Path
    scene: Scene
    hostile: HostileServer
    victim: Victim | None = None
    watch: HealthWatch | None = None
    problems: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def fail(self, message: str) -> None:
        self.problems.append(message)


Step = Callable[[Run], None]


def replica_of(palace: Path, own_ops: list[dict[str, Any]] | None = None) -> str:
    with Store.open(palace) as store:
        for fields in own_ops or []:
            store.append_event(**fields)
        return store.replica_id


def own_ops(palace: Path) -> list[dict[str, Any]]:
    with Store.open(palace) as store:
        return store.list_ops(store.replica_id, 0, 100)


def exercise(case: Case, tmp: Path, *, prepare: Step | None = None,
             live: Step | None = None, after_sync: Step | None = None,
             peer_url: Callable[[HostileServer], str] | None = None) -> Run:
    """The whole life of one mode; fails the test with every broken promise listed."""
    victim_palace, sync_palace = tmp / "victim", tmp / "syncer"
    victims = (replica_of(victim_palace), replica_of(sync_palace))
    scene = Scene.build(case.mode, victims=victims)
    server = HostileServer(scene)
    state = Run(case, tmp, scene, server)
    state.extra.update(victim_id=victims[0], sync_id=victims[1])
    if prepare:
        prepare(state)
    server.start()
    url = peer_url(server) if peer_url else server.url
    sync: subprocess.Popen[str] | None = None
    downstream: Victim | None = None
    started = time.monotonic()
    try:
        # a URL's user name and password are its credentials (a token beside them is refused)
        credentials = () if "@" in url else ("--token", HOSTILE_TOKEN)
        run(victim_palace, "peers", "add", "hostile", url, *credentials)
        if "partner" in state.extra:
            run(victim_palace, "peers", "add", "partner", state.extra["partner"].url)
        sync = subprocess.Popen(
            [*PY, "--palace", str(sync_palace), "sync", "--peer", server.url, "--token",
             HOSTILE_TOKEN], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        state.victim = victim = Victim(victim_palace, token="tok-victim",
                                       interval=state.extra.get("interval", 1.0))
        state.watch = HealthWatch(victim.url).start()
        _converge(state)
        _settle(state)
        if live and victim.alive():
            live(state)
        _check_delivered(state)
        _check_sync(state, sync, server.url)
        if after_sync and victim.alive():
            after_sync(state)
        server.stop()
        if "partner" in state.extra:
            state.extra["partner"].stop()
        if not victim.alive():
            state.fail(f"the victim daemon died (exit {victim.proc.returncode}):\n"
                       f"{victim.log_text()}")
        else:
            downstream = _downstream(state)
            state.extra["rss_mb"] = victim.peak_rss_mb()
        _check_store(state, victim_palace, "victim")
        if downstream is not None:
            _check_store(state, downstream.palace, "downstream")
    finally:
        if sync is not None and sync.poll() is None:
            sync.kill()
            sync.communicate(timeout=10)
        if state.watch is not None:
            state.watch.stop()
        for proc in (downstream, state.victim):
            if proc is not None:
                proc.stop()
        server.stop()
        _record(state, time.monotonic() - started)
    _verdict(state)
    return state


def _converge(state: Run) -> None:
    victim = state.victim
    assert victim is not None
    try:
        wait_until(lambda: not victim.alive() or victim.vector().get(GOOD_ORIGIN) == GOOD_COUNT,
                   state.case.converge, "the good origin never reached the victim",
                   victim.log_text)
    except AssertionError as exc:
        state.fail(str(exc))
    if not victim.alive():
        state.fail("the victim died before the good origin converged")


def _settle(state: Run) -> None:
    """A few more rounds against the bad origin (a mode may end the wait early)."""
    until = time.monotonic() + state.case.settle
    done = state.extra.get("settled")
    while time.monotonic() < until and state.victim is not None and state.victim.alive():
        if done is not None and done(state):
            return
        time.sleep(0.1)


def _check_delivered(state: Run) -> None:
    """The attack reached the victim: it asked for a bad origin (or the bad stream)."""
    mode = state.case.mode
    if mode == "honest":
        return
    if mode.startswith("sse_"):
        asked = state.hostile.seen("/logstream/stream")
    else:
        answer = state.scene.answer("/sync/version_vector", {})
        vector = answer.body["version_vector"]
        bad = {o for o in vector if o != GOOD_ORIGIN}
        asked = [p for p in state.hostile.seen("/sync/ops") if p.get("origin") in bad]
        if not asked and any(not isinstance(t, int) or t > 2**62 for t in vector.values()):
            # The attack is the vector entry itself: refused there, the origin skipped.
            asked = state.hostile.seen("/sync/version_vector")
    if not asked:
        state.fail(f"the victim never asked for what mode {mode} bends: the test proves nothing")


def _check_sync(state: Run, sync: subprocess.Popen[str], url: str) -> None:
    case = state.case
    try:
        out, err = sync.communicate(timeout=case.sync_timeout)
    except subprocess.TimeoutExpired:
        sync.kill()
        out, err = sync.communicate(timeout=10)
        state.fail(f"`logsync sync` did not end within {case.sync_timeout:.0f} s "
                   f"(stderr tail: {err[-300:]!r})")
        state.extra["sync_rc"] = "timeout"
        return
    rc = sync.returncode
    state.extra["sync_rc"] = rc
    said = f"(exit {rc}; stdout {out[-400:]!r}; stderr {err[-600:]!r})"
    if "Traceback" in out + err or "ExceptionGroup" in out + err:
        state.fail(f"`logsync sync` printed a traceback or an ExceptionGroup {said}")
    if case.sync == "error" and rc != 1:
        state.fail(f"`logsync sync` should exit 1 against mode {case.mode} {said}")
    if case.sync == "ok" and rc != 0:
        state.fail(f"`logsync sync` should exit 0 against mode {case.mode} {said}")
    if rc not in (0, 1):
        state.fail(f"`logsync sync` exit code should be 0 or 1 {said}")
    if rc == 1:
        _check_error_lines(state, err, url, said)
    held = sum(1 for r in stored_rows(state.tmp / "syncer") if r["origin_replica"] == GOOD_ORIGIN)
    if held != GOOD_COUNT:
        state.fail(f"`logsync sync` did not sync the good origin ({held}/{GOOD_COUNT}) {said}")


def _check_error_lines(state: Run, err: str, name: str, said: str) -> None:
    """The error is on stderr and names the peer once (never `peer a: peer a:`)."""
    lines = [line for line in err.splitlines() if name in line]
    if not lines:
        state.fail(f"`logsync sync` failed without naming the peer {name} on stderr {said}")
    doubled = [line for line in lines if line.count(name) > 1]
    if doubled:
        state.fail(f"`logsync sync` names the peer more than once in {doubled[0]!r}")


def _downstream(state: Run) -> Victim | None:
    """A second daemon pulling from the victim gets everything the victim holds."""
    victim = state.victim
    assert victim is not None
    time.sleep(1.2)  # a round in flight against the (now stopped) hostile peer ends
    try:
        target = victim.vector()
    except Exception as exc:  # noqa: BLE001 - any failure here is a finding
        state.fail(f"the victim's /sync/version_vector failed: {exc}")
        return None
    down = Victim(state.tmp / "downstream", token="tok-down")
    run(down.palace, "peers", "add", "victim", victim.url, "--token", victim.token)
    try:
        wait_until(lambda: down.vector() == target, 60,
                   f"the downstream replica never got the victim's vector {target}",
                   lambda: f"{victim.log_text()}\n--- downstream ---\n{down.log_text()}")
    except AssertionError as exc:
        state.fail(str(exc))
    if not victim.alive():
        state.fail(f"the victim died serving the downstream replica:\n{victim.log_text()}")
    return down


def _check_store(state: Run, palace: Path, who: str) -> None:
    if not (palace / "logstream.sqlite3").exists():
        return
    bad = invalid_stored(palace)
    if bad:
        state.fail(f"the {who} stored {len(bad)} invalid ops: {bad[:5]}")


def _record(state: Run, seconds: float) -> None:
    watch = state.watch
    FIGURES[state.case.label or state.case.mode] = {
        "findings": list(state.case.findings),
        "max_healthz_latency_s": round(watch.max_latency, 3) if watch else None,
        "healthz_samples": watch.samples if watch else 0,
        "healthz_failures": len(watch.failures) if watch else None,
        "peak_rss_mb": round(state.extra["rss_mb"], 1) if "rss_mb" in state.extra else None,
        "sync_exit": state.extra.get("sync_rc"),
        "seconds": round(seconds, 1),
        "problems": len(state.problems),
    }


def _verdict(state: Run) -> None:
    watch = state.watch
    if watch is not None:
        if watch.failures:
            state.fail(f"/healthz failed {len(watch.failures)} times: {watch.failures[:3]}")
        if watch.max_latency > MAX_HEALTH_LATENCY_S:
            state.fail(f"/healthz took {watch.max_latency:.2f} s at worst "
                       f"(limit {MAX_HEALTH_LATENCY_S} s)")
    rss = state.extra.get("rss_mb")
    if rss is not None and rss > MAX_RSS_MB:
        state.fail(f"the victim's peak RSS was {rss:.0f} MB (limit {MAX_RSS_MB:.0f} MB)")
    if state.problems:
        listed = "\n".join(f"- {p}" for p in state.problems)
        pytest.fail(f"mode {state.case.mode} (finding {state.case.findings}):\n{listed}",
                    pytrace=False)


# ── the modes ─────────────────────────────────────────────────────────


def test_seq_overflow_op_and_vector_entry(tmp_path: Path) -> None:
    """Finding 1: origin_seq 2**63 and a vector entry of 2**64-1."""
    exercise(Case("seq_overflow", (1,)), tmp_path)


def test_metadata_nested_990_deep(tmp_path: Path) -> None:
    """Finding 2: metadata nested ~990 deep, then relayed one hop (the downstream)."""
    exercise(Case("deep_metadata", (2,)), tmp_path)


def test_trailing_newline_origin_and_non_ascii_digits(tmp_path: Path) -> None:
    """Finding 6: `rep_…\\n` origins, ids/types ending in a newline, Arabic-Indic digits."""
    exercise(Case("trailing_newline_origin", (6,)), tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_huge_honest_page_is_pulled_by_halving(tmp_path: Path) -> None:
    """Finding 7: 300 valid ops of 250 KiB; a 5 000-op page is 77 MB > the 64 MiB cap."""
    def all_of_it(state: Run) -> None:
        victim = state.victim
        assert victim is not None
        try:
            wait_until(lambda: victim.vector().get(hostile.BAD_ORIGIN) == 300, 90,
                       "the 300 big honest ops never reached the victim", victim.log_text)
        except AssertionError as exc:
            state.fail(str(exc))

    exercise(Case("huge_page", (7,), sync="ok", sync_timeout=180), tmp_path, live=all_of_it)


def test_bad_page_seq_variants_stop_only_their_origin(tmp_path: Path) -> None:
    """Finding 8: seq 0 / negative / float / bool / string, a backwards page, a 500 and a
    reset, each on its own origin sorting before the good one."""
    exercise(Case("bad_page_seq", (8,), sync="error"), tmp_path)


def test_endless_valid_pages_end_the_round(tmp_path: Path) -> None:
    """Finding 9: a vector entry of 2**62 and valid pages forever."""
    exercise(Case("endless_pages", (9,), settle=4.0, sync_timeout=60), tmp_path)


def test_sse_line_without_newline_is_cut(tmp_path: Path) -> None:
    """Finding 10: 400 MB on /logstream/stream without a newline."""
    def settled(state: Run) -> bool:
        streams = state.hostile.seen("/logstream/stream")
        return (state.hostile.bytes_sent >= hostile.SSE_NO_NEWLINE_BYTES or len(streams) >= 3)

    case = Case("sse_no_newline", (10,), sync="ok", settle=25.0)
    exercise(case, tmp_path, prepare=lambda s: s.extra.update(settled=settled))


def test_sse_line_dripped_in_one_byte_chunks_is_cut_without_freezing_the_victim(
        tmp_path: Path) -> None:
    """Review 2026-12-03: a 1 MiB stream line in one-byte HTTP chunks, written 64 KiB of
    the wire at a time, pinned the victim's loop (each read re-scanned the line so far):
    `/healthz` went silent for minutes and the honest peers' ops stopped arriving. The
    line is refused after `watch.MAX_LINE_PIECES` reads; the loop stays responsive."""
    def settled(state: Run) -> bool:
        return len(state.hostile.seen("/logstream/stream")) >= 2

    case = Case("sse_drip_chunks", (10,), sync="ok", settle=20.0)
    exercise(case, tmp_path, prepare=lambda s: s.extra.update(settled=settled))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dripping_ops_answer_hits_the_deadline(tmp_path: Path) -> None:
    """Finding 10: /sync/ops drips one byte every 20 s (a read timeout never fires)."""
    exercise(Case("drip", (10,), sync="error", converge=150.0, sync_timeout=200.0), tmp_path)


def test_sse_frame_at_far_origin_seq_does_not_hold_the_origin(tmp_path: Path) -> None:
    """Finding 10: the hostile peer's frame names an origin at 2**62 and the pull it starts
    drips; an honest partner peer's later frames for that origin must still be pulled.
    Long interval: after the first full rounds only notifications can deliver."""
    partner = HostileServer(hostile.partner_scene()).start()

    def prepare(state: Run) -> None:
        state.extra["interval"] = 60.0
        state.extra["partner"] = partner

    def later_frames(state: Run) -> None:
        victim, scene = state.victim, partner.scene
        assert victim is not None
        wait_until(lambda: victim.vector().get(hostile.BAD_ORIGIN) == 3, 20,
                   "the partner's ops never reached the victim", victim.log_text)
        # Frames sent at connect are folded into the first full round: send it again now.
        # It may start a (dripping) pull, or a fixed victim may ignore it: either way give
        # it the time to arrive before the partner announces.
        state.scene.stream_frames.append(hostile.far_frame())
        with contextlib.suppress(AssertionError):
            wait_until(lambda: bool(state.hostile.seen("/sync/ops",
                                                       origin=hostile.BAD_ORIGIN)),
                       3, "the far frame never started a pull")
        state.extra["far_pulls"] = len(state.hostile.seen("/sync/ops",
                                                          origin=hostile.BAD_ORIGIN))
        new = make_event(hostile.BAD_ORIGIN, 4)
        scene.held[hostile.BAD_ORIGIN].append(new)
        scene.stream_frames.append(sse_frame(new))
        try:
            wait_until(lambda: victim.vector().get(hostile.BAD_ORIGIN) == 4, 20,
                       "an op the partner announced after the far frame never arrived",
                       victim.log_text)
        except AssertionError as exc:
            state.fail(str(exc))

    try:
        exercise(Case("sse_far_origin", (10,), sync="ok", settle=0.5), tmp_path,
                 prepare=prepare, live=later_frames)
    finally:
        partner.stop()


def test_msgpack_bomb_inside_the_cap(tmp_path: Path) -> None:
    """Finding 11: 60 MB of msgpack 0x90 (an array of 60 M empty arrays)."""
    exercise(Case("msgpack_bomb", (11,), sync="error"), tmp_path)


def test_json_bomb_inside_the_cap(tmp_path: Path) -> None:
    """Finding 11: 60 MB of JSON `[[],[],…]`."""
    exercise(Case("json_bomb", (11,), sync="error"), tmp_path)


def _own_events(count: int) -> list[dict[str, Any]]:
    return [{"type": "task.note", "stream": "s", "room": "r", "from_agent": "pi@victim",
             "body": f"own {i}"} for i in range(count)]


def test_forged_own_far_future_ops_are_pulled_once_and_never_reused(tmp_path: Path) -> None:
    """Findings 12 and 14: our own origin claimed above our counter (far-future HLC, a huge
    origin_seq). Restore recovery runs once, not every round; our next append takes a
    slot the peer does not hold."""
    def prepare(state: Run) -> None:
        victim_id = replica_of(state.tmp / "victim", _own_events(3))
        state.scene.own_held = {victim_id: 3, state.extra["sync_id"]: 0}

    def recovery_once(state: Run) -> None:
        victim_id = state.extra["victim_id"]
        time.sleep(4.0)  # about four more full rounds
        from_zero = state.hostile.seen("/sync/ops", origin=victim_id, after="0")
        if len(from_zero) > 2:
            state.fail(f"restore recovery of our own origin ran {len(from_zero)} times "
                       "(it must run once, not every round)")
        appended = json.loads(run(state.tmp / "victim", "append", "--type", "task.note",
                                  "--stream", "s", "--room", "r", "--from-agent", "pi@victim",
                                  "--json").stdout)
        forged = hostile.forged_seqs(3)
        if appended["origin_seq"] in forged or appended["origin_seq"] <= 3 + 2:
            state.fail(f"the next local append took origin_seq {appended['origin_seq']}, a "
                       f"slot the peer holds for our origin ({forged})")
        far = [r for r in stored_rows(state.tmp / "victim")
               if r["origin_replica"] == victim_id and r["hlc"] >= f"{hostile.FAR_FUTURE_MS}"]
        if far:
            state.fail(f"the victim stored forged far-future ops of its own origin: {far[:2]}")

    exercise(Case("forged_own_far_future", (12, 14), settle=1.0), tmp_path, prepare=prepare,
             live=recovery_once)


def test_numeric_fork_is_recorded_as_a_conflict(tmp_path: Path) -> None:
    """Finding 13: stored {"approved": 1} vs served {"approved": true}, 1 vs 1.0, 0 vs -0.0
    for the same (origin, origin_seq): the victim records a conflict for each."""
    def prepare(state: Run) -> None:
        palace = state.tmp / "victim"
        victim_id = replica_of(palace, [dict(e, metadata=m) for e, m in
                                        zip(_own_events(3), hostile.NUMERIC_METADATA,
                                            strict=True)])
        authored = own_ops(palace)
        lost = make_event(victim_id, 4, ms=int(time.time() * 1000) - 5000)
        state.scene.held[victim_id] = [*hostile.twins(authored), lost]

    def forks_recorded(state: Run) -> None:
        victim_id = state.extra["victim_id"]
        try:
            wait_until(lambda: {c["origin_seq"] for c in conflicts(state.tmp / "victim")
                                if c["origin_replica"] == victim_id} >= {1, 2, 3}, 10,
                       "no conflict recorded for the byte-different numeric twins",
                       state.victim.log_text if state.victim else str)
        except AssertionError as exc:
            state.fail(str(exc))

    exercise(Case("numeric_fork", (13,), sync="ok"), tmp_path, prepare=prepare,
             live=forks_recorded)


def test_unreachable_peer_port_stays_with_its_peer(tmp_path: Path) -> None:
    """Finding 4: a peer at port 99999 in peers.json (written by hand) next to a good one:
    the daemon stays up and keeps pulling; `sync` over both names the bad peer."""
    def add_dead_peer(state: Run) -> None:
        victim = state.victim
        assert victim is not None
        path = victim.palace / "peers.json"
        data = json.loads(path.read_text())
        data["peers"].append({"name": "dead", "url": "http://127.0.0.1:99999"})
        path.write_text(json.dumps(data))
        time.sleep(3.0)  # peers.json is polled every second; several rounds
        new = make_event(GOOD_ORIGIN, GOOD_COUNT + 1)
        state.scene.held[GOOD_ORIGIN].append(new)
        try:
            wait_until(lambda: victim.vector().get(GOOD_ORIGIN) == GOOD_COUNT + 1, 10,
                       "the good peer stopped being pulled after a dead peer was added",
                       victim.log_text)
        except AssertionError as exc:
            state.fail(str(exc))
        both = state.tmp / "both"
        both.mkdir()
        (both / "peers.json").write_text(json.dumps({"peers": [
            {"name": "dead", "url": "http://127.0.0.1:99999"},
            {"name": "hostile", "url": state.hostile.url, "token": HOSTILE_TOKEN}]}))
        proc = run(both, "sync", check=False)
        said = f"(exit {proc.returncode}; stdout {proc.stdout[-300:]!r}; " \
               f"stderr {proc.stderr[-500:]!r})"
        if proc.returncode != 1 or "Traceback" in proc.stderr or "ExceptionGroup" in \
                proc.stderr + proc.stdout:
            state.fail(f"`logsync sync` over a dead and a good peer {said}")
        if "dead" not in proc.stderr and "99999" not in proc.stderr:
            state.fail(f"`logsync sync` did not name the dead peer on stderr {said}")

    exercise(Case("honest", (4,), sync="ok", label="unreachable_port"), tmp_path,
             live=add_dead_peer)


def test_credentials_in_a_peer_url_are_never_shown(tmp_path: Path) -> None:
    """Finding 16: `http://user:pass@host` in peers.json is shown redacted everywhere."""
    secret = "pw-SECRET-9f3"

    def nowhere(state: Run) -> None:
        victim = state.victim
        assert victim is not None
        shown = {
            "/sync/peers": victim.get("/sync/peers").text,
            "status --json": run(victim.palace, "status", "--json", check=False).stdout,
            "peers list": run(victim.palace, "peers", "list", check=False).stdout,
            "the daemon log": victim.log_text(),
        }
        for where, text in shown.items():
            if secret in text:
                state.fail(f"{where} shows the peer URL's password")

    exercise(Case("honest", (16,), sync="ok", label="credentials_in_url"), tmp_path, live=nowhere,
             peer_url=lambda s: s.url.replace("http://", f"http://user:{secret}@"))
