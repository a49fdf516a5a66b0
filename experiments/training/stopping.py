"""Stopping a run cleanly on Ctrl-C (SIGINT) or SIGTERM.

Inside `graceful()` a signal does not raise at once: it records a request that the
training loop polls between steps, so the loop can save a checkpoint at the current
step and raise `Interrupted`. A second signal more than a second after the first
ends the process at once with 128 + signal (the user gave up waiting, e.g. during a
long compilation), without saving: the last saved checkpoint is kept. It is acted on
by a watchdog thread woken by the signal itself (`signal.set_wakeup_fd`), so it works
while the main thread is inside a long library call (an XLA compilation), and it ends
the process with `os._exit`: raising KeyboardInterrupt at an arbitrary point of such a
call, then tearing the interpreter down under XLA's threads, crashed (segmentation
fault). One within a second is the same Ctrl-C delivered twice (a sweep driver
forwards it to workers that the terminal already reached) and is ignored.
Outside `graceful()` the default behaviour applies.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
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


def _note(signum: int) -> None:
  """Records a stop request; a second one after the grace period ends the process."""
  with _lock:
    first = _requested.get("time")
    if first is None:
      _requested.update(signum=signum, time=time.monotonic())
      return
    if time.monotonic() - first <= _GRACE_SECONDS:
      return
  try:
    os.write(2, b"error: interrupted again: stopped at once without saving; the last "
                b"saved checkpoint is kept; run the same command to resume\n")
  finally:
    os._exit(128 + int(signum))  # pylint: disable=protected-access


_lock = threading.Lock()


def _handler(signum, frame):  # pylint: disable=unused-argument
  """Replaces the default action (KeyboardInterrupt, termination); the watchdog, woken
  through the wakeup socket, records the request: counting here too would count a
  signal again when the main thread gets to it, after a long library call."""


def _watch(reader: socket.socket) -> None:
  """The watchdog: the C-level signal handler writes each signal's number to the wakeup
  socket even while the main thread is busy in a library call."""
  while True:
    try:
      data = reader.recv(64)
    except OSError:
      return
    if not data:
      return
    for signum in data:
      if signum in [int(s) for s in SIGNALS]:
        _note(signum)


@contextlib.contextmanager
def graceful():
  """Turns SIGINT and SIGTERM into stop requests (main thread only; elsewhere, e.g. in a
  Ray worker's thread, signals keep their default behaviour)."""
  if (threading.current_thread() is not threading.main_thread()
      or signal.getsignal(signal.SIGINT) is _handler):
    yield  # Not ours to handle, or already handled by an enclosing `graceful()`.
    return
  _requested.clear()
  reader, writer = socket.socketpair()
  writer.setblocking(False)
  previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
  threading.Thread(target=_watch, args=(reader,), daemon=True,
                   name="stop-request watchdog").start()
  previous = {s: signal.signal(s, _handler) for s in SIGNALS}
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    signal.set_wakeup_fd(previous_fd)
    writer.close()
    try:
      reader.shutdown(socket.SHUT_RDWR)
    except OSError:
      pass
    reader.close()
    _requested.clear()
    sys.stderr.flush()
