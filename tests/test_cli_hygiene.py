"""CLI hygiene (issue 11, item 7): a missing palace is one sentence and is never created
by a read, nor by a write without --create; no command changes an existing directory's
mode; errors go to stderr (with --json, `{"error": …}` to stdout); every option has help
and every command an example that parses; `logsync logstream sync` is upstream's
spelling of `logsync sync`."""

from __future__ import annotations

import json
import os
import shlex
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from logsync.cli import cli
from logsync.store import DB_FILENAME, Store
from logsync.store.schema import create_upstream_tables

APPEND = ["append", "--type", "task.note", "--stream", "s", "--room", "r", "--from-agent", "a"]
# Every command that only reads the store (the ones from cli/ledgers.py and
# cli/replication.py included), with the arguments it needs.
READS = {
    "list": ["list"], "info": ["info"], "owed": ["owed", "--agent", "a@x"],
    "presence": ["presence"], "claims": ["claims", "corr-1"],
    "wait": ["wait", "--timeout-ms", "0"], "artifact get": ["artifact", "get", "art_x"],
    "verify": ["verify"], "status": ["status"], "conflicts": ["conflicts"],
    "quarantine": ["quarantine"], "logstream list": ["logstream", "list"],
    "logstream wait": ["logstream", "wait", "--timeout-ms", "0"],
}
# Reads that succeed on an empty palace (`artifact get art_x` is a not-found error there).
READS_OK_EMPTY = [name for name in READS if name != "artifact get"]


def invoke(palace: Path, *args: str, input: str | None = None) -> Result:
    result = CliRunner().invoke(cli, ["--palace", str(palace), *args], input=input)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"unexpected exception {result.exception!r}")
    return result


def the_sentence(palace: Path) -> str:
    return f"Error: no palace at {palace}: run 'logsync init {palace}' or pass --create"


def tree(palace: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under the palace: mode and size (what a read must not touch).
    SQLite's -wal and -shm beside a WAL store are left out: any reader of the store may make
    them (MemPalace's too), and they hold nothing of the palace's own."""
    found = {".": (os.stat(palace).st_mode, 0)}
    for path in sorted(palace.rglob("*")):
        if path.name.endswith(("-wal", "-shm")):
            continue
        info = path.stat()
        found[str(path.relative_to(palace))] = (info.st_mode, info.st_size)
    return found


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# ── a missing palace ────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", sorted(READS))
def test_a_read_on_a_missing_palace_is_one_sentence_and_creates_nothing(
        tmp_path: Path, name: str) -> None:
    palace = tmp_path / "absent"
    result = invoke(palace, *READS[name])
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    # Commands with their own --create get exactly this; the others (cli/replication.py,
    # cli/ledgers.py, until they take --create) say where the group's --create goes.
    assert result.stderr.startswith(the_sentence(palace)), result.stderr
    assert not palace.exists()


def test_a_directory_without_a_store_is_not_a_palace(tmp_path: Path) -> None:
    palace = tmp_path / "p"
    palace.mkdir()
    (palace / "peers.json").write_text('{"peers": []}')
    before = tree(palace)
    result = invoke(palace, "list")
    assert result.exit_code == 1 and result.stderr == the_sentence(palace) + "\n"
    assert tree(palace) == before


def test_a_read_with_create_makes_the_palace(tmp_path: Path) -> None:
    for args in (["list", "--create"], ["--create", "list"], ["info", "--create", "--json"]):
        palace = tmp_path / "-".join(args)
        result = invoke(palace, *args)
        assert result.exit_code == 0, result.output
        assert (palace / DB_FILENAME).is_file() and mode(palace) == 0o700


def test_a_write_refuses_a_missing_palace_without_create(tmp_path: Path) -> None:
    palace = tmp_path / "absent"
    for args in (APPEND, ["ack", "evt_x", "--from-agent", "a"],
                 ["artifact", "put", "--kind", "note", "--created-by", "a", "--content", "x"],
                 ["patch", "submit", "--from-agent", "a", "--stream", "s"]):
        result = invoke(palace, *args, input="diff\n")
        assert result.exit_code == 1 and result.stdout == "", (args, result.output)
        assert result.stderr == the_sentence(palace) + "\n", args
        assert not palace.exists()


def test_a_write_with_create_makes_the_palace_0700(tmp_path: Path) -> None:
    for args in ([*APPEND, "--create"], ["--create", *APPEND]):
        palace = tmp_path / ("own" if args[0] == "append" else "group") / "palace"
        result = invoke(palace, *args, "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["type"] == "task.note"
        assert mode(palace) == 0o700


def test_init_creates_the_named_directory_0700_and_is_idempotent(tmp_path: Path) -> None:
    palace = tmp_path / "new"
    done = CliRunner().invoke(cli, ["init", str(palace), "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["palace"] == str(palace) and mode(palace) == 0o700
    again = CliRunner().invoke(cli, ["init", str(palace), "--json"])
    assert json.loads(again.stdout)["replica_id"] == json.loads(done.stdout)["replica_id"]


def test_a_store_logsync_never_set_up_is_read_by_no_read_command(tmp_path: Path) -> None:
    """A MemPalace palace (upstream's tables, none of logsync's): reads refuse in one
    sentence naming `logsync init` and leave every byte as it was; `init` sets it up."""
    palace = tmp_path / "hub"
    palace.mkdir(mode=0o755)
    conn = sqlite3.connect(palace / DB_FILENAME)
    create_upstream_tables(conn)
    conn.commit()
    conn.close()
    (palace / "replica.json").write_text('{"replica_id": "rep_' + "a" * 32 + '"}')
    before = tree(palace)
    for args in (["list"], ["info"], ["verify"]):
        result = invoke(palace, *args)
        assert result.exit_code == 1 and len(result.stderr.splitlines()) == 1, result.output
        assert f"logsync init {palace}" in result.stderr
    assert tree(palace) == before
    assert invoke(palace, "init").exit_code == 0
    assert invoke(palace, "list").exit_code == 0 and mode(palace) == 0o755


# ── directory modes ─────────────────────────────────────────────────────────


@pytest.fixture
def shared_palace(tmp_path: Path) -> Iterator[Path]:
    """An existing palace whose owner made it 0755 (as a MemPalace hub's may be)."""
    palace = tmp_path / "shared"
    with Store.open(palace) as store:
        store.append_event("task.note", "s", "r", "a@x", correlation_id="corr-1")
    palace.chmod(0o755)
    yield palace


@pytest.mark.parametrize("name", READS_OK_EMPTY)
def test_a_read_leaves_an_existing_palace_as_it_was(shared_palace: Path, name: str) -> None:
    before = tree(shared_palace)
    result = invoke(shared_palace, *READS[name])
    assert result.exit_code in (0, 2), result.output  # wait --timeout-ms 0: 0 (a match) or 2
    assert mode(shared_palace) == 0o755
    assert tree(shared_palace) == before


def test_writes_and_init_keep_an_existing_palace_mode(shared_palace: Path) -> None:
    assert invoke(shared_palace, *APPEND).exit_code == 0
    assert invoke(shared_palace, "init").exit_code == 0
    assert invoke(shared_palace, "artifact", "put", "--kind", "note", "--created-by", "a",
                  "--content", "x").exit_code == 0
    assert invoke(shared_palace, "peers", "add", "b", "http://127.0.0.1:9").exit_code == 0
    assert mode(shared_palace) == 0o755


def test_peers_add_on_a_missing_palace_makes_its_directory_0700(tmp_path: Path) -> None:
    """As the README's two-daemon example would, were `init` left out: `serve` then puts
    the store and key in the directory `peers add` made."""
    palace = tmp_path / "new" / "palace"
    assert invoke(palace, "peers", "add", "b", "http://127.0.0.1:9").exit_code == 0
    assert mode(palace) == 0o700 and not (palace / DB_FILENAME).exists()


# ── errors go to stderr ─────────────────────────────────────────────────────


ERRORS = [
    (["artifact", "get", "art_nope"], "artifact 'art_nope' not found"),
    ([*APPEND, "--metadata", "[1]"], "--metadata"),
    (["verify", "--origin", "nope"], "is not a replica id"),
    (["owed", "--agent", " "], "--agent must name an agent"),
    (["ack", "evt_nope", "--from-agent", "a"], "not found"),
]


@pytest.mark.parametrize(("args", "fragment"), ERRORS)
def test_errors_go_to_stderr_and_to_stdout_as_json_with_json(
        shared_palace: Path, args: list[str], fragment: str) -> None:
    plain = invoke(shared_palace, *args)
    assert plain.exit_code == 1 and plain.stdout == "", plain.output
    assert len(plain.stderr.splitlines()) == 1 and plain.stderr.startswith("Error: ")
    assert fragment in plain.stderr
    as_json = invoke(shared_palace, *args, "--json")
    assert as_json.exit_code == 1 and as_json.stderr == ""
    assert fragment in json.loads(as_json.stdout)["error"]


def test_usage_errors_through_the_entry_point_go_to_stderr(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "logsync", "--palace", str(tmp_path / "p")]
    for args in (["list", "--limit", "x"], ["no-such-command"], ["list"]):
        done = subprocess.run(argv + args, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and done.stdout == "", (args, done.stdout)
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("Error: "), done.stderr
    done = subprocess.run(argv + ["list", "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr == ""
    assert json.loads(done.stdout)["error"].startswith(f"no palace at {tmp_path / 'p'}")


# ── help on every option, an example on every command ──────────────────────


def commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))


def examples(command: click.Command) -> list[list[str]]:
    """The `logsync …` lines after 'Example' in a command's help or epilog (a trailing
    backslash continues a line; a pipe, && or # ends it), as argv lists without `logsync`."""
    text = f"{command.help or ''}\n{command.epilog or ''}"
    if "Example" not in text:
        return []
    lines: list[str] = []
    for raw in text.split("Example", 1)[1].splitlines():
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1] + " " + raw.strip()
        else:
            lines.append(raw.strip())
    found = []
    for line in lines:
        if "logsync " not in line:
            continue
        tail = line[line.index("logsync ") + len("logsync "):]
        for stop in (" | ", " && "):
            tail = tail.split(stop)[0]
        found.append(shlex.split(tail, comments=True))
    return found


def parses_to(root: click.Group, argv: list[str]) -> click.Command:
    """The command `logsync ARGV` names, with its arguments and options checked by click."""
    ctx = root.make_context("logsync", list(argv))
    command: click.Command = root
    while isinstance(command, click.Group):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        name, sub, rest = command.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub
    return command


def offenders(root: click.Group) -> list[str]:
    found = []
    for path, command in commands(root):
        where = " ".join(path)
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden and not param.help:
                found.append(f"{where} {param.opts[0]}: no help")
        if isinstance(command, click.Group):
            continue
        lines = examples(command)
        if not lines:
            found.append(f"{where}: no example")
        for argv in lines:
            try:
                named = parses_to(root, argv)
            except click.BadParameter as exc:  # a file the example names need not exist
                named = command if "does not exist" in exc.format_message() else None
                if named is None:
                    found.append(f"{where}: example {shlex.join(argv)!r}: "
                                 f"{exc.format_message()}")
                    continue
            except click.ClickException as exc:
                found.append(f"{where}: example {shlex.join(argv)!r}: {exc.format_message()}")
                continue
            if named is not command:
                found.append(f"{where}: example {shlex.join(argv)!r} runs {named.name}")
    return found


def test_every_option_has_help_and_every_command_an_example() -> None:
    found = offenders(cli)
    assert not found, "\n".join(found)
    assert all(p.help for p in cli.params if isinstance(p, click.Option))


def test_the_walk_finds_a_planted_offender() -> None:
    @click.group()
    def root() -> None:
        """Root."""

    @root.command()
    @click.option("--quiet", is_flag=True)
    def bare() -> None:
        """No example here."""

    @root.command()
    @click.option("--n", type=int, help="A number.")
    def good() -> None:
        """Fine.

        Example:

        \b
          logsync good --n 3
        """

    @root.command()
    def wrong() -> None:
        """Its example names another command and an option that is not there.

        Example:

        \b
          logsync good --n 3
          logsync wrong --nope
        """

    assert offenders(root) == [
        "bare --quiet: no help", "bare: no example",
        "wrong: example 'good --n 3' runs good",
        "wrong: example 'wrong --nope': No such option '--nope'.",
    ]


# ── upstream's spelling of sync ─────────────────────────────────────────────


def test_logstream_sync_is_sync(tmp_path: Path) -> None:
    """`mempalace logstream sync --peer URL --token T --json` works as `logsync logstream
    sync`: the same command, the same options, the same answers."""
    ctx = click.Context(cli)
    alias = cli.get_command(ctx, "logstream").commands["sync"]  # type: ignore[union-attr]
    assert alias is cli.get_command(ctx, "sync")
    assert {"--peer", "--token", "--json"} <= {o for p in alias.params for o in p.opts}
    palace = tmp_path / "p"
    ours, upstream = invoke(palace, "sync"), invoke(palace, "logstream", "sync")
    assert ours.exit_code == upstream.exit_code == 1
    assert upstream.stderr == ours.stderr and "no peers configured" in ours.stderr
