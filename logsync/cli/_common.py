"""What every command shares: the palace, --json, one-line errors, exact I/O."""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
import platformdirs

from logsync.errors import LogsyncError, ValidationError, shorten
from logsync.files import symlink_loop
from logsync.model import MAX_ARTIFACT_BYTES
from logsync.store import DB_FILENAME, MAX_LIST_LIMIT, Store
from logsync.store.faults import StoreNeedsWrite

F = TypeVar("F", bound=Callable[..., Any])
EXIT_OK, EXIT_ERROR, EXIT_TIMEOUT = 0, 1, 2


def default_palace() -> Path:
    """A per-user data directory, so `logsync serve` needs no configuration."""
    return Path(platformdirs.user_data_dir("logsync", appauthor=False)) / "palace"


PALACE_ENV = "LOGSYNC_PALACE"


def checked_ca_file(ctx: click.Context, param: click.Parameter, value: str | None
                    ) -> str | None:
    """--ca-file's callback: a file that is no CA bundle is one sentence before the
    command starts (a daemon died on it once its first peer task began)."""
    if value is not None:
        from logsync.client import tls_context  # httpx: loaded only when a CA is given

        try:
            tls_context(True, value)
        except LogsyncError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


def palace_of(ctx: click.Context, named: str | None = None) -> Path:
    """The palace a command works on: `named` (a command's own argument) if given, else
    the group's --palace, else the per-user default. A name that is empty or blank (an
    unset shell variable, `--palace "$PALACE"`) is refused, never taken as the default:
    that would write to another replica than the one meant."""
    if named is None:
        named = (ctx.find_root().obj or {}).get("palace")
    if named is not None and not named.strip():
        raise click.BadParameter(f"palace {named!r} is invalid: must name a directory "
                                 "(leave --palace out for the default palace)")
    if named is None and os.environ.get(PALACE_ENV, "x").strip() == "":
        # click takes an empty variable for an unset one: `LOGSYNC_PALACE="$PALACE"` with
        # $PALACE unset would otherwise mean the default palace
        raise click.BadParameter(f"{PALACE_ENV} is set but empty: it must name a "
                                 "directory (unset it for the default palace)")
    palace = Path(named or default_palace()).expanduser()
    loop = symlink_loop(palace, palace / DB_FILENAME)
    if loop is not None:  # before any file of it is read, created or reported missing
        raise click.BadParameter(f"palace {palace} cannot be used: {loop}")
    return palace


class FiniteRange(click.FloatRange):
    """click's `FloatRange`, refusing NaN and the infinities, which pass its comparisons
    (`nan < 0.1` is false): a NaN interval made the daemon's schedule spin."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{shorten(value)} is not a finite number", param, ctx)
        return number


def within(option: str, value: int, low: int, high: int) -> int:
    """`value` of `option` when in [low, high]; else one sentence (also as --json's
    error). A documented maximum is refused, never clamped in silence (`list --limit
    501` showed 500 rows; `wait --timeout-ms 300001` waited 300 s)."""
    if not low <= value <= high:
        raise ValidationError(f"{option} {shorten(value)} is invalid: it must be an integer "
                              f"from {low} to {high}")
    return value


def row_limit(limit: int) -> int:
    """--limit of every listing command."""
    return within("--limit", limit, 1, MAX_LIST_LIMIT)


class NoPalaceError(LogsyncError):
    """A command that needs a palace was pointed at a directory that holds none."""


CREATE_HELP = ("Create the palace if it does not exist, or set up a store logsync has not "
               "opened yet (without it, either is an error).")
_CREATE_KEY = "logsync.create"


def remember_create(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_CREATE_KEY] = True  # meta is shared by every context of one invocation


def create_option(fn: F) -> F:
    """`--create` on a command that opens the store: may make a missing palace."""
    return click.option("--create", is_flag=True, expose_value=False,
                        callback=remember_create, help=CREATE_HELP)(fn)


def may_create(ctx: click.Context) -> bool:
    """--create was given, on the command or before it (`logsync --create CMD`)."""
    return bool(ctx.meta.get(_CREATE_KEY))


def has_palace(palace: Path) -> bool:
    """A palace is a directory holding the store file; anything else is not one (yet)."""
    return (palace / DB_FILENAME).is_file()


def no_palace(ctx: click.Context, palace: Path) -> NoPalaceError:
    """The one sentence for a missing palace, naming the --create that this command takes."""
    if any(p.name == "create" for p in ctx.command.params):
        hint = "pass --create"
    else:  # a command without its own --create: the group's one comes before its name
        names, at = [], ctx
        while at.parent is not None:  # the command's names (the program's may be `python -m`)
            names.append(at.info_name or "")
            at = at.parent
        rest = " ".join(reversed(names))
        hint = f"pass --create before the command ('logsync --create {rest}')"
    return NoPalaceError(f"no palace at {palace}: run 'logsync init {palace}' or {hint}")


@contextmanager
def open_store(ctx: click.Context, *, read_only: bool = False, must_exist: bool | None = None,
               palace: Path | None = None, check: bool = True,
               keyless: bool = False) -> Iterator[Store]:
    """The palace's store; read commands pass ``read_only=True``.

    ``must_exist`` (default: ``read_only``): a missing palace is an error (`no_palace`)
    unless --create was given, so a typo in --palace cannot mint a second replica. Read
    commands and the local write commands set it; `init` creates, and `sync` leaves it
    off so a new replica can bootstrap from a peer (as upstream's `logstream sync` does).
    A read-only open writes nothing at all (no directory, chmod, migration or replica id):
    a store that needs one of those first (an older schema, a palace logsync never opened)
    is an error naming `logsync init`, unless --create allows the writable open that sets
    it up. Store.open makes a new directory 0700 and never changes an existing one's mode.
    ``check=False`` skips the open's quick check (a file just checked whole, a joined
    snapshot). ``keyless``: `Store.open`'s, for `reidentify`.
    """
    create = may_create(ctx)
    palace = palace_of(ctx) if palace is None else palace
    must_exist = read_only if must_exist is None else must_exist
    if must_exist and not create and not has_palace(palace):
        raise no_palace(ctx, palace)
    store: Store | None = None
    if read_only:
        try:
            store = Store.open(palace, read_only=True)
        except StoreNeedsWrite:
            if not create:
                raise
    if store is None:
        store = Store.open(palace, check=check, keyless=keyless)
    if not keyless:  # reidentify replaces the key it went on without
        warn_key_problem(store)
    try:
        yield store
    finally:
        store.close()


def warn_key_problem(store: Store) -> None:
    """A read goes on without a damaged key file (`Store.open`); the operator is told."""
    if store.key_problem is not None:
        click.echo(f"Warning: {store.key_problem}; reads go on with the key the store "
                   "recorded, writes are refused until it is fixed", err=True)


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


def read_stdin_exact(max_bytes: int = MAX_ARTIFACT_BYTES) -> str:
    """Bytes, not the text layer: CRLF must reach the store as written. At most
    `max_bytes` are taken (`/dev/zero` piped in must not fill memory)."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:
        text = sys.stdin.read(max_bytes + 1)
        if len(text.encode("utf-8")) > max_bytes:
            raise _too_long("standard input", max_bytes)
        return text
    return _decoded(_bounded(buffer, "standard input", max_bytes), "standard input")


def _bounded(handle: Any, name: str, max_bytes: int) -> bytes:
    data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise _too_long(name, max_bytes)
    return data


def _too_long(name: str, max_bytes: int) -> ValidationError:
    return ValidationError(f"{name} holds more than {max_bytes} bytes: the maximum is "
                           f"{max_bytes} bytes of UTF-8")


def _decoded(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{name} is not UTF-8 text ({exc.reason} at byte "
                              f"{exc.start})") from None


def write_stdout_exact(content: str) -> None:
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(content)
        return
    sys.stdout.flush()
    buffer.write(content.encode("utf-8"))
    buffer.flush()


def read_text(inline: str | None, path: str | None, default: str | None = "", *,
              max_bytes: int = MAX_ARTIFACT_BYTES) -> str | None:
    """Inline text or a file ('-' = stdin), byte-exact; a file or stream is read only up
    to `max_bytes` (the store's own limit for what it is read into), so a device or a
    huge file is refused without being held."""
    if inline is not None and path is not None:
        raise ValidationError("pass inline text or a file, not both")
    if path is not None:
        if path == "-":
            return read_stdin_exact(max_bytes)
        with Path(os.path.expanduser(path)).open("rb") as handle:
            return _decoded(_bounded(handle, path, max_bytes), path)
    return inline if inline is not None else default


def parse_metadata(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValidationError(f"--metadata={shorten(raw)} nests deeper than can be "
                              "read") from None
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
