"""The shape of a replica id, pure (no files): the wire, the model and the engine check
ids with it; `replica.py` mints and keeps them."""

from __future__ import annotations

import re

REPLICA_ID_RE = re.compile(r"rep_(?:[0-9a-f]{12}|[0-9a-f]{32})")


def is_replica_id(value: object) -> bool:
    return isinstance(value, str) and REPLICA_ID_RE.fullmatch(value) is not None
