"""`logsync verify`: re-check the whole store (issue 10, item 5) and say what does not hold.

The store is opened read-only and never falls back to a writable open: a writable open
repairs an incomplete chain and would hide the very defects this command reports. Only a
missing palace may be created first, with --create (an empty palace verifies).
"""

from __future__ import annotations

import click

from logsync.cli._common import (
    create_option,
    emit_json,
    handles_errors,
    has_palace,
    json_option,
    may_create,
    no_palace,
    open_store,
    palace_of,
    warn_key_problem,
)
from logsync.cli.group import cli
from logsync.errors import ValidationError, shorten
from logsync.ids import is_replica_id
from logsync.store import Store
from logsync.store.audit import AuditReport, OriginAudit, UnchainableOp

EXIT_UNVERIFIED = 3  # the store was read, and something in it does not verify


@cli.command()
@click.option("--origin", default=None,
              help="Check only this origin's chain and signatures (a replica id); "
                   "artifacts are always all checked.")
@create_option
@json_option
@click.pass_context
@handles_errors
def verify(ctx: click.Context, as_json: bool, origin: str | None) -> None:
    """Re-check the whole store, read-only: every origin's hash chain recomputed from its
    ops, its stored signatures checked with its key (at every 64th op and the highest
    signed one), every artifact re-hashed from its content. Repairs nothing.

    Exit status: 0 everything verifies, 3 something does not (named in the output),
    1 error (the store cannot be read, or a bad --origin).

    Example:

    \b
      logsync --palace ~/palace verify --json
    """
    if origin is not None and not is_replica_id(origin):
        raise ValidationError(
            f"--origin {shorten(origin)} is not a replica id: it must be rep_ followed by "
            "12 or 32 lowercase hex digits"
        )
    palace = palace_of(ctx)
    if not has_palace(palace):
        if not may_create(ctx):
            raise no_palace(ctx, palace)
        with open_store(ctx):
            pass  # made here, so there is nothing a writable open could have repaired
    try:
        with Store.open(palace, read_only=True) as store:
            warn_key_problem(store)
            held = store.version_vector()
            if origin is not None and origin not in held:  # a typo must not verify "ok"
                known = ", ".join(sorted(held)[:3]) + (" ..." if len(held) > 3 else "")
                raise ValidationError(f"--origin {origin} has no ops in this store, so there "
                                      f"is nothing of it to verify (origins here: "
                                      f"{known or 'none'})")
            report = store.audit(origin)
    except UnchainableOp as exc:  # a value no chain rule covers: the store does not verify
        message = f"the store does not verify: {exc}"
        if as_json:
            emit_json({"ok": False, "error": message})
        else:
            click.echo(message)
        ctx.exit(EXIT_UNVERIFIED)
    if as_json:
        emit_json(report.to_json())
    else:
        for line in report_lines(report):
            click.echo(line)
    if not report.ok:
        ctx.exit(EXIT_UNVERIFIED)


def report_lines(report: AuditReport) -> list[str]:
    """One line per origin, then the artifacts (and one line per bad one named)."""
    lines = [origin_line(o) for o in report.origins]
    arts = report.artifacts
    if arts.ok:
        lines.append(f"artifacts {arts.checked} ok")
    else:
        lines.append(f"artifacts {arts.checked} checked, {arts.bad_count} BAD"
                     + (f" (first {len(arts.bad)} named)" if arts.bad_count > len(arts.bad)
                        else ""))
        lines.extend(f"  {b.id}  {b.reason} (stored sha256 {b.stored_sha256}, "
                     f"size {b.stored_size}; content sha256 {b.actual_sha256}, "
                     f"size {b.actual_size})" for b in arts.bad)
    return lines


def origin_line(audit: OriginAudit) -> str:
    head = f"{audit.origin}  ops {audit.ops}  top {audit.top or 0}"
    signature = "" if audit.signature is None else f"  {audit.signature.summary()}"
    problem = audit.problem
    if problem is None:
        return f"{head}  chain ok{signature}"
    if problem.kind == "missing":
        what = f"chain MISSING at seq {problem.seq} (recomputed {problem.recomputed})"
    elif problem.kind == "extra":
        what = f"chain EXTRA at seq {problem.seq} (stored {problem.stored}, no op held)"
    else:
        what = (f"chain MISMATCH at seq {problem.seq} (stored {problem.stored}, "
                f"recomputed {problem.recomputed})")
    return f"{head}  entries {audit.entries}  {what}{signature}"
