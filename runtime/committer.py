"""The checkpoint commit thread: the driver's part of a checkpoint, off its path."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Committer:
    """Commits checkpoints off the driver's path, one at a time. The trainer saves in its own process
    (queued before its next step, so the file holds exactly this version, and the driver sends that
    step only once the file is written); the driver's part, records and commit record with four
    fsyncs (~40-80 ms a step on this machine), runs in this thread while the engines keep
    generating. A new checkpoint first waits for the previous one, and a failing run lets the one in
    progress land: a trainer that dies mid-step leaves the checkpoint before that step committed."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, work: Callable[[], None]) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(work,), name="checkpoint-commit", daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:  # re-raised in the driver's thread by wait()
            self._error = exc

    def join(self) -> None:
        """Let the commit in progress land; its error, if any, stays for wait()."""
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
            self._thread = None

    def wait(self) -> None:
        self.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
