"""RFC 004 §11 (errors): one table of codes, the `{"error": CODE, "reason": SENTENCE}`
body, and upstream's `{"error": SENTENCE}` kept on the upstream routes for a client that
did not ask for codes (a MemPalace hub's clients get the hub's bytes)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from logsync.answers import error_text
from logsync.errorcodes import (
    ERROR_CODES,
    ERRORS_CODED,
    ERRORS_HEADER,
    UPSTREAM_PATHS,
    code_of,
    error_body,
    reason_of,
    upstream_shape,
)
from logsync.server import create_app
from logsync.store import Store

TOKEN = "secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CODED = {**AUTH, ERRORS_HEADER: ERRORS_CODED}


def test_every_code_has_one_status_and_the_default_of_a_status_is_its_first_code() -> None:
    assert all(400 <= status <= 599 and why for status, why in ERROR_CODES.values())
    assert error_body(503, "x") == {"error": "unavailable", "reason": "x"}
    assert error_body(503, "x", "busy") == {"error": "busy", "reason": "x"}
    assert error_body(404, "x")["error"] == "not_found"
    with pytest.raises(ValueError, match="not sent with status 400"):
        error_body(400, "x", "busy")


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)))
def test_reading_any_json_as_an_error_never_raises(data: Any) -> None:
    reason = reason_of(data)
    assert isinstance(reason, str) and "\n" not in reason and len(reason) <= 200
    assert code_of(data) is None or code_of(data) in ERROR_CODES


def test_a_client_reads_the_sentence_of_either_shape() -> None:
    coded = json.dumps(error_body(400, "after=-1 must be\na non-negative integer")).encode()
    assert error_text(coded) == "after=-1 must be a non-negative integer"
    assert error_text(b'{"error": "artifact \'a\' not found"}') == "artifact 'a' not found"
    assert error_text(b"x" * (64 * 1024 + 1)) == ""  # never decodes a large body
    assert upstream_shape({"error": "busy", "reason": "r"}) == {"error": "r"}
    assert upstream_shape({"events": []}) == {"events": []}


def test_a_zstd_coded_error_body_is_read_for_its_sentence_within_a_bound() -> None:
    """A page's refusal may come coded as its page would; its reason must not be lost,
    and a coded body can make the reader neither fail nor expand past 64 KiB."""
    said = json.dumps(error_body(429, "too many pullers; try again in 2 s")).encode()
    coded = zstandard.ZstdCompressor().compress(said)
    assert error_text(coded, "zstd") == "too many pullers; try again in 2 s"
    assert error_text(coded, " ZSTD ") == "too many pullers; try again in 2 s"
    assert error_text(coded) == ""  # not said to be coded: bytes that are not JSON
    bomb = zstandard.ZstdCompressor().compress(b'{"error": "' + b"x" * 50_000_000 + b'"}')
    assert len(bomb) < 64 * 1024 and error_text(bomb, "zstd") == ""
    assert error_text(b"not zstd at all", "zstd") == ""
    assert error_text(coded[: len(coded) // 2], "zstd") == ""  # cut inside its frame


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with Store.open(tmp_path / "palace") as opened:
        yield opened


async def _get(store: Store, path: str, headers: dict[str, str]) -> httpx.Response:
    transport = httpx.ASGITransport(app=create_app(store, token=TOKEN))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        return await c.get(path, headers=headers)


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "status", "code"), [
    ("/sync/ops?origin=rep_a&after=-1", 400, "bad_request"),
    ("/sync/ops?origin=rep_a&limit=0", 400, "bad_request"),
    ("/sync/ops", 400, "bad_request"),
    ("/sync/artifact?id=art_nope", 404, "not_found"),
    ("/sync/artifact", 400, "bad_request"),
])
async def test_upstream_routes_answer_codes_only_to_a_client_that_asks(
        store: Store, path: str, status: int, code: str) -> None:
    plain, coded = await _get(store, path, AUTH), await _get(store, path, CODED)
    assert plain.status_code == coded.status_code == status
    assert list(plain.json()) == ["error"]  # upstream's shape, as a hub words it
    assert coded.json() == {"error": code, "reason": plain.json()["error"]}
    for answer in (plain, coded):  # the length header matches the reworded body
        assert int(answer.headers["content-length"]) == len(answer.content)
    assert path.split("?")[0] in UPSTREAM_PATHS


@pytest.mark.anyio
async def test_a_refusal_before_any_route_is_coded_for_a_client_that_asks(store: Store) -> None:
    plain = await _get(store, "/sync/version_vector", {})
    coded = await _get(store, "/sync/version_vector", {ERRORS_HEADER: ERRORS_CODED})
    assert plain.status_code == coded.status_code == 401
    assert list(plain.json()) == ["error"]
    assert coded.json()["error"] == "unauthorized"
    assert coded.json()["reason"] == plain.json()["error"]


@pytest.mark.anyio
async def test_other_routes_always_answer_a_code_and_a_good_answer_is_untouched(
        store: Store) -> None:
    for headers in (AUTH, CODED):
        digests = await _get(store, "/sync/digests?origin=nope&at=1", headers)
        assert digests.status_code == 400 and digests.json()["error"] == "bad_request"
        unknown = await _get(store, "/sync/nope", headers)
        assert unknown.status_code == 404 and unknown.json()["error"] == "not_found"
    plain = await _get(store, "/sync/version_vector", AUTH)
    coded = await _get(store, "/sync/version_vector", CODED)
    assert plain.status_code == coded.status_code == 200
    assert _unstamped(plain.content) == _unstamped(coded.content)


def _unstamped(body: bytes) -> bytes:
    """The answer with its `advertised_at` seconds blanked: the two requests may fall
    either side of a second, and only the clock may differ between them."""
    stamp = rb'"advertised_at": "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"'
    unstamped, count = re.subn(stamp, b'"advertised_at": "-"', body)
    assert count >= 1, body
    return unstamped


@pytest.mark.anyio
@pytest.mark.parametrize(("value", "coded"), [
    ("codes", True), (" CODES ", True), ("x, codes", True), ("codes,other", True),
    ("", False), ("code", False), ("nocodes", False)])
async def test_the_header_value_is_a_list_matched_without_case_or_spaces(
        store: Store, value: str, coded: bool) -> None:
    """RFC 004 §11: `Logsync-Errors` holds `codes` among comma-separated values."""
    answer = await _get(store, "/sync/ops?origin=rep_a&after=-1", {**AUTH, ERRORS_HEADER: value})
    assert answer.status_code == 400
    assert (answer.json()["error"] == "bad_request") is coded
