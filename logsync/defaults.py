"""Defaults shared by the daemon and the CLI, kept import-light for fast commands."""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8742
DEFAULT_INTERVAL_S = 15.0
MIN_INTERVAL_S = 0.1  # below: rounds back to back (a value meant as milliseconds)
# A notification pulls at once (a round already running remembers it and pulls again
# when it ends, so bursts still collapse); many origins can be pulled side by side.
DEFAULT_DEBOUNCE_S = 0.0
DEFAULT_ORIGINS_IN_FLIGHT = 32
# A change stream writes a subscriber at most one batch of frames per this many seconds:
# the first change after a quiet spell goes out at once, later ones in the window together
# at its end (Plumtree's batched announcements; fewer frames, so fewer pulls).
DEFAULT_COALESCE_S = 0.02
# A server keeps `/sync/ops` answers to serve again: encoded ops and whole pages, half of
# this each (`server/opcache.py`, `server/pagecache.py`); `serve --cache-mb`.
DEFAULT_CACHE_MIB = 128
MIB = 1024 * 1024
