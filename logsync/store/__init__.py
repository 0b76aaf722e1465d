"""The logstream store: the only package that speaks SQL.

The schema is MemPalace's `logstream.sqlite3` (tables `events`, `artifacts`,
`event_artifacts`, the unique `(origin_replica, origin_seq)` index), so either
program can open a store the other wrote; logsync adds `logsync_conflicts`,
`logsync_quarantine`, `logsync_health` and `logsync_chain` (the per-origin hash
chain), which MemPalace ignores.

- `core`: `Store` -- connections (WAL, one writer, a reader per thread),
  local writes (gap-free `origin_seq`, HLC after everything stored,
  `synchronous=FULL`), reads and cursors (local seq), `apply_remote`.
- `apply`: the rules of applying a remote page (invariants 1-6).
- `schema`: DDL and named, ordered, idempotent migrations.
- `rows`: row shaping in upstream key order and content comparison.
- `chaining`: the per-origin hash chain table (`logsync.chain` holds the rule):
  extended on append and apply, repaired and backfilled at open.
"""

from logsync.store.apply import ApplyResult
from logsync.store.core import DB_FILENAME, Store, default_id_factory
from logsync.store.reads import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT, MAX_WAIT_TIMEOUT_MS
from logsync.store.schema import INSERT_ARTIFACT, INSERT_EVENT, UPSTREAM_SCHEMA

__all__ = [
    "DB_FILENAME",
    "DEFAULT_LIST_LIMIT",
    "INSERT_ARTIFACT",
    "INSERT_EVENT",
    "MAX_LIST_LIMIT",
    "MAX_WAIT_TIMEOUT_MS",
    "UPSTREAM_SCHEMA",
    "ApplyResult",
    "Store",
    "default_id_factory",
]
