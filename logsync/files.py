"""Small files in the palace directory, written so a crash never leaves half of one."""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TextIO


def symlink_loop(*paths: Path) -> str | None:
    """One sentence naming the first of `paths` that is a symbolic link leading back to
    itself (the OS gives up resolving it), else None: SQLite would say only "unable to
    open", pathlib raise RuntimeError, a JSON read "Too many levels"."""
    for path in paths:
        try:
            path.stat()
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return (f"{path} is a symbolic link that leads back to itself (a loop): "
                        "remove it or point it at what it should name")
    return None


def make_private_dir(path: Path) -> bool:
    """Create directory `path` (and missing parents) mode 0700; True if it was made here.

    An existing directory keeps its mode: it may be shared on purpose (a MemPalace hub's
    palace), and changing it is not ours to do. Raises OSError.
    """
    if path.is_dir():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        if not path.is_dir():
            raise  # a file is in the way
        return False  # a concurrent creator won; its mode stands
    with suppress(OSError):  # mkdir's mode is masked by the umask; some filesystems refuse
        os.chmod(path, 0o700)
    return True


def write_atomic(path: Path, text: str, *, mode: int = 0o600) -> None:
    """Temp file in the same directory, fsync, rename: readers see the old file or the new.

    Mode 0600 by default: these files hold tokens (peers.json) or fleet state.
    Raises OSError; callers turn it into their own error type.
    """
    tmp = _synced_temp(path, text, mode)
    try:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_exclusive(path: Path, text: str, *, mode: int = 0o644) -> bool:
    """Create `path` with this content only if it does not exist yet (first writer wins).

    The content is complete before the name appears (link of a synced temp file),
    so a concurrent reader never sees a partial file. Returns False if it existed.
    """
    tmp = _synced_temp(path, text, mode)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def whole_or_none(path: Path) -> Iterator[TextIO]:
    """A text file written while the block runs and named `path` only when the block ends
    without an exception (temp file beside it, then rename): an interrupted or failed
    writer leaves the old file, or none, never a part that looks whole. A symlink's
    target is replaced (the link stays); a device or a FIFO (a pipe to another program)
    is written in place, never replaced by a file."""
    if is_special(path):
        with open(path, "w", encoding="utf-8") as handle:
            yield handle
        return
    real = Path(os.path.realpath(path))
    remove_stale_temps(real.parent, (real.name,))
    fd, name = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".tmp")
    tmp = Path(name)
    handle = os.fdopen(fd, "w", encoding="utf-8")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600: a trace or a report is no secret
        yield handle
        try:
            handle.close()  # the last buffered bytes: a full disk may refuse them
            os.replace(tmp, real)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(path)) from None
    finally:
        handle.close()
        tmp.unlink(missing_ok=True)


def is_special(path: Path) -> bool:
    """Whether `path` names (through any symlink) something other than a regular file
    or a directory: a device, a FIFO, a socket."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


STALE_TEMP_S = 600.0  # a temp file this old was left by a process killed mid-write


def remove_stale_temps(directory: Path, names: Iterable[str], *,
                       older_than_s: float = STALE_TEMP_S) -> int:
    """Remove the temp files `_synced_temp` left in `directory` for the files `names`
    when its process was killed between writing and renaming (`.<name>.<8 random
    characters>.tmp`, mkstemp's), once old enough that no live writer can still be
    renaming them; nothing else (a palace may be a shared directory). Returns how many
    went."""
    alternatives = "|".join(map(re.escape, names))
    own = re.compile(rf"\.(?:{alternatives})\.[a-z0-9_]{{8}}\.tmp")
    removed = 0
    cutoff = time.time() - older_than_s
    with suppress(OSError):
        for entry in os.scandir(directory):
            if own.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                with suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)
                        removed += 1
    return removed


def _synced_temp(path: Path, text: str, mode: int) -> Path:
    """A temp file beside `path` holding `text`, flushed to disk (and any of `path`'s
    own a killed writer left, removed first)."""
    remove_stale_temps(path.parent, (path.name,))
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:  # a full disk names no file: name the one being written
        tmp.unlink(missing_ok=True)
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


MAX_JSON_FILE_BYTES = 64 * 1024 * 1024  # a palace's own JSON files are far smaller


class UnreadableJSON(Exception):
    """A local JSON file that cannot be read or parsed: `path`, and `reason` (a phrase:
    "is not valid JSON (…)"); `damaged` is False when the file could not be read at all
    (permissions, a broken disk) rather than read and found wrong."""

    def __init__(self, path: Path, reason: str, *, damaged: bool = True) -> None:
        super().__init__(f"{path} {reason}")
        self.path, self.reason, self.damaged = path, reason, damaged


def read_json(path: Path, *, max_bytes: int = MAX_JSON_FILE_BYTES) -> object:
    """The parsed content of a palace's own JSON file (peers, identity, peer state).
    `FileNotFoundError` passes through (each caller knows what a missing file means);
    any other failure, a hand edit or a broken disk, is `UnreadableJSON`."""
    import json

    try:
        # O_NONBLOCK: opening a FIFO put in the file's place would wait for a writer
        # (a daemon re-reading its peers would hang, deaf to SIGTERM)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UnreadableJSON(path, f"cannot be read: {exc.strerror or exc}",
                             damaged=False) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnreadableJSON(path, "is not a regular file", damaged=False)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as handle:
            fd = -1
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise UnreadableJSON(path, f"cannot be read: {exc.strerror or exc}",
                             damaged=False) from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(raw) > max_bytes:
        raise UnreadableJSON(path, f"is larger than {max_bytes} bytes, more than such a "
                             "file ever holds")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableJSON(path, f"is not UTF-8 text ({exc.reason} at byte "
                             f"{exc.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise UnreadableJSON(path, "nests its JSON deeper than can be read") from None
    except ValueError as exc:
        raise UnreadableJSON(path, f"is not valid JSON ({exc})") from None
