"""One daemon per palace (`logsync.servelock`): a second `serve` is one sentence, and the
lock goes with its holder however the holder ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logsync.errors import ConfigError
from logsync.servelock import LOCK_FILENAME, serving

PY = [sys.executable, "-m", "logsync"]
HOLD = ("import sys, time; from logsync.servelock import serving\n"
        "with serving(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)\n")


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    with serving(tmp_path / "palace"):
        with pytest.raises(ConfigError, match=rf"is already served by another logsync serve "
                                              rf"\(pid {os.getpid()}\): stop it first"):
            with serving(tmp_path / "palace"):
                pass
    with serving(tmp_path / "palace"):  # released at the end of the block
        pass
    assert (tmp_path / "palace" / LOCK_FILENAME).stat().st_mode & 0o777 == 0o600


def test_the_lock_goes_with_a_holder_killed_with_sigkill(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(ConfigError, match=f"pid {holder.pid}"):
            with serving(tmp_path):
                pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        with serving(tmp_path):  # no stale lock to clean up
            pass
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()


def test_a_second_serve_on_a_served_palace_exits_1_and_the_first_serves_on(
        tmp_path: Path) -> None:
    palace = tmp_path / "palace"
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    first = subprocess.Popen([*PY, "--palace", str(palace), "serve", "--port", "0"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while _held_by(palace) != first.pid:  # the first holds the lock
            assert time.monotonic() < deadline and first.poll() is None, "never served"
            time.sleep(0.1)
        second = subprocess.run([*PY, "--palace", str(palace), "serve", "--port", "0"],
                                env=env, capture_output=True, text=True, timeout=60,
                                check=False)
        assert second.returncode == 1, second.stderr
        assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr
        assert f"is already served by another logsync serve (pid {first.pid})" \
            in second.stderr
        time.sleep(0.5)
        assert first.poll() is None  # the first was never disturbed
    finally:
        first.send_signal(signal.SIGTERM)
        try:
            first.wait(30)
        finally:
            if first.poll() is None:
                first.kill()


def _held_by(palace: Path) -> int | None:
    try:
        text = (palace / LOCK_FILENAME).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def test_a_lock_file_that_is_a_symlink_is_refused_and_its_target_untouched(
        tmp_path: Path) -> None:
    """The pid would be written into whatever the link names (a shared palace)."""
    victim = tmp_path / "victim"
    victim.write_text("important data")
    palace = tmp_path / "palace"
    palace.mkdir()
    (palace / LOCK_FILENAME).symlink_to(victim)
    with pytest.raises(ConfigError, match="serve lock .* it is a symlink"):
        with serving(palace):
            pass
    assert victim.read_text() == "important data"
