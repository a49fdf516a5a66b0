"""A run's folder: who owns it (a lock) and which run it holds (its identity).

A run's identity is its config minus the settings that cannot change its trained
models (`NOT_IDENTITY`), minus `training.steps` (raising it continues a run) and minus
the evaluation settings (changing them re-evaluates the same models). A folder holding
another identity is refused, naming the settings that differ.

The lock is an OS-level lock (flock) on WORKDIR/.lock held for as long as the process
trains there; the operating system releases it when the process ends, however it ends,
so a lock is never stale. The file names the holder.
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import sys

from experiments.storage import io_utils

LOCK_FILE = ".lock"
CONFIG_FILE = "config.json"

# Settings that change neither the trained models nor the results, with why.
NOT_IDENTITY = (
    "progress",  # Progress bars.
    "compilation_cache",  # Where compiled programs are kept.
    "training.prefetch",  # How many batches are generated ahead.
    "training.log_every",  # How often metrics are averaged and written.
    "training.checkpoint_every",  # How often the state is saved (resume is exact).
    "training.checkpoints_to_keep",
    "sweep",  # Which other jobs a sweep holds.
)
EVALUATION = "evaluation"
STEPS = "training.steps"


class WorkdirBusy(RuntimeError):
  """Another process holds the workdir's lock."""


class StartRefused(RuntimeError):
  """A run was not begun: the process's start refusal (`refusing_starts`) said so."""


# A check this process runs before it takes a folder's lock, set by `refusing_starts`:
# a reason to refuse the start, or None.
_refusal = None


@contextlib.contextmanager
def refusing_starts(reason):
  """Within the block, `locked` raises StartRefused, before touching the folder, whenever
  `reason()` returns a reason (a drained Ray sweep's task that Ray handed to a worker
  despite the cancel stops there, however far its job had gone towards its start)."""
  global _refusal  # pylint: disable=global-statement
  before, _refusal = _refusal, reason
  try:
    yield
  finally:
    _refusal = before


def _flatten(d: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in d.items():
    path = f"{prefix}{key}"
    if isinstance(value, dict):
      out.update(_flatten(value, path + "."))
    else:
      out[path] = value
  return out


def _normalised(config_dict: dict) -> dict:
  """Flat {path: value} with JSON types (tuples as lists), as config.json stores them."""
  return _flatten(json.loads(json.dumps(config_dict)))


def _without(flat: dict, prefixes) -> dict:
  return {k: v for k, v in flat.items()
          if not any(k == p or k.startswith(p + ".") for p in prefixes)}


def identity(config_dict: dict) -> dict:
  """The settings that decide a run's trained models (flat {path: value})."""
  return _without(_normalised(config_dict), (*NOT_IDENTITY, EVALUATION, STEPS))


def evaluation_settings(config_dict: dict) -> dict:
  flat = _normalised(config_dict)
  return {k: v for k, v in flat.items() if k.startswith(EVALUATION + ".")}


def differences(old: dict, new: dict) -> list[str]:
  """'key: old -> new' for every setting that differs between two flat dicts."""
  missing = object()
  out = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key, missing), new.get(key, missing)
    if a != b:
      fmt = lambda v: "(absent)" if v is missing else json.dumps(v)  # pylint: disable=unnecessary-lambda-assignment
      out.append(f"{key}: {fmt(a)} -> {fmt(b)}")
  return out


def _defaults() -> dict:
  from configs import default  # pylint: disable=import-outside-toplevel
  return _normalised(default.get_config().to_dict())


def _differences_but_added_defaults(old: dict, new: dict) -> list[str]:
  """`differences`, except that a setting missing from `old` (stored before the setting
  existed) that has its default value in `new` is not a difference: defaults keep
  earlier behaviour, so upgrading the code does not orphan or redo earlier runs."""
  defaults = _defaults()
  added_as_default = {k for k in set(new) - set(old)
                      if k in defaults and new[k] == defaults[k]}
  return differences(old, {k: v for k, v in new.items() if k not in added_as_default})


def identity_differences(stored: dict, current: dict) -> list[str]:
  """The identity settings that differ between a stored config and the current one
  (settings added since at their default are none)."""
  return _differences_but_added_defaults(identity(stored), identity(current))


def evaluation_differences(stored: dict, current: dict) -> list[str]:
  """The evaluation settings that differ (settings added since at their default are none)."""
  return _differences_but_added_defaults(evaluation_settings(stored),
                                         evaluation_settings(current))


# The evaluation's schedule: runs that share a training are evaluated at the same steps.
EVALUATION_SCHEDULE = ("evaluation.every_steps", "evaluation.every_epochs")


def shared_training_differences(config: dict, other: dict) -> list[str]:
  """The settings that keep two runs from sharing one training (experiments/training/
  loop.py, `companions`): every setting but the evaluation's other than its schedule and
  those of `NOT_IDENTITY` that change no record (all but `training.log_every`, which
  decides the training records of metrics.jsonl). [] for runs whose models, records of
  training and evaluation steps are the same, e.g. Su's randomized RoPE with and
  without evenly spaced test positions (configs/su.py)."""
  free = [p for p in NOT_IDENTITY if p != "training.log_every"]

  def shared(config_dict):
    flat = _without(_normalised(config_dict), free)
    return {k: v for k, v in flat.items()
            if not k.startswith(EVALUATION + ".") or k in EVALUATION_SCHEDULE}
  return differences(shared(config), shared(other))


def describe_differences(diffs: list[str], limit: int = 4) -> str:
  shown = "; ".join(diffs[:limit])
  return shown + (f"; and {len(diffs) - limit} more" if len(diffs) > limit else "")


def stored_config(workdir: str) -> dict | None:
  """The config.json of a workdir, or None if there is none (CorruptFileError if damaged)."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    return io_utils.read_json(path)
  except io_utils.CorruptFileError as e:
    raise io_utils.CorruptFileError(
        f"{e}; it says which run the folder holds: restore it or use another folder"
    ) from None


def check_identity(workdir: str, config_dict: dict, has_checkpoints: bool) -> None:
  """Raises ValueError if `workdir` holds a run of another identity."""
  stored = stored_config(workdir)
  if stored is None:
    if has_checkpoints:
      raise ValueError(
          f"{workdir} has checkpoints but no {CONFIG_FILE}, so the run they belong to is "
          f"unknown; restore its {CONFIG_FILE} or use another --workdir")
    return
  diffs = identity_differences(stored, config_dict)
  if diffs:
    raise ValueError(f"{workdir} holds another run ({describe_differences(diffs)}); use "
                     "another --workdir, or the settings it was started with")


def _holder(path: str) -> str:
  try:
    with open(path) as f:
      info = json.loads(f.read() or "{}")
  except (OSError, ValueError):
    return "another process"
  return (f"process {info.get('pid', '?')} on {info.get('host', '?')} "
          f"(since {info.get('since', '?')})")


@contextlib.contextmanager
def locked(workdir: str):
  """Holds WORKDIR/.lock for the block; WorkdirBusy names the holder if another has it.

  A workdir this call creates is removed again if the block fails before writing
  anything but the lock, so a refused or failed start leaves nothing behind.
  StartRefused if the process refuses starts now (`refusing_starts`).
  """
  if _refusal is not None and (reason := _refusal()):
    raise StartRefused(f"{workdir} not started: {reason}")
  created = not os.path.exists(workdir)
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK_FILE)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
        raise WorkdirBusy(f"{workdir} is in use by {_holder(path)}; wait for it to finish "
                          "or stop it") from None
      raise
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "since": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    try:
      yield
    except BaseException:
      if created and os.listdir(workdir) == [LOCK_FILE]:
        os.remove(path)
        os.rmdir(workdir)
      raise
  finally:
    os.close(fd)  # Releases the lock.


def lock_stamp(workdir: str) -> tuple | None:
  """The lock file's identity and last write, or None without one: it changes each time
  a run takes the lock (`locked` rewrites the holder), and reading it takes no lock, so
  a driver may watch a folder whose run is starting (`holder_if_locked`'s shared lock
  would make that start fail as busy)."""
  try:
    info = os.stat(os.path.join(workdir, LOCK_FILE))
  except FileNotFoundError:
    return None
  return (info.st_ino, info.st_mtime_ns, info.st_size)


def holder_if_locked(workdir: str) -> str | None:
  """Who holds the workdir's lock right now, or None (for a sweep driver's check)."""
  path = os.path.join(workdir, LOCK_FILE)
  if not os.path.exists(path):
    return None
  fd = os.open(path, os.O_RDONLY)
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
  except OSError:
    return _holder(path)
  finally:
    os.close(fd)
  return None
