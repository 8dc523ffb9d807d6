"""Writing our output files atomically: readers see the old content or the new, never half of it.

A write goes to a temp file beside the target, then os.replace() puts it in place. Around that:
- the new file's mode is what open() would give: 0666 & ~umask for a new file, the old mode for an
  existing one (mkstemp's 0600 is not kept);
- a symlink is written through: its resolved target is replaced, the link stays;
- folders, devices, FIFOs and sockets are refused in one line (SpecError), as is a path under a file;
- the temp file is removed on any failure, on Ctrl-C and, in the main thread, on SIGTERM/SIGHUP; a
  SIGKILLed writer's temp file is swept by the next write of the same target.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from traces.errors import SpecError
from traces.os_errors import spec_error, special_kind

# A temp file older than this whose writer is gone is a killed write's leftover (a live writer
# touches its file as it writes and renames it within seconds).
STALE_TEMP_SECONDS = 60.0


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write text (UTF-8) atomically; see the module docstring."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write bytes atomically; bad paths raise SpecError naming the path and the fix."""
    given = Path(path)
    target, old_mode = _target(given)
    ensure_folder(target.parent)
    _sweep_stale_temps(target)
    mode = old_mode if old_mode is not None else 0o666 & ~current_umask()
    with _signals_as_exit():
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent)
        except OSError as exc:  # e.g. no permission to write in the folder
            raise spec_error(exc, given) from None
        done = False
        try:
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(handle.fileno(), mode)
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
            done = True
        except OSError as exc:
            raise spec_error(exc, given) from None
        finally:
            if not done:
                Path(tmp).unlink(missing_ok=True)
    _fsync_folder(target.parent)


def check_target(path: str | os.PathLike[str]) -> None:
    """Refuse, before any work, an output path that atomic_write_bytes would refuse: a folder, a
    special file, a link loop, a file among its parents. Creates nothing; a folder that cannot be
    written in is still found only by the write itself."""
    target, _ = _target(Path(path))
    folder = target.parent
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    if os.path.lexists(folder) and not folder.is_dir():
        raise SpecError(f"{folder}: is a file, not a folder (give a folder path, or remove the file)")


def ensure_folder(folder: str | os.PathLike[str]) -> Path:
    """The folder, created with its parents if missing; a file in the way is a SpecError."""
    p = Path(folder)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # exists, but is not a folder
        raise SpecError(f"{p}: is a file, not a folder (give a folder path, or remove the file)") from None
    except OSError as exc:
        raise spec_error(exc, p) from None
    return p


def current_umask() -> int:
    """The process umask, read without changing it where Linux shows it (os.umask can only swap)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere: swap and restore at once
    os.umask(mask)
    return mask


def _target(path: Path) -> tuple[Path, int | None]:
    """Where the bytes go (a symlink's resolved target) and the mode of the file there, if any."""
    try:
        st = os.stat(path)  # follows symlinks
    except FileNotFoundError:
        # a new file, or a dangling link (created where it points, as open() would); a missing
        # parent is made by ensure_folder, a file among the parents is found there
        return (Path(os.path.realpath(path)) if path.is_symlink() else path), None
    except OSError as exc:  # a symlink loop, a file among the parents, no permission to look
        raise spec_error(exc, path) from None
    except ValueError:  # a NUL character: no OS call takes it
        raise SpecError(f"{str(path)!r}: a path cannot hold a NUL character (fix the path)") from None
    kind = special_kind(st.st_mode)
    if kind == "a folder":
        raise SpecError(f"{path}: is a folder (give a file path, e.g. {path / 'NAME'})")
    if kind is not None:
        raise SpecError(f"{path}: is {kind}, not a regular file (give a file path)")
    return Path(os.path.realpath(path)), stat.S_IMODE(st.st_mode)


def _sweep_stale_temps(target: Path) -> None:
    """Remove this target's temp files left by writers that were killed (SIGKILL leaves no chance)."""
    now = time.time()
    for tmp in target.parent.glob(f".{target.name}.*.tmp"):
        parts = tmp.name[len(target.name) + 2 :].split(".")
        if len(parts) != 3 or not parts[0].isdigit() or _alive(int(parts[0])):
            continue
        with contextlib.suppress(OSError):
            if now - tmp.lstat().st_mtime > STALE_TEMP_SECONDS:
                tmp.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


@contextlib.contextmanager
def _signals_as_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit while a write is in progress, so its finally runs.

    Only where they would kill the process anyway (default handler) and only in the main thread
    (Python sets handlers there only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            saved[sig] = signal.signal(sig, _exit_on_signal)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (best effort: not every file system lets a folder be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
