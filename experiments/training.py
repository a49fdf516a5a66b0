"""Training and evaluation of one (task, encoding) run.

`train_and_evaluate(config, workdir)` trains with the paper's protocol, writes
  workdir/config.json       the resolved config
  workdir/metrics.jsonl     one record per log interval (step, loss, accuracy, steps/s)
  workdir/checkpoints/      orbax checkpoints every `checkpoint_every` steps
  workdir/eval.json         per-length accuracies and the scores
and resumes from the last checkpoint when run again with the same workdir.

Randomness: every key is derived from (seed, step) with fold_in, with separate
streams for parameters, model randomness (positions, dropout) and data, so a
resumed run continues exactly as an uninterrupted one.

Shapes: B batch, I input length, O output length, T = I + O.
"""
from __future__ import annotations

import json
import os
import queue
import threading
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

import randomized_pe as rpe
import tasks as tasks_lib
from experiments import evaluation
from experiments import io_utils

# Stream tags folded into the seeds.
_PARAMS, _MODEL, _DATA = 0x706172, 0x6D6F64, 0x646174


class TrainState(NamedTuple):
  params: Any
  opt_state: Any
  step: jax.Array  # int32 scalar: steps taken.
  nonfinite: jax.Array  # bool scalar: a non-finite loss was seen.


class NonFiniteLossError(FloatingPointError):
  pass


def model_config_from(config: ml_collections.ConfigDict, task) -> rpe.EncoderConfig:
  m = config.model
  return rpe.EncoderConfig(
      vocab_size=task.input_size + 1,  # The empty token is one extra symbol.
      pe=m.pe, num_layers=m.num_layers, num_heads=m.num_heads, d_model=m.d_model,
      widening_factor=m.widening_factor, dropout_rate=m.dropout_rate,
      emb_init_scale=m.emb_init_scale, max_position=m.max_position,
      max_timescale=m.max_timescale, learned_init_scale=m.learned_init_scale,
      compat=m.compat,
  )


def validate(config: ml_collections.ConfigDict, device_count: int = 1) -> None:
  """Raises ValueError with a one-line message for any bad setting, before any work."""
  task = tasks_lib.get(config.task)
  rpe.registry.get(config.model.pe)
  model_config_from(config, task)  # Architecture and compat checks.
  t, e = config.training, config.evaluation
  for name, value in [("training.steps", t.steps), ("training.batch_size", t.batch_size),
                      ("training.log_every", t.log_every),
                      ("training.checkpoint_every", t.checkpoint_every),
                      ("evaluation.batch_size", e.batch_size),
                      ("evaluation.max_buckets", e.max_buckets)]:
    if value < 1:
      raise ValueError(f"{name} must be >= 1, got {value}")
  for prefix, lo, hi in [("training", t.min_length, t.max_length),
                         ("evaluation", e.min_length, e.max_length)]:
    if not 1 <= lo <= hi:
      raise ValueError(f"{prefix} lengths must satisfy 1 <= min_length <= max_length, "
                       f"got {lo}..{hi}")
  if e.positions not in evaluation.POSITION_MODES:
    raise ValueError(f"unknown evaluation.positions {e.positions!r}; valid choices: "
                     f"{', '.join(evaluation.POSITION_MODES)}")
  if t.batch_size % device_count:
    raise ValueError(f"training.batch_size={t.batch_size} must be divisible by the "
                     f"{device_count} devices")
  longest = max(evaluation.sequence_length(task, n)
                for n in (*range(t.min_length, t.max_length + 1),
                          *range(e.min_length, e.max_length + 1)))
  if config.model.max_position < longest:
    raise ValueError(
        f"model.max_position={config.model.max_position} is smaller than the longest "
        f"sequence the model sees ({longest} tokens: input plus output of {config.task}); "
        f"raise model.max_position to at least {longest}")


def make_optimizer(config: ml_collections.ConfigDict,
                   learning_rate=None) -> optax.GradientTransformation:
  """Adam after global-norm clipping.

  The learning rate lives in the optimizer state (optax.inject_hyperparams), so
  models of a grid hold their own rate and share one update function.
  """
  if learning_rate is None:
    learning_rate = config.training.learning_rate
  return optax.chain(
      optax.clip_by_global_norm(config.training.grad_clip_norm),
      optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate),
  )


def grid_members(config: ml_collections.ConfigDict) -> list[tuple[int, float]]:
  """(seed, learning rate) of every model trained together: seeds x learning rates.

  Empty `grid.seeds` / `grid.learning_rates` mean the single `seed` /
  `training.learning_rate`.
  """
  seeds = list(config.grid.seeds) or [config.seed]
  rates = list(config.grid.learning_rates) or [config.training.learning_rate]
  return [(int(s), float(r)) for s in seeds for r in rates]


def make_batch(task, key, batch_size: int, length: int) -> dict[str, np.ndarray]:
  """Model inputs for one batch: the task input followed by one empty token per output."""
  sample = task.sample_batch(key, batch_size, length)
  empties = np.full(sample["output"].shape, task.input_size, np.int32)
  return {"tokens": np.concatenate([sample["input"], empties], axis=1),
          "targets": sample["output"], "mask": sample["mask"]}


def data_for_step(task, config, step: int) -> dict[str, np.ndarray]:
  """The training batch of `step`: a function of (data seed, step) only."""
  t = config.training
  data_seed = config.seed if config.data_seed < 0 else config.data_seed
  key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(data_seed), _DATA), step)
  length = int(tasks_lib.base.numpy_rng(key).integers(t.min_length, t.max_length + 1))
  return make_batch(task, jax.random.fold_in(key, 1), t.batch_size, length)


def loss_and_accuracy(model, params, key, batch, positions, is_training=True):
  """Mean cross-entropy over all output tokens (as the release) and masked accuracy."""
  # The answers are the last O positions; the model computes only their logits.
  out = model.apply(params, key, batch["tokens"], positions, is_training=is_training,
                    num_outputs=batch["targets"].shape[1])  # [B, O, C]
  log_probs = jax.nn.log_softmax(out)
  nll = -jnp.take_along_axis(log_probs, batch["targets"][..., None], axis=-1)[..., 0]
  correct = (jnp.argmax(out, axis=-1) == batch["targets"]) & batch["mask"]
  return jnp.mean(nll), jnp.sum(correct) / jnp.maximum(jnp.sum(batch["mask"]), 1)


def make_train_step(model, model_config: rpe.EncoderConfig, optimizer, seed):
  """Returns the pure train_step(state, batch) -> (state, metrics); `seed` may be traced."""

  def train_step(state: TrainState, batch):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), _MODEL), state.step)
    pos_key, dropout_key = jax.random.split(key)
    positions = model_config.sample_positions(pos_key, batch["tokens"].shape[1])

    def loss_fn(params):
      return loss_and_accuracy(model, params, dropout_key, batch, positions)

    (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(loss) & jnp.isfinite(optax.tree_utils.tree_norm(updates))
    new_state = TrainState(params, opt_state, state.step + 1, state.nonfinite | ~finite)
    return new_state, {"loss": loss, "accuracy": accuracy}

  return train_step


def init_state(model, optimizer, seed) -> TrainState:
  """One model's initial state; `seed` may be traced."""
  tokens = jnp.zeros((1, 2), jnp.int32)
  key = jax.random.fold_in(jax.random.PRNGKey(seed), _PARAMS)
  params = model.init(key, tokens)
  return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32),
                    jnp.zeros((), bool))


def init_grid(model, config, members) -> TrainState:
  """Initial states of all grid members stacked on a leading models axis [M, ...]."""
  seeds = jnp.array([s for s, _ in members], jnp.int32)
  rates = jnp.array([r for _, r in members], jnp.float32)

  def one(seed, rate):
    return init_state(model, make_optimizer(config, rate), seed)

  return jax.jit(jax.vmap(one))(seeds, rates)


def make_grid_step(model, model_config: rpe.EncoderConfig, optimizer):
  """grid_step(states [M], seeds [M], batch) -> (states, metrics [M]): one shared batch.

  Every model draws its own positions and dropout keys from its own seed.
  """

  def grid_step(states, seeds, batch):
    def one(state, seed):
      return make_train_step(model, model_config, optimizer, seed)(state, batch)
    return jax.vmap(one)(states, seeds)

  return grid_step


class Prefetcher:
  """Generates the batches of steps [start, stop) in a background thread."""

  def __init__(self, make, start: int, stop: int, depth: int, place=lambda b: b):
    self._queue = queue.Queue(maxsize=max(1, depth))
    self._stop = threading.Event()

    def work():
      try:
        for step in range(start, stop):
          item = place(make(step))
          while not self._stop.is_set():
            try:
              self._queue.put(item, timeout=0.1)
              break
            except queue.Full:
              pass
          if self._stop.is_set():
            return
      except BaseException as e:  # Handed to the consumer.
        self._queue.put(e)

    self._thread = threading.Thread(target=work, daemon=True)
    self._thread.start()

  def next(self):
    item = self._queue.get()
    if isinstance(item, BaseException):
      raise item
    return item

  def close(self):
    self._stop.set()


def _scores(lengths, accuracy, train_max, train_min) -> dict:
  acc = dict(zip(lengths, accuracy))
  seen = [a for n, a in acc.items() if train_min <= n <= train_max]
  unseen = [a for n, a in acc.items() if n > train_max]
  return {"train_range": float(np.mean(seen)) if seen else None,
          "unseen": float(np.mean(unseen)) if unseen else None}


def _config_without_steps(config_dict: dict) -> dict:
  d = json.loads(json.dumps(config_dict))
  d.get("training", {}).pop("steps", None)
  d.pop("progress", None)
  return d


def mesh_shardings(devices, num_models: int):
  """(state, seeds, batch) shardings: models split over devices when they divide evenly,
  otherwise the batch (data parallel); None on one device."""
  if len(devices) == 1:
    return None, None, None
  mesh = jax.sharding.Mesh(np.array(devices), ("devices",))
  split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("devices"))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  if num_models > 1 and num_models % len(devices) == 0:
    return split, split, replicated
  return replicated, replicated, split


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains every model of the grid (one model by default), resuming from workdir,
  evaluates them, and returns the eval results (also written to workdir/eval.json)."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  import tqdm  # pylint: disable=import-outside-toplevel

  devices = jax.devices()
  validate(config, len(devices))
  task = tasks_lib.get(config.task)
  model_config = model_config_from(config, task)
  model = rpe.make_encoder(model_config, task.output_size)
  optimizer = make_optimizer(config)
  members = grid_members(config)
  num_models = len(members)
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

  state_sharding, seeds_sharding, batch_sharding = mesh_shardings(devices, num_models)
  state = init_grid(model, config, members)
  seeds = jnp.array([s for s, _ in members], jnp.int32)
  manager = ocp.CheckpointManager(
      os.path.join(workdir, "checkpoints"),
      options=ocp.CheckpointManagerOptions(max_to_keep=t.checkpoints_to_keep, create=True),
  )
  start = 0
  if manager.latest_step() is not None:
    start = manager.latest_step()
    state = manager.restore(start, args=ocp.args.StandardRestore(state))
    print(f"resuming {workdir} from step {start}", flush=True)
  if state_sharding is not None:
    state = jax.device_put(state, state_sharding)
    seeds = jax.device_put(seeds, seeds_sharding)
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  records = [r for r in io_utils.read_jsonl(metrics_path) if r["step"] <= start]

  grid_step = jax.jit(make_grid_step(model, model_config, optimizer), donate_argnums=(0,))
  place = (lambda b: jax.device_put(b, batch_sharding)) if batch_sharding else (lambda b: b)
  prefetch = Prefetcher(lambda s: data_for_step(task, config, s), start, t.steps, t.prefetch,
                        place)
  bar = tqdm.tqdm(total=t.steps, initial=start, unit="step", disable=not config.progress,
                  dynamic_ncols=True, desc=f"{config.task} / {config.model.pe}"
                  + (f" x {num_models} models" if num_models > 1 else ""))
  pending, interval_start = [], time.perf_counter()

  def check_finite(step):
    diverged = np.asarray(state.nonfinite)
    # A grid goes on while any model is finite; a single model stops.
    if diverged.all():
      raise NonFiniteLossError(
          f"non-finite loss or update at or before step {step}; stopped, and kept the last "
          f"good checkpoint (step {manager.latest_step()}) in {workdir}")

  def unwrap(values):
    return values[0] if num_models == 1 else values

  try:
    for step in range(start + 1, t.steps + 1):
      state, metrics = grid_step(state, seeds, prefetch.next())
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
        manager.save(step, args=ocp.args.StandardSave(state))
      bar.update(1)
  finally:
    prefetch.close()
    bar.close()
    manager.wait_until_finished()
    manager.close()

  # Evaluation of every model over the configured length range.
  e = config.evaluation
  evaluator = evaluation.RangeEvaluator(
      model, model_config, task, positions=e.positions, max_logits=e.max_logits,
      batch_sharding=batch_sharding if num_models == 1 else None, stacked=True)
  params = state.params
  if num_models > 1 and state_sharding is not None:
    params = jax.device_put(params, jax.sharding.NamedSharding(
        state_sharding.mesh, jax.sharding.PartitionSpec()))
  result = evaluator.evaluate(params, range(e.min_length, e.max_length + 1),
                              e.batch_size, e.seed, e.max_buckets, progress=config.progress)
  diverged = np.asarray(state.nonfinite).tolist()
  models = []
  for m, (seed, rate) in enumerate(members):
    accuracy = [a[m] for a in result["accuracy"]]
    models.append({"seed": seed, "learning_rate": rate, "accuracy": accuracy,
                   "diverged": diverged[m],
                   "scores": _scores(result["lengths"], accuracy, t.max_length, t.min_length)})
  result = {
      "task": config.task, "pe": config.model.pe, "compat": config.model.compat,
      "step": int(np.asarray(state.step)[0]), "lengths": result["lengths"],
      "buckets": result["buckets"], "training_lengths": [t.min_length, t.max_length],
      "models": models,
  }
  if num_models == 1:  # A single run keeps its numbers at the top level.
    result.update(accuracy=models[0]["accuracy"], scores=models[0]["scores"])
  io_utils.write_json(os.path.join(workdir, "eval.json"), result)
  return result


def restore_state(workdir: str, config: ml_collections.ConfigDict, step: int | None = None):
  """The stacked TrainState [M, ...] saved in workdir's checkpoint at `step` (default: latest)."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  task = tasks_lib.get(config.task)
  model = rpe.make_encoder(model_config_from(config, task), task.output_size)
  target = init_grid(model, config, grid_members(config))
  with ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints")) as manager:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {workdir}")
    return manager.restore(step, args=ocp.args.StandardRestore(target))


def summary_table(result: dict) -> str:
  """A short Markdown table of in-distribution vs unseen-length accuracy per model."""
  lo, hi = result["training_lengths"]
  unseen = [n for n in result["lengths"] if n > hi]
  columns = [f"{lo}-{hi} (training)"] + ([f"{unseen[0]}-{unseen[-1]} (unseen)"] if unseen else [])
  keys = ["train_range"] + (["unseen"] if unseen else [])
  models = result["models"]

  def cell(value):
    return "-" if value is None else f"{100 * value:.1f}%"

  if len(models) == 1:
    rows = ["| lengths | accuracy |", "|---|---:|"]
    rows += [f"| {c} | {cell(models[0]['scores'][k])} |" for c, k in zip(columns, keys)]
    return "\n".join(rows)
  rows = ["| seed | learning rate | " + " | ".join(columns) + " |",
          "|---:|---:|" + "---:|" * len(columns)]
  for m in models:
    flag = " (diverged)" if m["diverged"] else ""
    rows.append(f"| {m['seed']} | {m['learning_rate']:g}{flag} | "
                + " | ".join(cell(m["scores"][k]) for k in keys) + " |")
  return "\n".join(rows)
