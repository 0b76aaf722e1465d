"""CLI hardening with real processes (issue 8, findings 4, 5, 16): peer URLs are validated
and redacted, `serve` reports a port in use or a bad TLS pair in one line before any banner,
whitespace-only tokens are refused."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from logsync.peers import check_url, redact_url
from tests.conftest import unavailable

PY = [sys.executable, "-m", "logsync"]


def run(palace: Path, *args: str, env: dict[str, str] | None = None,
        timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PY, "--palace", str(palace), *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("Error: "), done.stderr
    assert "serving" not in done.stderr and "serving" not in done.stdout
    return done.stderr.strip()


# ---------------------------------------------------------------- finding 4


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:0",
                                 "http://h:port", "ftp://h:1", "http://:80"])
def test_peers_add_refuses_bad_urls_in_one_line(tmp_path: Path, url: str) -> None:
    line = one_error_line(run(tmp_path / "p", "peers", "add", "y", url))
    assert url.split("//")[1].split(":")[0] in line or url in line
    assert "must" in line
    assert not (tmp_path / "p" / "peers.json").exists()


def test_a_peers_file_with_a_bad_port_names_the_peer(tmp_path: Path) -> None:
    palace = tmp_path / "p"
    assert run(palace, "init").returncode == 0  # `status` reads the store first
    (palace / "peers.json").write_text(json.dumps(
        {"peers": [{"name": "ok", "url": "http://127.0.0.1:8742"},
                   {"name": "y", "url": "http://127.0.0.1:99999"}]}))
    for args in (["peers", "list"], ["status"], ["sync"]):
        line = one_error_line(run(palace, *args))
        assert "peers[1]" in line and "'y'" in line and "65535" in line


def test_check_url_rules() -> None:
    assert check_url("https://host:65535/") == "https://host:65535"
    with pytest.raises(ValueError, match="port must be a number from 1 to 65535"):
        check_url("http://127.0.0.1:65536")


# ---------------------------------------------------------------- finding 5


def test_serve_on_a_port_in_use_is_one_line_without_banner(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_error_line(run(tmp_path / "p", "serve", "--port", str(port)))
    assert line == f"Error: cannot listen on 127.0.0.1:{port}: address already in use"


def _pair(tmp: Path, name: str) -> tuple[Path, Path]:
    cert, key = tmp / f"{name}.crt", tmp / f"{name}.key"
    done = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                           "-keyout", str(key), "-out", str(cert), "-days", "1",
                           "-subj", "/CN=127.0.0.1"], capture_output=True)
    if done.returncode != 0:
        unavailable("openssl cannot make a test certificate here")
    return cert, key


def test_serve_with_a_bad_tls_pair_is_one_line_without_banner(tmp_path: Path) -> None:
    cert, key = _pair(tmp_path, "a")
    _, other_key = _pair(tmp_path, "b")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    encrypted = tmp_path / "encrypted.pem"  # a terminal was asked for its passphrase
    subprocess.run(["openssl", "pkey", "-in", str(key), "-aes128", "-passout", "pass:pw",
                    "-out", str(encrypted)], check=True, capture_output=True, timeout=60)
    cases = {
        (str(cert), str(encrypted)): f"TLS key {encrypted} is encrypted (it asks for a "
                                     "passphrase)",
        (str(junk), str(key)): f"TLS certificate {junk} cannot be used: ",
        (str(cert), str(junk)): f"TLS certificate {cert} cannot be used: ",
        (str(cert), str(other_key)): f"the key {other_key} does not match it",
    }
    for (c, k), expected in cases.items():
        line = one_error_line(run(tmp_path / "p", "serve", "--port", port,
                                  "--tls-cert", c, "--tls-key", k))
        assert expected in line


# ---------------------------------------------------------------- finding 16


def test_redact_url_drops_userinfo_and_masks_secret_query_values() -> None:
    assert redact_url("http://user:pass@host:8742/p?token=abc&x=1") == \
        "http://host:8742/p?token=***&x=1"
    assert redact_url("https://h/?api_key=k&Password=p&auth_sig=s&page=2") == \
        "https://h/?api_key=***&Password=***&auth_sig=***&page=2"
    assert redact_url("http://127.0.0.1:8742") == "http://127.0.0.1:8742"


def test_peer_credentials_never_reach_peers_list_or_status(tmp_path: Path) -> None:
    palace = tmp_path / "p"
    url = "http://alice:hunter2@127.0.0.1:9/"
    assert run(palace, "init").returncode == 0  # `status` reads the store first
    assert run(palace, "peers", "add", "y", url).returncode == 0
    (palace / "peers.json").write_text(json.dumps(
        {"peers": [{"name": "y", "url": url}, {"url": "http://bob:pw@127.0.0.1:8/"}]}))
    for args in (["peers", "list"], ["peers", "list", "--json"], ["status"],
                 ["status", "--json"]):
        done = run(palace, *args)
        # status asks the peers now: none answers (ports 8 and 9), so it exits 1
        assert done.returncode == (1 if args[0] == "status" else 0), done.stderr
        shown = done.stdout + done.stderr
        for secret in ("hunter2", "alice", "bob:pw"):
            assert secret not in shown, (args, shown)
        assert "127.0.0.1:9" in shown


# ---------------------------------------------------------------- whitespace tokens


def test_whitespace_only_tokens_are_refused(tmp_path: Path) -> None:
    line = one_error_line(run(tmp_path / "p", "peers", "add", "y", "http://127.0.0.1:9",
                              "--token", "   "))
    assert "whitespace only" in line
    line = one_error_line(run(tmp_path / "p", "serve", "--port", "1", "--token", " \t"))
    assert "whitespace only" in line
    line = one_error_line(run(tmp_path / "p", "serve", "--port", "1",
                              env={"LOGSYNC_TOKEN": "  "}))
    assert "whitespace only" in line and "LOGSYNC_TOKEN" in line


def test_sync_refuses_a_whitespace_token_and_a_url_with_a_query(tmp_path: Path) -> None:
    """A query in a peer URL would swallow every request path (httpx joins paths onto it)."""
    from click.testing import CliRunner

    from logsync.cli import cli

    palace = str(tmp_path / "p")
    runner = CliRunner()
    blank = runner.invoke(cli, ["--palace", palace, "sync", "--peer", "http://127.0.0.1:9",
                                "--token", "   "])
    assert blank.exit_code == 1 and "--token" in blank.output
    query = runner.invoke(cli, ["--palace", palace, "sync", "--peer",
                                "http://127.0.0.1:9/?token=hush"])
    assert query.exit_code == 1 and "query" in query.output and "hush" not in query.output
    assert "Traceback" not in blank.output + query.output
