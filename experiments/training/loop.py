"""The training loop of one run: workdir, checkpoints, logging, then evaluation.

`train_and_evaluate(config, workdir)` trains every model of the run's grid with the
paper's protocol and writes
  workdir/config.json       the resolved config
  workdir/metrics.jsonl     one record per log interval (step, loss, accuracy, steps/s),
                            and for a dataset one per evaluation during training
                            (step, epoch, evaluation: accuracy per split and group)
  workdir/events/           the same records as TensorBoard event files
                            (experiments/training/events.py)
  workdir/checkpoints/      orbax checkpoints every `checkpoint_every` steps (and at a
                            stop request), with the partial metrics of their log interval
  workdir/eval.json         per-length accuracies and the scores, or a dataset's
                            accuracy per split and group (experiments.training.results)
  workdir/.lock             held while a process trains there (experiments/storage/workdir.py)
and resumes from the newest readable checkpoint when run again with the same workdir
(experiments/storage/checkpoints.py); a workdir holding another run is refused.

The kind of data (a generated task drawn per step, or a dataset read in shuffled
epochs) is `experiments.training.data.source(config)`; the loop reads its batches and hands its
evaluation (`experiments.training.evaluation.for_source`) the parameters.
"""
from __future__ import annotations

import collections
import contextlib
import os
import sys
import time
from typing import Iterator, Optional

import jax
import ml_collections
import numpy as np

from experiments.storage import checkpoints
from experiments.training import data
from experiments.training import evaluation
from experiments.training import events
from experiments.training import results
from experiments.storage import io_utils
from experiments.training import steps
from experiments.training import stopping
from experiments.training import validation
from experiments.storage import workdir as workdir_lib


class NonFiniteLossError(FloatingPointError):
  pass


# Steps dispatched ahead of the host at most: the loop waits for the metrics of the step
# this many before the newest, so a stop request waits for at most this many steps and
# the progress counts steps the device has computed, not steps queued.
MAX_STEPS_AHEAD = 4


def _is_terminal(stream) -> bool:
  try:
    return stream.isatty()
  except (AttributeError, ValueError):
    return False


class Progress:
  """Training progress: a tqdm bar on a terminal; anywhere else (a log file, a pipe) one
  plain line per log interval, without carriage returns. Counts computed steps."""

  def __init__(self, total: int, initial: int, description: str, enabled: bool,
               stream=None):
    self.stream = stream or sys.stderr
    self.total, self.done, self.description = total, initial, description
    self.enabled = enabled
    self.bar = None
    if enabled and _is_terminal(self.stream):
      import tqdm  # pylint: disable=import-outside-toplevel
      self.bar = tqdm.tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                           desc=description, file=self.stream)

  @property
  def terminal(self) -> bool:
    return self.bar is not None

  def computed(self, step: int) -> None:
    """Steps up to `step` are computed."""
    if step > self.done:
      if self.bar is not None:
        self.bar.update(step - self.done)
      self.done = step

  def record(self, step: int, loss: float, accuracy: float, steps_per_second: float):
    self.computed(step)
    if self.bar is not None:
      self.bar.set_postfix(loss=f"{loss:.4f}", acc=f"{accuracy:.3f}")
    elif self.enabled:
      print(f"{self.description}: step {step}/{self.total} "
            f"({100 * step / self.total:.0f}%), loss {loss:.4f}, accuracy {accuracy:.3f}, "
            f"{steps_per_second:.1f} steps/s", file=self.stream, flush=True)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


class MetricsInterval:
  """The metrics of the current log interval, summed in float64 in step order.

  At a log step the record is the mean over the interval; a checkpoint inside an
  interval saves the partial sums (`carry`), so that a resumed run writes the same
  records as an uninterrupted one. Device arrays are only read at log and checkpoint
  steps, so steps are not synchronised with the host in between.
  """

  def __init__(self, carry: dict | None = None):
    self._reset(carry or {})

  def _reset(self, carry: dict) -> None:
    self.count = int(carry.get("count", 0))
    self.sums = {k: np.asarray(v, np.float64) for k, v in carry.get("sums", {}).items()}
    self.pending = []
    self.started, self.timed_steps = time.perf_counter(), 0

  def add(self, metrics) -> None:
    self.pending.append(metrics)
    self.timed_steps += 1

  def _fold(self) -> None:
    for metrics in self.pending:
      for k, v in metrics.items():
        self.sums[k] = self.sums.get(k, np.float64(0.0)) + np.asarray(v, np.float64)
      self.count += 1
    self.pending = []

  def carry(self) -> dict:
    self._fold()
    return {"count": self.count, "sums": {k: v.tolist() for k, v in self.sums.items()}}

  def record(self, step: int, unwrap, end_interval: bool = True) -> dict:
    """The mean over the interval so far; a record at the end of a run that is not at a
    log step keeps the interval open, so that continuing the run averages it whole."""
    self._fold()
    record = {"step": step, **{k: unwrap((v / self.count).tolist())
                               for k, v in self.sums.items()},
              "steps_per_second": self.timed_steps / (time.perf_counter() - self.started)}
    if end_interval:
      self._reset({})
    return record


class TrainingClock:
  """Wall seconds spent training, evaluation during training excluded, carried across
  resumes through the checkpoints (the x axis of the paper's Figure 2; eval.json's
  train_seconds, the running time of the paper's Table 2). Compiling counts: it is part
  of what a run costs.

  Beside them the process's CPU seconds over the same spans (all its threads, user and
  system; eval.json's train_cpu_seconds): what the run cost the machine, which neither
  other work beside it nor a paused process (SIGSTOP) adds to, as they add to wall time.
  None where a resumed run's checkpoint did not carry them (saved before they were kept).
  """

  def __init__(self, carried: float = 0.0, carried_cpu: Optional[float] = 0.0):
    self._wall = _Stopwatch(time.perf_counter, carried)
    self._cpu = None if carried_cpu is None else _Stopwatch(time.process_time, carried_cpu)

  @classmethod
  def from_carry(cls, carry: dict) -> "TrainingClock":
    """The clock of a run resumed with a checkpoint's `carry()` (empty: a new run)."""
    cpu = carry.get("train_cpu_seconds", None if "train_seconds" in carry else 0.0)
    return cls(carry.get("train_seconds", 0.0), cpu)

  def seconds(self) -> float:
    return self._wall.seconds()

  def cpu_seconds(self) -> Optional[float]:
    return None if self._cpu is None else self._cpu.seconds()

  def carry(self) -> dict:
    """What a checkpoint keeps of the clock."""
    cpu = self.cpu_seconds()
    return {"train_seconds": self.seconds(),
            **({} if cpu is None else {"train_cpu_seconds": cpu})}

  @contextlib.contextmanager
  def excluded(self) -> Iterator[None]:
    """Neither clock counts the block (evaluation during training)."""
    watches = [w for w in (self._wall, self._cpu) if w is not None]
    began = [w.now() for w in watches]
    try:
      yield
    finally:
      for watch, start in zip(watches, began):
        watch.exclude_since(start)


class _Stopwatch:
  """Seconds of one clock (`now`) since it was made, plus those carried, minus those
  excluded."""

  def __init__(self, now, carried: float):
    self.now = now
    self._offset = float(carried) - now()

  def seconds(self) -> float:
    return self._offset + self.now()

  def exclude_since(self, began: float) -> None:
    self._offset -= self.now() - began


def _check_start(workdir: str, config: ml_collections.ConfigDict, saved_steps,
                 store=None) -> None:
  """Refuses (ValueError, before anything is written) a workdir holding another run, a
  checkpoint saved by another run (config.json edited or replaced), or a checkpoint
  beyond the configured steps."""
  workdir_lib.check_identity(workdir, config.to_dict(), bool(saved_steps))
  for step in reversed(saved_steps if store is not None else []):
    saved = store.identity(step)
    diffs = workdir_lib.identity_differences(saved, config.to_dict()) if saved else []
    if diffs:
      raise ValueError(
          f"the checkpoint of step {step} in {workdir} belongs to another run "
          f"({workdir_lib.describe_differences(diffs)}) than its "
          f"{workdir_lib.CONFIG_FILE} and this command say; use the settings it was "
          "trained with, or another --workdir")
  if saved_steps and saved_steps[-1] > config.training.steps:
    raise ValueError(
        f"{workdir} has a checkpoint at step {saved_steps[-1]}, beyond "
        f"training.steps={config.training.steps}; set training.steps to at least "
        f"{saved_steps[-1]} (its models are trained that far) or use another --workdir")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       validated=None) -> dict:
  """Trains every model of the grid (one model by default), resuming from workdir,
  evaluates them, and returns the eval results (also written to workdir/eval.json).

  validated: (source, model) as `validation.validate(config, jax.device_count())`
    returned them, for a config that also passed `validation.check_fits`: the run uses
    them, so that the config is validated and its source and model built once. None:
    validated and checked here.

  Raises ValueError for bad settings or a workdir holding another run (nothing written),
  WorkdirBusy if another process trains there, StorageError for operating-system
  errors, stopping.Interrupted after saving on SIGINT/SIGTERM, NonFiniteLossError.
  """
  devices = jax.devices()
  if validated is None:
    validated = validation.validate(config, len(devices))
    validation.check_fits(config, validated)
  source, model = validated
  workdir = os.path.abspath(workdir)
  store = checkpoints.Checkpoints(workdir, config.training.checkpoints_to_keep)
  _check_start(workdir, config, store.steps(), store)
  with workdir_lib.locked(workdir):
    # Again: it may have changed meanwhile.
    _check_start(workdir, config, store.steps(), store)
    try:
      # From here to the end, SIGINT and SIGTERM are stop requests that the loop acts on
      # (before its first step, between steps): a KeyboardInterrupt raised inside XLA's
      # compilation crashed the process, and one raised in a library's callback (jax's gc
      # callback) was swallowed and the run trained to the end.
      with stopping.graceful():
        return _train_and_evaluate(config, source, model, workdir, store, devices)
    finally:
      store.close()


def _evaluation_params(trainer):
  """The stacked params [M, ...], replicated on every device when the models are split
  over the devices (evaluation splits the batch instead)."""
  params = trainer.state.params
  if trainer.num_models > 1 and trainer.state_sharding is not None:
    params = jax.device_put(params, jax.sharding.NamedSharding(
        trainer.state_sharding.mesh, jax.sharding.PartitionSpec()))
  return params


def _train_and_evaluate(config, source, model, workdir, store, devices) -> dict:
  trainer = steps.build_trainer(config, source.task, devices, model)
  t = config.training
  io_utils.write_json(os.path.join(workdir, workdir_lib.CONFIG_FILE), config.to_dict())

  start, carry = 0, {}
  restored = store.restore_latest(trainer.state)
  if restored is not None:
    start, state, carry = restored
    trainer.set_state(state)
    print(f"resuming {workdir} from step {start}", flush=True)
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  # Records after the checkpoint are redone; so is a record of an open interval (the end
  # of a run with fewer steps) at the checkpoint itself. An evaluation record at the
  # checkpoint is complete (it was written before the checkpoint): it stays.
  written = io_utils.read_jsonl(metrics_path)
  records = [r for r in written
             if r["step"] < start or (r["step"] == start and (start % t.log_every == 0
                                                               or "evaluation" in r))]
  # TensorBoard's copy of metrics.jsonl (experiments/training/events.py): rewritten from the file
  # as it is now, then equal to it after every write.
  event_log = events.EventLog(workdir, trainer.members, written)

  def write_records():
    io_utils.write_jsonl(metrics_path, records)
    event_log.sync(records)

  num_models = trainer.num_models
  evaluator = evaluation.for_source(source, trainer.model, config,
                                    trainer.batch_sharding if num_models == 1 else None)
  prefetch = data.Prefetcher(source.batch, start, t.steps, t.prefetch, trainer.place)
  bar = Progress(t.steps, start, f"{config.task} / {trainer.model.label}"
                 + (f" x {num_models} models" if num_models > 1 else ""), config.progress)
  in_flight = collections.deque()  # (step, metrics) dispatched, not yet known computed.

  def computed(step=None):
    """Waits for the oldest steps until at most MAX_STEPS_AHEAD are in flight, and for
    every step up to `step` if given; the progress counts them."""
    while in_flight and (len(in_flight) > MAX_STEPS_AHEAD
                         or (step is not None and in_flight[0][0] <= step)):
      done, metrics = in_flight.popleft()
      jax.block_until_ready(metrics)
      bar.computed(done)

  interval = MetricsInterval(carry)
  clock = TrainingClock.from_carry(carry)
  identity = workdir_lib.identity(config.to_dict())

  def check_finite(step):
    diverged = np.asarray(trainer.state.nonfinite)
    # A grid goes on while any model is finite; a single model stops.
    if diverged.all():
      raise NonFiniteLossError(
          f"non-finite loss or update at or before step {step}; stopped, and kept the last "
          f"good checkpoint (step {(store.steps() or ['none'])[-1]}) in {workdir}")

  def unwrap(values):
    return values[0] if num_models == 1 else values

  def save(step):
    check_finite(step)
    store.save(step, trainer.state, {**interval.carry(), **clock.carry()}, identity)

  def stop_if_requested(step):
    signum = stopping.requested()
    if signum is None or step >= t.steps:
      return
    if step > start:
      if step % t.checkpoint_every:
        save(step)
      raise stopping.Interrupted(
          f"stopped at step {step}; saved a checkpoint of step {step} in {store.folder}; "
          "run the same command to resume", signum)
    kept = (f"the checkpoint of step {start} in {store.folder} is kept" if start
            else "no checkpoint was saved yet")
    raise stopping.Interrupted(f"stopped before step {start + 1}; {kept}; run the same "
                               "command to resume", signum)

  try:
    stop_if_requested(start)  # A request while the model was built or restored.
    for step in range(start + 1, t.steps + 1):
      trainer.state, metrics = trainer.step(trainer.state, trainer.seeds, prefetch.next())
      interval.add(metrics)
      in_flight.append((step, metrics))
      computed()
      if step % t.log_every == 0 or step == t.steps:
        check_finite(step)
        computed(step)  # check_finite waited for the state of this step.
        records.append(interval.record(step, unwrap, step % t.log_every == 0))
        write_records()
        bar.record(step, float(np.mean(records[-1]["loss"])),
                   float(np.mean(records[-1]["accuracy"])),
                   records[-1]["steps_per_second"])
      if evaluator.due(step):
        jax.block_until_ready(trainer.state)  # The steps so far count as training.
        train_seconds = clock.seconds()
        with clock.excluded():
          record = evaluator.periodic(_evaluation_params(trainer), step, unwrap)
          records.append({**record, "train_seconds": train_seconds})
          write_records()
      if step % t.checkpoint_every == 0 or step == t.steps:
        save(step)
        computed(step)
      stop_if_requested(step)
  finally:
    prefetch.close()
    bar.close()

  def stop_during_evaluation():
    signum = stopping.requested()
    if signum is not None:
      raise stopping.Interrupted(
          f"stopped during the final evaluation, before its result; training is finished "
          f"(the checkpoint of step {t.steps} in {store.folder}); run the same command to "
          "evaluate", signum)

  # Evaluation of every model: over the length range, or on the dataset's splits.
  jax.block_until_ready(trainer.state)
  spent = clock.carry()
  result = evaluator.final(_evaluation_params(trainer), trainer.members,
                           np.asarray(trainer.state.nonfinite).tolist(),
                           int(np.asarray(trainer.state.step)[0]),
                           progress=config.progress and bar.terminal,
                           before_each=stop_during_evaluation)
  result = results.with_model(result, trainer.model)
  result.update(spent)  # train_seconds and (where kept) train_cpu_seconds.
  io_utils.write_json(os.path.join(workdir, "eval.json"), result)
  return result
