"""Training state, optimizer, grids of models, the jitted step, and sharding.

Everything here talks to the model through the protocol of `randomized_pe.models`
(init, apply, sample_positions); nothing reads a model's config fields.

Randomness: every key is derived from (seed, step) with fold_in, with separate
streams for parameters and model randomness (positions, dropout), so a resumed run
continues exactly as an uninterrupted one. The data stream is `experiments.data`'s.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from experiments import data
from randomized_pe import models

# Stream tags folded into the seeds.
_PARAMS, _MODEL = 0x706172, 0x6D6F64
# The mesh axis the models or the batch are split over.
DEVICES_AXIS = "devices"


class TrainState(NamedTuple):
  params: Any
  opt_state: Any
  step: jax.Array  # int32 scalar: steps taken.
  nonfinite: jax.Array  # bool scalar: a non-finite loss was seen.


# Model settings whose 0 means a sequence length of the task (input plus output tokens),
# which only a run knows: setting -> the config section whose max_length gives it.
_TASK_LENGTH_SETTINGS = {
    "log_n_reference": "training",  # m of log-n scaling: the longest training sequence.
    "beta_max_length": "evaluation",  # M of equal_mean_beta: the longest evaluation one.
}


def build_model(config: ml_collections.ConfigDict, task) -> models.Model:
  """The run's model (`config.model.name`) for `task`'s vocabulary and outputs.

  Model settings that are task lengths (`_TASK_LENGTH_SETTINGS`) are resolved here,
  where the task is known, on a copy of the config: the run's config keeps its 0. A
  max_length below 1 is left unresolved for experiments.validation to report; a model
  without these settings, or a dataset without lengths, is left as it is.
  """
  resolved = {name: data.sequence_length(task, config[section].max_length)
              for name, section in _TASK_LENGTH_SETTINGS.items()
              if config.model.get(name) == 0 and config[section].get("max_length", 0) >= 1}
  if resolved:
    config = config.copy_and_resolve_references()
    config.model.update(resolved)
  return models.build(config, data.vocab_size(task), task.output_size)


def make_optimizer(config: ml_collections.ConfigDict,
                   learning_rate=None) -> optax.GradientTransformation:
  """Adam after global-norm clipping (none when training.grad_clip_norm is 0).

  The learning rate lives in the optimizer state (optax.inject_hyperparams), so
  models of a grid hold their own rate and share one update function.
  """
  if learning_rate is None:
    learning_rate = config.training.learning_rate
  clip_norm = config.training.grad_clip_norm
  return optax.chain(
      optax.clip_by_global_norm(clip_norm) if clip_norm > 0 else optax.identity(),
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


def loss_and_accuracy(model, params, key, batch, positions, is_training=True):
  """Mean cross-entropy over all output tokens (as the release) and masked accuracy.

  The batch may be padded (`experiments.data.pad_batch`): its true sizes come from
  sequence_length and output_length, padded keys are masked out of attention and
  padded outputs out of the loss and the accuracy, so a padded batch gives the same
  loss and gradients as the unpadded one.
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
  log_probs = jax.nn.log_softmax(out)
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  loss = jnp.sum(jnp.where(valid, nll, 0.0)) / (targets.shape[0] * output_length)
  correct = (jnp.argmax(out, axis=-1) == targets) & batch["mask"] & valid
  return loss, jnp.sum(correct) / jnp.maximum(jnp.sum(batch["mask"] & valid), 1)


def make_train_step(model, optimizer, seed):
  """Returns the pure train_step(state, batch) -> (state, metrics); `seed` may be traced.

  One program serves every batch of one padded shape: positions are drawn for the
  batch's true length (the padded draw's prefix is the unpadded draw).
  """

  def train_step(state: TrainState, batch):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), _MODEL), state.step)
    pos_key, dropout_key = jax.random.split(key)
    positions = model.sample_positions(pos_key, batch["sequence_length"][0],
                                       padded_length=batch["tokens"].shape[1])

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


def make_grid_step(model, optimizer):
  """grid_step(states [M], seeds [M], batch) -> (states, metrics [M]): one shared batch.

  Every model draws its own positions and dropout keys from its own seed.
  """

  def grid_step(states, seeds, batch):
    def one(state, seed):
      return make_train_step(model, optimizer, seed)(state, batch)
    return jax.vmap(one)(states, seeds)

  return grid_step


def mesh_shardings(devices, num_models: int):
  """(state, seeds, batch) shardings: models split over devices when they divide evenly,
  otherwise the batch (data parallel); None on one device."""
  if len(devices) == 1:
    return None, None, None
  mesh = jax.sharding.Mesh(np.array(devices), (DEVICES_AXIS,))
  split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(DEVICES_AXIS))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  if num_models > 1 and num_models % len(devices) == 0:
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
    step: the jitted grid step (state donated): (state, seeds, batch) -> (state, metrics).
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


def build_trainer(config: ml_collections.ConfigDict, task, devices=None) -> Trainer:
  """The model, the initial grid state and the jitted step of a run's config."""
  devices = jax.devices() if devices is None else devices
  model = build_model(config, task)
  members = grid_members(config)
  state_sharding, seeds_sharding, batch_sharding = mesh_shardings(devices, len(members))
  state = init_grid(model, config, members)
  seeds = jnp.array([s for s, _ in members], jnp.int32)
  if state_sharding is not None:
    state = jax.device_put(state, state_sharding)
    seeds = jax.device_put(seeds, seeds_sharding)
  step = jax.jit(make_grid_step(model, make_optimizer(config)), donate_argnums=(0,))
  place = ((lambda b: jax.device_put(b, batch_sharding)) if batch_sharding is not None
           else (lambda b: b))
  return Trainer(model, members, state, seeds, step, place, state_sharding, batch_sharding)
