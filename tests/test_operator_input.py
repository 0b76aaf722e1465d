"""A careless operator's input, through the real entry point: each mistake is one sentence
naming the value and the rule (exit 1, no traceback), found before anything is stored or
requested, and the palace is left as it was.

Found by an outside review: a damaged palace JSON file (not UTF-8, nested past the
parser), a NaN interval that made the daemon spin, an unbounded `--file /dev/zero`, an
empty `--palace` taken for the default palace, and URLs or tokens accepted by `peers add`
that every later request failed on."""

from __future__ import annotations

import json
import math
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from logsync.errors import ValidationError
from logsync.files import UnreadableJSON, read_json
from logsync.schedule import PullSchedule

PY = [sys.executable, "-m", "logsync"]


def logsync(tmp_path: Path, *args: str, stdin: bytes | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    return subprocess.run([*PY, *args], input=stdin, capture_output=True, env=env,
                          timeout=timeout, cwd=tmp_path, check=False)


def one_sentence(done: subprocess.CompletedProcess[bytes], *fragments: str) -> str:
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 1, (done.returncode, err, done.stdout)
    assert "Traceback" not in err and "unexpected" not in err and "internal" not in err, err
    assert err.count("\n") == 1 and err.startswith("Error: "), err
    for fragment in fragments:
        assert fragment in err, err
    return err


@pytest.fixture
def palace(tmp_path: Path) -> Path:
    path = tmp_path / "p"
    assert logsync(tmp_path, "init", str(path)).returncode == 0
    return path


def _fingerprint(palace: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(palace.iterdir()) if p.is_file()
            and not p.name.endswith(("-wal", "-shm"))}


# ── the palace's own JSON files ─────────────────────────────────────────

DAMAGE = {
    "not-utf8": (b"\xff\xfe", "is not UTF-8 text (invalid start byte at byte 0)"),
    "nested": (b"[" * 100_000, "nests its JSON deeper than can be read"),
    "truncated": (b'{"peers": [', "is not valid JSON"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("name, command", [
    ("peers.json", ["peers", "list"]),
    ("replica.json", ["info"]),
    ("peer_state.json", ["status", "--cached"]),
])
def test_a_damaged_palace_file_is_one_sentence_naming_it(
        tmp_path: Path, palace: Path, name: str, command: list[str], damage: str) -> None:
    content, said = DAMAGE[damage]
    (palace / name).write_bytes(content)
    before = _fingerprint(palace)
    err = one_sentence(logsync(tmp_path, "--palace", str(palace), *command),
                       str(palace / name))
    if not (name == "replica.json" and damage == "truncated"):
        assert said in err
    assert _fingerprint(palace) == before


def test_a_palace_file_is_read_only_up_to_its_cap(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(b"[" + b"0," * 600 + b"0]")
    assert read_json(path, max_bytes=2000) == [0] * 601
    with pytest.raises(UnreadableJSON, match="is larger than 1000 bytes"):
        read_json(path, max_bytes=1000)
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "missing.json")
    with pytest.raises(UnreadableJSON, match="is not a regular file") as info:
        read_json(tmp_path)  # a directory
    assert not info.value.damaged


def test_nested_metadata_is_one_sentence(tmp_path: Path, palace: Path) -> None:
    one_sentence(logsync(tmp_path, "--palace", str(palace), "append", "--type", "a.b",
                         "--stream", "s", "--room", "r", "--from-agent", "a@b",
                         "--metadata", "[" * 100_000), "nests deeper than can be read")


# ── an empty palace name ────────────────────────────────────────────────

@pytest.mark.parametrize("args", [
    ["--palace", "", "init"], ["--palace", " ", "info"], ["init", ""],
    ["serve", "--palace", "", "--port", "0"],
], ids=["group-init", "group-info", "init-argument", "serve-option"])
def test_an_empty_palace_name_is_never_the_default_palace(tmp_path: Path,
                                                          args: list[str]) -> None:
    one_sentence(logsync(tmp_path, *args, timeout=20), "must name a directory")
    assert not (tmp_path / "home").exists()  # no default palace was made


# ── numbers that are not numbers ────────────────────────────────────────

@pytest.mark.parametrize("args, option", [
    (["serve", "--interval", "nan"], "--interval"),
    (["serve", "--interval", "inf"], "--interval"),
    (["serve", "--interval", "0"], "--interval"),
    (["serve", "--interval", "0.001"], "0.001 is not in the range x>=0.1"),  # ms meant
    (["serve", "--commit-check-ms", "nan"], "--commit-check-ms"),
    (["serve", "--coalesce-ms", "-inf"], "--coalesce-ms"),
    (["sync", "--peer", "http://127.0.0.1:9", "--timeout", "nan"], "--timeout"),
    (["sync", "--peer", "http://127.0.0.1:9", "--timeout", "0"], "--timeout"),
    (["sync", "--peer", "http://127.0.0.1:9", "--timeout", "-1"], "--timeout"),
    (["status", "--timeout", "nan"], "--timeout"),
    (["conflicts", "review", "999999999999999999999999"], "IDS"),
    # a documented maximum is refused, never clamped in silence
    (["list", "--limit", "501"], "it must be an integer from 1 to 500"),
    (["wait", "--timeout-ms", "300001"], "it must be an integer from 0 to 300000"),
    (["wait", "--limit", "0"], "--limit"),
    (["conflicts", "--limit", "99999999999999999999999"], "from 1 to 500"),
    (["quarantine", "--limit", "1000"], "from 1 to 500"),
])
def test_a_number_out_of_its_rule_is_refused_before_anything_runs(
        tmp_path: Path, palace: Path, args: list[str], option: str) -> None:
    one_sentence(logsync(tmp_path, "--palace", str(palace), *args, timeout=20), option,
                 args[-1])


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
@pytest.mark.parametrize("name", ["interval", "debounce", "backoff_base", "backoff_cap"])
def test_a_schedule_refuses_a_time_that_is_not_a_finite_non_negative_number(
        name: str, value: float) -> None:
    with pytest.raises(ValidationError, match=f"{name}="):
        PullSchedule(random.Random(1), **{name: value})


# ── what a file or stdin holds ──────────────────────────────────────────

@pytest.mark.parametrize("args, limit", [
    (["artifact", "put", "--kind", "note", "--created-by", "a@b", "--file", "/dev/zero"],
     4194304),
    (["append", "--type", "a.b", "--stream", "s", "--room", "r", "--from-agent", "a@b",
      "--body-file", "/dev/zero"], 262144),
    (["artifact", "put", "--kind", "note", "--created-by", "a@b", "--file", "-"], 4194304),
], ids=["artifact-device", "body-device", "artifact-stdin"])
def test_input_past_its_limit_is_refused_without_being_held(
        tmp_path: Path, palace: Path, args: list[str], limit: int) -> None:
    stdin = bytes(limit + 1) if args[-1] == "-" else None
    before = _fingerprint(palace)
    err = one_sentence(logsync(tmp_path, "--palace", str(palace), *args, stdin=stdin),
                       f"holds more than {limit} bytes")
    assert ("standard input" if stdin else "/dev/zero") in err
    assert _fingerprint(palace) == before


def test_a_body_file_that_is_not_utf8_is_named(tmp_path: Path, palace: Path) -> None:
    (tmp_path / "bad.txt").write_bytes(b"a\xffb")
    one_sentence(logsync(tmp_path, "--palace", str(palace), "append", "--type", "a.b",
                         "--stream", "s", "--room", "r", "--from-agent", "a@b",
                         "--body-file", "bad.txt"),
                 "bad.txt is not UTF-8 text (invalid start byte at byte 1)")


def test_input_at_its_limit_is_stored_byte_for_byte(tmp_path: Path, palace: Path) -> None:
    content = b"x\r\n" * (262144 // 3)
    (tmp_path / "body.txt").write_bytes(content)
    done = logsync(tmp_path, "--palace", str(palace), "append", "--type", "a.b", "--stream",
                   "s", "--room", "r", "--from-agent", "a@b", "--body-file", "body.txt",
                   "--json")
    assert done.returncode == 0, done.stderr
    assert b'"body": "' + b"x\\r\\n" * 3 in done.stdout


# ── peers: URLs and tokens that no request could carry ──────────────────

@pytest.mark.parametrize("url", ["http://127.0.0.1:9/a\nb", "http://127.0.0.1:9/a\tb",
                                 "http://exa mple:9", "http://127.0.0.1:9/\x7f"])
def test_a_url_with_spaces_or_control_characters_is_refused(tmp_path: Path, palace: Path,
                                                            url: str) -> None:
    one_sentence(logsync(tmp_path, "--palace", str(palace), "peers", "add", "x", url),
                 "must not contain spaces or control characters")
    assert not (palace / "peers.json").exists()
    one_sentence(logsync(tmp_path, "--palace", str(palace), "sync", "--peer", url),
                 "must not contain spaces or control characters")


@pytest.mark.parametrize("token", ["é", "a\nb", "a\tb", "tok\x00"])
def test_a_token_no_header_can_carry_is_refused(tmp_path: Path, palace: Path,
                                                token: str) -> None:
    if "\x00" in token:  # an argument cannot carry NUL: peers.json can
        (palace / "peers.json").write_text(
            '{"peers": [{"url": "http://127.0.0.1:9", "token": "tok\\u0000"}]}')
        one_sentence(logsync(tmp_path, "--palace", str(palace), "peers", "list"),
                     "peers[0].token is invalid", "printable ASCII")
        return
    one_sentence(logsync(tmp_path, "--palace", str(palace), "peers", "add", "x",
                         "http://127.0.0.1:9", "--token", token), "printable ASCII")
    one_sentence(logsync(tmp_path, "--palace", str(palace), "sync", "--peer",
                         "http://127.0.0.1:9", "--token", token), "printable ASCII")
    assert not (palace / "peers.json").exists()


def test_a_lost_key_file_is_refused_without_minting_another(tmp_path: Path,
                                                           palace: Path) -> None:
    append = ["--palace", str(palace), "append", "--type", "a.b", "--stream", "s", "--room",
              "r", "--from-agent", "a@b"]
    assert logsync(tmp_path, *append).returncode == 0
    (palace / "logsync-signing-key").unlink()
    one_sentence(logsync(tmp_path, *append), "logsync-signing-key is missing",
                 "restore the original key file")
    assert not (palace / "logsync-signing-key").exists()  # no second key left behind


@pytest.mark.parametrize("damage", ["lost", "corrupt", "exposed", "replaced"])
def test_a_palace_whose_key_is_lost_or_damaged_is_read_and_reidentified(
        tmp_path: Path, palace: Path, damage: str) -> None:
    """Reads need no key: they go on, warning. Writes are refused naming both ways on, and
    `reidentify --yes` is one of them (it refused too: no way forward without a backup of
    a 65-byte file; the old ops keep their origin and their signatures)."""
    base = ["--palace", str(palace)]
    append = [*base, "append", "--type", "a.b", "--stream", "s", "--room", "r",
              "--from-agent", "a@b"]
    assert logsync(tmp_path, *append).returncode == 0
    key = palace / "logsync-signing-key"
    if damage == "lost":
        key.unlink()
    elif damage == "corrupt":
        key.write_text("0123\n")
    elif damage == "exposed":
        key.chmod(0o644)
    else:  # a valid key, not the one the store records (its sentence names reidentify)
        key.write_text(bytes(range(32)).hex() + "\n")
    for read in ([] if damage == "replaced" else (["list"], ["info"], ["verify"])):
        done = logsync(tmp_path, *base, *read)
        assert done.returncode == 0, (read, done.stderr)
        assert (b"Warning:" in done.stderr) == (damage != "lost"), (read, done.stderr)
    one_sentence(logsync(tmp_path, *append), "logsync reidentify --yes")
    done = logsync(tmp_path, *base, "reidentify", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    moved = json.loads(done.stdout)
    assert moved["replica_id"] != moved["previous_replica_id"]
    assert logsync(tmp_path, *append).returncode == 0
    checked = logsync(tmp_path, *base, "verify", "--json")
    assert checked.returncode == 0 and json.loads(checked.stdout)["ok"] is True, checked.stdout


def test_a_token_with_spaces_inside_is_taken(tmp_path: Path, palace: Path) -> None:
    """The server compares the whole header, so such a token works: it stays allowed."""
    done = logsync(tmp_path, "--palace", str(palace), "peers", "add", "x",
                   "http://127.0.0.1:9", "--token", "correct horse battery")
    assert done.returncode == 0, done.stderr
    assert b"correct horse battery" in (palace / "peers.json").read_bytes()


@pytest.mark.parametrize("url", ["http://\u2603.net", "http://[::1"])
def test_a_url_the_http_client_cannot_request_is_refused_when_added(
        tmp_path: Path, palace: Path, url: str) -> None:
    one_sentence(logsync(tmp_path, "--palace", str(palace), "peers", "add", "x", url),
                 "is invalid")
    assert not (palace / "peers.json").exists()


@pytest.mark.parametrize("url", ["http://[::1]:8742", "http://b\u00fccher.example",
                                 "https://user@host.example:443/base"])
def test_ipv6_idn_and_path_urls_are_still_taken(tmp_path: Path, palace: Path,
                                               url: str) -> None:
    done = logsync(tmp_path, "--palace", str(palace), "peers", "add", "x", url)
    assert done.returncode == 0, done.stderr


def test_an_empty_palace_variable_is_never_the_default_palace(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path / "home"), "LOGSYNC_PALACE": ""}
    done = subprocess.run([*PY, "info"], capture_output=True, env=env, timeout=60,
                          cwd=tmp_path, check=False)
    one_sentence(done, "LOGSYNC_PALACE is set but empty")
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("command", [["status"], ["verify"], ["sync", "--peer",
                                     "http://127.0.0.1:9"], ["append", "--type", "ask",
                                     "--stream", "s", "--room", "r", "--from-agent", "a",
                                     "--body", "x"]])
def test_a_store_that_is_a_symlink_loop_is_one_sentence(tmp_path: Path,
                                                        command: list[str]) -> None:
    """A store path that links back to itself: named, for reads and writes alike, and
    left as it was (no store made beside it)."""
    palace = tmp_path / "loop"
    palace.mkdir()
    (palace / "logstream.sqlite3").symlink_to("logstream.sqlite3")
    one_sentence(logsync(tmp_path, "--palace", str(palace), *command),
                 f"{palace / 'logstream.sqlite3'} is a symbolic link", "a loop")
    assert sorted(p.name for p in palace.iterdir()) == ["logstream.sqlite3"]
    looping = tmp_path / "looping"  # the palace directory itself
    looping.symlink_to("looping")
    one_sentence(logsync(tmp_path, "--palace", str(looping), *command),
                 f"{looping} is a symbolic link", "a loop")


def test_a_store_link_to_nowhere_is_no_palace_and_creates_nothing(tmp_path: Path) -> None:
    """A link to a file that does not exist is not a store: without --create nothing is
    made, neither the target nor the palace's identity."""
    palace = tmp_path / "p"
    palace.mkdir()
    (palace / "logstream.sqlite3").symlink_to(tmp_path / "target.sqlite3")
    one_sentence(logsync(tmp_path, "--palace", str(palace), "append", "--type", "ask",
                         "--stream", "s", "--room", "r", "--from-agent", "a", "--body", "x"),
                 "no palace at")
    assert not (tmp_path / "target.sqlite3").exists()
    assert sorted(p.name for p in palace.iterdir()) == ["logstream.sqlite3"]


def test_a_hand_edited_replica_id_is_refused_until_restored(tmp_path: Path,
                                                            palace: Path) -> None:
    """Another valid id written into replica.json: the key would sign as two origins.
    Every command refuses, naming both ids, and stores nothing; restored, all is as
    before, and `reidentify` is the way to a new identity."""
    append = ["--palace", str(palace), "append", "--type", "ask", "--stream", "s",
              "--room", "r", "--from-agent", "a", "--body", "x"]
    assert logsync(tmp_path, *append).returncode == 0
    original = (palace / "replica.json").read_text()
    own = json.loads(original)["replica_id"]
    (palace / "replica.json").write_text(json.dumps({"replica_id": "rep_0123456789ab"}))
    before = _fingerprint(palace)
    for command in (append[2:], ["status"], ["verify"]):
        one_sentence(logsync(tmp_path, "--palace", str(palace), *command),
                     "rep_0123456789ab", own, "restore that id")
    assert _fingerprint(palace) == before
    key = palace / "logsync-signing-key"  # a reader who may not read the key file
    key.rename(tmp_path / "key")
    one_sentence(logsync(tmp_path, "--palace", str(palace), "status"),
                 "rep_0123456789ab", own, "changed by hand")
    (tmp_path / "key").rename(key)
    assert _fingerprint(palace) == before
    (palace / "replica.json").write_text(original)
    assert logsync(tmp_path, *append).returncode == 0
    assert logsync(tmp_path, "--palace", str(palace), "reidentify", "--yes").returncode == 0
    assert logsync(tmp_path, *append).returncode == 0


@pytest.fixture
def junk_vector_peer() -> Iterator[tuple[str, list[str]]]:
    """A peer on loopback whose vector lists junk (an origin that is no replica id, NaN,
    1e400, a count past 2**62) beside a valid empty origin; every other path is 404."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    answer = (b'{"replica_id": "rep_00000000000a", "version_vector": {"junk": 1, '
              b'"rep_00000000000b": NaN, "rep_00000000000c": 1e400, '
              b'"rep_00000000000d": 9223372036854775807, "rep_00000000000e": 0}}')

    asked: list[str] = []

    class Stub(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            asked.append(self.path)
            found = self.path.startswith("/sync/version_vector")
            body = answer if found else b'{"error": "not found"}'
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_vector_entries_no_replica_can_pull_are_reported_not_dropped(
        tmp_path: Path, palace: Path, junk_vector_peer: tuple[str, list[str]]) -> None:
    """`sync` says so in one line and in its JSON, and pulls the rest."""
    url, _ = junk_vector_peer
    done = logsync(tmp_path, "--palace", str(palace), "sync", "--peer", url, "--pull-only")
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert err.count("cannot pull") == 1, err
    assert "lists 4 origins this replica cannot pull, skipped: 'junk'" in err, err
    assert "and 3 more" in err and "Traceback" not in err, err
    done = logsync(tmp_path, "--palace", str(palace), "sync", "--peer", url, "--pull-only",
                   "--json")
    skipped = json.loads(done.stdout)[0]["skipped_origins"]
    assert sorted(skipped) == ["junk", "rep_00000000000b", "rep_00000000000c",
                               "rep_00000000000d"], skipped


def test_the_daemon_warns_of_skipped_vector_entries_once(
        tmp_path: Path, palace: Path, junk_vector_peer: tuple[str, list[str]]) -> None:
    """Round after round the same junk: one warning, not one per round."""
    url, asked = junk_vector_peer
    assert logsync(tmp_path, "--palace", str(palace), "peers", "add", "junk",
                   url).returncode == 0
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    daemon = subprocess.Popen([*PY, "--palace", str(palace), "serve", "--port", "0",
                               "--interval", "0.3", "--no-notify"], env=env, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(
                path.startswith("/sync/version_vector") for path in list(asked)) < 4:
            time.sleep(0.1)  # rounds, each seeing the same junk
    finally:
        daemon.terminate()
        _, err = daemon.communicate(timeout=30)
    rounds = sum(path.startswith("/sync/version_vector") for path in asked)
    assert rounds >= 3, asked
    assert err.count("cannot pull") == 1, err
    assert "peer junk: its vector lists 4 origins" in err, err


def test_a_daemon_whose_store_file_is_deleted_stops_saying_so(tmp_path: Path,
                                                              palace: Path) -> None:
    """Writes would go on into the deleted file, lost at exit: the daemon stops (exit 1)
    with one line naming the file, and leaves no empty store where it was."""
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    daemon = subprocess.Popen([*PY, "--palace", str(palace), "serve", "--port", "0"],
                              env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (palace / "logstream.sqlite3-shm").exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # the daemon holds the store open (WAL's shared memory file)
        time.sleep(1.0)  # and serves
        for path in palace.glob("logstream.sqlite3*"):
            path.unlink()
        code = daemon.wait(timeout=30)
    finally:
        if daemon.poll() is None:
            daemon.kill()
        _, err = daemon.communicate(timeout=30)
    assert code == 1, err
    assert "was deleted or replaced while it was open" in err, err
    assert "Traceback" not in err and not (palace / "logstream.sqlite3").exists(), err


def test_status_is_not_in_sync_with_a_peer_listing_origins_it_cannot_pull(
        tmp_path: Path, palace: Path, junk_vector_peer: tuple[str, list[str]]) -> None:
    """The peer holds ops this replica cannot pull: `status` says so and exits 3, never
    'in sync both ways' with 0."""
    url, _ = junk_vector_peer
    assert logsync(tmp_path, "--palace", str(palace), "sync", "--peer", url,
                   "--pull-only").returncode == 0  # what can be pulled is pulled
    assert logsync(tmp_path, "--palace", str(palace), "peers", "add", "junk",
                   url).returncode == 0
    done = logsync(tmp_path, "--palace", str(palace), "status")
    out = done.stdout.decode()
    assert done.returncode == 3, (out, done.stderr)
    assert "NOT IN SYNC: its vector lists 4 origins this replica cannot pull" in out, out
    assert "in sync both ways" not in out, out
    done = logsync(tmp_path, "--palace", str(palace), "status", "--json")
    (peer,) = json.loads(done.stdout)["peers"]
    assert done.returncode == 3 and len(peer["skipped_origins"]) == 4, peer


def test_cached_status_is_not_in_sync_with_a_peer_that_listed_origins_it_cannot_pull(
        tmp_path: Path, palace: Path, junk_vector_peer: tuple[str, list[str]]) -> None:
    """What the last round saw is what `status --cached` tells: the origins it could not
    pull too (exit 3, never 'in sync both ways')."""
    url, _ = junk_vector_peer
    assert logsync(tmp_path, "--palace", str(palace), "peers", "add", "junk",
                   url).returncode == 0
    assert logsync(tmp_path, "--palace", str(palace), "sync", "--pull-only").returncode == 0
    done = logsync(tmp_path, "--palace", str(palace), "status", "--cached")
    out = done.stdout.decode()
    assert done.returncode == 3, (out, done.stderr)
    assert "NOT IN SYNC: its vector lists 4 origins this replica cannot pull" in out, out
    assert "in sync both ways" not in out, out
    done = logsync(tmp_path, "--palace", str(palace), "status", "--cached", "--json")
    (peer,) = json.loads(done.stdout)["peers"]
    assert done.returncode == 3 and len(peer["skipped_origins"]) == 4, peer


@pytest.mark.parametrize("args", [
    ["peers", "add", b"ab\xffcd", "http://127.0.0.1:1"],
    ["peers", "add", "x", b"http://127.0.0.1:1/\xff"],
    ["list", "--since-event-id", b"evt_\xff"],
    ["artifact", "get", b"\xfe"],
    ["sync", "--peer", b"http://127.0.0.1:1/\xff"],
])
def test_an_argument_that_is_not_utf8_is_one_sentence(tmp_path: Path, palace: Path,
                                                      args: list[str | bytes]) -> None:
    """Undecodable bytes reach Python as lone surrogates, which SQLite, JSON files and
    HTTP refuse later (a peer name with them once stopped `serve` at every start)."""
    before = _fingerprint(palace)
    done = logsync(tmp_path, "--palace", str(palace), *args)  # type: ignore[arg-type]
    one_sentence(done, "is not valid UTF-8: logsync takes UTF-8 text", "\\xf")
    assert _fingerprint(palace) == before


def test_a_logsync_variable_that_is_not_utf8_is_one_sentence(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path / "home"),
           "LOGSYNC_PALACE": os.fsdecode(str(tmp_path).encode() + b"/p\xff")}
    done = subprocess.run([*PY, "status"], capture_output=True, env=env, timeout=60,
                          cwd=tmp_path, check=False)
    one_sentence(done, "environment variable LOGSYNC_PALACE=", "is not valid UTF-8")


def test_another_applications_database_is_left_as_it_is(tmp_path: Path) -> None:
    """A logstream.sqlite3 with an `events` table of its own: every command says whose
    it is not, in one sentence, and nothing is written beside it (init wrote replica.json
    and a signing key, then failed on a missing column, and read commands sent the
    operator back to init)."""
    palace = tmp_path / "other"
    palace.mkdir()
    conn = sqlite3.connect(palace / "logstream.sqlite3")
    conn.execute("CREATE TABLE events (x)")
    conn.execute("INSERT INTO events VALUES (1)")
    conn.commit()
    conn.close()
    before = _fingerprint(palace)
    for args in (["init", str(palace)], ["--palace", str(palace), "info"],
                 ["--palace", str(palace), "append", "--stream", "s", "--room", "r",
                  "--from-agent", "a", "--type", "note", "--body", "x"]):
        one_sentence(logsync(tmp_path, *args), "logstream.sqlite3 is not a logstream store: "
                     "its events table has no column id, type, stream, created_at")
        assert _fingerprint(palace) == before and sorted(p.name for p in palace.iterdir()) \
            == ["logstream.sqlite3"]


@pytest.mark.parametrize("args", [
    ["list", "--before-event-id", "x" * 100_000],
    ["list", "--since-event-id", "x" * 100_000],
    ["artifact", "get", "x" * 100_000],
    ["peers", "add", "x" * 100_000, "http://127.0.0.1:1"],
])
def test_a_huge_value_is_shown_shortened(tmp_path: Path, palace: Path,
                                         args: list[str]) -> None:
    err = one_sentence(logsync(tmp_path, "--palace", str(palace), *args), "xxx...")
    assert len(err) < 300, len(err)


def test_the_create_hint_names_the_command_also_under_python_m(tmp_path: Path) -> None:
    """Run as `python -m logsync` (as here), the hint is still `logsync --create CMD`."""
    done = logsync(tmp_path, "--palace", str(tmp_path / "none"), "conflicts")
    one_sentence(done, "pass --create before the command ('logsync --create conflicts')")


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["sync"], ["status"]])
def test_a_ca_file_that_is_no_ca_bundle_is_one_sentence(tmp_path: Path, palace: Path,
                                                        command: list[str]) -> None:
    """Refused before the command starts: a daemon with a peer died on it with a
    traceback once the peer's task began, and sync said 'internal error' per peer."""
    assert logsync(tmp_path, "--palace", str(palace), "peers", "add", "x",
                   "http://127.0.0.1:1").returncode == 0
    (tmp_path / "notpem.pem").write_text("garbage\n")
    done = logsync(tmp_path, "--palace", str(palace), *command, "--ca-file",
                   str(tmp_path / "notpem.pem"), timeout=30)
    one_sentence(done, "Invalid value for '--ca-file': CA file ", "cannot be loaded")


def test_a_daemon_given_a_ca_file_that_is_no_ca_bundle_refuses_to_start(
        tmp_path: Path) -> None:
    """The daemon's own check, for a config not made by the CLI: before the store opens."""
    from logsync.daemon import Daemon, DaemonConfig
    from logsync.errors import ConfigError

    (tmp_path / "notpem.pem").write_text("garbage\n")
    with pytest.raises(ConfigError, match="cannot be loaded"):
        Daemon(DaemonConfig(palace=tmp_path / "p", port=0, ca_file=str(tmp_path / "notpem.pem")))
    assert not (tmp_path / "p").exists()


def test_a_palace_under_a_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    done = logsync(tmp_path, "init", str(tmp_path / "afile" / "sub"))
    err = done.stderr.decode()
    assert done.returncode != 0 and "Traceback" not in err, err
    assert f"{tmp_path / 'afile'} is a file, not a directory" in err, err


def test_status_names_a_stopped_origin_and_counts_by_origin_seq(
        capsys: pytest.CaptureFixture) -> None:
    """A stopped origin looked like ordinary lag ('we lack 9 of its ops'), and a hub's
    own origin skips numbers (rowids), so the lag is an upper bound, said as one."""
    from logsync.cli.status import _print_peer

    origin = "rep_" + "e" * 32
    _print_peer({"name": "hub", "url": "http://127.0.0.1:9/", "state": "reachable",
                 "last_success_at": None, "last_error": None, "we_lack": 9, "they_lack": 0,
                 "we_lack_by_origin": {origin: 9}, "drift": {},
                 "stopped_origins": {origin: "store stopped this origin: metadata=... is "
                                             "invalid"}}, "now")
    out = capsys.readouterr().out
    assert f"STOPPED at its last round: origin {origin}: store stopped" in out, out
    assert "we lack up to 9 of its ops; it lacks up to 0 of ours" in out, out
    assert f"we lack up to 9 of {origin}" in out, out
