#!/usr/bin/env bash
# Create (once) the private virtualenv that holds the real MemPalace 3.11.0 hub
# used by tests/interop, and print its path on stdout.
#
# Why its own venv: mempalace drags in ~500 MB of vector-store dependencies and
# must never be importable from logsync's environment (interop means talking to
# it as a separate program, the way a user's hub is).
#
#   LOGSYNC_MEMPALACE_VENV     where the venv lives
#                              (default: $HOME/.cache/logsync/mempalace-3.11.0)
#   LOGSYNC_MEMPALACE_PYTHON   interpreter used to create it (default: python3)
#
# Idempotent: an existing venv whose bin/mempalace reports 3.11.0 is reused in
# well under a second. Progress goes to stderr; stdout carries only the path.
# Exit 0 on success, 1 with one "Error: ..." line on failure.
set -euo pipefail

VERSION="3.11.0"
VENV="${LOGSYNC_MEMPALACE_VENV:-$HOME/.cache/logsync/mempalace-$VERSION}"
PYTHON="${LOGSYNC_MEMPALACE_PYTHON:-python3}"

fail() {
    echo "Error: $*" >&2
    exit 1
}

is_ready() {
    [ -x "$VENV/bin/mempalace" ] \
        && [ "$("$VENV/bin/mempalace" --version 2>/dev/null)" = "MemPalace $VERSION" ]
}

if is_ready; then
    echo "$VENV"
    exit 0
fi

mkdir -p "$(dirname "$VENV")"
# Serialise concurrent installers (two CI jobs, two pytest workers): the
# second waits for the first and then finds the venv ready.
exec 9>"$VENV.lock"
if command -v flock >/dev/null 2>&1; then
    flock -w 900 9 || fail "timed out after 900 s waiting for another install holding $VENV.lock"
fi
if is_ready; then
    echo "$VENV"
    exit 0
fi

if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ] && [ -n "$(ls -A "$VENV" 2>/dev/null)" ]; then
    fail "$VENV exists and is not a virtualenv; move it away or set LOGSYNC_MEMPALACE_VENV"
fi

command -v "$PYTHON" >/dev/null 2>&1 \
    || fail "interpreter '$PYTHON' not found; set LOGSYNC_MEMPALACE_PYTHON to a Python >= 3.9"

echo "Installing mempalace==$VERSION into $VENV (about a minute, ~500 MB)..." >&2
if [ ! -f "$VENV/pyvenv.cfg" ]; then
    "$PYTHON" -m venv "$VENV" >&2 || fail "could not create a virtualenv at $VENV with $PYTHON"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "mempalace==$VERSION" >&2 \
    || fail "pip could not install mempalace==$VERSION into $VENV (is PyPI reachable?)"

is_ready || fail "$VENV/bin/mempalace does not report MemPalace $VERSION after installing"
echo "$VENV"
