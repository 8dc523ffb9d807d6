"""One line for an operating-system error on a user's path: what went wrong and how to fix it.

Reading and writing user paths turn OSError into SpecError with these lines; the CLI's main() uses
them too for any OSError that escapes (exit 2, no traceback).
"""

from __future__ import annotations

import errno
import os
import stat

from traces.errors import SpecError

# (what, fix) by exception class first, then by errno for the plain OSErrors
_BY_KIND: tuple[tuple[type[OSError], str, str], ...] = (
    (FileNotFoundError, "no such file or folder", "check the path"),
    (IsADirectoryError, "is a folder", "give a file path"),
    (NotADirectoryError, "a part of the path is a file, not a folder", "fix the path"),
    (PermissionError, "permission denied", "choose a path you may use, or change its permissions"),
    (FileExistsError, "already exists and is in the way", "remove it or choose another path"),
)
_BY_ERRNO: dict[int, tuple[str, str]] = {
    errno.ELOOP: ("a symbolic link loop, or too many links in a row", "fix the link"),
    errno.EROFS: ("read-only file system", "write somewhere else"),
    errno.ENOSPC: ("no space left on the device", "free some space or write somewhere else"),
    errno.EDQUOT: ("disk quota exceeded", "free some space or write somewhere else"),
    errno.ENAMETOOLONG: ("file name too long", "use a shorter path"),
    errno.EXDEV: ("crosses file systems", "write on the file system of the target"),
}


def os_error_line(exc: OSError, path: str | os.PathLike[str] | None = None) -> str:
    """`<path>: <what> (<fix>)` for an OSError; `path` where the caller knows it better than the error."""
    where = path if path is not None else (exc.filename if exc.filename is not None else "(unnamed path)")
    for kind, what, fix in _BY_KIND:
        if isinstance(exc, kind):
            return f"{where}: {what} ({fix})"
    what, fix = _BY_ERRNO.get(exc.errno or 0, (exc.strerror or type(exc).__name__, "check the path"))
    return f"{where}: {what} ({fix})"


def spec_error(exc: OSError, path: str | os.PathLike[str] | None = None) -> SpecError:
    return SpecError(os_error_line(exc, path))


def special_kind(mode: int) -> str | None:
    """What a non-regular file is, in words (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"
