"""A daemon whose disk fills while it pulls (issue 8, finding 3, invariant 9), as real
processes: it stays up, `/healthz` answers, `/sync/*` answers a 503 naming the problem,
pulls pause, and once space is back it resumes and converges by itself."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from logsync.store import Store
from tests.conftest import mounted_tmpfs
from tests.test_daemon import Daemon, free_port, peer, wait_for


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "small", "3m") as mount:
        yield mount


def test_a_daemon_on_a_full_disk_stays_up_answers_503_and_resumes(
    tmp_path: Path, small_disk: Path
) -> None:
    source = Daemon(tmp_path / "source", free_port(), "tok-s", interval=1.0)
    victim = None
    try:
        with Store.open(source.palace) as store:
            for n in range(300):
                store.append_event("note", "s", "r", "pi@source", body=f"{n}" + "x" * 20_000)
        victim = Daemon(small_disk / "victim", free_port(), "tok-v", interval=1.0,
                        log_dir=tmp_path)
        peer(victim, source)
        wait_for(lambda: victim.get("/sync/version_vector").status_code == 503, 60,
                 "the victim never reported its full disk", victim)
        said = victim.get("/sync/ops", origin="x").json()["error"]
        assert "full" in said and "store" in said, said
        started = time.monotonic()
        assert httpx.get(victim.url + "/healthz", timeout=1).status_code == 200
        assert time.monotonic() - started < 1 and victim.proc.poll() is None
        subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)

        def converged() -> bool:
            answer = victim.get("/sync/version_vector")
            return (answer.status_code == 200 and answer.json()["version_vector"]
                    == source.get("/sync/version_vector").json()["version_vector"])

        wait_for(converged, 60, "the victim never resumed after the disk had space", victim)
        log = victim.log.read_text()
        assert "Traceback" not in log and "pulls resume" in log
    finally:
        for daemon in (victim, source):
            if daemon is not None and daemon.proc.poll() is None:
                daemon.proc.kill()
                daemon.proc.wait(5)
            if daemon is not None:
                daemon.close()
