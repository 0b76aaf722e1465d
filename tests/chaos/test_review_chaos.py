"""A review of the chaos harness (issue 13): each test names a behaviour the harness should
have and, in its docstring, what is wrong today and where. All are unit-level (no root, no
cluster): the checker, the workload's bookkeeping, the nemesis's timing, the proxy, the
ownership of tags, the run's figures and its replay command, on crafted inputs and fakes.
"""

from __future__ import annotations

import contextlib
import secrets
import shlex
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from logsync.chaos import netns
from logsync.chaos import run as run_mod
from logsync.chaos.__main__ import parser
from logsync.chaos.checker import OP_TAG, Acked, Replica, check, read_replica
from logsync.chaos.nemesis import Nemesis
from logsync.chaos.proxy import ProxyHub
from logsync.chaos.run import RunConfig
from logsync.chaos.schedule import Fault
from logsync.chaos.timeline import Timeline
from logsync.chaos.workload import Op, Workload
from logsync.store import Store

PATCH = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b ✓\n"


def sql(path: Path, statement: str, *params: object) -> None:
    with contextlib.closing(sqlite3.connect(path / "logstream.sqlite3")) as conn, conn:
        conn.execute(statement, params)


# ── the checker ──────────────────────────────────────────────────────────


def test_an_acknowledged_patch_whose_artifact_no_replica_holds_fails(tmp_path: Path) -> None:
    """checker.py (_read_rows, _check_identical, converged): the artifacts a replica holds
    are read with ``WHERE id IN (SELECT artifact_id FROM event_artifacts)``, so a link to
    an artifact that is *not there* simply yields no row. When every replica lacks it (the
    author lost it, so nobody could pull it), all digests agree and the verdict is green:
    an acknowledged ``patch submit`` lost its patch and the run passes. ``Acked`` does not
    even carry the op's artifact id (``Workload.acknowledged`` drops ``Op.artifact``).
    Fix: fail on any ``event_artifacts`` row whose artifact is missing (and carry the
    acknowledged artifact id into ``Acked`` and require it on every replica)."""
    paths = [tmp_path / name for name in ("a", "b", "c")]
    with Store.open(paths[0]) as author:
        result = author.submit_patch(PATCH, "x", "s", metadata={OP_TAG: "op-patch"})
        ops = author.list_ops(author.replica_id)
        artifacts = [author.get_artifact(i) for e in ops for i in e["artifact_ids"]]
    for path in paths[1:]:
        with Store.open(path) as replica:
            replica.apply_remote(ops, artifacts)
    event = result["event"]
    acked = [Acked(event["id"], event["origin_replica"], event["origin_seq"], "a", "op-patch")]
    for path in paths:  # the patch itself is gone everywhere; the event and its link stay
        sql(path, "DELETE FROM artifacts WHERE id = ?", result["artifact"]["id"])
    replicas = [read_replica(p.name, "logsync", p) for p in paths]
    assert all(r.links for r in replicas) and not any(r.artifacts for r in replicas)
    verdict = check(replicas, acked)
    assert not verdict.ok, "an acknowledged patch's artifact is on no replica, yet the run passes"


# ── the workload's bookkeeping ───────────────────────────────────────────


class _FakeCli:
    def __init__(self, returncode: int, stdout: bytes = b"", stderr: bytes = b"") -> None:
        self.done = subprocess.CompletedProcess(["x"], returncode, stdout, stderr)

    def run(self, *args: object, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        return self.done


def test_a_cli_killed_by_a_signal_is_indeterminate_not_failed(tmp_path: Path) -> None:
    """workload.py (Workload._run): any non-zero exit is *fail* -- including a negative
    return code, i.e. the CLI was killed by a signal (the OOM killer, a sweep's SIGKILL)
    at an unknown point, possibly after its commit. That is Jepsen's *info*
    (indeterminate), not *fail* (definitely did not happen); counted as failed it would
    make any future "failed ops must be absent" check report a false loss-of-atomicity,
    and the verdict's ``failed``/``indeterminate`` figures are wrong today.
    Fix: ``returncode < 0`` -> ``info``."""
    op = Op(tag="t", node="n1", kind="append", start=0.0)
    node = SimpleNamespace(palace=tmp_path, name="n1", kind="logsync")
    Workload._run(None, _FakeCli(-9), node, op, ["append"], b"")  # type: ignore[arg-type]
    assert op.outcome == "info", f"a CLI killed by SIGKILL was recorded as {op.outcome!r}"


def test_an_exit_0_with_a_non_object_answer_is_indeterminate(tmp_path: Path) -> None:
    """workload.py (Workload._run): an exit 0 whose stdout is JSON but not an object
    returns None *without setting* ``op.outcome``: the op (which committed, by its exit
    code) is then neither ok, fail nor info, and vanishes from every figure of the
    verdict (``appends`` and ``acknowledged/failed/indeterminate`` in ``_summary``).
    Fix: set ``op.outcome = "info"`` there as for non-JSON output."""
    op = Op(tag="t", node="n1", kind="append", start=0.0)
    node = SimpleNamespace(palace=tmp_path, name="n1", kind="logsync")
    answer = Workload._run(None, _FakeCli(0, b"[1, 2]"), node, op,  # type: ignore[arg-type]
                           ["append"], b"")
    assert answer is None
    assert op.outcome in ("ok", "fail", "info"), f"outcome {op.outcome!r}: counted nowhere"


# ── the nemesis's timing ─────────────────────────────────────────────────


class _SlowCluster:
    """Records SIGSTOP/SIGCONT times; restarting a node takes ``restart_s`` (as a real
    ``start_node`` waits for the daemon to serve)."""

    def __init__(self, restart_s: float) -> None:
        self.restart_s = restart_s
        self.paused: dict[str, float] = {}
        self.resumed: dict[str, float] = {}

    def kill(self, name: str) -> None:
        pass

    def heal_network(self) -> None:
        pass

    def start_node(self, name: str, **_: object) -> None:
        time.sleep(self.restart_s)

    def pause(self, name: str) -> None:
        self.paused[name] = time.monotonic()

    def resume(self, name: str) -> None:
        self.resumed[name] = time.monotonic()


def test_a_pause_lasts_its_scheduled_length_even_when_it_begins_late() -> None:
    """nemesis.py (Nemesis.run): every action runs at ``began + at`` on one thread, so a
    slow step (a kill's restart waits for the daemon to serve, up to 30 s; a skew's
    restart longer) delays the *begin* of the pause that follows, while its *end*
    (SIGCONT) is still due at the absolute time: the SIGSTOP is shorter than scheduled by
    the delay, and a pause of 31-35 s can end up shorter than the 30 s request timeout it
    exists to exceed (schedule.py promises pauses "always run their full length").
    Scaled down here: a 1.0 s pause begins 0.5 s late and lasts 0.5 s.
    Fix: schedule a pause's end from the moment its SIGSTOP really happened (or skip/flag
    a pause whose begin is late)."""
    cluster = _SlowCluster(restart_s=0.6)
    faults = [Fault("kill", 0.0, 0.1, ["n1"]), Fault("pause", 0.2, 1.0, ["n2"])]
    timeline = Timeline()
    Nemesis(cluster, timeline, faults).run(timeline.now(), threading.Event())  # type: ignore[arg-type]
    assert not [e for e in timeline.entries if e["kind"] == "nemesis_error"]
    stopped = cluster.resumed["n2"] - cluster.paused["n2"]
    assert stopped >= faults[1].duration - 0.05, (
        f"the pause was scheduled for {faults[1].duration} s and lasted {stopped:.2f} s")


# ── the proxy ────────────────────────────────────────────────────────────


def test_a_frozen_link_lets_nothing_through_not_even_a_close() -> None:
    """proxy.py (ProxyHub._pump): a frozen link holds data, but when its source reaches
    EOF the pump calls ``write_eof`` at once without waiting for the link to open (and a
    reset from the source aborts the other side at once too). During a "partition" the
    peer's close -- e.g. uvicorn's 5 s keep-alive timeout on a connection whose request
    the proxy is holding -- reaches the puller as a FIN within seconds, so the puller
    learns of the failure across the cut instead of waiting for its 30 s read timeout:
    the partition does not cut what it says ("frozen: nothing moves").
    Fix: in ``_pump``, ``await link.opened.wait()`` before forwarding EOF (and hold an
    abort until thawed)."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def serve() -> None:
        conn, _ = server.accept()
        accepted.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    hub = ProxyHub(seed=1)
    hub.start()
    client = None
    try:
        port = hub.add("a>b", "127.0.0.1", "127.0.0.1", int(server.getsockname()[1]))
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        deadline = time.monotonic() + 5
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.02)
        assert accepted, "the proxy did not connect upstream"
        hub.set("a>b", frozen=True)  # the partition begins
        accepted[0].close()  # the peer closes its side (its keep-alive timeout)
        client.settimeout(1.5)
        try:
            got = client.recv(1)
        except TimeoutError:
            got = None  # nothing crossed the frozen link: what a partition means
        except ConnectionResetError:
            got = b"<reset>"
        assert got is None, f"a frozen link delivered {got!r} (the peer's close) to the puller"
    finally:
        if client is not None:
            client.close()
        hub.stop()
        server.close()


# ── ownership of tags (cleanup) ──────────────────────────────────────────


def test_a_live_harness_owns_its_tag_whoever_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    """netns.py (owner_dir, owner_alive, sweep): the owner file lives in
    ``/run/logsync-chaos`` for root and in the temp dir otherwise. A root harness's
    ``sweep()`` therefore finds no owner for the tag of a *live* non-root harness (loopback
    mode, its daemons carry ``LOGSYNC_CHAOS_TAG``), declares it dead and SIGKILLs its
    processes -- the docstring's "a concurrent run (another live owner) is never touched"
    fails across users (and across TMPDIRs). Fix: one fixed owner directory for everyone
    (world-writable sticky, e.g. /tmp/logsync-chaos or /run with a fallback searched by
    all), or look in both before declaring a tag dead."""
    tag = "zz" + "".join(secrets.choice(netns._DIGITS) for _ in range(4))
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    netns.claim(tag)  # a live harness, not root, owns the tag
    try:
        assert netns.owner_alive(tag)
        monkeypatch.setattr(netns.os, "geteuid", lambda: 0)  # root's sweep looks
        assert netns.owner_alive(tag), "root's sweep would take a live harness's tag as dead"
    finally:
        monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
        netns.release(tag)


# ── the run's figures ────────────────────────────────────────────────────


def _replica(name: str, events: dict[str, str], tags: dict[str, int] | None = None) -> Replica:
    """A replica holding ``events`` (all authored by n1, seqs 1..)."""
    r = Replica(name=name, kind="logsync", replica_id=f"rid-{name}", integrity="ok")
    for n, (event_id, row) in enumerate(sorted(events.items()), start=1):
        r.events[event_id] = row
        r.keys[event_id] = ("rid-n1", n)
        r.seqs.setdefault("rid-n1", []).append(n)
    r.op_tags.update(tags or {})
    return r


class _FakeWorkload:
    def __init__(self, history: list[Op]) -> None:
        self.history = history

    def run(self, stop: threading.Event, round_no: int = 0) -> None:
        stop.wait(5)

    def acknowledged(self) -> list[Acked]:
        return [Acked(o.id, o.origin, o.origin_seq, o.node, o.tag)
                for o in self.history if o.outcome == "ok"]


def _round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, history: list[Op],
           heal, read) -> dict:
    cluster = SimpleNamespace(nodes={n: SimpleNamespace(name=n, kind="logsync",
                                                        palace=tmp_path / n)
                                     for n in ("n1", "n2")})
    monkeypatch.setattr(run_mod, "heal_all", heal)
    monkeypatch.setattr(run_mod, "read_replica", read)
    cfg = RunConfig(seed=1, out=tmp_path, window=0.2, converge_timeout=10.0)
    return run_mod._round(cfg, cluster, Timeline(), _FakeWorkload(history), [], 0)  # type: ignore[arg-type]


def test_heal_to_convergence_is_measured_from_the_network_heal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run.py (_round): the convergence clock starts when ``heal_all`` *returns*, but
    ``heal_all`` heals the network first and then frees disks, SIGCONTs, restarts skewed
    nodes and starts dead ones (each restart waits up to 30 s for the daemon to serve,
    with up to 3 attempts). Replication resumes at the network heal, so the reported
    ``convergence_s`` (and the timeline's ``heal``/``heal_at``) leaves out everything that
    happened during the rest of the heal: a cluster that took 1.0 s to converge after
    the split ended is reported as converging in ~0 s.
    Fix: record the time ``heal_network`` succeeded (e.g. ``heal_all`` returns it, or the
    round takes the time before calling it) and measure from there."""
    row = "'row'"
    healed: dict[str, float] = {}

    def heal(cluster, timeline, round_no=0):
        healed["network"] = time.monotonic()  # the split ends here
        time.sleep(1.5)  # then a skewed node is restarted on the real clock
        return []

    def read(name, kind, palace, deep=True):
        events = {"e1": row}
        if time.monotonic() < healed["network"] + 1.0 and name == "n2":
            events = {}  # n2 catches up 1.0 s after the network heal
        return _replica(name, events)

    took = _round(tmp_path, monkeypatch, [], heal, read)["convergence_s"]
    assert took is not None and took >= 0.9, (
        f"converged 1.0 s after the network heal, reported {took} s")


def test_an_append_the_cli_said_failed_must_not_be_stored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run.py (_round) / checker.py (check): only acknowledged ops reach the checker; the
    ops the CLI reported *failed* (exit non-zero: a full disk, a lock timeout) are never
    looked for. In Jepsen's model a failed op definitely did not happen: a CLI that
    answers "failed" after committing (the client would retry: a duplicate by design)
    is a defect the run should catch, and here a failed op's tag sits on every replica
    and the round is green. Fix: pass the failed ops' tags to ``check`` and fail when any
    replica holds an event carrying one (with signal-killed CLIs counted as info, see
    above)."""
    failed = Op(tag="s1r0w0n3", node="n1", kind="append", start=0.0, outcome="fail",
                error="database or disk is full")

    def read(name, kind, palace, deep=True):
        return _replica(name, {"e1": "'row'"}, {failed.tag: 1})

    verdict = _round(tmp_path, monkeypatch, [failed], lambda *a, **k: [], read)["verdict"]
    assert not verdict["ok"], "an append reported failed is stored on every replica"


def test_a_run_that_acknowledged_nothing_does_not_pass(tmp_path: Path) -> None:
    """run.py (_summary): ``ok`` is every round's verdict ok and nothing left behind; a run
    whose workload had *no* acknowledged append (every CLI failing or timing out -- a
    broken CLI, a wrong palace, a disk full all round) checks nothing and still PASSes
    with "acknowledged 0, lost 0" and exit 0 from ``python -m logsync.chaos``. Only the
    pytest wrapper (test_runs.py) asks for >= 40. Fix: fail the verdict (or the summary)
    when a round acknowledged nothing (or too little for its window and rate)."""
    cfg = RunConfig(seed=1, out=tmp_path)
    cluster = SimpleNamespace(mode="loopback", mode_reason="asked for", tag="x", swept=[])
    ops = [Op(tag=f"t{n}", node="n1", kind="append", start=0.0, outcome="info",
              error="did not finish in 20 s") for n in range(30)]
    verdict = {"ok": True, "lost": [], "duplicated": [], "divergent": [], "problems": []}
    rounds = [{"round": 0, "convergence_s": 0.5, "verdict": verdict, "faults": []}]
    summary = run_mod._summary(cfg, cluster, _FakeWorkload(ops), rounds, [], [])  # type: ignore[arg-type]
    assert summary["acknowledged"] == 0
    assert not summary["ok"], "a run that acknowledged no append passes"


def test_faults_that_never_ran_are_not_counted_as_run(tmp_path: Path) -> None:
    """run.py (_summary): the verdict's ``faults`` counts the *scheduled* faults by kind,
    whether or not they ran: a skew whose begin failed (no libfaketime: ``clock_env``
    raises after the node was stopped -- the "skew" was a kill) is logged as
    ``nemesis_error`` yet counted as a skew, and nemesis errors never fail the verdict.
    A run can PASS reporting ``{"skew": 1}`` with no skew injected. Fix: count faults
    whose ``ran`` is set, and fail (or flag) the run when a fault of the mix did not run."""
    cfg = RunConfig(seed=1, out=tmp_path, mix="skew")
    cluster = SimpleNamespace(mode="loopback", mode_reason="asked for", tag="x", swept=[])
    ops = [Op(tag="t", node="n1", kind="append", start=0.0, outcome="ok", id="e1",
              origin="rid-n1", origin_seq=1)]
    verdict = {"ok": True, "lost": [], "duplicated": [], "divergent": [], "problems": []}
    skew = {**Fault("skew", 2.0, 10.0, ["n1"], {"offset": 60, "jump": 120.0}).as_dict(),
            "ran": None}
    rounds = [{"round": 0, "convergence_s": 0.5, "verdict": verdict, "faults": [skew],
               "nemesis_errors": ["skew begin on ['n1']: clock faults need libfaketime"]}]
    summary = run_mod._summary(cfg, cluster, _FakeWorkload(ops), rounds, [], [])  # type: ignore[arg-type]
    assert summary["faults"].get("skew", 0) == 0 or not summary["ok"], (
        f"faults {summary['faults']} and ok={summary['ok']} for a skew that never ran")


# ── the replay command ───────────────────────────────────────────────────


def test_the_replay_command_carries_every_setting_of_the_run(tmp_path: Path) -> None:
    """run.py (RunConfig.replay): the printed replay command drops ``--rate``,
    ``--interval`` and ``--converge-timeout``. The workload's ops are drawn from the seed
    but paced by the rate, and the daemons' anti-entropy interval decides what is in
    flight when each fault lands: a failing run made with ``--rate 8 --interval 0.5``
    "replays" with 4 appends/s and 2 s rounds -- another run. Fix: emit every option that
    differs from its default (rate, interval, converge-timeout)."""
    cfg = RunConfig(seed=5, out=tmp_path, rate=8.0, interval=0.5, converge_timeout=30.0)
    args = parser().parse_args(shlex.split(cfg.replay("loopback"))[3:])
    assert (args.rate, args.interval, args.converge_timeout) == (8.0, 0.5, 30.0), cfg.replay(
        "loopback")
