"""The local CLI, through click's CliRunner and through a real subprocess
(`python -m logsync`): upstream flag names and JSON shapes, byte-exact
stdin/stdout, exit codes (0 ok, 1 error, 2 timeout), one-line errors and
never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from logsync.cli import cli
from logsync.store import Store

EVENT_KEYS = [
    "id", "seq", "origin_replica", "origin_seq", "hlc", "type", "stream", "room", "topic",
    "from_agent", "to_agent", "correlation_id", "branch", "base_commit", "status",
    "artifact_ids", "body", "created_at", "metadata",
]
CRLF_BODY = "line one\r\nline two\r\n\r\nno newline at end"
PATCH = "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-old\n+new\n"
BASE = ["append", "--type", "task.note", "--stream", "proj", "--room", "general",
        "--from-agent", "lead"]


@pytest.fixture
def palace(tmp_path: Path) -> Path:
    return tmp_path / "palace"


@pytest.fixture
def run(palace: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Invoke the CLI in-process against `palace` (via --palace), which any command may
    create (--create: a missing palace is otherwise an error, tests/test_cli_hygiene.py)."""
    runner = CliRunner()

    def invoke(*args: str, input: bytes | str | None = None,
               env: dict[str, str] | None = None) -> Result:
        full = ["--create", *(["--palace", str(palace)] if env is None else []), *args]
        result = runner.invoke(cli, full, input=input, env=env, catch_exceptions=True)
        assert "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            f"unexpected exception {result.exception!r}"
        )
        return result

    return invoke


def sh(palace: Path, *args: str, stdin: bytes = b"", use_env: bool = False,
       extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run `python -m logsync` for real (--create, as `run`); bytes in, bytes out."""
    env = {**os.environ, "HOME": str(palace.parent / "home"), **(extra_env or {})}
    env.pop("LOGSYNC_PALACE", None)
    argv = [sys.executable, "-m", "logsync", "--create"]
    if use_env:
        env["LOGSYNC_PALACE"] = str(palace)
    else:
        argv += ["--palace", str(palace)]
    proc = subprocess.run(argv + list(args), input=stdin, capture_output=True, timeout=60,
                          env=env, check=False)
    assert b"Traceback" not in proc.stdout + proc.stderr
    return proc


def as_json(result: Result) -> Any:
    return json.loads(result.stdout)


def assert_one_line_error(result: Result, fragment: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    assert fragment in lines[0]


# ── CliRunner ─────────────────────────────────────────────────────────


def test_init_creates_the_palace_and_is_idempotent(run: Any, palace: Path) -> None:
    first = run("init", "--json")
    assert first.exit_code == 0
    payload = as_json(first)
    assert set(payload) == {"palace", "replica_id", "db_path"}
    assert payload["palace"] == str(palace)
    assert payload["db_path"] == str(palace / "logstream.sqlite3")
    assert payload["replica_id"].startswith("rep_")
    assert (palace / "replica.json").exists()
    second = run("init")
    assert second.exit_code == 0
    assert payload["replica_id"] in second.stdout


def test_append_json_is_the_upstream_event(run: Any) -> None:
    result = run(*BASE, "--to-agent", "coder", "--topic", "t1", "--correlation-id", "job-1",
                 "--branch", "main", "--base-commit", "abc", "--status", "open",
                 "--body", "hello", "--metadata", '{"k": [1, 2]}', "--json")
    assert result.exit_code == 0, result.output
    event = as_json(result)
    assert list(event) == EVENT_KEYS
    assert (event["type"], event["stream"], event["room"], event["from_agent"],
            event["to_agent"], event["topic"], event["correlation_id"], event["branch"],
            event["base_commit"], event["status"], event["body"], event["metadata"]) == (
        "task.note", "proj", "general", "lead", "coder", "t1", "job-1", "main", "abc", "open",
        "hello", {"k": [1, 2]},
    )
    assert event["origin_seq"] == 1


def test_append_text_output_names_the_event(run: Any) -> None:
    result = run(*BASE, "--body", "hi")
    assert result.exit_code == 0
    assert result.stdout.startswith("Appended:\n  evt_")
    assert "task.note  proj/general  lead->*" in result.stdout


def test_append_body_file_stdin_is_byte_exact(run: Any, palace: Path) -> None:
    result = run(*BASE, "--body-file", "-", "--json", input=CRLF_BODY.encode("utf-8"))
    assert result.exit_code == 0, result.output
    assert as_json(result)["body"] == CRLF_BODY
    with Store.open(palace) as store:
        assert store.list_events()[0]["body"] == CRLF_BODY


def test_append_body_file_path_is_byte_exact(run: Any, tmp_path: Path) -> None:
    path = tmp_path / "body.txt"
    path.write_bytes("ünï\r\n\ttab  \n".encode())
    result = run(*BASE, "--body-file", str(path), "--json")
    assert as_json(result)["body"] == "ünï\r\n\ttab  \n"


def test_append_with_artifact_ids(run: Any) -> None:
    art = as_json(run("artifact", "put", "--kind", "note", "--created-by", "lead",
                      "--content", "n", "--json"))
    result = run(*BASE, "--artifact-id", art["id"], "--artifact-id", art["id"], "--json")
    assert as_json(result)["artifact_ids"] == [art["id"]]


def test_list_json_shape_filters_and_orders(run: Any) -> None:
    for body, to in (("a", "coder"), ("b", "*"), ("c", "other")):
        run(*BASE, "--body", body, "--to-agent", to)
    listed = as_json(run("list", "--json"))
    assert set(listed) == {"events", "count"}
    assert listed["count"] == 3 == len(listed["events"])
    assert [list(e) for e in listed["events"]] == [EVENT_KEYS] * 3
    assert [e["body"] for e in as_json(run("list", "--to-agent", "coder", "--json"))
            ["events"]] == ["a", "b"]
    assert [e["body"] for e in as_json(run("list", "--order", "desc", "--json"))
            ["events"]] == ["c", "b", "a"]
    assert [e["body"] for e in as_json(run("list", "--order", "hlc", "--json"))
            ["events"]] == ["a", "b", "c"]
    assert as_json(run("list", "--limit", "2", "--json"))["count"] == 2
    first = listed["events"][0]["id"]
    assert [e["body"] for e in as_json(run("list", "--since-event-id", first, "--json"))
            ["events"]] == ["b", "c"]
    last = listed["events"][2]["id"]
    assert [e["body"] for e in as_json(run("list", "--before-event-id", last, "--json"))
            ["events"]] == ["a", "b"]
    empty = as_json(run("list", "--stream", "nowhere", "--json"))
    assert empty == {"events": [], "count": 0}
    text = run("list")
    assert text.stdout.startswith("3 event(s):\n")
    assert run("list", "--stream", "nowhere").stdout == "No matching events.\n"


def test_list_order_hlc_is_the_merged_timeline(run: Any, palace: Path, remote: Any) -> None:
    run(*BASE, "--body", "local")
    with Store.open(palace) as store:
        store.apply_remote([remote.op(remote.origin(1), 1, ms=1_000_000_000_000, body="old")])
    arrival = [e["body"] for e in as_json(run("list", "--json"))["events"]]
    merged = [e["body"] for e in as_json(run("list", "--order", "hlc", "--json"))["events"]]
    assert arrival == ["local", "old"]
    assert merged == ["old", "local"]


def test_wait_exits_2_on_timeout_and_0_with_events(run: Any) -> None:
    timed_out = run("wait", "--stream", "proj", "--timeout-ms", "100", "--json")
    assert timed_out.exit_code == 2
    assert as_json(timed_out) == {"timed_out": True, "events": [], "count": 0}
    text = run("wait", "--stream", "proj", "--timeout-ms", "50")
    assert (text.exit_code, text.stdout) == (2, "Timed out; no matching events.\n")
    run(*BASE, "--body", "here")
    found = run("wait", "--stream", "proj", "--timeout-ms", "5000", "--json")
    assert found.exit_code == 0
    payload = as_json(found)
    assert (payload["timed_out"], payload["count"]) == (False, 1)
    assert payload["events"][0]["body"] == "here"


def test_ack_routes_back_to_the_author(run: Any) -> None:
    target = as_json(run(*BASE, "--to-agent", "coder", "--correlation-id", "job-1", "--json"))
    result = run("ack", target["id"], "--from-agent", "coder", "--status", "claimed",
                 "--body", "on it", "--json")
    assert result.exit_code == 0
    ack = as_json(result)
    assert list(ack) == EVENT_KEYS
    assert (ack["type"], ack["from_agent"], ack["to_agent"], ack["correlation_id"],
            ack["status"], ack["body"], ack["metadata"]) == (
        "event.ack", "coder", "lead", "job-1", "claimed", "on it", {"ack_of": target["id"]},
    )
    assert run("ack", target["id"], "--from-agent", "x").stdout.startswith("Acknowledged:")


def test_artifact_put_from_file_and_stdin_and_get_exact_bytes(run: Any, tmp_path: Path) -> None:
    crlf = "a\r\nb\r\n"
    path = tmp_path / "in.txt"
    path.write_bytes(crlf.encode())
    from_file = as_json(run("artifact", "put", "--kind", "file", "--created-by", "c",
                            "--file", str(path), "--json"))
    from_dash = as_json(run("artifact", "put", "--kind", "file", "--created-by", "c",
                            "--file", "-", "--json", input=crlf.encode()))
    from_stdin = as_json(run("artifact", "put", "--kind", "file", "--created-by", "c",
                             "--json", input=crlf.encode()))
    for record in (from_file, from_dash, from_stdin):
        assert record["size_bytes"] == len(crlf.encode())
        assert "content" not in record
        got = run("artifact", "get", record["id"])
        assert got.exit_code == 0
        assert got.stdout_bytes == crlf.encode()
    out = tmp_path / "out.txt"
    written = run("artifact", "get", from_file["id"], "--out", str(out))
    assert written.exit_code == 0
    assert out.read_bytes() == crlf.encode()
    assert f"Wrote {len(crlf)} bytes to {out}" in written.stdout
    meta = as_json(run("artifact", "get", from_file["id"], "--json"))
    assert meta["content"] == crlf and meta["id"] == from_file["id"]


def test_patch_warnings_go_to_stderr_and_content_is_unaltered(run: Any) -> None:
    no_newline = PATCH.rstrip("\n")
    result = run("artifact", "put", "--kind", "patch", "--created-by", "c", "--json",
                 input=no_newline.encode())
    assert result.exit_code == 0
    record = as_json(result)
    assert "trailing newline" in record["warnings"][0]
    assert "Warning: patch content does not end with a trailing newline" in result.stderr
    assert run("artifact", "get", record["id"]).stdout_bytes == no_newline.encode()


def test_patch_submit(run: Any, tmp_path: Path) -> None:
    path = tmp_path / "x.diff"
    path.write_bytes(PATCH.encode())
    result = run("patch", "submit", "--from-agent", "coder", "--stream", "proj",
                 "--file", str(path), "--to-agent", "lead", "--json")
    assert result.exit_code == 0, result.output
    payload = as_json(result)
    assert set(payload) == {"artifact", "event"}
    event = payload["event"]
    assert (event["type"], event["room"], event["status"], event["to_agent"]) == (
        "patch.ready", "patches", "ready", "lead")
    assert event["artifact_ids"] == [payload["artifact"]["id"]]
    assert run("artifact", "get", payload["artifact"]["id"]).stdout_bytes == PATCH.encode()
    piped = run("patch", "submit", "--from-agent", "coder", "--stream", "proj", "--json",
                input=PATCH.replace("\n", "\r\n").encode())
    assert "carriage returns" in piped.stderr
    art_id = as_json(piped)["artifact"]["id"]
    assert run("artifact", "get", art_id).stdout_bytes == PATCH.replace("\n", "\r\n").encode()


def test_info_json(run: Any, palace: Path, remote: Any) -> None:
    run(*BASE)
    run(*BASE)
    with Store.open(palace) as store:
        me = store.replica_id
        store.apply_remote(remote.chain(remote.origin(1), 3))
    payload = as_json(run("info", "--json"))
    assert payload == {
        "palace": str(palace), "replica_id": me,
        "version_vector": {me: 2, remote.origin(1): 3},
        "events": 5, "artifacts": 0, "conflicts": 0, "quarantined": 0,
        "signing": {me: {"state": "signed", "signed_to": 2, "unproven": 0},
                    remote.origin(1): {"state": "unsigned", "signed_to": 0, "unproven": 3}},
    }
    text = run("info").stdout
    assert f"replica_id  {me}" in text and "events 5" in text
    assert f"  {me}  2  signed, signed to 2, 0 unproven" in text.splitlines()
    assert f"  {remote.origin(1)}  3  unsigned, 3 unproven" in text.splitlines()


def test_logsync_palace_env_is_honoured(run: Any, tmp_path: Path) -> None:
    elsewhere = tmp_path / "from-env"
    result = run("init", "--json", env={"LOGSYNC_PALACE": str(elsewhere)})
    assert as_json(result)["palace"] == str(elsewhere)
    assert (elsewhere / "replica.json").exists()


# ── errors: one line, exit 1, JSON with --json, never a traceback ─────


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([*BASE[:2], "Bad.Type", *BASE[3:]], "type='Bad.Type' is invalid: must be 1-64 chars"),
        ([*BASE, "--status", "done"], "status='done' is invalid: must be one of:"),
        ([*BASE, "--artifact-id", "art_nope"], "artifact_ids names 'art_nope', which is not"),
        ([*BASE, "--body-file", "/nonexistent/body"], "/nonexistent/body: No such file"),
        (["list", "--since-event-id", "evt_nope"], "since_event_id 'evt_nope' not found"),
        (["list", "--limit", "0"], "--limit 0 is invalid: it must be an integer from 1 to 500"),
        (["wait", "--timeout-ms", "-5"], "--timeout-ms -5 is invalid"),
        (["ack", "evt_nope", "--from-agent", "x"], "event 'evt_nope' not found"),
        (["artifact", "get", "art_nope"], "artifact 'art_nope' not found"),
        (["artifact", "put", "--kind", "diff", "--created-by", "c", "--content", "x"],
         "kind='diff' is invalid: must be one of: file, json, log, note, patch"),
        (["artifact", "put", "--kind", "note", "--created-by", "c", "--content", ""],
         "content='' is invalid: must be a non-empty string"),
        ([*BASE, "--metadata", "{bad"], "--metadata"),
        ([*BASE, "--metadata", "[1]"], "--metadata"),
    ],
)
def test_errors_are_one_line_and_json_with_json(run: Any, args: list[str],
                                                fragment: str) -> None:
    assert_one_line_error(run(*args), fragment)
    result = run(*args, "--json")
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert list(payload) == ["error"]
    assert fragment in payload["error"]


def test_stdin_that_is_not_utf8_is_a_clear_error(run: Any) -> None:
    result = run("artifact", "put", "--kind", "note", "--created-by", "c", input=b"\xff\xfe")
    assert_one_line_error(result, "standard input is not UTF-8 text (invalid start byte at byte 0)")


def test_a_corrupt_replica_file_is_a_clear_error(run: Any, palace: Path) -> None:
    palace.mkdir()
    (palace / "replica.json").write_text("{nope")
    result = run("info")
    assert_one_line_error(result, "replica.json is corrupt")
    assert (palace / "replica.json").read_text() == "{nope"


def test_usage_errors_are_one_line_through_the_real_entry_point(palace: Path) -> None:
    """`main()` (what the console script runs) turns click's usage errors into
    the same one-line form, exit 1; `wait`'s exit 2 stays unambiguous."""
    missing = sh(palace, "append", "--type", "t")
    assert missing.returncode == 1
    assert missing.stdout == b""
    assert missing.stderr == b"Error: Missing option '--stream'.\n"
    bad_choice = sh(palace, "list", "--order", "sideways", "--json")
    assert bad_choice.returncode == 1
    assert json.loads(bad_choice.stdout) == {
        "error": "Invalid value for '--order': 'sideways' is not one of 'asc', 'desc', 'hlc'."
    }
    typo = sh(palace, "wait", "--timeout-msec", "5")
    assert typo.returncode == 1
    assert typo.stderr.startswith(b"Error: No such option '--timeout-msec'")
    assert typo.stderr.count(b"\n") == 1


# ── a real subprocess ─────────────────────────────────────────────────


def test_subprocess_round_trip(palace: Path, tmp_path: Path) -> None:
    init = sh(palace, "init", "--json")
    assert init.returncode == 0, init.stderr
    replica = json.loads(init.stdout)["replica_id"]

    appended = sh(palace, *BASE, "--body-file", "-", "--json", stdin=CRLF_BODY.encode())
    assert appended.returncode == 0, appended.stderr
    event = json.loads(appended.stdout)
    assert list(event) == EVENT_KEYS
    assert event["body"] == CRLF_BODY and event["origin_replica"] == replica

    listed = sh(palace, "list", "--json", "--order", "hlc")
    payload = json.loads(listed.stdout)
    assert payload["count"] == 1 and payload["events"][0]["body"] == CRLF_BODY

    put = sh(palace, "artifact", "put", "--kind", "patch", "--created-by", "c", "--json",
             stdin=PATCH.replace("\n", "\r\n").encode())
    art = json.loads(put.stdout)
    assert b"Warning: patch content contains carriage returns" in put.stderr
    got = sh(palace, "artifact", "get", art["id"])
    assert got.returncode == 0 and got.stdout == PATCH.replace("\n", "\r\n").encode()
    out = tmp_path / "copy.diff"
    assert sh(palace, "artifact", "get", art["id"], "--out", str(out)).returncode == 0
    assert out.read_bytes() == PATCH.replace("\n", "\r\n").encode()

    acked = sh(palace, "ack", event["id"], "--from-agent", "coder", "--json")
    assert json.loads(acked.stdout)["to_agent"] == "lead"

    submitted = sh(palace, "patch", "submit", "--from-agent", "coder", "--stream", "proj",
                   "--json", stdin=PATCH.encode())
    assert json.loads(submitted.stdout)["event"]["type"] == "patch.ready"

    info = json.loads(sh(palace, "info", "--json").stdout)
    assert info["replica_id"] == replica
    assert info["version_vector"] == {replica: 3}
    assert (info["events"], info["artifacts"]) == (3, 2)


def test_subprocess_wait_exit_codes(palace: Path) -> None:
    timed_out = sh(palace, "wait", "--stream", "proj", "--timeout-ms", "100", "--json")
    assert timed_out.returncode == 2
    assert json.loads(timed_out.stdout) == {"timed_out": True, "events": [], "count": 0}
    sh(palace, *BASE)
    found = sh(palace, "wait", "--stream", "proj", "--timeout-ms", "2000", "--json")
    assert found.returncode == 0
    assert json.loads(found.stdout)["count"] == 1


def test_subprocess_errors_and_env_palace(palace: Path) -> None:
    via_env = sh(palace, "init", "--json", use_env=True)
    assert json.loads(via_env.stdout)["palace"] == str(palace)
    bad = sh(palace, *BASE[:2], "Nope", *BASE[3:], use_env=True)
    assert bad.returncode == 1
    assert bad.stdout == b""
    assert bad.stderr.decode().count("\n") == 1
    assert bad.stderr.startswith(b"Error: type='Nope' is invalid")
    bad_json = sh(palace, "artifact", "get", "art_nope", "--json", use_env=True)
    assert bad_json.returncode == 1
    assert json.loads(bad_json.stdout) == {"error": "artifact 'art_nope' not found"}
    (palace / "logstream.sqlite3").write_bytes(b"garbage" * 1000)
    for name in ("logstream.sqlite3-wal", "logstream.sqlite3-shm"):
        (palace / name).unlink(missing_ok=True)
    broken = sh(palace, "list", use_env=True)
    assert broken.returncode == 1
    assert broken.stderr.startswith(b"Error: cannot open ")
    assert broken.stderr.count(b"\n") == 1


def test_owed_lists_an_expired_ask_apart_and_claims_names_who_must_yield(run) -> None:
    """R2 and R3 as views through the CLI: `owed --now` and `claims`."""
    base = ["append", "--type", "task.request", "--stream", "s", "--room", "r",
            "--from-agent", "boss@a", "--to-agent", "pi@b", "--status", "open"]
    run(*base, "--metadata", '{"expires_at": "2026-01-01T00:00:00Z"}')
    run(*base, "--metadata", '{"expires_at": "2030-01-01T00:00:00Z"}')
    result = run("owed", "--agent", "pi@b", "--now", "2026-12-01T00:00:00Z", "--json")
    data = json.loads(result.output)
    assert data["count"] == 1 and len(data["expired"]) == 1
    assert data["expired"][0]["metadata"]["expires_at"] == "2026-01-01T00:00:00Z"
    assert data["unreadable_expiry"] == 0
    for now in ("noon", "2026-13-45T99:00:00Z"):  # a lookalike compared as text passed
        bad = run("owed", "--agent", "pi@b", "--now", now)
        assert bad.exit_code == 1 and f"--now '{now}' is not a real UTC time" in bad.output
    # JavaScript's toISOString(): not a UTC time as created_at spells it, so it never
    # expires (R2); the operator is told
    run(*base, "--metadata", '{"expires_at": "2020-01-01T00:00:00.000Z"}')
    data = json.loads(run("owed", "--agent", "pi@b", "--now", "2026-12-01T00:00:00Z",
                          "--json").output)
    assert data["count"] == 2 and data["unreadable_expiry"] == 1
    text = run("owed", "--agent", "pi@b")
    assert "1 of these asks carry an expires_at that is not a UTC time" in text.output
    for agent in ("pi@a", "pi@b"):
        run("append", "--type", "task.claim", "--stream", "s", "--room", "r", "--from-agent",
            agent, "--status", "claimed", "--correlation-id", "job-1")
    text = run("claims", "job-1").output
    assert "won by pi@a" in text and "still to yield" in text and "pi@b" in text.split(
        "still to yield")[1]


# ── commands load their modules when named ─────────────────────────────────


def test_the_command_map_names_every_module_that_adds_a_command() -> None:
    """`group.COMMAND_MODULES` against the modules themselves: every command, and every
    module that defines it or adds a subcommand to it."""
    import importlib
    import pkgutil

    import click

    import logsync.cli
    from logsync.cli.group import COMMAND_MODULES

    modules = [m.name for m in pkgutil.iter_modules(logsync.cli.__path__)
               if m.name not in ("group", "_common")]
    for name in modules:
        importlib.import_module(f"logsync.cli.{name}")
    found: dict[str, set[str]] = {}
    for name, command in cli.commands.items():
        parts = [command, *(command.commands.values() if isinstance(command, click.Group)
                            else ())]
        found[name] = {c.callback.__module__.rsplit(".", 1)[1] for c in parts if c.callback}
    found["logstream"] = {"local"}  # its subcommands are other commands (aliases)
    assert {k: set(v) for k, v in COMMAND_MODULES.items()} == found


def test_sync_does_not_load_the_other_commands() -> None:
    code = ("import sys; from logsync.cli import cli; "
            "cli.main(['sync', '--help'], standalone_mode=False); "
            "print(sorted(m for m in sys.modules if m.startswith('logsync.cli.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    loaded = done.stdout.strip().splitlines()[-1]
    assert "replication" in loaded
    for other in ("sim", "derived", "conformance", "operator", "ledgers", "status", "verify"):
        assert f"logsync.cli.{other}'" not in loaded, loaded


def test_a_command_finds_its_subcommands_whatever_was_loaded_before() -> None:
    """`conflicts` is registered by one module and its `review` added by another: naming
    `peers` first (which loads the first) must not hide `review`."""
    code = ("from click.testing import CliRunner; from logsync.cli import cli; r = CliRunner(); "
            "print([r.invoke(cli, args).exit_code for args in (['peers', '--help'], "
            "['conflicts', 'review', '--help'], ['quarantine', 'retry', '--help'])])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[0, 0, 0]", done.stdout + done.stderr


def test_a_stopped_origin_points_to_where_its_op_is_held(capsys: pytest.CaptureFixture) -> None:
    """A fork or an id collision is a conflict (`logsync conflicts`); any other stop holds
    its op in quarantine (`logsync quarantine`)."""
    from logsync.cli import replication

    stats = {"peer_name": "hub", "peer_replica": "rep_" + "a" * 32, "pulled_events": 0,
             "pulled_artifacts": 0, "conflicts": 1, "quarantined": 1, "per_origin_detail": {},
             "failed_origins": {}, "stopped_origins": {
                 "rep_" + "b" * 32: "store stopped this origin: id collision",
                 "rep_" + "c" * 32: "store stopped this origin: fork",
                 "rep_" + "d" * 32: "store stopped this origin: names artifact 'x', which "
                                    "is not present",
                 "rep_" + "e" * 32: "store stopped this origin: type 'a fork' is not "
                                    "a fork"}}  # a quarantine reason quoting the op
    replication._print_result({"stats": stats, "report": None})
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith("id collision (recorded as a conflict: logsync conflicts)")
    assert lines[1].endswith("fork (recorded as a conflict: logsync conflicts)")
    assert lines[2].endswith("(held in quarantine: logsync quarantine)")
    assert lines[3].endswith("(held in quarantine: logsync quarantine)")
