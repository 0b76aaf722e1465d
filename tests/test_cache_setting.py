"""`logsync serve --cache-mb`: the memory a daemon spends on `/sync/ops` answers it keeps
to serve again (encoded ops and whole pages, half each; 0 keeps none)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from logsync.daemon import Daemon, DaemonConfig
from logsync.defaults import DEFAULT_CACHE_MIB, MIB
from logsync.errors import ConfigError
from logsync.server.opcache import DEFAULT_OP_CACHE_BYTES
from logsync.server.pagecache import DEFAULT_PAGE_CACHE_BYTES

TOKEN = "tok-cache"


def test_the_default_is_the_caches_own_defaults(tmp_path: Path) -> None:
    config = DaemonConfig(palace=tmp_path / "p")
    assert config.cache_mib == DEFAULT_CACHE_MIB
    assert config.cache_bytes() == (DEFAULT_OP_CACHE_BYTES, DEFAULT_PAGE_CACHE_BYTES)


@pytest.mark.parametrize(("mib", "split"), [(0, (0, 0)), (1, (MIB // 2, MIB // 2)),
                                            (3, (3 * MIB // 2, 3 * MIB - 3 * MIB // 2))])
def test_the_setting_is_split_evenly_and_whole(tmp_path: Path, mib: int,
                                               split: tuple[int, int]) -> None:
    config = DaemonConfig(palace=tmp_path / "p", cache_mib=mib)
    config.check()
    assert config.cache_bytes() == split
    assert sum(config.cache_bytes()) == mib * MIB


@pytest.mark.parametrize("bad", [-1, 64 * 1024 + 1, 1.5, True, "8"])
def test_a_bad_setting_is_one_sentence_naming_it(tmp_path: Path, bad: object) -> None:
    config = DaemonConfig(palace=tmp_path / "p", cache_mib=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        config.check()
    message = str(caught.value)
    assert str(bad) in message and "MiB" in message and "\n" not in message


@pytest.mark.parametrize("mib", [0, 2])
def test_the_daemon_serves_with_the_caches_it_was_given(tmp_path: Path, mib: int) -> None:
    daemon = Daemon(DaemonConfig(palace=tmp_path / "p", port=0, token=TOKEN, cache_mib=mib),
                    rng=random.Random(1))
    try:
        for i in range(30):
            daemon.store.append_event("task.request", "s", "r", "a@b", body=f"op {i}")
        server = daemon.app.state.logsync
        assert (server.op_cache.max_bytes, server.page_cache.max_bytes) == \
            DaemonConfig(palace=tmp_path, cache_mib=mib).cache_bytes()

        async def pages() -> list[httpx.Response]:
            transport = httpx.ASGITransport(app=daemon.app)
            async with httpx.AsyncClient(transport=transport,
                                         base_url="http://127.0.0.1") as client:
                return [await client.get("/sync/ops", params={
                    "origin": daemon.store.replica_id, "after": 0, "limit": 10},
                    headers={"Authorization": f"Bearer {TOKEN}"}) for _ in range(2)]

        first, again = anyio.run(pages)
        assert first.status_code == again.status_code == 200
        assert first.content == again.content
        assert [e["origin_seq"] for e in first.json()["events"]] == list(range(1, 11))
        held = server.op_cache.bytes_held + server.page_cache.bytes_held
        if mib == 0:
            assert held == 0  # nothing kept, every answer built afresh
        else:
            assert 0 < held <= mib * MIB
    finally:
        daemon.store.close()


def test_serve_refuses_a_negative_cache_in_one_sentence(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "logsync", "--palace", str(tmp_path / "p"), "serve",
         "--port", "0", "--cache-mb", "-1"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "-1 MiB" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
