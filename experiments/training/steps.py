"""Training state, optimizer, grids of models, the jitted step, and sharding.

Everything here talks to the model through the protocol of `randomized_pe.models`
(init, apply, sample_positions); nothing reads a model's config fields.

Randomness: every key is derived from (seed, step) with fold_in, with separate
streams for parameters and model randomness (positions, dropout), so a resumed run
continues exactly as an uninterrupted one. The data stream is `experiments.training.data`'s.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from experiments.training import compile_cache
from experiments.training import data
from experiments.training import members as members_lib
from randomized_pe import models
from randomized_pe import registry

# Stream tags folded into the seeds.
_PARAMS, _MODEL = 0x706172, 0x6D6F64
# The mesh axis the models or the batch are split over.
DEVICES_AXIS = "devices"


class TrainState(NamedTuple):
  params: Any
  opt_state: Any
  step: jax.Array  # int32 scalar: steps taken.
  nonfinite: jax.Array  # bool scalar: a non-finite loss was seen.


def run_spec(config: ml_collections.ConfigDict, task) -> models.RunSpec:
  """What the run's model needs to know of the run (`randomized_pe.models.RunSpec`): the
  samplers of training and evaluation and their longest sequences of `task` in tokens
  (input plus output; a dataset's examples all have its `sequence_length`; 0 where the
  run has no max_length >= 1, which experiments.training.validation reports)."""

  def longest(section) -> int:
    if isinstance(task, data.Dataset):  # Every example has the dataset's length.
      return task.sequence_length
    max_length = config.get(section, {}).get("max_length", 0)
    return data.sequence_length(task, max_length) if max_length >= 1 else 0

  return models.RunSpec(positions=config.get("training", {}).get("positions", ""),
                        eval_positions=config.get("evaluation", {}).get("positions", ""),
                        max_length=longest("training"), eval_max_length=longest("evaluation"))


def build_model(config: ml_collections.ConfigDict, task) -> models.Model:
  """The run's model (`config.model`, by its name) for `task`'s vocabulary and outputs.

  The one place a run's config becomes a model: the model reads `config.model` and what
  it needs of the run (`run_spec`), and resolves its own settings from them (e.g. the
  encoder's lengths whose 0 means a length of the run). The run's config keeps its 0.
  """
  return models.build(config.model, data.vocab_size(task), task.output_size,
                      run_spec(config, task))


@dataclasses.dataclass(frozen=True)
class Optimizer:
  """One choice of `training.optimizer`.

  Attributes:
    make: (learning_rate, weight_decay) -> optax.GradientTransformation, with the
      learning rate in its state (optax.inject_hyperparams), so that the models of a
      grid hold their own rate and share one update function.
    weight_decay: whether it takes `training.weight_decay`.
  """

  make: Callable[[float, float], optax.GradientTransformation]
  weight_decay: bool = False


OPTIMIZERS: registry.Registry[Optimizer] = registry.Registry("optimizer")
OPTIMIZERS.register("adam", Optimizer(
    lambda rate, decay: optax.inject_hyperparams(optax.adam)(learning_rate=rate)))
# Decoupled weight decay, p <- p - rate * (adam's step + decay * p): torch.optim.AdamW.
OPTIMIZERS.register("adamw", Optimizer(
    lambda rate, decay: optax.inject_hyperparams(optax.adamw)(learning_rate=rate,
                                                              weight_decay=decay),
    weight_decay=True))
OPTIMIZERS.register("sgd", Optimizer(  # Plain SGD, no momentum: torch.optim.SGD(lr).
    lambda rate, decay: optax.inject_hyperparams(optax.sgd)(learning_rate=rate)))


@dataclasses.dataclass(frozen=True)
class Schedule:
  """One choice of `training.lr_schedule`.

  Attributes:
    factor: (training settings) -> the factor of the learning rate as a function of the
      update count (an optax schedule), or None for none (the rate is constant).
    uses_steps: whether it reads `training.lr_warmup_steps` and `training.lr_decay_steps`.
  """

  factor: Callable[[ml_collections.ConfigDict], Optional[optax.Schedule]]
  uses_steps: bool = False


SCHEDULES: registry.Registry[Schedule] = registry.Registry("learning-rate schedule")
SCHEDULES.register("constant", Schedule(lambda t: None))  # The paper's.
# Linear from 0 to the rate over lr_warmup_steps, then half a cosine down to 0 at
# lr_decay_steps (and 0 after it): optax.warmup_cosine_decay_schedule.
SCHEDULES.register("warmup_cosine", Schedule(
    lambda t: optax.warmup_cosine_decay_schedule(0.0, 1.0, t.lr_warmup_steps,
                                                 t.lr_decay_steps, 0.0),
    uses_steps=True))


def _schedule_factor(t: ml_collections.ConfigDict) -> Optional[optax.Schedule]:
  """The factor of `training.lr_schedule` (default "constant": None), after checking its
  step settings: a one-line ValueError for an unknown schedule, a negative or non-integer
  step count, steps given to a schedule that takes none, or a decay that does not end
  after the warm-up."""
  name = t.get("lr_schedule", "constant")
  choice = SCHEDULES.get(name)
  warmup, decay = t.get("lr_warmup_steps", 0), t.get("lr_decay_steps", 0)
  for key, value in (("lr_warmup_steps", warmup), ("lr_decay_steps", decay)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise ValueError(f"training.{key} must be an integer >= 0, got {value!r}")
  if not choice.uses_steps and (warmup or decay):
    takes = [n for n in SCHEDULES.names() if SCHEDULES.get(n).uses_steps]
    raise ValueError(f"training.lr_warmup_steps={warmup} and training.lr_decay_steps={decay} "
                     f"need a schedule that takes them ({', '.join(takes)}), got {name!r}")
  if choice.uses_steps and decay <= warmup:
    raise ValueError(f"training.lr_decay_steps must be > training.lr_warmup_steps for "
                     f"{name!r}, got {decay} and {warmup}")
  return choice.factor(t)


def make_optimizer(config: ml_collections.ConfigDict,
                   learning_rate=None) -> optax.GradientTransformation:
  """Global-norm clipping (none when training.grad_clip_norm is 0), then the optimizer,
  then the learning-rate schedule's factor.

  `training.optimizer` (default "adam"; `OPTIMIZERS`), with `training.weight_decay`
  (default 0) for "adamw"; `training.lr_schedule` (default "constant": no factor, the
  chain as it was before schedules existed; `SCHEDULES`). A schedule multiplies the
  optimizer's update by its factor at the update count, i.e. it scales the rate (and
  adamw's decay with it, as optax's own schedules do); the count is part of the
  optimizer's state, so resuming continues the schedule. Raises a one-line ValueError for
  an unknown optimizer or schedule, a weight decay the optimizer does not take, or bad
  schedule steps.
  """
  t = config.training
  if learning_rate is None:
    learning_rate = t.learning_rate
  name = t.get("optimizer", "adam")
  choice = OPTIMIZERS.get(name)
  decay = t.get("weight_decay", 0.0)
  if isinstance(decay, bool) or not isinstance(decay, (int, float)) or decay < 0:
    raise ValueError(f"training.weight_decay must be >= 0, got {decay!r}")
  if decay and not choice.weight_decay:
    raise ValueError(f"training.weight_decay={decay} needs training.optimizer='adamw', "
                     f"got {name!r}")
  factor = _schedule_factor(t)
  clip_norm = t.grad_clip_norm
  parts = [optax.clip_by_global_norm(clip_norm) if clip_norm > 0 else optax.identity(),
           choice.make(learning_rate, decay)]
  if factor is not None:
    parts.append(optax.scale_by_schedule(factor))
  return optax.chain(*parts)


def optimizer_for(model, config: ml_collections.ConfigDict,
                  learning_rate=None) -> optax.GradientTransformation:
  """`make_optimizer`, and for a model with frozen parameters their updates set to zero.

  A model may keep parameters that are not trained in `params` (Ito's `random` tables:
  the protocol has no separate state) and mark them with its protocol's
  `frozen_mask(params)`. Their gradient is zero, but weight decay would still shrink them;
  PyTorch's AdamW skips them because they have no gradient. Zeroing their updates leaves
  them unchanged under any optimizer. A model whose `frozen_mask` is None (nothing
  frozen) gets `make_optimizer`'s optimizer as it is.
  """
  optimizer = make_optimizer(config, learning_rate)
  if model.frozen_mask is None:
    return optimizer
  return optax.chain(optimizer, optax.masked(optax.set_to_zero(), model.frozen_mask))


def grid_members(config: ml_collections.ConfigDict) -> list[tuple[int, float]]:
  """(seed, learning rate) of every model trained together: seeds x learning rates.

  Empty `grid.seeds` / `grid.learning_rates` mean the single `seed` /
  `training.learning_rate`.
  """
  seeds = list(config.grid.seeds) or [config.seed]
  rates = list(config.grid.learning_rates) or [config.training.learning_rate]
  return [(int(s), float(r)) for s in seeds for r in rates]


def loss_and_accuracy(model, params, key, batch, positions, is_training=True):
  """Mean cross-entropy over all output tokens of the real rows (as the release) and
  masked accuracy.

  The batch may be padded (`experiments.training.data`): its true sizes come from
  sequence_length and output_length, and its real rows from row_mask where it has one;
  padded keys are masked out of attention, padded outputs and padded rows out of the
  loss and the accuracy, so a padded batch gives the same loss and gradients as the
  unpadded one.
  """
  tokens, targets = batch["tokens"], batch["targets"]  # [B, T], [B, O]
  sequence_length = batch["sequence_length"][0]
  output_length = batch["output_length"][0]
  key_mask = jnp.broadcast_to(jnp.arange(tokens.shape[1])[None, :] < sequence_length,
                              tokens.shape)
  # The answers follow the input; the model computes only their logits.
  out = model.apply(params, key, tokens, positions, is_training=is_training, key_mask=key_mask,
                    num_outputs=targets.shape[1],
                    outputs_from=sequence_length - output_length)  # [B, O, C]
  valid = jnp.arange(targets.shape[1])[None, :] < output_length  # [1, O]
  rows = targets.shape[0]
  # Only a batch with padded rows has a row mask (a dataset's last partial batch): without
  # one the program is the one it always was, to the bit (a [B, O] mask would change the
  # order XLA sums the loss in).
  if "row_mask" in batch:
    valid = valid & batch["row_mask"][:, None]  # [B, O]
    rows = jnp.sum(batch["row_mask"])
  log_probs = jax.nn.log_softmax(out)
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  loss = jnp.sum(jnp.where(valid, nll, 0.0)) / (rows * output_length)
  correct = (jnp.argmax(out, axis=-1) == targets) & batch["mask"] & valid
  return loss, jnp.sum(correct) / jnp.maximum(jnp.sum(batch["mask"] & valid), 1)


def model_keys(seed, step):
  """The keys of a model's step, [2, 2]: (positions, dropout) = split(fold_in(fold_in(
  PRNGKey(seed), _MODEL), step)); `seed` and `step` may be traced. They do not depend on
  the batch's shape, so a run compiles them once (`TrainingStep`)."""
  key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), _MODEL), step)
  return jax.random.split(key)


def make_gradient_step(model):
  """Returns the pure gradients(state, keys, batch) -> (grads, metrics), `keys` the step's
  `model_keys`.

  One program serves every batch of one padded shape: positions are drawn for the
  batch's true length (the padded draw's prefix is the unpadded draw).
  """

  def gradients(state: TrainState, keys, batch):
    pos_key, dropout_key = keys
    positions = model.sample_positions(pos_key, batch["sequence_length"][0],
                                       padded_length=batch["tokens"].shape[1])

    def loss_fn(params):
      return loss_and_accuracy(model, params, dropout_key, batch, positions)

    (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    return grads, {"loss": loss, "accuracy": accuracy}

  return gradients


def make_update(optimizer):
  """Returns the pure update(state, grads, metrics) -> state: the optimizer's step, and
  the state's flag set when the loss or the update is not finite. It does not depend on
  the batch's shape."""

  def update(state: TrainState, grads, metrics):
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(optax.tree_utils.tree_norm(updates))
    return TrainState(params, opt_state, state.step + 1, state.nonfinite | ~finite)

  return update


def make_train_step(model, optimizer, seed):
  """Returns the pure train_step(state, batch) -> (state, metrics), gradients and update
  in one function; `seed` may be traced. (`Trainer.step` runs them as three programs:
  `TrainingStep`.)"""
  gradients, update = make_gradient_step(model), make_update(optimizer)

  def train_step(state: TrainState, batch):
    grads, metrics = gradients(state, model_keys(seed, state.step), batch)
    return update(state, grads, metrics), metrics

  return train_step


def init_state(model, optimizer, seed, tokens=None) -> TrainState:
  """One model's initial state; `seed` may be traced.

  tokens: int [1, T] to initialise with (`experiments.training.data.example_tokens`); None: two
  tokens, which the encoder's parameters do not depend on.
  """
  tokens = jnp.zeros((1, 2), jnp.int32) if tokens is None else jnp.asarray(tokens)
  key = jax.random.fold_in(jax.random.PRNGKey(seed), _PARAMS)
  params = model.init(key, tokens)
  return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32),
                    jnp.zeros((), bool))


def init_grid(model, config, members, tokens=None, cache_key=None) -> TrainState:
  """Initial states of all grid members stacked on a leading models axis [M, ...].

  cache_key: what determines model, config and tokens, to keep the program's executable
  (`compile_cache.Program`); None: not kept.
  """
  seeds = jnp.array([s for s, _ in members], jnp.int32)
  rates = jnp.array([r for _, r in members], jnp.float32)

  def one(seed, rate):
    return init_state(model, optimizer_for(model, config, rate), seed, tokens)

  return compile_cache.Program(jax.vmap(one), "init_grid", cache_key)(seeds, rates)


def make_grid_step(model, optimizer, layout: str = members_lib.DEFAULT):
  """grid_step(states [M], seeds [M], batch) -> (states, metrics [M]): one shared batch,
  in one function (`make_grid_programs` gives its two parts).

  Every model draws its own positions and dropout keys from its own seed; `layout`
  (`experiments.training.members`) says how the models run in the program.
  """

  # One model's step, named as the grid's program and its arguments (the names of the
  # compiled program's parameters).
  def grid_step(states, seeds, batch):
    return make_train_step(model, optimizer, seeds)(states, batch)

  return members_lib.over_members(grid_step, layout, in_axes=(0, 0, None))


def make_grid_programs(model, optimizer, layout: str = members_lib.DEFAULT):
  """(grid_keys, grid_gradients, grid_update): `make_grid_step` in three parts, lifted
  over the grid's models as `layout` runs them.

  grid_keys(steps [M], seeds [M]) -> keys [M, 2, 2] (`model_keys`) and grid_update(states
  [M], grads [M], metrics [M]) -> states do not depend on the batch's shape, so a run
  compiles each once; grid_gradients(states [M], keys [M], batch) -> (grads [M], metrics
  [M]) once per training shape.
  """

  def grid_keys(steps, seeds):
    return model_keys(seeds, steps)

  def grid_gradients(states, keys, batch):
    return make_gradient_step(model)(states, keys, batch)

  def grid_update(states, grads, metrics):
    return make_update(optimizer)(states, grads, metrics)

  return (members_lib.over_members(grid_keys, layout, in_axes=(0, 0)),
          members_lib.over_members(grid_gradients, layout, in_axes=(0, 0, None)),
          members_lib.over_members(grid_update, layout, in_axes=(0, 0, 0)))


def _placeholders(compiled):
  """Zeros shaped and placed as a compiled program's outputs: the arguments of the next
  program's signature, to compile it without running the first."""
  return jax.tree_util.tree_map(
      lambda info: jax.device_put(jnp.zeros(info.shape, info.dtype), info.sharding),
      compiled.out_info)


class TrainingStep:
  """The grid step as three programs: the step's keys and the update (Adam, the
  non-finite flag), one each per run since neither depends on the batch's shape, and the
  gradients, one per batch shape.

  On a CPU the update is about a fifth of a training program's compile time at the
  paper's model and the keys' small random-bit loops a few percent (docs/benchmark.md),
  so a run of 40 training lengths compiles them once instead of 40 times. The keys are
  the same bits wherever they are computed; the update in a program of its own gives the
  one-program step's models to within float rounding (XLA fuses and orders some
  operations otherwise; about 1e-5 after a few Adam steps), so the split is part of how a
  run computes, not of its settings.

  Call it as the one-program step: step(state, seeds, batch) -> (state, metrics), the
  state donated; `compile` and `lower(...).compile()` give a `CompiledStep`.
  """

  def __init__(self, keys: compile_cache.Program, gradients: compile_cache.Program,
               update: compile_cache.Program):
    self.keys = keys
    self.gradients = gradients
    self.update = update

  def __call__(self, state, seeds, batch):
    return _run_step(self.keys, self.gradients, self.update, state, seeds, batch)

  def compile(self, state, seeds, batch) -> "CompiledStep":
    """The three programs compiled (or loaded) for these arguments, without running a step
    (the keys and the update are compiled once; later shapes find them)."""
    keys = self.keys.compile(state.step, seeds)
    gradients = self.gradients.compile(state, _placeholders(keys), batch)
    update = self.update.compile(state, *_placeholders(gradients))
    return CompiledStep(keys, gradients, update)

  def lower(self, state, seeds, batch):
    """An object whose `compile()` is `compile(state, seeds, batch)` (as jax.jit's lower)."""
    return _Lowered(lambda: self.compile(state, seeds, batch))


@dataclasses.dataclass(frozen=True)
class _Lowered:
  compile: Callable


def _run_step(keys, gradients, update, state, seeds, batch):
  grads, metrics = gradients(state, keys(state.step, seeds), batch)
  return update(state, grads, metrics), metrics


@dataclasses.dataclass(frozen=True)
class CompiledStep:
  """A `TrainingStep` compiled for one batch shape: callable as the step, with XLA's
  cost analysis of its programs summed."""
  keys: Any
  gradients: Any
  update: Any

  def __call__(self, state, seeds, batch):
    return _run_step(self.keys, self.gradients, self.update, state, seeds, batch)

  def as_text(self) -> str:
    """The programs' optimised HLO, the gradients' first (for profiles that read it)."""
    return "\n".join(p.as_text() for p in (self.gradients, self.keys, self.update))

  def cost_analysis(self) -> dict:
    total: dict = {}
    for program in (self.keys, self.gradients, self.update):
      cost = program.cost_analysis()
      cost = cost[0] if isinstance(cost, (list, tuple)) else cost
      for name, value in (cost or {}).items():
        if isinstance(value, (int, float)):
          total[name] = total.get(name, 0.0) + float(value)
    return total


def mesh_shardings(devices, num_models: int, layout: str = members_lib.DEFAULT):
  """(state, seeds, batch) shardings: models split over devices when they divide evenly
  and the layout runs them side by side, otherwise the batch (data parallel: a `loop`
  grid runs one model at a time over every device); None on one device."""
  if len(devices) == 1:
    return None, None, None
  mesh = jax.sharding.Mesh(np.array(devices), (DEVICES_AXIS,))
  split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(DEVICES_AXIS))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  side_by_side = members_lib.LAYOUTS[layout].side_by_side
  if side_by_side and num_models > 1 and num_models % len(devices) == 0:
    return split, split, replicated
  return replicated, replicated, split


@dataclasses.dataclass
class Trainer:
  """Everything a training loop (or the benchmark) needs, built once from a config.

  Attributes:
    model: the model (protocol of `randomized_pe.models`).
    members: (seed, learning rate) of every model of the grid.
    state: the initial stacked state [M, ...], placed on the devices.
    seeds: int32 [M] seeds, placed.
    step: the grid step (state donated): (state, seeds, batch) -> (state, metrics), a
      `TrainingStep` of two `compile_cache.Program`s keyed by the run's config.
    place: puts a host batch on the devices (split over them when data parallel).
    state_sharding, batch_sharding: None on one device.
  """

  model: Any
  members: list
  state: TrainState
  seeds: jax.Array
  step: Callable
  place: Callable
  state_sharding: Any
  batch_sharding: Any

  @property
  def num_models(self) -> int:
    return len(self.members)

  def set_state(self, state: TrainState) -> None:
    """Replaces the state (e.g. by a restored one), placed as the initial one."""
    if self.state_sharding is not None:
      state = jax.device_put(state, self.state_sharding)
    self.state = state


def build_trainer(config: ml_collections.ConfigDict, task, devices=None,
                  model=None) -> Trainer:
  """The model, the initial grid state and the jitted step of a run's config.

  task: what the model is built for, a generated task or a dataset
  (`experiments.training.data.source(config).task`).
  model: the run's model when already built (`experiments.training.validation.validate`
    returns it); None builds it (`build_model`).
  """
  devices = jax.devices() if devices is None else devices
  model = build_model(config, task) if model is None else model
  members = grid_members(config)
  layout = members_lib.of(config)
  state_sharding, seeds_sharding, batch_sharding = mesh_shardings(devices, len(members), layout)
  # Everything the programs close over follows from the config and the task, so they key
  # the programs' executables.
  key = compile_cache.run_key(config, task)
  state = init_grid(model, config, members, data.example_tokens(task), cache_key=key)
  seeds = jnp.array([s for s, _ in members], jnp.int32)
  if state_sharding is not None:
    state = jax.device_put(state, state_sharding)
    seeds = jax.device_put(seeds, seeds_sharding)
  keys, gradients, update = make_grid_programs(model, optimizer_for(model, config), layout)
  step = TrainingStep(compile_cache.Program(keys, "grid_keys", key),
                      compile_cache.Program(gradients, "grid_gradients", key),
                      compile_cache.Program(update, "grid_update", key, donate_argnums=(0,)))
  place = ((lambda b: jax.device_put(b, batch_sharding)) if batch_sharding is not None
           else (lambda b: b))
  return Trainer(model, members, state, seeds, step, place, state_sharding, batch_sharding)
