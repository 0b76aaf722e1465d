"""The `logsync` command line: thin click commands over the library.

Exit codes: 0 ok, 1 error (one line: `Error: …` on stderr, or `{"error": …}`
with --json), 2 timeout (`wait`) or a usage error.
"""

from __future__ import annotations

import os
import sys

import click

from logsync import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--palace",
    envvar="LOGSYNC_PALACE",
    type=click.Path(file_okay=False),
    help="Palace directory (env LOGSYNC_PALACE; default: a per-user data directory).",
)
@click.version_option(__version__, prog_name="logsync")
@click.pass_context
def cli(ctx: click.Context, palace: str | None) -> None:
    """Multi-master replication for MemPalace logstream coordination logs."""
    ctx.obj = {"palace": palace}


def main() -> None:
    """Entry point: never lets a traceback reach the user unless LOGSYNC_DEBUG is set."""
    try:
        cli.main(standalone_mode=True)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except Exception as exc:  # the last line of defence, not a control path
        if os.environ.get("LOGSYNC_DEBUG"):
            raise
        click.echo(f"Error: unexpected {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)


from logsync.cli import (
    local,  # noqa: E402,F401  (registers the commands)
    replication,  # noqa: E402,F401
)
