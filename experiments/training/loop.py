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

Runs that differ only in their evaluation settings train the same models (the step
function never sees them), so `companions` evaluates such runs on this run's training:
each companion's workdir gets its config.json, a metrics.jsonl whose training records
are this run's and whose evaluation records are its own, its events/ and eval.json
(with `shared_training`, the path of the run that trained its models), and no
checkpoints. Its files are those it would have written trained alone on the same
machine, but for the training seconds, which are the shared training's.

The kind of data (a generated task drawn per step, or a dataset read in shuffled
epochs) is `experiments.training.data.source(config)`; the loop reads its batches and hands its
evaluation (`experiments.training.evaluation.for_source`) the parameters.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
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
from experiments.training import learned
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

  def note(self, message: str) -> None:
    """A line beside the progress (above the bar on a terminal)."""
    if self.bar is not None:
      self.bar.write(message, file=self.stream)
    else:
      print(message, file=self.stream, flush=True)

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


# eval.json's keys for what evaluating a run cost: wall and CPU seconds (TrainingClock).
EVALUATION_TIMES = ("evaluation_seconds", "evaluation_cpu_seconds")


class TrainingClock:
  """Wall seconds spent training, evaluation during training excluded, carried across
  resumes through the checkpoints (the x axis of the paper's Figure 2; eval.json's
  train_seconds, the running time of the paper's Table 2). Compiling counts: it is part
  of what a run costs.

  Beside them the process's CPU seconds over the same spans (all its threads, user and
  system; eval.json's train_cpu_seconds): what the run cost the machine, which neither
  other work beside it nor a paused process (SIGSTOP) adds to, as they add to wall time.
  None where a resumed run's checkpoint did not carry them (saved before they were kept).

  And what the excluded evaluations cost, wall and CPU seconds (eval.json's
  evaluation_seconds and evaluation_cpu_seconds, with the final evaluation's added): a
  run's whole cost is its training's and its evaluations', those during training being
  part of a protocol that stops where its models have learned. None where a resumed run's
  checkpoint did not carry them.
  """

  def __init__(self, carried: float = 0.0, carried_cpu: Optional[float] = 0.0,
               carried_evaluation: Optional[tuple] = (0.0, 0.0)):
    self._wall = _Stopwatch(time.perf_counter, carried)
    self._cpu = None if carried_cpu is None else _Stopwatch(time.process_time, carried_cpu)
    self._evaluation = None if carried_evaluation is None else list(carried_evaluation)

  @classmethod
  def from_carry(cls, carry: dict) -> "TrainingClock":
    """The clock of a run resumed with a checkpoint's `carry()` (empty: a new run)."""
    older = "train_seconds" in carry  # Keys a checkpoint lacks were not kept when saved.
    cpu = carry.get("train_cpu_seconds", None if older else 0.0)
    evaluation = tuple(carry[k] for k in EVALUATION_TIMES) if EVALUATION_TIMES[0] in carry \
        else None if older else (0.0, 0.0)
    return cls(carry.get("train_seconds", 0.0), cpu, evaluation)

  def seconds(self) -> float:
    return self._wall.seconds()

  def cpu_seconds(self) -> Optional[float]:
    return None if self._cpu is None else self._cpu.seconds()

  def evaluation_seconds(self) -> Optional[dict]:
    """{evaluation_seconds, evaluation_cpu_seconds} of the evaluations so far, or None."""
    return None if self._evaluation is None else dict(zip(EVALUATION_TIMES, self._evaluation))

  def carry(self) -> dict:
    """What a checkpoint keeps of the clock."""
    cpu = self.cpu_seconds()
    return {"train_seconds": self.seconds(),
            **({} if cpu is None else {"train_cpu_seconds": cpu}),
            **(self.evaluation_seconds() or {})}

  @contextlib.contextmanager
  def evaluating(self) -> Iterator[None]:
    """The block counts as evaluation (the final one, after training)."""
    began = (time.perf_counter(), time.process_time())
    try:
      yield
    finally:
      if self._evaluation is not None:
        self._evaluation[0] += time.perf_counter() - began[0]
        self._evaluation[1] += time.process_time() - began[1]

  @contextlib.contextmanager
  def excluded(self) -> Iterator[None]:
    """Neither training clock counts the block, which counts as evaluation (evaluation
    during training)."""
    watches = [w for w in (self._wall, self._cpu) if w is not None]
    began = [w.now() for w in watches]
    try:
      with self.evaluating():
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


# The key of a companion's eval.json naming the run that trained its models (its folder,
# relative to the companion's).
SHARED_TRAINING = "shared_training"
METRICS_FILE = "metrics.jsonl"


def _kept_records(written: list, start: int, log_every: int) -> list:
  """The records of metrics.jsonl a run resumed at `start` keeps: those before the
  checkpoint, and at it an evaluation record (written before the checkpoint) or the
  record of a whole log interval; the rest are redone (a record of an open interval,
  at the end of a run with fewer steps, too)."""
  return [r for r in written
          if r["step"] < start or (r["step"] == start and (start % log_every == 0
                                                            or "evaluation" in r))]


def _evaluation_steps(records: list) -> set:
  return {r["step"] for r in records if "evaluation" in r}


def companion_resumable(workdir: str, companion_workdir: str, start: int,
                        log_every: int) -> bool:
  """Whether a companion of the run in `workdir` can go on from that run's checkpoint
  at `start`: its metrics.jsonl holds an evaluation record at every step the run's
  records kept at `start` hold one (it was evaluated beside that training so far).
  Always at start 0."""
  def kept(folder):
    return _kept_records(io_utils.read_jsonl(os.path.join(folder, METRICS_FILE)), start,
                         log_every)
  return _evaluation_steps(kept(workdir)) <= _evaluation_steps(kept(companion_workdir))


def _check_companions(config, workdir: str, companions, start: int) -> None:
  """ValueError (before anything is written) for a companion that cannot share this
  run's training: other settings, a folder of its own run (checkpoints, another
  identity), or one not evaluated beside this training up to its checkpoint."""
  folders = [os.path.abspath(workdir)]
  for other_config, other_workdir in companions:
    other_workdir = os.path.abspath(other_workdir)
    if other_workdir in folders:
      raise ValueError(f"companions: {other_workdir} is given twice (or is the run's own "
                       "workdir)")
    folders.append(other_workdir)
    diffs = workdir_lib.shared_training_differences(config.to_dict(), other_config.to_dict())
    if diffs:
      raise ValueError(
          f"companions: {other_workdir} cannot share the training of {workdir} "
          f"({workdir_lib.describe_differences(diffs)}); only evaluation settings other "
          f"than {', '.join(workdir_lib.EVALUATION_SCHEDULE)} may differ")
    if checkpoints.Checkpoints(other_workdir).steps():
      raise ValueError(f"companions: {other_workdir} has checkpoints of its own; resume it "
                       "on its own")
    workdir_lib.check_identity(other_workdir, other_config.to_dict(), False)
    if not companion_resumable(workdir, other_workdir, start, config.training.log_every):
      raise ValueError(
          f"companions: {other_workdir} was not evaluated beside the training of "
          f"{workdir} up to its checkpoint of step {start}; train it on its own")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       validated=None, companions=()) -> dict:
  """Trains every model of the grid (one model by default), resuming from workdir,
  evaluates them, and returns the eval results (also written to workdir/eval.json).

  validated: (source, model) as `validation.validate(config, jax.device_count())`
    returned them, for a config that also passed `validation.check_fits`: the run uses
    them, so that the config is validated and its source and model built once. None:
    validated and checked here.
  companions: (config, workdir) pairs of runs evaluated on this run's training (see the
    module docstring), each differing from `config` only in evaluation settings other
    than the evaluation's steps (`workdir_lib.shared_training_differences`); their
    eval.json files are written before this run's.

  Raises ValueError for bad settings or a workdir holding another run (nothing written),
  WorkdirBusy if another process trains there, StartRefused if this process refuses
  starts now (a drained sweep's task, `workdir.refusing_starts`), StorageError for
  operating-system errors, stopping.Interrupted after saving on SIGINT/SIGTERM,
  NonFiniteLossError.
  """
  devices = jax.devices()
  if validated is None:
    validated = validation.validate(config, len(devices))
    validation.check_fits(config, validated)
  source, model = validated
  # Each companion's own model: the same parameters, its own evaluation (e.g. the
  # position sampler at test time).
  built = []
  for other_config, other_workdir in companions:
    other_validated = validation.validate(other_config, len(devices))
    validation.check_fits(other_config, other_validated)
    built.append((other_config, os.path.abspath(other_workdir), other_validated[1]))
  companions = [(c, w) for c, w, _ in built]
  workdir = os.path.abspath(workdir)
  store = checkpoints.Checkpoints(workdir, config.training.checkpoints_to_keep)

  def check():
    saved = store.steps()
    _check_start(workdir, config, saved, store)
    _check_companions(config, workdir, companions, saved[-1] if saved else 0)

  check()
  with contextlib.ExitStack() as locks:
    for folder in [workdir] + [w for _, w in companions]:
      locks.enter_context(workdir_lib.locked(folder))
    check()  # Again: it may have changed meanwhile.
    try:
      # From here to the end, SIGINT and SIGTERM are stop requests that the loop acts on
      # (before its first step, between steps): a KeyboardInterrupt raised inside XLA's
      # compilation crashed the process, and one raised in a library's callback (jax's gc
      # callback) was swallowed and the run trained to the end.
      with stopping.graceful():
        return _train_and_evaluate(config, source, model, workdir, store, devices, built)
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


class _Records:
  """A run's metrics.jsonl, kept in memory and written whole at every change, with its
  TensorBoard copy (experiments/training/events.py: rewritten from the file as it was at
  the start, then equal to it after every write)."""

  def __init__(self, workdir: str, members, written: list, kept: list):
    self.path = os.path.join(workdir, METRICS_FILE)
    self.records = kept
    self._events = events.EventLog(workdir, members, written)

  def add(self, record: dict) -> None:
    self.records.append(record)
    io_utils.write_jsonl(self.path, self.records)
    self._events.sync(self.records)


@dataclasses.dataclass
class _Companion:
  """A run evaluated on the training of the loop's run: its evaluation and records."""
  config: ml_collections.ConfigDict
  workdir: str
  model: object
  evaluator: object
  records: _Records


def _train_and_evaluate(config, source, model, workdir, store, devices, companions) -> dict:
  trainer = steps.build_trainer(config, source.task, devices, model)
  t = config.training
  num_models = trainer.num_models
  sharding = trainer.batch_sharding if num_models == 1 else None
  evaluator = evaluation.for_source(source, trainer.model, config, sharding)
  for folder, run_config in [(workdir, config)] + [(w, c) for c, w, _ in companions]:
    io_utils.write_json(os.path.join(folder, workdir_lib.CONFIG_FILE), run_config.to_dict())

  start, carry = 0, {}
  restored = store.restore_latest(trainer.state)
  if restored is not None:
    start, state, carry = restored
    trainer.set_state(state)
    print(f"resuming {workdir} from step {start}", flush=True)
  written = io_utils.read_jsonl(os.path.join(workdir, METRICS_FILE))
  kept = _kept_records(written, start, t.log_every)
  records = _Records(workdir, trainer.members, written, list(kept))
  sharing = []
  for other_config, other_workdir, other_model in companions:
    # The training records are this run's, the evaluation records its own.
    other_written = io_utils.read_jsonl(os.path.join(other_workdir, METRICS_FILE))
    own = [r for r in _kept_records(other_written, start, t.log_every) if "evaluation" in r]
    merged = sorted([r for r in kept if "evaluation" not in r] + own,
                    key=lambda r: (r["step"], "evaluation" in r))
    sharing.append(_Companion(
        other_config, other_workdir, other_model,
        evaluation.for_source(source, other_model, other_config, sharding),
        _Records(other_workdir, trainer.members, other_written, merged)))
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
  stop_when = learned.threshold(config)

  def has_learned(record):
    # Off (0) for any run, e.g. a dataset's, whose evaluations score no training lengths.
    return bool(stop_when) and learned.learned(record["evaluation"]["train_range"],
                                               trainer.members, stop_when)

  # The step at which `training.stop_when_learned` stopped training: a run resumed from
  # the checkpoint of that step (stopped during its final evaluation) trains no further.
  stopped = next((start for r in kept if r["step"] == start and "evaluation" in r
                  and has_learned(r)), None) if start < t.steps else None

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
    for step in range(start + 1, (stopped or t.steps) + 1):
      trainer.state, metrics = trainer.step(trainer.state, trainer.seeds, prefetch.next())
      interval.add(metrics)
      in_flight.append((step, metrics))
      computed()
      if step % t.log_every == 0 or step == t.steps:
        check_finite(step)
        computed(step)  # check_finite waited for the state of this step.
        record = interval.record(step, unwrap, step % t.log_every == 0)
        for run in [records] + [c.records for c in sharing]:
          run.add(record)
        bar.record(step, float(np.mean(record["loss"])), float(np.mean(record["accuracy"])),
                   record["steps_per_second"])
      if evaluator.due(step):
        jax.block_until_ready(trainer.state)  # The steps so far count as training.
        train_seconds = clock.seconds()
        with clock.excluded():
          params = _evaluation_params(trainer)
          own = None  # This run's record (the companions evaluate their own way).
          for run, run_evaluator in ([(records, evaluator)]
                                     + [(c.records, c.evaluator) for c in sharing]):
            record = run_evaluator.periodic(params, step, unwrap)
            run.add({**record, "train_seconds": train_seconds})
            own = own or record
        if step < t.steps and has_learned(own):
          stopped = step
          bar.note(f"{config.task}: learned its training lengths at step {step} "
                   f"(training.stop_when_learned={stop_when}): training stops here")
      if step % t.checkpoint_every == 0 or step == t.steps or step == stopped:
        save(step)
        computed(step)
      if step == stopped:
        break
      stop_if_requested(step)
  finally:
    prefetch.close()
    bar.close()

  def stop_during_evaluation():
    signum = stopping.requested()
    if signum is not None:
      raise stopping.Interrupted(
          f"stopped during the final evaluation, before its result; training is finished "
          f"(the checkpoint of step {trained_to} in {store.folder}); run the same command "
          "to evaluate", signum)

  # Evaluation of every model: over the length range, or on the dataset's splits; the
  # companions' eval.json first, so that this run's says that all are written.
  jax.block_until_ready(trainer.state)
  spent = clock.carry()
  params = _evaluation_params(trainer)
  diverged = np.asarray(trainer.state.nonfinite).tolist()
  trained_to = int(np.asarray(trainer.state.step)[0])

  def final(run_config, run_model, run_evaluator):
    before = clock.evaluation_seconds()
    with clock.evaluating():
      result = run_evaluator.final(params, trainer.members, diverged, trained_to,
                                   progress=run_config.progress and bar.terminal,
                                   before_each=stop_during_evaluation)
    after = clock.evaluation_seconds()
    result = results.with_model(result, run_model)
    # train_seconds and (where kept) train_cpu_seconds; the evaluations during training
    # (of every run sharing it) and this run's final one, where kept.
    result.update(spent)
    if after is not None:
      result.update({k: spent[k] + after[k] - before[k] for k in EVALUATION_TIMES})
    if stopped is not None:
      result[learned.STOPPED] = stopped
    return result

  for companion in sharing:
    result = final(companion.config, companion.model, companion.evaluator)
    result[SHARED_TRAINING] = os.path.relpath(workdir, companion.workdir)
    io_utils.write_json(os.path.join(companion.workdir, "eval.json"), result)
  result = final(config, trainer.model, evaluator)
  io_utils.write_json(os.path.join(workdir, "eval.json"), result)
  return result
