"""Models by name, and the narrow protocol experiments/ uses to talk to them.

experiments/ never reads a model's config fields: it builds a model with
`build(config.model, vocab_size, output_size, run)`, where `run` (a `RunSpec`) is what a
model needs to know of the run it is trained in, and then only uses the protocol below.
Adding a model is one new file in this folder and one `register` line here.

Shapes: B batch, T sequence length, O outputs, C output classes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Protocol

import jax

from randomized_pe import registry


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """What a model may know of the run it is built for (the run's config, not the model's).

  `experiments.training.steps.build_model` is the one place that makes it from a run's
  config; a model built outside a run takes the defaults.

  Attributes:
    positions: the training position sampler (`training.positions`; "": the model's
      default).
    eval_positions: the evaluation position sampler (`evaluation.positions`; "": the
      training sampler's evaluation default).
    max_length: the longest training sequence in tokens (input plus output); 0 unknown.
    eval_max_length: the longest evaluation sequence in tokens; 0 unknown.
  """

  positions: str = ""
  eval_positions: str = ""
  max_length: int = 0
  eval_max_length: int = 0


class Model(Protocol):
  """What experiments/ may use of a model."""

  description: str  # One line for progress output, e.g. "encoding X (paper semantics)".
  label: str  # A short name for titles and folder names, e.g. the encoding "rope".
  # What results (eval.json) record of the model, e.g. {"pe": "rope", "compat": "paper"};
  # a new model may record nothing ({}).
  record: Mapping[str, Any]
  # None: every parameter is trained. Else params -> a pytree of bools like params, True
  # for the parameters the optimizer must leave unchanged (e.g. Ito's `random` tables,
  # kept in params because the protocol has no separate state).
  frozen_mask: Optional[Callable[[Any], Any]]

  def init(self, key: jax.Array, tokens: jax.Array) -> Any:
    """Parameters for token batches like `tokens` (int [B, T])."""

  def apply(self, params, key: Optional[jax.Array], tokens: jax.Array, positions=None, *,
            is_training: bool = False, key_mask: Optional[jax.Array] = None,
            num_outputs: Optional[int] = None, outputs_from=None) -> jax.Array:
    """Logits [B, T, C], or [B, num_outputs, C] for num_outputs positions from
    outputs_from (default: the last ones; may be traced).

    key_mask (bool [B, T]) hides padded keys; positions come from `sample_positions`.
    """

  def sample_positions(self, key: jax.Array, length, *, padded_length: Optional[int] = None,
                       evaluation: bool = False) -> jax.Array:
    """Positions of one batch of `length` tokens (padded: the first `length` entries equal
    the unpadded draw); the evaluation sampler with evaluation=True."""

  def attention_logits_per_sequence(self, length: int) -> int:
    """Cost hint for evaluation batching: attention logits of one sequence in one layer."""

  def activation_floats_per_sequence(self, length: int, *, training: bool) -> int:
    """Cost hint for the memory check: floats one sequence of `length` tokens holds at
    once, a lower bound (attention logits and block activations): of one layer at a time
    for a forward pass (training=False), of every layer, kept for the backward pass, for
    a training step (training=True)."""

  def check_sequence_length(self, length: int, what: str = "") -> None:
    """Raises a one-line ValueError (naming the setting to change) if the model cannot
    take sequences of `length` tokens; `what` says where the length comes from."""


# name -> builder(model_config, vocab_size, output_size, run) -> Model, where model_config
# is a run's `config.model` section (an ml_collections.ConfigDict or a mapping) and run a
# `RunSpec`. The builder resolves its own settings that depend on the run (a sampler, a
# length setting whose 0 means a length of the run).
MODELS: registry.Registry[Callable[..., Model]] = registry.Registry("model")
register = MODELS.register
names = MODELS.names
get = MODELS.get


def build(model_config, vocab_size: int, output_size: int,
          run: RunSpec = RunSpec()) -> Model:
  """The model `model_config.name` (a run's `config.model`) for `run`."""
  return get(model_config["name"])(model_config, vocab_size, output_size, run)


def settings_of(config_class, model_config, exclude=()) -> dict:
  """{field: model_config[field]} for the fields of the dataclass `config_class` that
  `model_config` sets, except `exclude`: a builder passes them to the class, whose
  defaults stand in for the absent ones (configs saved before a setting was added)."""
  return {field.name: model_config[field.name] for field in dataclasses.fields(config_class)
          if field.name not in exclude and field.name in model_config}


def _encoder(model_config, vocab_size, output_size, run):
  from randomized_pe.models import encoder  # pylint: disable=import-outside-toplevel
  return encoder.from_config(model_config, vocab_size, output_size, run)


def _ito(model_config, vocab_size, output_size, run):
  from randomized_pe.models import ito  # pylint: disable=import-outside-toplevel
  return ito.from_config(model_config, vocab_size, output_size, run)


register("encoder", _encoder)
register("ito", _ito)
