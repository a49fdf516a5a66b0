"""The command line of the entry points: one-line errors, exit codes and Ctrl-C.

Every problem a user can cause (an unknown flag or config key, a value of the wrong type,
a config file that does not load, a bad setting) is reported as one line on stderr with
exit code 2, before anything is written. Failures of the run itself (the operating
system, a damaged file, a diverged loss) exit with 1, an interruption with 130.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import traceback
import warnings
from typing import Callable, NoReturn, Sequence

from absl import app
from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags
from ml_collections.config_flags import config_flags as config_flag_types

EXIT_FAILED = 1  # The run failed: operating-system error, damaged file, non-finite loss.
EXIT_BAD_INPUT = 2  # Bad flags, config file or setting; nothing was written.
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it.


def one_line(error: BaseException | str) -> str:
  """The message of `error` on one line (multi-line messages joined with '; ')."""
  text = str(error).strip()
  if isinstance(error, KeyError) and len(error.args) == 1:
    text = str(error.args[0]).strip()  # KeyError's str() quotes and escapes its message.
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  return "; ".join(lines) or type(error).__name__


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


def _unknown_key_message(error: BaseException, argv: Sequence[str]) -> str | None:
  """"unknown setting --config.a.stepz (did you mean steps?)" for a misspelt override."""
  match = re.search(r'Did you mean "(\w+)" instead of "(\w+)"', str(error))
  if match is None:
    return None
  right, wrong = match.groups()
  for arg in argv:
    name = arg.split("=", 1)[0]
    if name.startswith("--") and "." in name and name.rsplit(".", 1)[-1] == wrong:
      return f"unknown setting {name} (did you mean {name.rsplit('.', 1)[0]}.{right}?)"
  return f"unknown setting {wrong!r} (did you mean {right!r}?)"


def config_error_message(error: BaseException, argv: Sequence[str] = ()) -> str:
  """One line for an error raised while flags or a config file are read."""
  if isinstance(error, (KeyError, AttributeError)):
    message = _unknown_key_message(error, argv)
    if message:
      return message
  if isinstance(error, flags.UnrecognizedFlagError):
    return f"{one_line(error)}; see --helpfull for the valid flags"
  if isinstance(error, flags.Error):
    text = str(error)
    if "Traceback (most recent call last)" in text:  # An error inside get_config().
      last = [line.strip() for line in text.splitlines() if line.strip()][-1]
      flag = text.split(": Error whilst")[0].split("\n")[0]
      return f"{flag}: {last}"
    return one_line(error)
  if isinstance(error, SyntaxError):
    return f"config file {error.filename}, line {error.lineno}: {error.msg}"
  cause = error.__cause__ or error
  if isinstance(cause, OSError) and "Failed loading config file" in str(cause):
    missing = re.findall(r"No such file or directory: '([^']+)'", str(cause))
    if missing:
      return f"config file {missing[0]} does not exist"
  if isinstance(error, AttributeError) and "get_config" in str(error):
    return "the config file has no get_config() function"
  return f"bad config: {one_line(error)}"


# A setting the grid replaces: (setting, the grid's setting, when the grid shadows it).
SHADOWED = (
    ("training.learning_rate", "grid.learning_rates", lambda config: True),
    # With data_seed -1 `seed` still seeds the training data; otherwise it decides nothing.
    ("seed", "grid.seeds", lambda config: config.data_seed != -1),
)


def overridden(argv: Sequence[str], flag: str = "config") -> set[str]:
  """The settings given on the command line as --FLAG.SETTING=VALUE (or without '=')."""
  out = set()
  for arg in argv:
    name = arg.split("=", 1)[0]
    if name.startswith(f"--{flag}."):
      out.add(name[len(flag) + 3:])
  return out


def check_shadowed(config, argv: Sequence[str], flag: str = "config") -> None:
  """ValueError for a setting given on the command line that the config's grid replaces
  (it would be stored in config.json but change nothing)."""
  given = overridden(argv, flag)
  for setting, grid_setting, shadowed in SHADOWED:
    grid = config
    for part in grid_setting.split("."):
      grid = grid[part]
    if setting in given and tuple(grid) and shadowed(config):
      raise ValueError(
          f"--{flag}.{setting} has no effect: {grid_setting}={tuple(grid)!r} sets it for "
          f"every model of the run; set --{flag}.{grid_setting} instead, or "
          f"--{flag}.{grid_setting}='()' to use {setting}")


def check_folder(path: str | None, flag: str) -> None:
  """ValueError if `path`, the folder of --FLAG, exists as something else (a file)."""
  if path and os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"--{flag}={path} is a file, not a folder; use another --{flag}")


DEBUG_ENV = "RANDOMIZED_PE_DEBUG"  # Set (not 0): libraries' messages and tracebacks shown.
LIBRARY_LOG = "library.log"  # Otherwise they go to this file of the workdir.


def debug() -> bool:
  return os.environ.get(DEBUG_ENV, "") not in ("", "0")


class _LibraryLog:
  """A text stream appending to a file once the file's folder exists (stderr before):
  the messages and tracebacks libraries print from their threads (orbax's failed
  background writes, tensorstore's callbacks) stay out of the terminal."""

  def __init__(self, path: str):
    self.path, self.file, self.used = path, None, False

  def write(self, text: str) -> int:
    if not text:
      return 0
    if self.file is None and os.path.isdir(os.path.dirname(self.path) or "."):
      try:
        self.file = open(self.path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
      except OSError:
        pass
    if self.file is None:
      return sys.__stderr__.write(text)
    try:
      self.file.write(text)
      self.file.flush()
      self.used = True
    except (OSError, ValueError):
      # A full disk, or the file already closed by the interpreter's shutdown while a
      # library still logs (orbax's unretrieved futures, collected last): the one-line
      # error still says what failed, and nothing reaches stderr. A write cut short
      # (a file-size limit, a disk filled midway) still left its start in the file,
      # usually the line that says what failed: the error line points to it.
      self.used = self.used or self._holds_anything()
    return len(text)

  def _holds_anything(self) -> bool:
    try:
      return os.fstat(self.file.fileno()).st_size > 0
    except (OSError, ValueError):
      return False

  def flush(self) -> None:
    pass

  def close(self) -> None:
    if self.file is not None:
      try:
        self.file.close()
      except OSError:
        pass


@contextlib.contextmanager
def library_output_to(path: str):
  """Sends library log records (absl logging, used by orbax), warnings, exceptions of
  threads and unraisable exceptions to the file `path` for the block, unless RANDOMIZED_PE_DEBUG is
  set; yields the stream (None in debug mode), whose `used` says whether it got any."""
  if debug():
    yield None
    return

  stream = _LibraryLog(path)
  handler = absl_logging.get_absl_handler().python_handler
  saved = (handler.stream, sys.unraisablehook, threading.excepthook)

  def unraisable(info):
    stream.write("".join(traceback.format_exception(
        info.exc_type, info.exc_value, info.exc_traceback)) + f"({info.err_msg or ''})\n")

  def thread_exception(args):
    stream.write(f"exception in thread {getattr(args.thread, 'name', '?')}:\n" + "".join(
        traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback)))

  def show_warning(message, category, filename, lineno, file=None, line=None):  # pylint: disable=unused-argument
    stream.write(warnings.formatwarning(message, category, filename, lineno, line))

  saved_show_warning = warnings.showwarning
  handler.stream, sys.unraisablehook, threading.excepthook = stream, unraisable, thread_exception
  # Warnings too: orbax's write tasks cancelled by a failed save, collected at shutdown,
  # warn "coroutine ... was never awaited".
  warnings.showwarning = show_warning
  exiting = False
  try:
    yield stream
  except SystemExit:
    # The process is on its way out (cli.fail inside the block): what libraries still
    # print while it shuts down (orbax's unretrieved background write errors, logged when
    # their tasks are collected) goes on to the log, not to the one-line error's stderr.
    exiting = True
    raise
  finally:
    if not exiting:
      handler.stream, sys.unraisablehook, threading.excepthook = saved
      warnings.showwarning = saved_show_warning
      stream.close()


def log_traceback(stream, error: BaseException) -> None:
  """The traceback of `error` into the library log (stderr in debug mode)."""
  text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
  (stream or sys.stderr).write(text)


def define_config(name: str, default: str, help_text: str):
  """config_flags.DEFINE_config_file, whose own errors (it applies overrides from the
  command line as soon as it is defined) become one line and exit code 2."""
  try:
    return config_flags.DEFINE_config_file(name, default, help_text)
  except Exception as e:  # pylint: disable=broad-except
    fail(config_error_message(e, sys.argv))


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parser with one-line errors (exit 2), for `app.run(flags_parser=...)`."""
  try:
    remaining = flags.FLAGS(argv)
    for name in list(flags.FLAGS):  # Config files load lazily: load them now, in the try.
      if config_flag_types.is_config_flag(flags.FLAGS[name]):
        getattr(flags.FLAGS, name).keys()  # Raises the deferred error of a failed load.
  except Exception as e:  # pylint: disable=broad-except
    fail(config_error_message(e, argv))
  if len(remaining) > 1:
    fail(f"unexpected arguments: {' '.join(remaining[1:])}; settings are flags, "
         "e.g. --config.training.steps=100")
  return remaining


def run(main: Callable[[list[str]], None]) -> None:
  """app.run with one-line flag errors, and Ctrl-C outside the training loop (which
  handles it itself: experiments/training/stopping.py) ending quietly with exit code 130.

  A process started with SIGINT ignored (a background job of a non-interactive shell:
  `cmd &` in a script) gets Python's default handler back, so that `kill -INT` stops it;
  before, it was lost until the training loop handled signals. (experiments.train
  turns signals into stop requests as soon as its flags are parsed.)"""
  if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    app.run(main, flags_parser=parse_flags)
  except SystemExit as e:
    if e.code in (EXIT_INTERRUPTED, 128 + signal.SIGTERM):  # Stopped on request: a
      signal.signal(signal.SIGINT, signal.SIG_IGN)  # second Ctrl-C must not kill (-2).
    raise
  except KeyboardInterrupt:
    # A second Ctrl-C while the interpreter shuts down (seconds under load, with XLA's
    # threads) would otherwise end it by the signal's default action (exit code -2).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print("\ninterrupted", file=sys.stderr, flush=True)
    sys.exit(EXIT_INTERRUPTED)
