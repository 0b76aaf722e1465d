"""docs/rfc-004-details.md, the RFC's normative details: the snapshot schema it prints is
the one a store is made with, and the query-string and artifact-id rules hold."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import httpx
import pytest

from logsync.server import create_app
from logsync.store import Store
from logsync.store.schema import migrate

DETAILS = Path(__file__).resolve().parents[1] / "docs" / "rfc-004-details.md"
TOKEN = "secret"


def _catalogue(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    """(type, name, statement with its whitespace collapsed), SQLite's own indexes left out."""
    rows = conn.execute("SELECT type, name, sql FROM sqlite_master "
                        "WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name")
    return [(kind, name, re.sub(r"\s+", " ", sql.replace("IF NOT EXISTS ", "")).strip())
            for kind, name, sql in rows]


def test_the_schema_here_is_the_one_a_store_is_made_with() -> None:
    blocks = re.findall(r"```sql\n(.*?)```", DETAILS.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "docs/rfc-004-details.md must hold exactly one sql block"
    printed = sqlite3.connect(":memory:")
    made = sqlite3.connect(":memory:", isolation_level=None)
    try:
        printed.executescript(blocks[0])
        migrate(made, "rep_000000000000")
        assert _catalogue(printed) == _catalogue(made)
    finally:
        printed.close()
        made.close()


@pytest.mark.anyio
async def test_a_plus_is_a_space_and_an_unknown_artifact_id_is_404(store: Store) -> None:
    """D2 and D3: `+` decodes as a space; any id not held is 404 with upstream's sentence,
    whatever its shape; an empty id is 400."""
    app = create_app(store, token=TOKEN)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://127.0.0.1",
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        plus = await client.get("/sync/artifact?id=art+x%2By")
        odd = await client.get("/sync/artifact?id=not-an-id")
        empty = await client.get("/sync/artifact?id=")
    assert plus.status_code == 404
    assert plus.json() == {"error": "artifact 'art x+y' not found"}
    assert odd.status_code == 404 and empty.status_code == 400
