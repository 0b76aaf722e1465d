"""Reconciling an offline device, with real processes on loopback (issue 11): the laptop
behind NAT that nobody can reach, `status` that looks, and the daemon that pushes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from logsync.store import Store
from tests.test_daemon import PY, Daemon, daemons, event_ids, free_port, run, wait_for

__all__ = ["daemons"]  # the fixture, shared with tests/test_daemon.py


def status(palace: Path, *args: str) -> tuple[int, dict]:
    done = run(palace, "status", "--json", *args, check=False)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def desk_entry(payload: dict) -> dict:
    (entry,) = [p for p in payload["peers"] if p["name"] == "desk"]
    return entry


def write_offline(palace: Path, count: int) -> None:
    with Store.open(palace) as store:
        for i in range(count):
            store.append_event("task.note", "proj", "lobby", "laptop-agent",
                               body=f"written offline {i}")


def test_a_laptop_that_never_serves_reconciles_with_one_sync(daemons, tmp_path: Path) -> None:
    port = free_port()
    desk = daemons("desk", port=port, token="tok-desk")
    laptop = tmp_path / "laptop"
    run(laptop, "init")
    run(laptop, "peers", "add", "desk", desk.url, "--token", desk.token)
    assert desk.stop() == 0
    write_offline(laptop, 200)
    code, payload = status(laptop)  # the desk is down: it says so now, not 15 s later
    assert code == 1 and desk_entry(payload)["state"] == "unreachable"
    desk = daemons("desk", port=port, token="tok-desk")
    code, payload = status(laptop)
    entry = desk_entry(payload)
    assert (code, entry["state"], entry["we_lack"], entry["they_lack"]) == (
        3, "reachable", 0, 200)
    assert entry["takes_pushes"] is True
    done = run(laptop, "sync")
    assert "pushed +200 events" in done.stdout, done.stdout + done.stderr
    assert len(event_ids(desk.palace)) == 200
    code, payload = status(laptop)
    entry = desk_entry(payload)
    assert (code, entry["we_lack"], entry["they_lack"], payload["in_sync"]) == (0, 0, 0, True)
    # and the desk sees the laptop's origin as held, byte for byte
    with Store.open(laptop, read_only=True) as mine, Store.open(desk.palace,
                                                               read_only=True) as theirs:
        origin = mine.replica_id
        assert theirs.list_ops(origin, 0, 500) == mine.list_ops(origin, 0, 500)
    assert desk.stop() == 0


def test_a_serving_laptop_pushes_to_a_desk_that_cannot_reach_it(daemons) -> None:
    desk = daemons("desk", interval=60)
    laptop = daemons("laptop", interval=1)
    # the desk has no entry for the laptop (it could not reach it); the laptop pushes
    (laptop.palace / "peers.json").write_text(json.dumps({"peers": [
        {"name": "desk", "url": desk.url, "token": desk.token, "push": True}]}))
    appended = json.loads(run(laptop.palace, "append", "--type", "task.note", "--stream", "s",
                              "--room", "r", "--from-agent", "pi@laptop", "--json").stdout)
    wait_for(lambda: appended["id"] in event_ids(desk.palace), 15,
             "the laptop's daemon never pushed its append", laptop)
    wait_for(lambda: "pushed +1 events" in laptop.log.read_text(), 5,
             "the laptop's daemon did not log its push", laptop)
    assert laptop.stop() == 0 and desk.stop() == 0


def test_status_names_a_wrong_token_and_a_peer_that_just_stopped(daemons,
                                                                 tmp_path: Path) -> None:
    desk = daemons("desk")
    other = daemons("other")
    laptop = tmp_path / "laptop"
    run(laptop, "init")
    run(laptop, "peers", "add", "desk", desk.url, "--token", "not-the-token")
    run(laptop, "peers", "add", "other", other.url, "--token", other.token)
    code, payload = status(laptop)
    states = {p["name"]: p["state"] for p in payload["peers"]}
    assert code == 1 and states == {"desk": "auth failed", "other": "reachable"}
    assert "not-the-token" not in json.dumps(payload)
    assert other.stop() == 0
    code, payload = status(laptop, "--timeout", "2")
    states = {p["name"]: p["state"] for p in payload["peers"]}
    assert states["other"] == "unreachable"
    text = run(laptop, "status", check=False)
    assert text.returncode == 1 and "other" in text.stdout and "unreachable (now)" in text.stdout
    assert desk.stop() == 0


def test_sync_against_a_peer_without_push_still_pulls_and_says_so(daemons,
                                                                 tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    write_offline(hub, 3)
    # a logsync daemon without a token takes no pushes, like a MemPalace hub
    port = free_port()
    proc = subprocess.Popen([*PY, "--palace", str(hub), "serve", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        laptop = tmp_path / "laptop"
        run(laptop, "init")
        write_offline(laptop, 2)
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(url), 20, "the tokenless daemon never answered")
        done = run(laptop, "sync", "--peer", url, check=False)
        assert done.returncode == 0, done.stderr
        assert "+3 events" in done.stdout
        (line,) = [ln for ln in done.stderr.splitlines() if "takes no pushes" in ln]
        assert "it must pull from this replica" in line
    finally:
        proc.terminate()
        proc.wait(15)


def _answers(url: str) -> bool:
    import httpx
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_status_stops_warning_about_conflicts_once_reviewed(tmp_path: Path) -> None:
    from tests.conftest import RemoteKit

    kit, palace = RemoteKit(), tmp_path / "p"
    with Store.open(palace) as store:
        origin = kit.origin(7)
        store.apply_remote([kit.op(origin, 1)])
        store.apply_remote([kit.op(origin, 1, body="another op 1")])  # a fork: recorded
        assert store.counts()["conflicts"] == 1
    before = run(palace, "status", check=False)
    assert before.returncode == 0 and "1 conflicts not reviewed" in before.stderr
    assert json.loads(run(palace, "status", "--json").stdout)["conflicts_unreviewed"] == 1
    run(palace, "conflicts", "review", "--all")
    after = run(palace, "status")
    assert "not reviewed: see" not in after.stderr and "(0 not reviewed)" in after.stdout


def test_a_daemon_stops_when_its_palace_is_given_a_new_identity(daemons) -> None:
    """`logsync reidentify` while the daemon runs: serving or signing on as the old id
    would mix two identities, so the daemon stops with exit 1 and says why (a supervisor
    with Restart=on-failure starts it again, under the new id)."""
    desk = daemons("desk", interval=1)
    old = json.loads((desk.palace / "replica.json").read_text())["replica_id"]
    done = run(desk.palace, "reidentify", "--yes", check=False)
    assert done.returncode == 0, done.stderr
    new = json.loads((desk.palace / "replica.json").read_text())["replica_id"]
    assert new != old
    assert desk.proc.wait(20) == 1
    log = desk.log.read_text()
    assert f"the palace was given a new identity ({new}) while this daemon ran as {old}" in log
    assert "Traceback" not in log
    again = Daemon(desk.palace, desk.port, desk.token)  # started again: the new identity
    try:
        assert again.get("/sync/version_vector").json()["replica_id"] == new
    finally:
        assert again.stop() == 0
