"""peers.json: the upstream format, managed by `logsync peers …`."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from logsync import peers
from logsync.cli import cli
from logsync.errors import ConfigError, NotFoundError, ValidationError


def test_add_replace_remove_in_the_upstream_format(tmp_path: Path) -> None:
    peers.add_peer(tmp_path, "laptop", "http://127.0.0.1:8801/", "t1")
    peers.add_peer(tmp_path, "hub", "https://hub.example:8080", None)
    peers.add_peer(tmp_path, "laptop", "http://127.0.0.1:8802", "t2")  # replaces by name
    data = json.loads((tmp_path / "peers.json").read_text())
    assert data == {"peers": [
        {"name": "hub", "url": "https://hub.example:8080"},
        {"name": "laptop", "url": "http://127.0.0.1:8802", "token": "t2"},
    ]}
    assert stat.S_IMODE((tmp_path / "peers.json").stat().st_mode) == 0o600
    assert peers.remove_peer(tmp_path, "hub").url == "https://hub.example:8080"
    assert [p.key for p in peers.load_peers(tmp_path)] == ["laptop"]
    with pytest.raises(NotFoundError, match="no peer named 'hub'"):
        peers.remove_peer(tmp_path, "hub")


def test_only_url_is_required_and_a_nameless_peer_is_known_by_its_url(tmp_path: Path) -> None:
    (tmp_path / "peers.json").write_text('{"peers": [{"url": "http://10.0.0.2:9000"}]}')
    (peer,) = peers.load_peers(tmp_path)
    assert (peer.key, peer.token) == ("http://10.0.0.2:9000", None)


@pytest.mark.parametrize("text, problem", [
    ("{", "is not valid JSON"),
    ('{"peers": {}}', "must be an object with a 'peers' list"),
    ('{"peers": [{"name": "x"}]}', "peers[0]: peer url=None is invalid"),
    ('{"peers": [{"url": "ftp://x"}]}', "must be an http:// or https:// URL"),
    ('{"peers": [{"url": "http://x", "token": 5}]}', "peers[0].token must be a string"),
    ('{"peers": [{"name": "desk", "url": "http://h:5"}, {"name": "desk", "url": "http://h:6"}]}',
     "peers[0] and peers[1] are both 'desk': each peer needs a name of its own"),
    ('{"peers": [{"url": "http://h:5"}, {"url": "http://a@h:5"}]}',
     "peers[0] and peers[1] are both 'http://h:5'"),
    ('{"peers": [{"name": "ab\\udcffcd", "url": "http://h:5"}]}',
     "is invalid: must be 1-128 printable characters of valid Unicode"),
    ('{"peers": [{"url": "http://h:5/\\udcff"}]}', "is invalid: it must be valid Unicode"),
    ('{"peers": [{"url": "http://u:pw@h:5", "token": "t"}]}',
     "peers[0]: peer url='http://h:5' carries a user name and password, which are sent in "
     "place of the token"),
])
def test_a_malformed_file_is_one_clear_error(tmp_path: Path, text: str, problem: str) -> None:
    (tmp_path / "peers.json").write_text(text)
    with pytest.raises(ConfigError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        peers.load_peers(tmp_path)


def test_bad_names_and_urls_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="peer url='localhost:80' is invalid"):
        peers.add_peer(tmp_path, "x", "localhost:80", None)
    with pytest.raises(ValidationError, match=r"'http://\[::1' is invalid: it is not a URL"):
        peers.add_peer(tmp_path, "x", "http://[::1", None)  # not a port problem
    with pytest.raises(ValidationError, match="the port must be a number from 1 to 65535"):
        peers.add_peer(tmp_path, "x", "http://h:99999", None)
    with pytest.raises(ValidationError, match="carries a user name and password"):
        peers.add_peer(tmp_path, "x", "http://u:pw@127.0.0.1:1", "tok")
    with pytest.raises(ValidationError, match="peer name='a\\\\nb' is invalid"):
        peers.add_peer(tmp_path, "a\nb", "http://x", None)
    assert not (tmp_path / "peers.json").exists()


@pytest.mark.parametrize(("url", "rule"), [
    ("http://" + "a" * 5000 + ".com", "it is 5011 characters long, the most a peer's URL may "
                                      "be is 2048"),
    ("http://" + "a" * 64 + ".example", "its host name must be at most 253 characters, in "
                                        "labels of at most 63"),
    ("http://" + ".".join(["a" * 60] * 5), "its host name must be at most 253 characters"),
])
def test_a_url_past_what_dns_or_servers_take_is_refused_shortened(tmp_path: Path, url: str,
                                                                  rule: str) -> None:
    """It was stored, and every later request failed at the resolver; the refusal shows
    the URL cut to one line."""
    with pytest.raises(ValidationError) as refused:
        peers.add_peer(tmp_path, "far", url, None)
    assert rule in str(refused.value) and len(str(refused.value)) < 400
    assert not (tmp_path / "peers.json").exists()
    assert peers.check_url("http://" + ".".join(["a" * 63] * 3) + ":80")  # at the bounds


def test_a_peer_not_found_is_named_shortened(tmp_path: Path) -> None:
    peers.add_peer(tmp_path, "desk", "http://127.0.0.1:9", None)
    with pytest.raises(NotFoundError) as missing:
        peers.remove_peer(tmp_path, "x" * 100_000)
    assert len(str(missing.value)) < 300


def test_the_cli_never_prints_tokens(tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["--palace", str(tmp_path)]
    added = runner.invoke(cli, [*base, "peers", "add", "a", "http://127.0.0.1:9", "--token",
                                "s3cret", "--json"])
    assert added.exit_code == 0 and "s3cret" not in added.output
    listed = runner.invoke(cli, [*base, "peers", "list", "--json"])
    assert json.loads(listed.output) == {
        "peers": [{"name": "a", "url": "http://127.0.0.1:9", "token_set": True, "push": False}]}
    assert "s3cret" not in runner.invoke(cli, [*base, "status"]).output


def test_push_is_a_checked_flag_of_peers_json(tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["--palace", str(tmp_path)]
    added = runner.invoke(cli, [*base, "peers", "add", "desk", "http://127.0.0.1:9", "--push"])
    assert added.exit_code == 0 and "(push)" in added.output
    assert json.loads((tmp_path / "peers.json").read_text())["peers"][0]["push"] is True
    assert peers.load_peers(tmp_path)[0].push is True
    (tmp_path / "peers.json").write_text(json.dumps(
        {"peers": [{"name": "desk", "url": "http://127.0.0.1:9", "push": "yes"}]}))
    with pytest.raises(ConfigError, match=r"peers\[0\].push='yes' must be true or false"):
        peers.load_peers(tmp_path)


def test_a_full_disk_names_the_file_being_written(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC names no file: the error says which one (it read 'I/O: No space left')."""
    import errno

    from logsync import files

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError) as caught:
        peers.add_peer(tmp_path, "x", "http://127.0.0.1:1", None)
    assert caught.value.filename == str(tmp_path / "peers.json")
    assert caught.value.errno == errno.ENOSPC
    assert [p.name for p in tmp_path.iterdir()] == []  # no temp file left


def test_a_peers_file_that_is_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    """Opening a FIFO waits for a writer: a daemon re-reading its peers hung, deaf to
    SIGTERM. It is refused at once, as any unreadable file is."""
    import os

    os.mkfifo(tmp_path / "peers.json")
    with pytest.raises(ConfigError, match="peers.json is not a regular file"):
        peers.load_peers(tmp_path)
