"""`logsync conformance URL`: run the black-box conformance kit against a peer."""

from __future__ import annotations

import sys

import click

from logsync import peers as peers_mod
from logsync.cli._common import (
    FiniteRange,
    checked_ca_file,
    emit_json,
    handles_errors,
    json_option,
)
from logsync.cli.group import cli
from logsync.conformance import DEFAULT_DEADLINE_S, DEFAULT_MAX_REQUESTS, DEFAULT_TIMEOUT_S


@cli.command("conformance", epilog="""\b
Examples:
  logsync conformance http://127.0.0.1:8742 --token "$T"       # read-only checks
  logsync conformance https://hub:8742 --token T --ca-file ca.pem --json
  logsync conformance http://127.0.0.1:8742 --token T --writable  # also pushes 2 ops

Exit status: 0 every applicable check passes; 1 a check failed (each failure is one line
naming its RFC 004 section, the value and the rule), or a usage error (a URL carrying a
user name or password among them); 2 the peer cannot be checked (unreachable, refuses the
token, or its version vector is unusable), or the run is incomplete: the kit's own
--deadline or --max-requests ran out before every check was made and none had failed
(one 'incomplete:' line names the request not made).""")
@click.argument("url")
@click.option("--token", envvar="LOGSYNC_PEER_TOKEN",
              help="Bearer token for the peer (env LOGSYNC_PEER_TOKEN); with it the kit also "
                   "checks that requests without it are refused. Example: --token s3cret")
@click.option("--writable", is_flag=True,
              help="Also push two ops of a fresh origin (if the peer advertises push); they "
                   "stay on the peer. Example: --writable")
@click.option("--timeout", type=FiniteRange(0.1, 300), default=DEFAULT_TIMEOUT_S,
              show_default=True, help="Seconds one request may take, body included. "
              "Example: --timeout 5")
@click.option("--deadline", type=FiniteRange(1, 3600), default=DEFAULT_DEADLINE_S,
              show_default=True, help="Seconds the whole run may take. Example: --deadline 60")
@click.option("--max-requests", type=click.IntRange(10, 10_000), default=DEFAULT_MAX_REQUESTS,
              show_default=True, help="Requests the run may make. Example: --max-requests 200")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False),
              callback=checked_ca_file,
              help="CA bundle for verifying an https peer. Example: --ca-file ca.pem")
@json_option
@handles_errors
def conformance_cmd(url: str, token: str | None, writable: bool, timeout: float,
                    deadline: float, max_requests: int, ca_file: str | None,
                    as_json: bool) -> None:
    """Check the peer at URL against RFC 004: each section's checks pass, fail or are not
    applicable (an extension it does not advertise). Read-only unless --writable."""
    from logsync.conformance.runner import run_conformance  # the HTTP stack loads only here

    url = peers_mod.check_url(url)
    report = run_conformance(url, peers_mod.check_token(token, "--token"),
                             writable_ok=writable, timeout=timeout, deadline=deadline,
                             max_requests=max_requests, ca_file=ca_file)
    if as_json:
        emit_json(report.as_dict())
    else:
        for line in report.lines():
            click.echo(line, err=report.unusable is not None)
    sys.exit(report.exit_code())
