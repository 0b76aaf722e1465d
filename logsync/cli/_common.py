"""What every command shares: the palace, --json, one-line errors, exact I/O."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import click
import platformdirs

from logsync.errors import LogsyncError, ValidationError, shorten
from logsync.store import Store
from logsync.store.faults import StoreNeedsWrite

F = TypeVar("F", bound=Callable[..., Any])
EXIT_OK, EXIT_ERROR, EXIT_TIMEOUT = 0, 1, 2


def default_palace() -> Path:
    """A per-user data directory, so `logsync serve` needs no configuration."""
    return Path(platformdirs.user_data_dir("logsync", appauthor=False)) / "palace"


def palace_of(ctx: click.Context) -> Path:
    obj = ctx.find_root().obj or {}
    return Path(obj.get("palace") or default_palace()).expanduser()


@contextmanager
def open_store(ctx: click.Context, *, read_only: bool = False) -> Iterator[Store]:
    """The palace's store; read commands pass ``read_only=True``.

    A read-only open runs no migration and writes nothing, so a store the user may only
    read (or one made immutable) can still be listed. When there is nothing to read yet
    (no store, no replica id) or the schema must first migrate, it opens writable as
    before: a read command on a new palace creates it, as upstream's does.
    """
    palace = palace_of(ctx)
    store: Store | None = None
    if read_only:
        with suppress(StoreNeedsWrite):
            store = Store.open(palace, read_only=True)
    if store is None:
        store = Store.open(palace)
    try:
        yield store
    finally:
        store.close()


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(fn)


def emit_json(payload: Any) -> None:
    click.echo(json.dumps(payload, indent=2, ensure_ascii=False))


def fail(message: str, as_json: bool, code: int = EXIT_ERROR) -> None:
    """One line, never a traceback: `Error: …` on stderr, or {"error": …} with --json."""
    if as_json:
        click.echo(json.dumps({"error": message}, ensure_ascii=False))
    else:
        click.echo(f"Error: {message}", err=True)
    sys.exit(code)


def handles_errors(fn: F) -> F:
    """Turn our errors (and file errors) into the one-line form."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LogsyncError as exc:
            fail(str(exc), kwargs.get("as_json", False))
        except OSError as exc:
            fail(f"{exc.filename or 'I/O'}: {exc.strerror or exc}", kwargs.get("as_json", False))
        except UnicodeDecodeError as exc:
            fail(f"input is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                 kwargs.get("as_json", False))
        return None

    return wrapper  # type: ignore[return-value]


def read_stdin_exact() -> str:
    """Bytes, not the text layer: CRLF must reach the store as written."""
    buffer = getattr(sys.stdin, "buffer", None)
    return sys.stdin.read() if buffer is None else buffer.read().decode("utf-8")


def write_stdout_exact(content: str) -> None:
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(content)
        return
    sys.stdout.flush()
    buffer.write(content.encode("utf-8"))
    buffer.flush()


def read_text(inline: str | None, path: str | None, default: str | None = "") -> str | None:
    """Inline text or a file ('-' = stdin), byte-exact."""
    if inline is not None and path is not None:
        raise ValidationError("pass inline text or a file, not both")
    if path is not None:
        if path == "-":
            return read_stdin_exact()
        return Path(os.path.expanduser(path)).read_bytes().decode("utf-8")
    return inline if inline is not None else default


def parse_metadata(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ValidationError(f"--metadata={shorten(raw)} is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValidationError(f"--metadata={shorten(raw)} is invalid: must be a JSON object")
    return value


def event_line(event: dict[str, Any]) -> str:
    """The upstream one-line rendering of an event."""
    target = event["to_agent"] or "*"
    corr = f" corr={event['correlation_id']}" if event["correlation_id"] else ""
    topic = f" topic={event['topic']}" if event.get("topic") else ""
    status = f" [{event['status']}]" if event["status"] else ""
    arts = f" artifacts={len(event['artifact_ids'])}" if event["artifact_ids"] else ""
    body = event["body"].replace("\n", " ")
    body = body[:77] + "..." if len(body) > 80 else body
    body = f" :: {body}" if body else ""
    return (
        f"  {event['id']}  {event['created_at']}  {event['type']}  "
        f"{event['stream']}/{event['room']}  {event['from_agent']}->{target}"
        f"{status}{topic}{corr}{arts}{body}"
    )
