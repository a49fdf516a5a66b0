"""A run's checkpoints (orbax) with fallback past damaged ones, and the partial metrics of
the log interval each checkpoint interrupts.

  WORKDIR/checkpoints/STEP/             orbax checkpoints (the newest `keep`)
  WORKDIR/checkpoints/metrics_carry.json {STEP: metrics summed since the last log record,
                                         and the identity of the run that saved STEP}
  WORKDIR/damaged_checkpoints/STEP-TIME/ checkpoints that could not be read, moved aside

Restoring tries the newest checkpoint first and falls back to older ones, saying which
it skipped and why; a damaged one is moved aside so the run can save that step again.
Operating-system errors (disk full, permissions) become `StorageError`, one line.
"""
from __future__ import annotations

import datetime
import os
import shutil
import sys

from experiments.storage import io_utils

CARRY_FILE = "metrics_carry.json"
IDENTITY = "identity"  # The key of a checkpoint's run identity in its carry.


class StorageError(OSError):
  """The operating system refused a write or read (disk full, permissions)."""


def _first_line(error: BaseException) -> str:
  text = str(error).split(" See full TensorStore details")[0].strip().splitlines()
  return (text[0] if text else type(error).__name__)[:300]


def _is_os_error(error: BaseException) -> bool:
  """OSError, or an orbax/tensorstore error whose message carries one."""
  if isinstance(error, OSError):
    return True
  text = str(error)
  return any(s in text for s in ("No space left", "Permission denied", "Read-only file",
                                 "Disk quota exceeded", "File too large", "os_error_code"))


class Checkpoints:
  """The checkpoints of one workdir."""

  def __init__(self, workdir: str, keep: int | None = None):
    self.workdir = workdir
    self.folder = os.path.join(workdir, "checkpoints")
    self.keep = keep
    self._manager = None

  @property
  def manager(self):
    if self._manager is None:
      import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
      self._manager = ocp.CheckpointManager(
          self.folder, options=ocp.CheckpointManagerOptions(max_to_keep=self.keep,
                                                            create=True))
    return self._manager

  def steps(self) -> list[int]:
    """Steps with a checkpoint, oldest first (without creating anything)."""
    if not os.path.isdir(self.folder):
      return []
    return sorted(int(name) for name in os.listdir(self.folder) if name.isdigit())

  def _carry_path(self) -> str:
    return os.path.join(self.folder, CARRY_FILE)

  def _carries(self) -> dict:
    path = self._carry_path()
    if not os.path.exists(path):
      return {}
    try:
      return io_utils.read_json(path)
    except io_utils.CorruptFileError as e:
      print(f"warning: {e}; the first metrics record after resuming may average fewer "
            "steps", file=sys.stderr)
      return {}

  def identity(self, step: int) -> dict | None:
    """The identity (experiments.storage.workdir.identity) of the run that saved `step`, or None
    for a checkpoint saved before checkpoints carried one."""
    return self._carries().get(str(step), {}).get(IDENTITY)

  def save(self, step: int, state, carry: dict, identity: dict | None = None) -> None:
    """Saves `state` at `step` with the metrics `carry` of the unfinished log interval
    and the `identity` of its run (so a checkpoint cannot be resumed as another run)."""
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

    try:
      # The carry first: a checkpoint never exists without it.
      kept = set(self.steps()) | {step}
      carries = {k: v for k, v in self._carries().items() if int(k) in kept}
      carries[str(step)] = {**carry, **({IDENTITY: identity} if identity is not None else {})}
      os.makedirs(self.folder, exist_ok=True)
      io_utils.write_json(self._carry_path(), carries)
      self.manager.save(step, args=ocp.args.StandardSave(state), force=True)
      self.manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      if _is_os_error(e):
        raise StorageError(f"cannot save the checkpoint of step {step} in {self.folder}: "
                           f"{_first_line(e)}; the last good checkpoint is kept") from e
      raise

  def restore_latest(self, target) -> tuple[int, object, dict] | None:
    """(step, state, carry) of the newest readable checkpoint, or None if there is none.

    Unreadable checkpoints are moved to WORKDIR/damaged_checkpoints with a message.
    """
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

    for step in reversed(self.steps()):
      try:
        state = self.manager.restore(step, args=ocp.args.StandardRestore(target))
      except Exception as e:  # pylint: disable=broad-except
        if isinstance(e, OSError) and _is_os_error(e):
          raise StorageError(f"cannot read the checkpoint of step {step} in "
                             f"{self.folder}: {_first_line(e)}") from e
        self._move_aside(step, e)
        continue
      return step, state, self._carries().get(str(step), {})
    return None

  def _move_aside(self, step: int, error: BaseException) -> None:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    destination = os.path.join(self.workdir, "damaged_checkpoints", f"{step}-{stamp}")
    os.makedirs(os.path.dirname(destination), exist_ok=True)
    shutil.move(os.path.join(self.folder, str(step)), destination)
    self.close()  # The manager caches the list of steps.
    older = [s for s in self.steps() if s < step]
    print(f"warning: the checkpoint of step {step} cannot be read ({_first_line(error)}); "
          f"moved it to {destination}; "
          + (f"trying step {older[-1]}" if older else "no older checkpoint: starting over"),
          file=sys.stderr, flush=True)

  def close(self) -> None:
    if self._manager is not None:
      self._manager.wait_until_finished()
      self._manager.close()
      self._manager = None
