"""Stopping a run cleanly on Ctrl-C (SIGINT) or SIGTERM.

Inside `graceful()` a signal does not raise at once: it records a request that the
training loop polls between steps, so the loop can save a checkpoint at the current
step and raise `Interrupted`. A second signal more than a second after the first
raises KeyboardInterrupt at once (the user gave up waiting, e.g. during a long
compilation); one within a second is the same Ctrl-C delivered twice (a sweep driver
forwards it to workers that the terminal already reached) and is ignored.
Outside `graceful()` the default behaviour applies.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_GRACE_SECONDS = 1.0


class Interrupted(Exception):
  """Raised by the training loop after saving, at a stop request."""

  def __init__(self, message: str, signum: int = signal.SIGINT):
    super().__init__(message)
    self.signum = signum

  @property
  def exit_code(self) -> int:
    return 128 + int(self.signum)


_requested: dict = {}


def requested() -> int | None:
  """The signal number of a pending stop request, or None."""
  return _requested.get("signum")


def _handler(signum, frame):  # pylint: disable=unused-argument
  first = _requested.get("time")
  if first is None:
    _requested.update(signum=signum, time=time.monotonic())
  elif time.monotonic() - first > _GRACE_SECONDS:
    raise KeyboardInterrupt


@contextlib.contextmanager
def graceful():
  """Turns SIGINT and SIGTERM into stop requests (main thread only; elsewhere, e.g. in a
  Ray worker's thread, signals keep their default behaviour)."""
  if (threading.current_thread() is not threading.main_thread()
      or signal.getsignal(signal.SIGINT) is _handler):
    yield  # Not ours to handle, or already handled by an enclosing `graceful()`.
    return
  _requested.clear()
  previous = {s: signal.signal(s, _handler) for s in SIGNALS}
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    _requested.clear()
