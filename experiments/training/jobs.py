"""The sweep's jobs: (task, variant) jobs made from a sweep config, each a grid of seeds x
learning rates trained by the loop into SWEEP_DIR/TASK/VARIANT/, their status read from
their folders, and the executors that run them (local processes or Ray). The command
line is experiments/sweep.py (python -m experiments.sweep), which documents the files
and executors."""
from __future__ import annotations

from collections.abc import Mapping
import contextlib
import copy
import ctypes
import dataclasses
import fnmatch
import glob
import importlib
import multiprocessing
import os
import re
import shutil
import signal
import sys
import threading
import time
from typing import Callable

import ml_collections

from experiments import cli
from experiments.storage import checkpoints as checkpoints_lib
from experiments.storage import io_utils
from experiments.storage import results_git
from experiments.storage import workdir as workdir_lib
from experiments.training import compile_cache
from experiments.training import data
from experiments.training import learned
from experiments.training import loop
from experiments.training import stopping
from experiments.training import validation

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXECUTORS = ("local", "ray")
# Minutes between the sweep's progress lines while jobs train (`Progress.heartbeat`).
REPORT_EVERY = 10.0


@dataclasses.dataclass(frozen=True)
class Job:
  task: str
  pe: str  # The label of the job's model (its protocol's `label`: the encoding).
  workdir: str  # SWEEP_DIR/TASK/VARIANT.
  config: dict  # The job's full config (task and variant's overrides set).
  variant: str = ""  # The variant's name (for `sweep.encodings`: the encoding).
  # Jobs evaluated on this job's training (`share_training`), trained with it.
  companions: tuple = ()

  @property
  def name(self) -> str:
    return f"{self.task}/{self.variant or self.pe}"

  @property
  def members(self) -> tuple:
    """The job and its companions: the jobs one training finishes."""
    return (self,) + self.companions

  @property
  def companion_args(self) -> list:
    """The companions as `run_job` takes them: (config, workdir) pairs."""
    return [(c.config, c.workdir) for c in self.companions]


# A variant's name is a folder name: letters, digits and _ . + = , - (not first: . or -).
_VARIANT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=,-]{0,99}")
# Settings a variant may not set: the job's task is its folder, `sweep` the job list.
_NOT_OVERRIDABLE = ("task", "sweep")


def _is_mapping(value) -> bool:
  return isinstance(value, (Mapping, ml_collections.ConfigDict))


def _flat_overrides(overrides, prefix: str = "") -> dict:
  """{dotted path: value} of a variant's overrides, written with dotted keys
  ({"model.pe": "rope"}) or nested ({"model": {"pe": "rope"}}), or both."""
  if not _is_mapping(overrides):
    raise ValueError(f"must map settings to values, got {overrides!r}")
  flat = {}
  for key, value in overrides.items():
    path = f"{prefix}{key}"
    if _is_mapping(value):
      flat.update(_flat_overrides(value, path + "."))
    else:
      flat[path] = value
  return flat


def variants(sweep_config) -> list[tuple[str, dict]]:
  """The sweep's variants in job order: (name, {dotted setting: value}).

  `sweep.encodings` (each encoding ENC is the variant ENC: {"model.pe": ENC}) come first,
  then `sweep.variants`: (name, overrides) pairs (order kept) or a mapping name ->
  overrides (a ConfigDict sorts its names). ValueError for a name that is not a valid
  folder name or is given twice.
  """
  pairs = [(pe, {"model.pe": pe}) for pe in sweep_config.get("encodings", None) or ()]
  given = sweep_config.get("variants", None) or ()
  if _is_mapping(given):
    given = list(given.items())
  for entry in given:
    if not isinstance(entry, (tuple, list)) or len(entry) != 2:
      raise ValueError(f"sweep.variants: each variant must be a (name, overrides) pair, "
                       f"got {entry!r}")
    name, overrides = entry
    try:
      pairs.append((name, _flat_overrides(overrides)))
    except ValueError as e:
      raise ValueError(f"sweep.variants: the overrides of {name!r} {e}") from None
  seen = set()
  for name, _ in pairs:
    if (not isinstance(name, str) or not _VARIANT_NAME.fullmatch(name)
        or ".replaced-" in name):
      raise ValueError(
          f"sweep: the variant name {name!r} is not a valid folder name (1 to 100 of "
          "letters, digits and _ . + = , -, not starting with . or -, without '.replaced-')")
    if name in seen:
      raise ValueError(f"sweep: the variant name {name!r} is given twice "
                       "(in sweep.encodings or sweep.variants)")
    seen.add(name)
  return pairs


def task_overrides(sweep_config) -> dict[str, dict]:
  """{task: {dotted setting: value}} of `sweep.task_overrides`, (task, overrides) pairs
  set on every job of that task before its variant's overrides (a scale's settings for
  one task, e.g. the longer training range configs/scales.py gives
  missing_duplicate_string). A task the sweep leaves out keeps its entry, unused, so
  that `--config.sweep.tasks` can narrow a scale's sweep. ValueError for a name that is
  no task at all (a typo) or a task given twice."""
  given = sweep_config.get("task_overrides", None) or ()
  if _is_mapping(given):
    given = list(given.items())
  known = data.task_names()
  out = {}
  for entry in given:
    if not isinstance(entry, (tuple, list)) or len(entry) != 2:
      raise ValueError(f"sweep.task_overrides: each entry must be a (task, overrides) pair, "
                       f"got {entry!r}")
    task, overrides = entry
    if task not in known or task in out:
      raise ValueError(f"sweep.task_overrides: {task!r} is "
                       + ("given twice" if task in out else
                          f"no task; valid names: {', '.join(known)}"))
    try:
      out[task] = _flat_overrides(overrides)
    except ValueError as e:
      raise ValueError(f"sweep.task_overrides: the overrides of {task!r} {e}") from None
  return out


def _override(config: ml_collections.ConfigDict, variant: str, path: str, value,
              who: str = "variant") -> None:
  """Sets one dotted setting of a job's config; ValueError for an unknown one."""
  where = f"sweep: {who} {variant!r} overrides {path!r}"
  parts = path.split(".")
  if parts[0] in _NOT_OVERRIDABLE:
    raise ValueError(f"{where}, which a {who} may not set ({', '.join(_NOT_OVERRIDABLE)} "
                     "are the sweep's own)")
  node = config
  for i, part in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      raise ValueError(f"{where}, but the config has no setting {'.'.join(parts[:i + 1])}")
    if i < len(parts) - 1:
      node = node[part]
  if isinstance(node[parts[-1]], ml_collections.ConfigDict):
    raise ValueError(f"{where}, a section, not a setting; name its settings instead")
  try:
    node[parts[-1]] = value
  except (TypeError, ValueError) as e:
    raise ValueError(f"{where} with {value!r}: {str(e).splitlines()[0]}") from None


def make_jobs(config: ml_collections.ConfigDict, sweep_dir: str) -> list[Job]:
  """One job per (task, variant) of config.sweep, validated before anything runs.

  Variants are `sweep.encodings` and `sweep.variants` (see `variants`); a job's config
  is the sweep's config with its task, its task's overrides (`task_overrides`) and its
  variant's overrides set, in that order, and its folder
  SWEEP_DIR/TASK/VARIANT.
  """

  pairs = variants(config.sweep)
  encodings = set(config.sweep.get("encodings", None) or ())
  by_task = task_overrides(config.sweep)
  _job_outputs(config.to_dict())  # ValueError for an unknown name.
  for task in set(by_task) - set(config.sweep.tasks):  # Unused, but no unknown settings.
    scratch = copy.deepcopy(config)
    for path, value in by_task[task].items():
      _override(scratch, task, path, value, who="task")
  jobs = []
  for task in config.sweep.tasks:
    for name, overrides in pairs:
      job_config = copy.deepcopy(config)
      job_config.task = task
      for path, value in by_task.get(task, {}).items():
        _override(job_config, task, path, value, who="task")
      for path, value in overrides.items():
        _override(job_config, name, path, value)
      try:
        _, model = validation.validate(job_config)
      except ValueError as e:
        if name in encodings:  # A variant of `sweep.encodings`: the message as before.
          raise
        raise ValueError(f"variant {name!r} of task {task}: {e}") from None
      jobs.append(Job(task, model.label,
                      os.path.join(os.path.abspath(sweep_dir), task, name),
                      job_config.to_dict(), name))
  return jobs


def select(jobs: list[Job], only=()) -> list[Job]:
  """The jobs whose name (TASK/VARIANT) matches one of the shell patterns `only`
  (fnmatch: `*`, `?`, `[...]`), in the sweep's order; every job when `only` is empty.
  ValueError when a pattern matches no job, naming the tasks and variants."""
  patterns = [p.strip() for p in only if p.strip()]
  if not patterns:
    return list(jobs)
  unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(j.name, p) for j in jobs)]
  if unmatched:
    tasks = ", ".join(dict.fromkeys(j.task for j in jobs))
    names = ", ".join(dict.fromkeys(j.name.split("/", 1)[1] for j in jobs))
    raise ValueError(f"--only: {', '.join(repr(p) for p in unmatched)} matches no job; "
                     f"jobs are TASK/VARIANT with TASK one of {tasks} and VARIANT one of "
                     f"{names} (shell patterns, e.g. '*/rope*')")
  return [j for j in jobs if any(fnmatch.fnmatchcase(j.name, p) for p in patterns)]


def _check_max_jobs(max_jobs: int | None) -> None:
  if max_jobs is not None and max_jobs < 1:
    raise ValueError(f"--max_jobs must be >= 1 (or unset: every job), got {max_jobs}")


# Files a job may be asked to leave beside eval.json (`sweep.job_outputs`, a tuple of
# names), written by run_job from the job's checkpoints right after training, for
# analyses of a results folder committed without checkpoints: name -> (module,
# function(workdir), file name).
JOB_OUTPUTS = {
    "ito_analysis_inputs": ("experiments.analysis.ito", "write_job_inputs",
                            "ito_analysis_inputs.npz"),
}


def _job_outputs(config: dict) -> list[tuple[str, str, str]]:
  names = (config.get("sweep") or {}).get("job_outputs") or ()
  unknown = [n for n in names if n not in JOB_OUTPUTS]
  if unknown:
    raise ValueError(f"sweep.job_outputs: unknown {', '.join(map(repr, unknown))}; valid "
                     f"names: {', '.join(JOB_OUTPUTS)}")
  return [JOB_OUTPUTS[n] for n in names]


def _missing_outputs(job: Job) -> list[str]:
  """The `sweep.job_outputs` files the job's folder lacks."""
  return [file for _, _, file in _job_outputs(job.config)
          if not os.path.exists(os.path.join(job.workdir, file))]


def _has_checkpoints(workdir: str) -> bool:
  folder = os.path.join(workdir, "checkpoints")
  return os.path.isdir(folder) and any(not n.startswith(".") for n in os.listdir(folder))


def job_status(job: Job) -> tuple[bool, str | None]:
  """(finished, why not) of a job from its folder.

  Finished: eval.json is for the configured steps and the folder's config.json has the
  job's identity and evaluation settings, and the files of `sweep.job_outputs` are
  there (or cannot be made any more: no checkpoints, e.g. a results folder committed
  without them). The reason is None for a job not yet run or partly trained, and says
  what changed, is damaged or missing otherwise.
  """
  finished, why = _trained_status(job)
  if finished:
    missing = _missing_outputs(job)
    if missing and _has_checkpoints(job.workdir):
      return False, f"{', '.join(missing)} missing; writing it from the checkpoints"
  return finished, why


_CHANGED = "its folder holds a run with other settings"


def _trained_status(job: Job) -> tuple[bool, str | None]:
  """job_status without `sweep.job_outputs`."""

  path = os.path.join(job.workdir, "eval.json")
  if not os.path.exists(path):
    return False, None
  try:
    result = io_utils.read_json(path)
    stored = workdir_lib.stored_config(job.workdir) or {}
  except io_utils.CorruptFileError as e:
    return False, f"{e}; evaluating it again"
  changed = workdir_lib.identity_differences(stored, job.config)
  if changed:
    return False, f"{_CHANGED} ({workdir_lib.describe_differences(changed)})"
  changed = workdir_lib.evaluation_differences(stored, job.config)
  if changed:
    return False, ("evaluation settings changed ("
                   + workdir_lib.describe_differences(changed) + "); evaluating again")
  steps = job.config["training"]["steps"]
  if result.get("step") != steps and not _stopped_within(result, steps):
    return False, f"eval.json is for step {result.get('step')}, the config says {steps}"
  return True, None


def _stopped_within(result: dict, steps: int) -> bool:
  """Whether eval.json is of a run that `training.stop_when_learned` stopped within
  `steps` (the rule is part of the run's identity, so it would stop there again)."""
  stopped = result.get(learned.STOPPED)
  return stopped is not None and stopped == result.get("step") and stopped <= steps


def is_finished(job: Job) -> bool:
  return job_status(job)[0]


# A job whose settings equal those of a finished job in another sweep folder
# (`--reuse_from`) is copied from it instead of trained again: e.g. the "sorted" jobs of
# configs/table3.py are configs/table1.py's randomized_sin_cos jobs at the same scale (the
# paper also takes that column of its Table 3 from its Table 1). The copy holds the
# source's small files and REUSED_FROM, which names the source folder.
REUSED_FROM = "reused_from.json"


def check_reuse_folders(folders) -> list[str]:
  """The `--reuse_from` folders, each an existing folder; ValueError (one line) otherwise."""
  for folder in folders:
    if not os.path.isdir(folder):
      raise ValueError(f"--reuse_from: {folder!r} is not a folder (a sweep folder whose "
                       "finished jobs may be reused)")
  return list(folders)


def find_reusable(job: Job, folders) -> str | None:
  """The folder of a finished job in one of `folders` (sweep folders: FOLDER/TASK/NAME)
  with `job`'s task, identity, evaluation settings and steps, and every file its
  `sweep.job_outputs` names; None if there is none, or if `job`'s own folder holds
  anything (a started run is resumed, not replaced)."""
  if os.path.exists(job.workdir) and os.listdir(job.workdir):
    return None
  for folder in folders:
    for candidate in sorted(glob.glob(os.path.join(folder, job.task, "*"))):
      if (".replaced-" in os.path.basename(candidate) or not os.path.isdir(candidate)
          or os.path.realpath(candidate) == os.path.realpath(job.workdir)):
        continue
      other = dataclasses.replace(job, workdir=candidate)
      if _trained_status(other)[0] and not _missing_outputs(other):
        return candidate
  return None


def reuse(job: Job, source: str) -> None:
  """Copies the small files of the finished job in `source` into `job.workdir`, with
  REUSED_FROM naming `source` (relative to the job's folder). The folder appears whole or
  not at all (assembled beside it in a hidden folder, which reports skip, then renamed)."""
  outputs = [file for _, _, file in _job_outputs(job.config)]
  parent, name = os.path.split(job.workdir)
  staging = os.path.join(parent, f".{name}.reusing")
  shutil.rmtree(staging, ignore_errors=True)
  os.makedirs(staging)
  copied = []
  for path in results_git.job_files(source, outputs):
    name = os.path.basename(path)
    if name != REUSED_FROM:
      shutil.copyfile(path, os.path.join(staging, name))
      copied.append(name)
  io_utils.write_json(os.path.join(staging, REUSED_FROM), {
      "source": os.path.relpath(os.path.realpath(source), os.path.realpath(job.workdir)),
      "files": copied})
  if os.path.isdir(job.workdir):
    os.rmdir(job.workdir)  # Empty (find_reusable).
  os.rename(staging, job.workdir)


# Jobs that differ only in evaluation settings (e.g. configs/su.py's randomized_rope and
# randomized_rope+even, whose test positions differ) train the same models: the sweep
# trains them once and evaluates the later ones on the first one's training (the
# training loop's `companions`, experiments/training/loop.py).


def _latest_checkpoint(workdir: str) -> int:
  if not _has_checkpoints(workdir):
    return 0
  return max(checkpoints_lib.Checkpoints(workdir).steps() or [0])


def _can_share(host: Job, job: Job) -> bool:
  """Whether `job` can be evaluated on the training of `host`: the same settings but
  the evaluation's (its steps too), neither with `sweep.job_outputs` (made from a job's
  own checkpoints), `job` without checkpoints of its own and evaluated beside `host`'s
  training up to `host`'s checkpoint (nothing to cover for a host not started)."""
  if (_job_outputs(host.config) or _job_outputs(job.config)
      or workdir_lib.shared_training_differences(host.config, job.config)
      or _has_checkpoints(job.workdir)):
    return False
  try:
    workdir_lib.check_identity(job.workdir, job.config, False)  # Not another run's folder.
    return loop.companion_resumable(host.workdir, job.workdir,
                                    _latest_checkpoint(host.workdir),
                                    host.config["training"]["log_every"])
  except (ValueError, io_utils.CorruptFileError):  # Such a job trains on its own.
    return False


def share_training(todo: list[Job], alone=()) -> list[Job]:
  """The trainings that run `todo` (jobs to train, in the sweep's order): each job joins
  the first earlier one it can share a training with (`_can_share`) as a companion
  (`Job.companions`), and trains on its own otherwise, as do the jobs `alone` (a job
  whose folder needs a look: settings changed, a damaged file)."""
  alone = {job.name for job in alone}
  hosts = []
  for job in todo:
    i = None if job.name in alone else next(
        (i for i, host in enumerate(hosts) if host.name not in alone and _can_share(host, job)),
        None)
    if i is None:
      hosts.append(job)
    else:
      hosts[i] = dataclasses.replace(hosts[i], companions=hosts[i].companions + (job,))
  return hosts


def _model_scores(model: dict) -> dict:
  """The scores of one model of an eval.json record: a generated task's `scores`
  (training range, unseen lengths), or a dataset's overall accuracy per split."""
  if "scores" in model:
    return model["scores"]
  return {split: by_group.get("overall") for split, by_group in model["accuracy"].items()}


def _run_config(config_dict: dict) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict(config_dict)
  config.progress = False
  return config


def run_job(config_dict: dict, workdir: str, companions=()) -> dict:
  """Trains and evaluates one job (resuming from its checkpoints), and its companions,
  (config, workdir) pairs of jobs evaluated on its training (`share_training`); returns
  its scores, one dict per model (`_model_scores`)."""

  config = _run_config(config_dict)
  compile_cache.enable(config.get("compilation_cache", ""))  # Also on Ray workers.
  # The folder is SWEEP_DIR/TASK/VARIANT; the model's label is not needed to read it.
  job = Job(config.task, "", workdir, config_dict, os.path.basename(os.path.normpath(workdir)))
  outputs = _job_outputs(config_dict)
  if outputs and _trained_status(job)[0]:  # Trained before; only an output is missing.
    result = io_utils.read_json(os.path.join(workdir, "eval.json"))
  else:
    result = loop.train_and_evaluate(
        config, workdir, companions=[(_run_config(c), w) for c, w in companions])
  for module, function, file in outputs:  # From the checkpoints, before they are gone.
    if not os.path.exists(os.path.join(workdir, file)):
      getattr(importlib.import_module(module), function)(workdir)
  return {"job": job.name,
          "scores": [_model_scores(m) for m in result["models"]]}


def _error_kind(error: BaseException) -> tuple[str, int]:
  """(description, worker exit code) of a job's exception."""

  if isinstance(error, stopping.Interrupted):
    return cli.one_line(error), error.exit_code
  code = cli.EXIT_BAD_INPUT if isinstance(error, ValueError) else cli.EXIT_FAILED
  return f"{type(error).__name__}: {cli.one_line(error)}", code


def _stop_with_parent(parent_pid: int) -> None:
  """Asks Linux to send SIGTERM to this process when its parent dies (a killed driver
  must not leave workers training); the worker then saves and stops like on Ctrl-C."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG.
  except (OSError, AttributeError):
    pass  # Not Linux: the restarted driver still respects the workers' locks.
  if os.getppid() != parent_pid:  # The parent died before prctl.
    os._exit(143)  # pylint: disable=protected-access


def _worker(job_fn, config: dict, workdir: str, companions, parent_pid: int,
            messages) -> None:
  """A local worker process: runs one job (and its companions), reports (workdir, error
  or None), exits with 0, 2 (bad input), 1 (failed) or 128 + signal (interrupted, after
  saving)."""

  def report(message):
    try:
      messages.put((workdir, message))
    except OSError:
      pass  # The driver is gone.

  signal.signal(DRAIN_SIGNAL, signal.SIG_IGN)  # Meant for the driver (`_Drain`).
  _stop_with_parent(parent_pid)
  try:
    with stopping.graceful():  # The training loop's own `graceful()` joins this one.
      job_fn(config, workdir, companions)
  except KeyboardInterrupt:
    sys.exit(130)
  except Exception as e:  # pylint: disable=broad-except
    message, code = _error_kind(e)
    report(message)
    sys.exit(code)
  report(None)


class Progress:
  """Prints jobs done / running / left and an ETA from the trainings finished so far.

  The ETA counts trainings, not jobs: jobs evaluated on another's training
  (`share_training`) cost no training of their own. It is the mean wall time of the
  finished trainings times the trainings not started, plus what remains of each running
  one, spread over the workers (never below the longest single remainder). A running
  training's remainder is read from its own pace (the steps its metrics.jsonl records
  since it started, against its config's `training.steps`), else what the mean leaves
  of it: a job slower than the mean is not reported as due. Before any training has
  finished, the running ones' paces stand in for the mean (no ETA without a pace).
  The pace is the last logged interval's steps per second once a training has logged
  two since it started (the first holds its compilation, and the last follows the
  machine's load as other work starts and ends), before that its steps over its time.

  `heartbeat(seconds)` also prints the count, the ETA and each running training's step
  every `seconds` while jobs train, so a long job's log says how far it got.
  """

  def __init__(self, total: int, already_done: int, workers: int, trainings: int,
               on_finished: Callable[[Job], None] | None = None):
    self.total, self.done, self.workers = total, already_done, max(1, workers)
    self.on_finished = on_finished  # Called with every job that finished (not failed).
    self.failed = []
    self.later = 0  # Jobs to run that this run leaves to the next (--max_jobs, drain).
    self._durations = []  # Wall seconds of each finished training.
    self._started = {}
    self._unstarted = trainings  # Trainings of this run not started yet.
    self._print_lock = threading.Lock()  # The heartbeat prints from its own thread.

  def start(self, job: Job):
    """A training starts: the job and its companions."""
    self._started[job.name] = (time.time(), job, _trained_to(job.workdir) or 0)
    self._unstarted -= 1
    shared = f" (with {', '.join(c.name for c in job.companions)})" if job.companions else ""
    self._say(f"[sweep] started {job.name}{shared}: {self._counts()}")

  def finish(self, job: Job, error: str | None = None):
    """A training ended: each of its jobs finished, or failed with `error`."""
    elapsed = time.time() - self._started.pop(job.name, (time.time(),))[0]
    if not error:
      self._durations.append(elapsed)
    for member in job.members:
      shared = f" (on the training of {job.name})" if member is not job else ""
      if error:
        self.failed.append(member.name)
        self._say(f"[sweep] FAILED {member.name}{shared} after {elapsed:.0f} s: {error}")
        continue
      self.done += 1
      self._say(f"[sweep] finished {member.name}{shared} in {elapsed:.0f} s")
      if self.on_finished is not None:
        self.on_finished(member)
    self.report()

  def stop(self, job: Job, how: str):
    elapsed = time.time() - self._started.pop(job.name, (time.time(),))[0]
    names = ", ".join(m.name for m in job.members)
    self._say(f"[sweep] stopped {names} after {elapsed:.0f} s: {how}")

  def eta_seconds(self) -> float | None:
    """Seconds until the trainings of this run end, or None before one has finished or
    shown its pace."""
    now = time.time()
    paced = {}  # Name: (remainder, whole training) at the training's own pace.
    for name, (started, job, steps_at_start) in list(self._started.items()):
      steps, since = _training_steps(job), _records_after(job.workdir, steps_at_start)
      if steps is None or not since:
        continue
      recorded, last_rate = since[-1]["step"], since[-1].get("steps_per_second")
      if len(since) >= 2 and isinstance(last_rate, (int, float)) and last_rate > 0:
        per_step = 1.0 / last_rate
      else:
        per_step = (now - started) / (recorded - steps_at_start)
      paced[name] = (per_step * max(steps - recorded, 0), per_step * steps)
    if self._durations:
      mean = sum(self._durations) / len(self._durations)
    elif paced:
      mean = sum(whole for _, whole in paced.values()) / len(paced)
    else:
      return None
    remainders = [paced[name][0] if name in paced else max(mean - (now - started), 0.0)
                  for name, (started, _, _) in list(self._started.items())]
    remainders += [mean] * self._unstarted
    return max(sum(remainders) / self.workers, max(remainders, default=0.0))

  @contextlib.contextmanager
  def heartbeat(self, seconds: float):
    """Inside the block, `report(steps=True)` every `seconds` (never if `seconds` is 0)."""
    if seconds <= 0:
      yield
      return
    done = threading.Event()
    def beat():
      while not done.wait(seconds):
        if self._started:
          self.report(steps=True)
    thread = threading.Thread(target=beat, name="sweep-heartbeat", daemon=True)
    thread.start()
    try:
      yield
    finally:
      done.set()
      thread.join()

  def leave(self, trainings, started: bool = False):
    """The `trainings` (not `started`, else stopped) are left to a later run: a drain
    request."""
    members = [m.name for t in trainings for m in t.members]
    if not members:
      return
    self.total -= len(members)
    self.later += len(members)
    if started:
      return
    self._unstarted -= len(trainings)
    self._say(f"[sweep] {DRAIN_SIGNAL.name}: the running jobs finish, {len(members)} not "
              f"started are left to a later run: {', '.join(members)}")

  def _counts(self) -> str:
    running = sum(len(job.members) for _, job, _ in list(self._started.values()))
    left = self.total - self.done - running - len(self.failed)
    return (f"{self.done}/{self.total} done, {running} running, {left} left"
            f"{', ' + str(len(self.failed)) + ' failed' if self.failed else ''}")

  def report(self, steps: bool = False):
    """Prints the count and the ETA; with `steps`, each running training's last
    recorded step."""
    eta = self.eta_seconds()
    line = f"[sweep] {self._counts()}{'' if eta is None else f', ETA {eta / 60:.1f} min'}"
    if steps:
      at = []
      for _, job, _ in list(self._started.values()):
        recorded, total = _trained_to(job.workdir), _training_steps(job)
        at.append(f"{job.name} at step {recorded or 0}"
                  + (f" of {total}" if total else ""))
      if at:
        line += "; " + ", ".join(at)
    self._say(line)

  def _say(self, line: str):
    with self._print_lock:
      print(line, flush=True)


def _training_steps(job: Job) -> int | None:
  """The steps the job's config trains for (None if it does not say)."""
  steps = job.config.get("training", {}).get("steps")
  return steps if isinstance(steps, int) and steps > 0 else None


class SweepInterrupted(Exception):
  """The sweep stopped at Ctrl-C; running jobs saved their state."""


# `kill -USR1 DRIVER_PID`: the running jobs finish (and are committed), no other starts;
# those are left to a later run like --max_jobs's. For ending a session's share of a long
# sweep without losing the running jobs (Ctrl-C stops them at their last checkpoint).
DRAIN_SIGNAL = signal.SIGUSR1


class _Drain:
  """Inside `with _Drain() as drain:`, DRAIN_SIGNAL sets `drain.requested` (main thread
  only: elsewhere, e.g. under a test runner's thread, the signal keeps its default)."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def _handler(self, signum, frame):  # pylint: disable=unused-argument
    self.requested = True

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(DRAIN_SIGNAL, self._handler)
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(DRAIN_SIGNAL, self._previous)


def _run_local(jobs, progress, job_fn, workers, max_retries):
  with _Drain() as drain:
    if workers <= 1:
      _run_in_process(jobs, progress, job_fn, drain)
    else:
      _run_workers(jobs, progress, job_fn, workers, max_retries, drain)


def _run_in_process(jobs, progress, job_fn, drain):
  """Jobs one after another in this process."""
  for index, job in enumerate(jobs):
    if drain.requested:
      progress.leave(jobs[index:])
      return
    progress.start(job)
    try:
      job_fn(job.config, job.workdir, job.companion_args)
      progress.finish(job)
    except (stopping.Interrupted, KeyboardInterrupt) as e:
      progress.stop(job, str(e) or "interrupted")
      raise SweepInterrupted() from None
    except Exception as e:  # pylint: disable=broad-except
      progress.finish(job, _error_kind(e)[0])


def _run_workers(jobs, progress, job_fn, workers, max_retries, drain):
  """Jobs in `workers` processes at once; a worker that dies is started again on its job.

  A job whose folder another process holds (a worker of a killed driver still saving)
  waits until that process lets go. Ctrl-C (or SIGTERM) stops every worker after it
  saved, and raises SweepInterrupted; a drain request (DRAIN_SIGNAL) starts no other job
  and lets the running ones finish (a retry of a running job's dead worker included).
  """
  context = multiprocessing.get_context("spawn")  # JAX does not survive fork.
  messages = context.SimpleQueue()
  queue = list(jobs)
  attempts = {job.name: 0 for job in jobs}
  errors = {}
  running = {}
  waiting_reported = set()
  with stopping.graceful():
    while queue or running:
      if stopping.requested() is not None:
        break
      if drain.requested:
        progress.leave([job for job in queue if attempts[job.name] == 0])
        queue = [job for job in queue if attempts[job.name] > 0]
      for job in list(queue):
        if len(running) >= workers:
          break
        holder = next((h for h in map(workdir_lib.holder_if_locked,
                                      [m.workdir for m in job.members]) if h), None)
        if holder is not None:
          if job.name not in waiting_reported:
            print(f"[sweep] {job.name}: its folder is in use by {holder}; waiting",
                  flush=True)
            waiting_reported.add(job.name)
          continue
        queue.remove(job)
        attempts[job.name] += 1
        process = context.Process(target=_worker, args=(
            job_fn, job.config, job.workdir, job.companion_args, os.getpid(), messages))
        process.start()
        if attempts[job.name] == 1:
          progress.start(job)
        running[job.name] = (job, process)
      time.sleep(0.2)
      while not messages.empty():
        workdir, message = messages.get()
        errors[workdir] = message
      for name, (job, process) in list(running.items()):
        if process.exitcode is None:
          continue
        del running[name]
        error = errors.pop(job.workdir, None)
        if process.exitcode == 0 and all(map(is_finished, job.members)):
          progress.finish(job)
        elif process.exitcode == cli.EXIT_BAD_INPUT:
          progress.finish(job, error or "bad input")  # Retrying cannot help.
        elif attempts[name] <= max_retries:
          print(f"[sweep] worker of {name} exited with {process.exitcode}"
                + (f" ({error})" if error else "")
                + f"; resuming it (attempt {attempts[name] + 1})", flush=True)
          queue.insert(0, job)
        else:
          progress.finish(job, f"worker exited with {process.exitcode}"
                          + (f" ({error})" if error else "")
                          + f", {max_retries} retries used")
    if stopping.requested() is None:
      return
    print(f"[sweep] stopping: {len(running)} running jobs save their state", flush=True)
    for job, process in running.values():
      if process.exitcode is None:
        os.kill(process.pid, signal.SIGINT)  # Ignored by a worker the terminal reached.
    for job, process in running.values():
      process.join()
      progress.stop(job, f"its worker saved and exited with {process.exitcode}")
  raise SweepInterrupted()


# A drained Ray sweep's marker file in the sweep folder, written before its tasks are
# cancelled: a task Ray has handed to a worker may miss `ray.cancel` (a known race of
# Ray's), so each task looks for it before it starts its job and again before its
# training takes a folder's lock (`workdir.refusing_starts`).
DRAIN_MARKER_PREFIX = ".drained-"
_NOT_STARTED = "not started: the sweep was drained"


def _ray_task(job_fn, config: dict, workdir: str, companions, drain_marker: str):
  """One job in a Ray worker, which ignores the drain signal (meant for the driver);
  none (`_NOT_STARTED`) if the sweep was drained before the task began or before its
  training took a folder's lock."""
  signal.signal(DRAIN_SIGNAL, signal.SIG_IGN)
  drained = lambda: os.path.exists(drain_marker) and "the sweep was drained"
  if drained():
    return _NOT_STARTED
  try:
    with workdir_lib.refusing_starts(drained):
      return job_fn(config, workdir, companions)
  except workdir_lib.StartRefused:
    return _NOT_STARTED


def _lock_stamps(job: Job) -> list:
  """Its folders' lock stamps: a training takes each one's lock when it starts
  (training/loop.py), which changes the stamp."""
  return [workdir_lib.lock_stamp(m.workdir) for m in job.members]


def _ray_result(ray, ref, job: Job, progress: Progress, cancelled: bool = False) -> bool:
  """Reports the ended task `ref` of `job` as finished or failed; False (nothing
  reported) if it was `cancelled` before it started."""
  error = None
  try:
    not_started = isinstance(result := ray.get(ref), str) and result == _NOT_STARTED
  except ray.exceptions.TaskCancelledError:
    not_started = True
  except Exception as e:  # pylint: disable=broad-except
    not_started, error = False, f"{type(e).__name__}: {str(e).splitlines()[0]}"
  if not_started:
    if cancelled:
      return False
    error = "cancelled"
  if cancelled:  # It ended before the cancel, unseen: it did start.
    progress.start(job)
  progress.finish(job, error)
  return True


def _run_ray(jobs, progress, job_fn, sweep_dir, ray_address, gpus_per_job, max_retries):
  """One Ray task a training, all submitted at once; the cluster runs as many as its
  resources allow. A job counts as started (progress, ETA) when its training has taken
  its folder's lock, and the ETA spreads over as many jobs as have run at once. A drain
  request (DRAIN_SIGNAL) cancels the tasks not started, left to a later run, and lets
  the running ones finish (a task cancelled as it took its lock counts as stopped)."""
  import ray  # pylint: disable=import-outside-toplevel

  if not ray.is_initialized():
    ray.init(address=ray_address, runtime_env={"env_vars": {"PYTHONPATH": ROOT}},
             log_to_driver=False)
  remote = ray.remote(num_cpus=1, num_gpus=gpus_per_job, max_retries=max_retries,
                      retry_exceptions=False)(_ray_task)
  before = [_lock_stamps(job) for job in jobs]  # Before any task can start.
  marker = os.path.join(os.path.abspath(sweep_dir),
                        f"{DRAIN_MARKER_PREFIX}{os.getpid()}-{time.time_ns()}")
  pending = {remote.remote(job_fn, job.config, job.workdir, job.companion_args, marker): job
             for job in jobs}
  stamps = dict(zip(pending, before))
  waiting = set(pending)  # Tasks whose training has not been seen to start.
  progress.workers = 1
  def took_lock(ref) -> bool:
    return _lock_stamps(pending[ref]) != stamps[ref]

  def look(refs, ready=()):
    """Counts as started the `refs` whose training took its lock (or ended)."""
    for ref in [r for r in refs if r in ready or took_lock(r)]:
      waiting.discard(ref)
      progress.start(pending[ref])

  with _Drain() as drain:
    try:
      while pending:
        # Look without waiting and sleep in Python: in a test, ray.wait(timeout=0.5) with
        # the drain signal arriving returned only when a job ended, minutes later.
        time.sleep(0.5)
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
        look(list(waiting), ready)
        progress.workers = max(progress.workers, len(pending) - len(waiting))
        for ref in ready:
          _ray_result(ray, ref, pending.pop(ref), progress)
        if drain.requested and waiting:
          look(list(waiting))  # Those that took their lock since the look above run on.
          io_utils.atomic_write_text(marker, "drained\n")
          for ref in waiting:
            ray.cancel(ref)  # Not started: Ray drops it from its queue, or interrupts it.
          left = []
          for ref in waiting:
            # A task may have ended between the look and the cancel: it counts as run.
            if _ray_result(ray, ref, pending[ref], progress, cancelled=True):
              continue
            if not took_lock(ref):
              left.append(pending[ref])
            else:  # Interrupted as it took its lock: a later run resumes it.
              progress.start(pending[ref])
              progress.stop(pending[ref], "the drain interrupted it as it started")
              progress.leave([pending[ref]], started=True)
          for ref in waiting:
            del pending[ref]
          waiting.clear()
          progress.leave(left)
    finally:
      with contextlib.suppress(FileNotFoundError):
        os.remove(marker)


def _finished_steps(job: Job, steps: int) -> str:
  """How far a finished job trained: "N steps", or where the rule stopped it."""
  try:
    stopped = io_utils.read_json(os.path.join(job.workdir, "eval.json")).get(learned.STOPPED)
  except (io_utils.CorruptFileError, OSError):
    stopped = None
  return (f"{steps} steps" if stopped is None else
          f"learned at step {stopped} of {steps}: training.stop_when_learned stopped it")


def _step_records(workdir: str) -> list[dict] | None:
  """metrics.jsonl's records (None without one, or a damaged one)."""
  try:
    return [r for r in io_utils.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
            if isinstance(r, dict) and isinstance(r.get("step"), int)]
  except (io_utils.CorruptFileError, OSError):
    return None


def _trained_to(workdir: str) -> int | None:
  """The last step metrics.jsonl records (None without one, or a damaged one): how far a
  stopped job got."""
  records = _step_records(workdir)
  return records[-1]["step"] if records else None


def _records_after(workdir: str, step: int) -> list[dict]:
  """metrics.jsonl's records of the steps after `step` (none if it is missing or damaged)."""
  return [r for r in _step_records(workdir) or [] if r["step"] > step]


def plan(config: ml_collections.ConfigDict, sweep_dir: str,
         rerun_changed: bool = False, reuse_from=(), only=(),
         max_jobs: int | None = None) -> list[tuple[Job, str, str]]:
  """What running the sweep would do with each job, without doing it or writing
  anything: (job, action, detail), action one of "skip" (finished), "reuse" (copied from
  a finished job of the same settings in a `reuse_from` folder), "outputs" (trained;
  a file of `sweep.job_outputs` is written from its checkpoints), "resume" (from its
  checkpoints), "start" (no checkpoint: from step 0), "refuse" (its folder holds a run
  with other settings; "start again" with rerun_changed), "share" (evaluated on the
  training of an earlier job, `share_training`), "later" (beyond `max_jobs`: a training
  to run that this run leaves to the next). Only the jobs `only` selects (see
  `select`). ValueError for bad settings, as run_sweep."""
  _check_max_jobs(max_jobs)
  reuse_from = check_reuse_folders(reuse_from)
  planned, alone = [], []
  statuses = [(job, *job_status(job)) for job in select(make_jobs(config, sweep_dir), only)]
  took = _hours_taken([job for job, finished, _ in statuses if finished])
  for job, finished, why in statuses:
    source = None if finished or why else find_reusable(job, reuse_from)
    if source is not None:
      planned.append((job, "reuse", f"from {source} (finished, the same settings)"))
      continue
    if not finished and why is None:  # A stopped run (no eval.json): its config too.
      try:
        stored = workdir_lib.stored_config(job.workdir) or job.config
      except io_utils.CorruptFileError as e:
        planned.append((job, "refuse", str(e)))
        continue
      changed = workdir_lib.identity_differences(stored, job.config)
      if changed:
        why = f"{_CHANGED} ({workdir_lib.describe_differences(changed)})"
    steps = job.config["training"]["steps"]
    trained = _trained_to(job.workdir)
    if finished:
      action, detail = "skip", f"finished ({_finished_steps(job, steps)})"
    elif why and _trained_status(job)[0]:  # Trained; a job output is missing.
      action, detail = "outputs", f"{why} (no training)"
    elif why and why.startswith(_CHANGED):
      action = "start again" if rerun_changed else "refuse"
      detail = why + ("" if rerun_changed else "; --rerun_changed moves it aside")
    elif _has_checkpoints(job.workdir):
      saved = checkpoints_lib.Checkpoints(job.workdir).steps()
      action = "resume"
      detail = (f"from its checkpoint at step {max(saved)} of {steps}" if saved
                else why or "from its checkpoints")
    else:
      action = "start"
      detail = why or ("nothing trained yet" if trained is None else
                       f"no checkpoint (metrics reach step {trained}): from step 0")
    if action not in ("skip", "reuse") and took.get(job.task):
      detail += f"; {took[job.task]}"
    planned.append((job, action, detail))
    if why:
      alone.append(job)
  # The trainings, as run_sweep makes them: a companion is "share"d.
  index = {job.name: i for i, (job, _, _) in enumerate(planned)}
  trainings = share_training([job for job, action, _ in planned
                              if action not in ("skip", "reuse")], alone)
  for training in trainings:
    for companion in training.companions:
      planned[index[companion.name]] = (
          companion, "share", f"evaluated on the training of {training.name} (only "
          "evaluation settings differ)")
  if max_jobs is not None:
    for training in trainings[max_jobs:]:
      for member in training.members:
        job, action, detail = planned[index[member.name]]
        planned[index[member.name]] = (
            job, "later", f"beyond --max_jobs={max_jobs} (then: {action}, {detail})")
  return planned


def _hours_taken(finished: list[Job]) -> dict[str, str]:
  """task -> "its task's N finished jobs took A-B h of training" (wall hours, eval.json's
  train_seconds, of the `finished` jobs of that task): what a job of that task may take,
  for choosing --max_jobs."""
  hours = {}
  for job in finished:
    try:
      result = io_utils.read_json(os.path.join(job.workdir, "eval.json"))
    except io_utils.CorruptFileError:
      continue
    seconds = result.get("train_seconds")
    if seconds is not None and loop.SHARED_TRAINING not in result:  # Counted once.
      hours.setdefault(job.task, []).append(seconds / 3600)
  took = {}
  for task, h in hours.items():
    low, high = f"{min(h):.2f}", f"{max(h):.2f}"
    took[task] = (f"its task's {len(h)} finished job{'s' if len(h) > 1 else ''} took "
                  f"{low if low == high else f'{low}-{high}'} h of training")
  return took


def run_sweep(config: ml_collections.ConfigDict, sweep_dir: str, executor: str = "local",
              workers: int = 1, ray_address: str | None = None, gpus_per_job: float = 0.0,
              max_retries: int = 3, job_fn: Callable = run_job,
              rerun_changed: bool = False, commit_results: bool = False,
              reuse_from=(), only=(), max_jobs: int | None = None,
              report_every: float = REPORT_EVERY) -> Progress:
  """Runs every unfinished job of the sweep; returns the final progress (failures listed).

  `only` (shell patterns over TASK/VARIANT, see `select`) keeps the jobs it matches;
  `max_jobs` runs at most that many trainings of the unfinished jobs, the first in the
  sweep's order (finished and reused jobs do not count; a job evaluated on another's
  training, `share_training`, counts with it), and leaves the rest to a later run: a
  session's share of a long sweep. Every `report_every` minutes while jobs train
  (0: never) it prints the count, the ETA and each running training's step.

  Raises ValueError for bad settings (before anything is written), SweepInterrupted
  on Ctrl-C. A job whose folder holds a run with other settings fails with the
  differences named, or with rerun_changed is moved aside (FOLDER.replaced-TIME) and
  run again. A job not started yet whose settings equal those of a finished job in one
  of the `reuse_from` sweep folders is copied from it (`reuse`), not trained.
  """

  if executor not in EXECUTORS:
    raise ValueError(f"unknown executor {executor!r}; valid choices: {', '.join(EXECUTORS)}")
  for name, value, low in [("--workers", workers, 1), ("--max_retries", max_retries, 0),
                           ("--gpus_per_job", gpus_per_job, 0),
                           ("--report_every", report_every, 0)]:
    if value < low:
      raise ValueError(f"{name} must be >= {low}, got {value}")
  _check_max_jobs(max_jobs)
  if executor == "ray":
    try:
      import ray  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
      raise ValueError("the ray executor needs Ray: pip install -e .[cluster]") from None
  cli.check_folder(sweep_dir, "sweep_dir")
  reuse_from = check_reuse_folders(reuse_from)
  every = make_jobs(config, sweep_dir)
  jobs = select(every, only)
  todo, notes, reused = [], [], []
  for job in jobs:
    finished, why = job_status(job)
    if finished:
      continue
    source = None if why else find_reusable(job, reuse_from)
    if source is not None:
      reused.append((job, source))
      continue
    todo.append(job)
    if why:
      notes.append((job, why))
  trainings = share_training(todo, alone=[job for job, _ in notes])
  later_trainings = trainings[max_jobs:] if max_jobs is not None else []
  trainings = trainings[:len(trainings) - len(later_trainings)]
  todo = [member for training in trainings for member in training.members]
  later = [member for training in later_trainings for member in training.members]
  notes = [(job, why) for job, why in notes if job.name in {m.name for m in todo}]
  on_finished = None
  if commit_results:  # Each finished job's small files, committed as it finishes.
    committer = results_git.Committer()
    on_finished = lambda job: committer(  # pylint: disable=unnecessary-lambda-assignment
        job.workdir, job.name, [file for _, _, file in _job_outputs(job.config)])
  finished = len(jobs) - len(todo) - len(later)
  progress = Progress(finished + len(todo), finished, workers, len(trainings), on_finished)
  progress.later = len(later)
  kind = "variants" if config.sweep.get("variants", None) else "encodings"
  selected = f" ({len(jobs)} of them selected by --only)" if len(jobs) < len(every) else ""
  print(f"[sweep] {len(every)} jobs ({len(config.sweep.tasks)} tasks x "
        f"{len(variants(config.sweep))} {kind}){selected}, {finished} already finished"
        f"{f' ({len(reused)} of them reused)' if reused else ''}; executor {executor}",
        flush=True)
  if later:
    names = ", ".join(t.name + "".join(f" (with {c.name})" for c in t.companions)
                      for t in trainings)
    print(f"[sweep] --max_jobs={max_jobs}: this run trains {names} and leaves "
          f"{len(later)} unfinished jobs to a later run", flush=True)
  for training in trainings:
    for companion in training.companions:
      print(f"[sweep] {companion.name}: evaluated on the training of {training.name} "
            "(only evaluation settings differ)", flush=True)
  for job, source in reused:
    reuse(job, source)
    print(f"[sweep] {job.name}: reused the finished job {source} (the same settings)",
          flush=True)
    if on_finished is not None:
      on_finished(job)
  for job, why in notes:
    changed = why.startswith(_CHANGED)
    hint = ("; pass --rerun_changed to move it aside and run the job again"
            if changed and not rerun_changed else "")
    print(f"[sweep] {job.name} not finished: {why}{hint}", flush=True)
    if changed and rerun_changed:
      stamp = time.strftime("%Y%m%d-%H%M%S")
      os.rename(job.workdir, f"{job.workdir}.replaced-{stamp}")
      print(f"[sweep] {job.name}: moved the old run to {job.workdir}.replaced-{stamp}",
            flush=True)
  os.makedirs(sweep_dir, exist_ok=True)
  with progress.heartbeat(report_every * 60):
    if executor == "local":
      _run_local(trainings, progress, job_fn, workers, max_retries)
    else:
      _run_ray(trainings, progress, job_fn, sweep_dir, ray_address, gpus_per_job,
               max_retries)
  return progress
