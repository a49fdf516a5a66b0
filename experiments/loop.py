"""The training loop of one run: workdir, checkpoints, logging, then evaluation.

`train_and_evaluate(config, workdir)` trains every model of the run's grid with the
paper's protocol and writes
  workdir/config.json       the resolved config
  workdir/metrics.jsonl     one record per log interval (step, loss, accuracy, steps/s)
  workdir/checkpoints/      orbax checkpoints every `checkpoint_every` steps
  workdir/eval.json         per-length accuracies and the scores (experiments.results)
and resumes from the last checkpoint when run again with the same workdir.
"""
from __future__ import annotations

import json
import os
import time

import jax
import ml_collections
import numpy as np

import tasks as tasks_lib
from experiments import data
from experiments import evaluation
from experiments import io_utils
from experiments import results
from experiments import steps
from experiments import validation


class NonFiniteLossError(FloatingPointError):
  pass


# Settings that change neither the models nor the results.
_NOT_IDENTITY = ("progress", "compilation_cache")


def _config_without_steps(config_dict: dict) -> dict:
  d = json.loads(json.dumps(config_dict))
  d.get("training", {}).pop("steps", None)
  for key in _NOT_IDENTITY:
    d.pop(key, None)
  return d


def _checkpoint_manager(workdir: str, max_to_keep=None):
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  return ocp.CheckpointManager(
      os.path.join(workdir, "checkpoints"),
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains every model of the grid (one model by default), resuming from workdir,
  evaluates them, and returns the eval results (also written to workdir/eval.json)."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  import tqdm  # pylint: disable=import-outside-toplevel

  devices = jax.devices()
  validation.validate(config, len(devices))
  task = tasks_lib.get(config.task)
  trainer = steps.build_trainer(config, task, devices)
  t = config.training

  # Workdir and config (refuse to mix two different runs in one folder).
  workdir = os.path.abspath(workdir)
  config_path = os.path.join(workdir, "config.json")
  config_dict = config.to_dict()
  if os.path.exists(config_path):
    with open(config_path) as f:
      previous = json.load(f)
    if _config_without_steps(previous) != _config_without_steps(config_dict):
      raise ValueError(f"{workdir} holds a run with a different config; "
                       "use another --workdir or the same config")
  os.makedirs(workdir, exist_ok=True)
  io_utils.write_json(config_path, config_dict)

  manager = _checkpoint_manager(workdir, t.checkpoints_to_keep)
  start = 0
  if manager.latest_step() is not None:
    start = manager.latest_step()
    trainer.set_state(manager.restore(start, args=ocp.args.StandardRestore(trainer.state)))
    print(f"resuming {workdir} from step {start}", flush=True)
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  records = [r for r in io_utils.read_jsonl(metrics_path) if r["step"] <= start]

  num_models = trainer.num_models
  shapes = data.training_shapes(task, config)  # None: one program per training length.
  prefetch = data.Prefetcher(lambda s: data.data_for_step(task, config, s, shapes), start,
                             t.steps, t.prefetch, trainer.place)
  bar = tqdm.tqdm(total=t.steps, initial=start, unit="step", disable=not config.progress,
                  dynamic_ncols=True, desc=f"{config.task} / {config.model.pe}"
                  + (f" x {num_models} models" if num_models > 1 else ""))
  pending, interval_start = [], time.perf_counter()

  def check_finite(step):
    diverged = np.asarray(trainer.state.nonfinite)
    # A grid goes on while any model is finite; a single model stops.
    if diverged.all():
      raise NonFiniteLossError(
          f"non-finite loss or update at or before step {step}; stopped, and kept the last "
          f"good checkpoint (step {manager.latest_step()}) in {workdir}")

  def unwrap(values):
    return values[0] if num_models == 1 else values

  try:
    for step in range(start + 1, t.steps + 1):
      trainer.state, metrics = trainer.step(trainer.state, trainer.seeds, prefetch.next())
      pending.append(metrics)
      if step % t.log_every == 0 or step == t.steps:
        check_finite(step)
        elapsed = time.perf_counter() - interval_start
        mean = {k: np.mean(np.stack([np.asarray(m[k]) for m in pending]), axis=0).tolist()
                for k in pending[0]}
        records.append({"step": step, **{k: unwrap(v) for k, v in mean.items()},
                        "steps_per_second": len(pending) / elapsed})
        io_utils.write_jsonl(metrics_path, records)
        bar.set_postfix(loss=f"{np.mean(mean['loss']):.4f}",
                        acc=f"{np.mean(mean['accuracy']):.3f}")
        pending, interval_start = [], time.perf_counter()
      if step % t.checkpoint_every == 0 or step == t.steps:
        check_finite(step)
        manager.save(step, args=ocp.args.StandardSave(trainer.state))
      bar.update(1)
  finally:
    prefetch.close()
    bar.close()
    manager.wait_until_finished()
    manager.close()

  # Evaluation of every model over the configured length range.
  e = config.evaluation
  evaluator = evaluation.RangeEvaluator(
      trainer.model, task, max_logits=e.max_logits,
      batch_sharding=trainer.batch_sharding if num_models == 1 else None, stacked=True)
  params = trainer.state.params
  if num_models > 1 and trainer.state_sharding is not None:
    params = jax.device_put(params, jax.sharding.NamedSharding(
        trainer.state_sharding.mesh, jax.sharding.PartitionSpec()))
  evaluated = evaluator.evaluate(params, range(e.min_length, e.max_length + 1),
                                 e.batch_size, e.seed, e.max_buckets, progress=config.progress)
  result = results.eval_record(config, trainer.members, evaluated,
                               np.asarray(trainer.state.nonfinite).tolist(),
                               int(np.asarray(trainer.state.step)[0]))
  io_utils.write_json(os.path.join(workdir, "eval.json"), result)
  return result


def restore_state(workdir: str, config: ml_collections.ConfigDict, step: int | None = None):
  """The stacked TrainState [M, ...] saved in workdir's checkpoint at `step` (default: latest)."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  task = tasks_lib.get(config.task)
  model = steps.build_model(config, task)
  target = steps.init_grid(model, config, steps.grid_members(config))
  with _checkpoint_manager(os.path.abspath(workdir)) as manager:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {workdir}")
    return manager.restore(step, args=ocp.args.StandardRestore(target))
