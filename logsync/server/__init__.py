"""The HTTP face of a replica: what peers, MemPalace hubs and operators talk to.

Routes (GET, and HEAD answered like GET, unless noted):

- ``/healthz``  200 ``text/plain`` ``ok\\n``; no token needed.
- ``/``  the status page (HTML, `statuspage.py`): without a credential, a login form;
  ``POST /login`` (the token as a form field) sets an HttpOnly session cookie the guard
  accepts like the bearer header, ``POST /logout`` clears it; ``/conflicts.json`` and
  ``/quarantine.json`` list the ledgers.
- ``/statusz``  this server's status: replica id, vector, store counts, version, requests.
- ``/sync/version_vector``  ``{"replica_id", "version_vector", "profile", "profiles",
  "logsync"}``; the last key advertises our extensions (upstream clients read only the keys
  they know, see ``mempalace/logsync.py``).
- ``/sync/ops?origin=&after=&limit=``  ``{"origin", "events", "count"}``, exactly upstream.
- ``/sync/artifact?id=``  ``{"artifact": ...}``, 404 ``{"error": "artifact '<id>' not found"}``.
- ``/sync/digests?origin=&at=s1,s2``  ``{"origin", "digests": [[seq, hex|null], ...]}``:
  the origin's hash chain at each seq (extension ``chain``; `logsync.responder`).
- ``POST /sync/push``  a pushed page (extension ``push``, only with a token;
  `pushroute.py`, `logsync.pushed`).
- ``/sync/snapshot``  a consistent copy of the store (extension ``snapshot``;
  `snapshotroute.py`, `logsync.snapshot`).
- ``/sync/peers``  the estate in the upstream shape; tokens never appear.
- ``/logstream/stream``  Server-Sent Events with upstream filters, cursor and frames.
- ``/metrics``  Prometheus text from a per-app registry, per-peer series included
  (`peermetrics.py`).

Request policy, as upstream (``mcp_server/http.py``) except where noted: on a loopback bind
the ``Host`` header is pinned to loopback names (403); an ``Origin`` header must be loopback
(403); ``Authorization: Bearer <token>`` (or the status page's session cookie) is compared
in constant time on every route but ``/healthz``, ``/`` and ``/login`` (401) -- unknown
routes too, so route probing needs the token (upstream answers 404 there). A request body
over ``max_body_bytes`` is refused with 413 (``/sync/push`` and ``/login`` read their own
bodies under their own caps). Every error body is ``{"error": CODE, "reason": "<one
sentence>"}`` (`logsync.errorcodes`), except on the routes upstream defines to a client
that did not send ``Logsync-Errors: codes``: those get upstream's ``{"error": "<one
sentence>"}`` (the guard rewords them, `policy.py`).

Extensions, additive and negotiated (constants shared with ``logsync.engine``, the pulling
side); a request without them gets upstream bytes, including the silent 500 cap:

- advertised in ``/sync/version_vector`` as ``"logsync": {"version": "<logsync version>",
  "extensions": ["msgpack", "large_pages", "inline_artifacts", "notify", "chain"],
  "max_page": N, "tips": {origin: [seq, digest hex]}}``.
- ``Accept: application/msgpack`` on a ``/sync/*`` route: a 200 answer is the same object
  msgpack-encoded (``Content-Type: application/msgpack``); error bodies stay JSON.
- ``ext=<name>[,<name>...]`` on ``/sync/ops`` (repeatable; an ``X-Logsync-Extensions``
  header works too); unknown names are ignored so newer peers never break us.
  ``large_pages``: ``limit`` is honoured up to ``max_page`` (default 5000) instead of 500.
  ``inline_artifacts``: the answer gains ``"artifacts": [...]``, the artifacts the page's
  events name, ordered by id, up to ``inline_artifact_bytes`` of content; any left out
  are fetched with ``/sync/artifact``.
- ``chain``: the page gains ``"chain": {"prev": <digest hex>}``, the origin's hash chain
  at ``after``, so a puller applies it only onto the same history (`logsync.divergence`).
- ``notify``: ``/logstream/stream`` frees its slot when the client leaves and wakes on a
  ``ChangeNotifier``, so a peer may hold a stream open as its pull trigger.

New events reach streams two ways: a ``ChangeNotifier`` that writers in this process poke
(from the event loop or any thread), and a cheap shared poll of the newest event id every
``sse_poll_s`` that catches writers in other processes. The daemon adds ``commits.CommitWatch``
(``PRAGMA data_version`` every few ms), so another process's commit wakes streams at once.
"""

from logsync.server.app import create_app
from logsync.server.common import is_loopback_host, json_bytes
from logsync.server.stream import SSE_FILTERS, SSE_TYPE, ChangeNotifier

__all__ = [
    "SSE_FILTERS",
    "SSE_TYPE",
    "ChangeNotifier",
    "create_app",
    "is_loopback_host",
    "json_bytes",
]
