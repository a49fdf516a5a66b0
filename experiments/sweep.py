"""Run a sweep of (task, encoding) jobs, each a grid of seeds x learning rates.

  python -m experiments.sweep --config=configs/table1.py:scale=small --sweep_dir=runs/small
  python -m experiments.sweep --config=configs/table1.py --sweep_dir=/shared/table1 \
      --executor=ray --ray_address=auto --gpus_per_job=1

Each job writes into SWEEP_DIR/TASK/ENCODING/ (the files of experiments.train,
eval.json last and atomically). Re-running the command skips finished jobs and
resumes unfinished ones from their checkpoints, so a sweep survives a dead
worker or a killed driver. Executors:
  local (default): jobs in sequence, or --workers=N processes at once; a worker
      that dies is restarted on its job (up to --max_retries times).
  ray: one Ray task per job on an existing cluster (--ray_address) or a local
      one; Ray retries a task whose worker died. Needs `pip install -e .[cluster]`;
      on a multi-machine cluster SWEEP_DIR must be on a shared filesystem.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
import time
from typing import Callable

import ml_collections

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXECUTORS = ("local", "ray")


@dataclasses.dataclass(frozen=True)
class Job:
  task: str
  pe: str
  workdir: str
  config: dict  # The job's full config (task and encoding set).

  @property
  def name(self) -> str:
    return f"{self.task}/{self.pe}"


def make_jobs(config: ml_collections.ConfigDict, sweep_dir: str) -> list[Job]:
  """One job per (task, encoding) of config.sweep, validated before anything runs."""
  from experiments import validation  # pylint: disable=import-outside-toplevel

  jobs = []
  for task in config.sweep.tasks:
    for pe in config.sweep.encodings:
      job_config = copy.deepcopy(config)
      job_config.task = task
      job_config.model.pe = pe
      validation.validate(job_config)
      jobs.append(Job(task, pe, os.path.join(os.path.abspath(sweep_dir), task, pe),
                      job_config.to_dict()))
  return jobs


def is_finished(job: Job) -> bool:
  """A job is finished when its eval.json exists for the configured number of steps."""
  path = os.path.join(job.workdir, "eval.json")
  if not os.path.exists(path):
    return False
  with open(path) as f:
    return json.load(f).get("step") == job.config["training"]["steps"]


def run_job(config_dict: dict, workdir: str) -> dict:
  """Trains and evaluates one job (resuming from its checkpoints); returns its scores."""
  from experiments import compile_cache  # pylint: disable=import-outside-toplevel
  from experiments import loop  # pylint: disable=import-outside-toplevel

  config = ml_collections.ConfigDict(config_dict)
  config.progress = False
  compile_cache.enable(config.get("compilation_cache", ""))  # Also on Ray workers.
  result = loop.train_and_evaluate(config, workdir)
  return {"job": f"{config.task}/{config.model.pe}",
          "unseen": [m["scores"]["unseen"] for m in result["models"]]}


class Progress:
  """Prints jobs done / running / left and an ETA from the jobs finished so far."""

  def __init__(self, total: int, already_done: int, workers: int):
    self.total, self.done, self.workers = total, already_done, max(1, workers)
    self.failed = []
    self._durations = []
    self._started = {}

  def start(self, job: Job):
    self._started[job.name] = time.time()

  def finish(self, job: Job, error: str | None = None):
    elapsed = time.time() - self._started.pop(job.name, time.time())
    if error:
      self.failed.append(job.name)
      print(f"[sweep] FAILED {job.name} after {elapsed:.0f} s: {error}", flush=True)
    else:
      self.done += 1
      self._durations.append(elapsed)
      print(f"[sweep] finished {job.name} in {elapsed:.0f} s", flush=True)
    self.report()

  def report(self):
    running = len(self._started)
    left = self.total - self.done - running - len(self.failed)
    eta = ""
    if self._durations:
      mean = sum(self._durations) / len(self._durations)
      eta = f", ETA {mean * (left + running) / self.workers / 60:.1f} min"
    print(f"[sweep] {self.done}/{self.total} done, {running} running, {left} left"
          f"{', ' + str(len(self.failed)) + ' failed' if self.failed else ''}{eta}", flush=True)


def _run_local(jobs, progress, job_fn, workers, max_retries):
  if workers <= 1:
    for job in jobs:
      progress.start(job)
      try:
        job_fn(job.config, job.workdir)
        progress.finish(job)
      except Exception as e:  # pylint: disable=broad-except
        progress.finish(job, f"{type(e).__name__}: {e}")
    return
  import multiprocessing  # pylint: disable=import-outside-toplevel

  context = multiprocessing.get_context("spawn")  # JAX does not survive fork.
  queue = list(jobs)
  attempts = {job.name: 0 for job in jobs}
  running = {}
  while queue or running:
    while queue and len(running) < workers:
      job = queue.pop(0)
      attempts[job.name] += 1
      process = context.Process(target=job_fn, args=(job.config, job.workdir))
      process.start()
      if attempts[job.name] == 1:
        progress.start(job)
      running[job.name] = (job, process)
    time.sleep(0.2)
    for name, (job, process) in list(running.items()):
      if process.exitcode is None:
        continue
      del running[name]
      if process.exitcode == 0 and is_finished(job):
        progress.finish(job)
      elif attempts[name] <= max_retries:
        print(f"[sweep] worker of {name} exited with {process.exitcode}; resuming it "
              f"(attempt {attempts[name] + 1})", flush=True)
        queue.insert(0, job)
      else:
        progress.finish(job, f"worker exited with {process.exitcode}, "
                        f"{max_retries} retries used")


def _run_ray(jobs, progress, job_fn, ray_address, gpus_per_job, max_retries):
  import ray  # pylint: disable=import-outside-toplevel

  if not ray.is_initialized():
    ray.init(address=ray_address, runtime_env={"env_vars": {"PYTHONPATH": ROOT}},
             log_to_driver=False)
  remote = ray.remote(num_cpus=1, num_gpus=gpus_per_job, max_retries=max_retries,
                      retry_exceptions=False)(job_fn)
  pending = {}
  for job in jobs:
    progress.start(job)
    pending[remote.remote(job.config, job.workdir)] = job
  while pending:
    ready, _ = ray.wait(list(pending), num_returns=1)
    job = pending.pop(ready[0])
    try:
      ray.get(ready[0])
      progress.finish(job)
    except Exception as e:  # pylint: disable=broad-except
      progress.finish(job, f"{type(e).__name__}: {str(e).splitlines()[0]}")


def run_sweep(config: ml_collections.ConfigDict, sweep_dir: str, executor: str = "local",
              workers: int = 1, ray_address: str | None = None, gpus_per_job: float = 0.0,
              max_retries: int = 3, job_fn: Callable = run_job) -> Progress:
  """Runs every unfinished job of the sweep; returns the final progress (failures listed)."""
  if executor not in EXECUTORS:
    raise ValueError(f"unknown executor {executor!r}; valid choices: {', '.join(EXECUTORS)}")
  if executor == "ray":
    try:
      import ray  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
      raise ValueError("the ray executor needs Ray: pip install -e .[cluster]") from None
  jobs = make_jobs(config, sweep_dir)
  todo = [job for job in jobs if not is_finished(job)]
  os.makedirs(sweep_dir, exist_ok=True)
  progress = Progress(len(jobs), len(jobs) - len(todo), workers)
  print(f"[sweep] {len(jobs)} jobs ({len(config.sweep.tasks)} tasks x "
        f"{len(config.sweep.encodings)} encodings), {len(jobs) - len(todo)} already finished; "
        f"executor {executor}", flush=True)
  if executor == "local":
    _run_local(todo, progress, job_fn, workers, max_retries)
  else:
    _run_ray(todo, progress, job_fn, ray_address, gpus_per_job, max_retries)
  return progress


def main(argv):
  from absl import app  # pylint: disable=import-outside-toplevel

  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  from absl import logging  # pylint: disable=import-outside-toplevel
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  if "sweep" not in config:
    print("error: the config has no `sweep` section (tasks and encodings); "
          "use e.g. --config=configs/table1.py", file=sys.stderr)
    sys.exit(2)
  try:
    progress = run_sweep(config, _SWEEP_DIR.value, _EXECUTOR.value, _WORKERS.value,
                         _RAY_ADDRESS.value, _GPUS.value, _RETRIES.value)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  if progress.failed:
    print(f"[sweep] {len(progress.failed)} jobs failed: {', '.join(progress.failed)}; "
          "re-run the command to retry them", file=sys.stderr)
    sys.exit(1)
  print(f"[sweep] all {progress.total} jobs finished; report: "
        f"python -m experiments.report --sweep_dir={_SWEEP_DIR.value}")


if __name__ == "__main__":
  from experiments import runtime  # pylint: disable=ungrouped-imports
  runtime.maybe_reexec()  # Huge-page malloc for XLA CPU; see experiments/runtime.py.
  from absl import app, flags  # pylint: disable=ungrouped-imports
  from ml_collections import config_flags

  _CONFIG = config_flags.DEFINE_config_file("config", os.path.join(ROOT, "configs", "table1.py"),
                                            "Sweep config (with a `sweep` section).")
  _SWEEP_DIR = flags.DEFINE_string("sweep_dir", None, "Folder of the sweep's jobs.",
                                   required=True)
  _EXECUTOR = flags.DEFINE_enum("executor", "local", EXECUTORS, "Where jobs run.")
  _WORKERS = flags.DEFINE_integer("workers", 1, "Local worker processes.")
  _RAY_ADDRESS = flags.DEFINE_string("ray_address", None,
                                     "Ray cluster address (default: start a local Ray).")
  _GPUS = flags.DEFINE_float("gpus_per_job", 0.0, "GPUs requested per Ray job.")
  _RETRIES = flags.DEFINE_integer("max_retries", 3, "Retries of a job whose worker died.")
  app.run(main)
