"""Local commands on one palace: init, append, list, wait, ack, artifact, patch, info, and
the upstream-spelled `logstream` aliases.

Only `init` (and any command given --create) may create a palace; read commands open the
store read-only and write nothing (`_common.open_store`).
"""

from __future__ import annotations

from typing import Any

import click

from logsync.cli._common import (
    EXIT_TIMEOUT,
    create_option,
    emit_json,
    event_line,
    handles_errors,
    json_option,
    open_store,
    palace_of,
    parse_metadata,
    read_stdin_exact,
    read_text,
    row_limit,
    within,
    write_stdout_exact,
)
from logsync.cli.group import cli
from logsync.cli.replication import sync_cmd
from logsync.errors import NotFoundError, shorten
from logsync.model import ARTIFACT_KINDS, EVENT_STATUSES, MAX_BODY_BYTES
from logsync.store import MAX_WAIT_TIMEOUT_MS, Store
from logsync.store.signing_state import phrase, read_signing_states
from logsync.store.waiting import wait_events

# What each routing field is: `append` sets it, the filters of `list` and `wait` match it.
FIELDS = {
    "stream": "stream, e.g. project/x",
    "room": "room within the stream, e.g. delegation",
    "topic": "topic (free text)",
    "type": "event type, e.g. task.request",
    "to-agent": "addressee, e.g. codex@desk ('*' = everyone)",
    "from-agent": "author, e.g. pi@laptop",
    "correlation-id": "correlation id tying replies to their ask",
    "status": f"status: {', '.join(sorted(EVENT_STATUSES))}",
    "branch": "git branch the event is about",
    "base-commit": "git commit a patch applies to",
}
JSON_OBJECT = "A JSON object of extra fields, e.g. '{\"pr\": 12}'."


def _set(name: str) -> str:
    return f"The {FIELDS[name]}."


def _match(name: str) -> str:
    if name == "to-agent":
        return "Only events to this agent (broadcasts to '*' included)."
    return f"Only events with this {FIELDS[name]}."


def _filter_options(fn: Any) -> Any:
    for name in reversed(("stream", "room", "topic", "type", "to-agent", "from-agent",
                          "correlation-id", "status")):
        fn = click.option(f"--{name}", default=None, help=_match(name))(fn)
    fn = click.option("--since-event-id", default=None,
                      help="Only events after this one (local arrival order).")(fn)
    fn = click.option("--since-created-at", default=None,
                      help="Only events created at or after this ISO time.")(fn)
    return fn


def _filters(kw: dict[str, Any]) -> dict[str, Any]:
    keys = ("stream", "room", "topic", "type", "to_agent", "from_agent", "correlation_id",
            "status", "since_event_id", "since_created_at")
    return {k: kw[k] for k in keys}


@cli.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False))
@json_option
@click.pass_context
@handles_errors
def init(ctx: click.Context, as_json: bool, directory: str | None) -> None:
    """Create the palace DIRECTORY (default: --palace): store, replica id, signing key.

    A directory made here is mode 0700; an existing one keeps its mode. On a store logsync
    has not opened yet (a MemPalace palace) it adds logsync's tables. Running it again
    changes nothing.

    Example:

    \b
      logsync init ~/palace
    """
    palace = palace_of(ctx, directory)
    with open_store(ctx, palace=palace) as store:
        payload = {"palace": str(store.palace), "replica_id": store.replica_id,
                   "db_path": str(store.db_path)}
    if as_json:
        emit_json(payload)
    else:
        click.echo(f"Palace {payload['palace']}\n  replica_id={payload['replica_id']}")


@cli.command()
@click.option("--type", "type_", required=True, help=_set("type"))
@click.option("--stream", required=True, help=_set("stream"))
@click.option("--room", required=True, help=_set("room"))
@click.option("--from-agent", required=True, help=_set("from-agent"))
@click.option("--topic", help=_set("topic"))
@click.option("--to-agent", help=_set("to-agent"))
@click.option("--correlation-id", help=_set("correlation-id"))
@click.option("--branch", help=_set("branch"))
@click.option("--base-commit", help=_set("base-commit"))
@click.option("--status", help=_set("status"))
@click.option("--body", help="The body text (default: empty).")
@click.option("--body-file", help="Read the body from a file ('-' = stdin), byte-exact.")
@click.option("--metadata", help=JSON_OBJECT)
@click.option("--artifact-id", multiple=True,
              help="An artifact this event carries (from `artifact put`); repeatable.")
@create_option
@json_option
@click.pass_context
@handles_errors
def append(ctx: click.Context, as_json: bool, type_: str, body: str | None,
           body_file: str | None, metadata: str | None, artifact_id: tuple[str, ...],
           **fields: Any) -> None:
    """Append one immutable event.

    Example:

    \b
      logsync append --type task.request --stream project/x --room delegation \\
          --from-agent pi@laptop --to-agent codex@desk --body "Fix the test"
    """
    with open_store(ctx, must_exist=True) as store:
        event = store.append_event(
            type_, fields.pop("stream"), fields.pop("room"), fields.pop("from_agent"),
            body=read_text(body, body_file, max_bytes=MAX_BODY_BYTES),
            metadata=parse_metadata(metadata),
            artifact_ids=list(artifact_id) or None, **fields,
        )
    if as_json:
        emit_json(event)
    else:
        click.echo("Appended:")
        click.echo(event_line(event))


@cli.command("list")
@_filter_options
@click.option("--before-event-id", default=None,
              help="Only events before this one (local arrival order).")
@click.option("--order", type=click.Choice(["asc", "desc", "hlc"]), default="asc",
              help="asc/desc by local arrival; hlc = the fleet-wide merged timeline.")
@click.option("--limit", type=int, default=50, show_default=True, help="At most 500.")
@create_option
@json_option
@click.pass_context
@handles_errors
def list_(ctx: click.Context, as_json: bool, order: str, limit: int,
          before_event_id: str | None, **kw: Any) -> None:
    """List events matching filters (`--to-agent` also matches `*` broadcasts).

    Example:

    \b
      logsync list --stream project/x --to-agent codex@desk --order hlc --limit 20
    """
    row_limit(limit)
    with open_store(ctx, read_only=True) as store:
        events = store.list_events(limit=limit, order=order, before_event_id=before_event_id,
                                   **_filters(kw))
    _print_events({"events": events, "count": len(events)}, as_json)


@cli.command()
@_filter_options
@click.option("--timeout-ms", type=int, default=60_000, show_default=True,
              help="Give up (exit 2) after this many milliseconds; at most 300000.")
@click.option("--limit", type=int, default=50, show_default=True,
              help="At most this many events; at most 500.")
@create_option
@json_option
@click.pass_context
@handles_errors
def wait(ctx: click.Context, as_json: bool, timeout_ms: int, limit: int, **kw: Any) -> None:
    """Block until a matching event exists; exit 2 on timeout.

    Example:

    \b
      logsync wait --to-agent codex@desk --type task.request --timeout-ms 30000
    """
    row_limit(limit)
    within("--timeout-ms", timeout_ms, 0, MAX_WAIT_TIMEOUT_MS)
    with open_store(ctx, read_only=True) as store:
        result = wait_events(store, timeout_ms=timeout_ms, limit=limit, **_filters(kw))
    result["count"] = len(result["events"])
    _print_events(result, as_json)
    if result["timed_out"]:
        ctx.exit(EXIT_TIMEOUT)


def _print_events(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(result)
    elif result.get("timed_out"):
        click.echo("Timed out; no matching events.")
    elif not result["events"]:
        click.echo("No matching events.")
    else:
        click.echo(f"{result['count']} event(s):")
        for event in result["events"]:
            click.echo(event_line(event))


@cli.command()
@click.argument("event_id")
@click.option("--from-agent", required=True, help="The acknowledging agent, e.g. codex@desk.")
@click.option("--status", help=_set("status"))
@click.option("--body", default="", help="Notes, verbatim (default: empty).")
@click.option("--topic", help="The topic (default: the acknowledged event's).")
@create_option
@json_option
@click.pass_context
@handles_errors
def ack(ctx: click.Context, as_json: bool, event_id: str, from_agent: str,
        status: str | None, body: str, topic: str | None) -> None:
    """Append an event.ack for EVENT_ID, routed back to its author.

    Example:

    \b
      logsync ack evt_20250101T120000_0123456789ab --from-agent codex@desk --status applied
    """
    with open_store(ctx, must_exist=True) as store:
        event = store.ack_event(event_id, from_agent, status=status, body=body, topic=topic)
    if as_json:
        emit_json(event)
    else:
        click.echo("Acknowledged:")
        click.echo(event_line(event))


@cli.group()
def artifact() -> None:
    """Exact payloads: put and get."""


@artifact.command("put")
@click.option("--kind", required=True, help=f"The kind: {', '.join(sorted(ARTIFACT_KINDS))}.")
@click.option("--created-by", required=True, help="The agent storing it, e.g. pi@laptop.")
@click.option("--file", "file_", help="Read content from a file ('-' = stdin).")
@click.option("--content", help="Inline content (default: read stdin).")
@click.option("--metadata", help=JSON_OBJECT)
@create_option
@json_option
@click.pass_context
@handles_errors
def artifact_put(ctx: click.Context, as_json: bool, kind: str, created_by: str,
                 file_: str | None, content: str | None, metadata: str | None) -> None:
    """Store exact content (UTF-8 text, at most 4 MiB).

    Example:

    \b
      git diff | logsync artifact put --kind patch --created-by pi@laptop
    """
    text = read_text(content, file_, default=None)
    if text is None:
        text = read_stdin_exact()
    with open_store(ctx, must_exist=True) as store:
        record = store.put_artifact(kind, text, created_by, parse_metadata(metadata))
    if as_json:
        emit_json(record)
    else:
        click.echo(f"Stored {record['id']}  kind={record['kind']}")
        click.echo(f"  sha256={record['sha256']}")
        click.echo(f"  size={record['size_bytes']} bytes")
    for warning in record.get("warnings", []):
        click.echo(f"Warning: {warning}", err=True)


@artifact.command("get")
@click.argument("artifact_id")
@click.option("--out", help="Write the exact bytes to this file instead of stdout.")
@create_option
@json_option
@click.pass_context
@handles_errors
def artifact_get(ctx: click.Context, as_json: bool, artifact_id: str, out: str | None) -> None:
    """Print an artifact's exact bytes (pipe into `git apply`).

    Example:

    \b
      logsync artifact get art_20250101T120000_0123456789ab | git apply
    """
    with open_store(ctx, read_only=True) as store:
        record = store.get_artifact(artifact_id)
    if record is None:
        raise NotFoundError(f"artifact {shorten(artifact_id)} not found")
    if out:
        with open(click.format_filename(out), "wb") as handle:
            handle.write(record["content"].encode("utf-8"))
    if as_json:
        if out:
            record = {**record, "content_written_to": out}
            record.pop("content")
        emit_json(record)
    elif out:
        click.echo(f"Wrote {record['size_bytes']} bytes to {out}")
        click.echo(f"  sha256={record['sha256']}")
    else:
        write_stdout_exact(record["content"])


@cli.group()
def patch() -> None:
    """Patch handoff."""


@patch.command("submit")
@click.option("--from-agent", required=True, help=_set("from-agent"))
@click.option("--stream", required=True, help=_set("stream"))
@click.option("--room", default="patches", show_default=True, help=_set("room"))
@click.option("--file", "file_", help="The diff ('-' = stdin; default: stdin).")
@click.option("--topic", help=_set("topic"))
@click.option("--to-agent", help=_set("to-agent"))
@click.option("--correlation-id", help=_set("correlation-id"))
@click.option("--branch", help=_set("branch"))
@click.option("--base-commit", help=_set("base-commit"))
@click.option("--body", default="", help="The patch.ready event's body (default: empty).")
@click.option("--metadata", help=JSON_OBJECT)
@create_option
@json_option
@click.pass_context
@handles_errors
def patch_submit(ctx: click.Context, as_json: bool, file_: str | None, metadata: str | None,
                 from_agent: str, stream: str, room: str, **fields: Any) -> None:
    """Store a patch artifact and append its patch.ready event.

    Example:

    \b
      git diff | logsync patch submit --from-agent codex@desk --stream project/x \\
          --to-agent pi@laptop --branch fix-test
    """
    content = read_text(None, file_ or "-")
    with open_store(ctx, must_exist=True) as store:
        result = store.submit_patch(content or "", from_agent, stream, room,
                                    metadata=parse_metadata(metadata), **fields)
    if as_json:
        emit_json(result)
    else:
        click.echo(f"Stored {result['artifact']['id']}  sha256={result['artifact']['sha256']}")
        click.echo(event_line(result["event"]))
    for warning in result["artifact"].get("warnings", []):
        click.echo(f"Warning: {warning}", err=True)


def info_payload(store: Store) -> dict[str, Any]:
    return {"palace": str(store.palace), "replica_id": store.replica_id,
            "version_vector": store.version_vector(), **store.counts(),
            "signing": signing_payload(store)}


def signing_payload(store: Store) -> dict[str, dict[str, Any]]:
    """Per held origin: its signing state (signed/pinned/unsigned), the highest seq with
    a stored signature and the held ops above it (`store/signing_state.py`)."""
    return {o: s.to_json() for o, s in read_signing_states(store).items()}


@cli.command()
@create_option
@json_option
@click.pass_context
@handles_errors
def info(ctx: click.Context, as_json: bool) -> None:
    """This replica's id, version vector and counts; per origin whether its ops are
    signed (key certified by the id, or ours), pinned (key trusted on first sight) or
    unsigned, up to which seq a signature proves them, and how many held ops no
    signature covers (taken through a peer that cannot carry signatures).

    Example:

    \b
      logsync --palace ~/palace info --json
    """
    with open_store(ctx, read_only=True) as store:
        payload = info_payload(store)
    if as_json:
        emit_json(payload)
        return
    click.echo(f"palace      {payload['palace']}")
    click.echo(f"replica_id  {payload['replica_id']}")
    click.echo(f"events {payload['events']}  artifacts {payload['artifacts']}  "
               f"conflicts {payload['conflicts']}  quarantined {payload['quarantined']}")
    for origin, top in sorted(payload["version_vector"].items()):
        signing = payload["signing"].get(origin)  # None: an op that came between two reads
        click.echo(f"  {origin}  {top}" + (f"  {phrase(signing)}" if signing else ""))


@cli.group()
def logstream() -> None:
    """Upstream-style aliases: `logsync logstream append|list|wait|ack|sync`, as
    `mempalace logstream …` spells them (`sync` is `logsync sync`)."""


for _command in (append, list_, wait, ack, sync_cmd):
    logstream.add_command(_command, "sync" if _command is sync_cmd else None)
