"""Models by name, and the narrow protocol experiments/ uses to talk to them.

experiments/ never reads a model's config fields: it builds a model with
`build(config, vocab_size, output_size)` and then only calls the protocol below.
Adding a model is one new file in this folder and one `register` line here.

Shapes: B batch, T sequence length, O outputs, C output classes.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

import jax

from randomized_pe import registry


class Model(Protocol):
  """What experiments/ may call on a model."""

  description: str  # One line for progress output, e.g. "encoding X (paper semantics)".

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

  def check_sequence_length(self, length: int, what: str = "") -> None:
    """Raises a one-line ValueError (naming the setting to change) if the model cannot
    take sequences of `length` tokens; `what` says where the length comes from."""


# name -> builder(config, vocab_size, output_size) -> Model, where config is a run's
# ml_collections config (the builder reads config.model and the position samplers).
MODELS: registry.Registry[Callable[..., Model]] = registry.Registry("model")
register = MODELS.register
names = MODELS.names
get = MODELS.get


def build(config, vocab_size: int, output_size: int) -> Model:
  """The model `config.model.name` of a run's config."""
  return get(config.model.name)(config, vocab_size, output_size)


def _encoder(config, vocab_size, output_size):
  from randomized_pe.models import encoder  # pylint: disable=import-outside-toplevel
  return encoder.from_config(config, vocab_size, output_size)


def _ito(config, vocab_size, output_size):
  from randomized_pe.models import ito  # pylint: disable=import-outside-toplevel
  return ito.from_config(config, vocab_size, output_size)


register("encoder", _encoder)
register("ito", _ito)
