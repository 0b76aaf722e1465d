"""The `logsync` click group and its entry point; the command modules register on it."""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
from collections.abc import Mapping

import click

from logsync import __version__
from logsync.cli._common import remember_create
from logsync.errors import shorten
from logsync.text import is_unicode

# Which modules define (or add subcommands to) each command. A command's modules are
# imported when it is named, all of them for the group's help: `logsync sync` does not
# load the simulator, the conformance runner or the operator commands (~0.05 s of a
# short run on the 2-core VM). tests/test_cli.py checks this map against the modules.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("ack", "append", "artifact", "info", "init", "list", "logstream",
                     "patch", "wait"), ("local",)),
    **dict.fromkeys(("claims", "owed", "presence"), ("derived",)),
    "simulate": ("sim",),
    **dict.fromkeys(("conflicts", "quarantine"), ("ledgers", "operator")),
    "peers": ("ledgers",),
    "conformance": ("conformance",),
    "reidentify": ("operator",),
    **dict.fromkeys(("serve", "sync"), ("replication",)),
    "status": ("status",),
    "verify": ("verify",),
}


class LazyGroup(click.Group):
    """The top-level group: commands register themselves when their module is imported,
    and a module is imported only when one of its commands is named."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        for name in COMMAND_MODULES:
            self._load(name)
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._load(cmd_name)
        return super().get_command(ctx, cmd_name)

    def _load(self, name: str) -> None:
        # every module each time (a no-op once imported): `conflicts` is registered by
        # `ledgers` and its `review` added by `operator`, which another command's load
        # may not have imported
        for module in COMMAND_MODULES.get(name, ()):
            importlib.import_module(f"logsync.cli.{module}")


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--palace",
    envvar="LOGSYNC_PALACE",
    type=click.Path(file_okay=False),
    help="Palace directory (env LOGSYNC_PALACE; default: a per-user data directory).",
)
@click.option("--create", is_flag=True, expose_value=False, callback=remember_create,
              help="Let any command create a missing palace (as its own --create does).")
@click.version_option(__version__, prog_name="logsync", help="Show the version and exit.")
@click.pass_context
def cli(ctx: click.Context, palace: str | None) -> None:
    """Multi-master replication for MemPalace logstream coordination logs.

    Example:

    \b
      logsync init ~/palace && logsync --palace ~/palace serve
    """
    ctx.obj = {"palace": palace}


def main() -> None:
    """Entry point: every failure is one line, never a traceback (unless LOGSYNC_DEBUG)."""
    try:
        _main()
    finally:
        # The process ends here, so nothing is left for the interpreter's last full
        # collection to free: frozen, every object is skipped by it (it walked the
        # objects of every imported module: ~0.1 s of a short command on a 2-core VM).
        gc.freeze()


def _main() -> None:
    as_json = "--json" in sys.argv[1:]
    problem = not_utf8(sys.argv[1:], os.environ)
    if problem:
        _one_line(problem, as_json)
    try:
        code = cli.main(standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # bare `logsync`: the help, not an error
        click.echo(exc.format_message())
        sys.exit(0)
    except click.exceptions.Abort as exc:  # click's word for Ctrl-C too: that is 130
        if isinstance(exc.__context__, KeyboardInterrupt):
            click.echo("Interrupted.", err=True)
            sys.exit(130)
        _one_line("aborted", as_json)
    except click.ClickException as exc:  # usage errors too: one sentence, exit 1
        _one_line(exc.format_message(), as_json)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except Exception as exc:  # the last line of defence, not a control path
        if os.environ.get("LOGSYNC_DEBUG"):
            raise
        _one_line(f"unexpected {type(exc).__name__}: {exc}", as_json)
    sys.exit(code if isinstance(code, int) else 0)


def not_utf8(argv: list[str], environ: Mapping[str, str]) -> str | None:
    """The first argument or LOGSYNC_ variable that is not UTF-8 text, in a sentence.
    Python hands undecodable bytes on as lone surrogates, which every later encode
    (SQLite, JSON files, HTTP) refuses: checked once here, before anything is written."""
    named = [(f"argument {i} ", arg) for i, arg in enumerate(argv, 1)]
    named += [(f"environment variable {key}=", value) for key, value in sorted(environ.items())
              if key.startswith("LOGSYNC_")]
    for what, text in named:
        if not is_unicode(text):
            raw = os.fsencode(text)
            return f"{what}{shorten(raw, 80)} is not valid UTF-8: logsync takes UTF-8 text"
    return None


def _one_line(message: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"error": message}, ensure_ascii=False))
    else:
        click.echo(f"Error: {message}", err=True)
    sys.exit(1)
