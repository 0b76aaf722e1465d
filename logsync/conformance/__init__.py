"""`logsync conformance`: black-box checks of any `/sync/*` peer (a logsync daemon, a
MemPalace hub, another implementation) against RFC 004, each naming its section.

`probe` is the one HTTP edge (bounded bytes, time, requests); `reads` checks the upstream
read routes, `extensions` the negotiated ones, `refusals` errors, tokens and the routes
only opened, `writable` the push (only with `--writable`); `runner.run_conformance` orders
them and `report` prints the verdicts and the exit code. The run's default bounds are here
so the command line can show them without loading the HTTP stack.
"""

DEFAULT_TIMEOUT_S = 10.0  # one request, headers and body
DEFAULT_DEADLINE_S = 120.0  # the whole run
DEFAULT_MAX_REQUESTS = 400
