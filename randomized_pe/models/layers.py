"""Haiku layers both models use, defined once (issue #30, item 3).

  get_params    creates the parameters an encoding family declares (`families.ParamSpec`)
  layer_norm    LayerNorm over the features, scale and offset, eps 1e-5 (Haiku's default,
                which is also torch.nn.LayerNorm's)
  dropout       inverted dropout from the module's rng, in the order a model draws it
  next_rng_keys_in_order
                the next keys of Haiku's sequence, as many calls of hk.next_rng_key
                give them, split in one loop
  torch_uniform, xavier_uniform
                PyTorch's default initialisers (Ito's model copies them: docs/ito.md); the
                others are jax.nn's (`jax.nn.initializers.normal`, `zeros`, ...)

`randomized_pe.models.encoder` and `randomized_pe.models.ito` import them from here; a
change here changes both models (tests/test_pinned_outputs.py pins both).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Optional

import haiku as hk
import jax
import jax.numpy as jnp

from randomized_pe import families


def get_params(specs: Mapping[str, families.ParamSpec]) -> dict:
  """Creates a family's declared parameters in the current Haiku module, in `specs` order.

  Each draws its own key (`hk.next_rng_key()`), so the order of the specs and of the
  modules around them fixes the initial values.
  """
  return {name: hk.get_parameter(
      name, list(spec.shape),
      init=lambda shape, dtype, spec=spec: spec.init(hk.next_rng_key(), tuple(shape), dtype))
      for name, spec in specs.items()}


def layer_norm(x: jax.Array, name: str, eps: float = 1e-5) -> jax.Array:
  """LayerNorm over the last axis with a learned scale (init 1) and offset (init 0)."""
  return hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, eps=eps, name=name)(x)


def dropout(x: jax.Array, rate: float, *, position_major: bool = False,
            positions: Optional[int] = None, key: Optional[jax.Array] = None) -> jax.Array:
  """Inverted dropout of x [B, T, M]: each entry kept with 1 - rate and divided by it.

  Args:
    x: [B, T, M].
    rate: the probability of dropping, in [0, 1).
    position_major: draw the mask as [T, B, M] (the encoder's: a position's mask then does
      not depend on how many positions follow it, so a padded batch drops what the
      unpadded batch drops); else as x's shape [B, T, M] (Ito's model).
    positions: with position_major, draw the mask for this many positions (at least T)
      and keep its first T: the same bits as a draw for T (JAX's partitionable threefry
      draws a shape as a prefix of a longer one), but every mask of a program then has
      one shape, and XLA compiles one random-bit kernel instead of one per shape. None
      draws for T.
    key: the PRNG key; None takes `hk.next_rng_key()`.
  """
  keep_rate = 1.0 - rate
  key = hk.next_rng_key() if key is None else key
  if position_major:
    length = x.shape[1]
    drawn = length if positions is None else positions
    if drawn < length:
      raise ValueError(f"dropout: positions ({drawn}) must be at least x's {length}")
    keep = jax.random.bernoulli(key, keep_rate, (drawn, x.shape[0], *x.shape[2:]))
    keep = jnp.swapaxes(keep[:length], 0, 1)
  else:
    keep = jax.random.bernoulli(key, keep_rate, x.shape)
  return jnp.where(keep, x / keep_rate, 0.0)


def next_rng_keys_in_order(num: int) -> list:
  """The next `num` keys of Haiku's key sequence: what `num` calls of hk.next_rng_key give.

  Haiku splits each key from the sequence's own (`key, subkey = split(key)`, its default
  reserve of one key), a chain of small threefry programs, one while loop each: XLA
  emits and optimises every one of them as a kernel of its own (about 50 KB of machine
  code each). The same chain as one `lax.scan` gives the same keys, bit for bit, from one
  kernel. Keys Haiku has already split come first, as next_rng_key would give them; the
  sequence then continues after the last key returned.
  """
  state = hk.maybe_get_rng_sequence_state()
  if state is None or num <= 0:
    return [hk.next_rng_key() for _ in range(num)]  # Raises Haiku's own error without rng.
  key, reserved = state
  reserved = list(reserved)
  keys, rest = reserved[:num], reserved[num:]
  if len(keys) < num:
    def split(key, _):
      key, subkey = jax.random.split(key)
      return key, subkey
    key, subkeys = jax.lax.scan(split, key, None, length=num - len(keys))
    keys += list(subkeys)
  hk.replace_rng_sequence_state((key, tuple(rest)))
  return keys


# --------------------------------------------------------------------------
# PyTorch's default initialisers, as jax initialisers (key, shape, dtype) -> array. They
# have no jax.nn equal: jax.nn's uniform is U[0, s), and its variance_scaling draws
# U(-1, 1) times the bound, which differs from U(-bound, bound) in the last bit.


def torch_uniform(fan_in: int) -> Callable[..., jax.Array]:
  """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): torch.nn.Linear's weight and bias defaults.

  (kaiming_uniform_ with a = sqrt(5) gives the bound sqrt(6 / ((1 + 5) fan_in)).)
  """
  bound = 1.0 / math.sqrt(fan_in)
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


def xavier_uniform(fan_in: int, fan_out: int) -> Callable[..., jax.Array]:
  """U(±sqrt(6 / (fan_in + fan_out))): torch.nn.MultiheadAttention's packed in-projection."""
  bound = math.sqrt(6.0 / (fan_in + fan_out))
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


# --------------------------------------------------------------------------
# The model wrapper's shared methods (the protocol of `randomized_pe.models`).


class TransformedModel:
  """What both models' wrappers share: a frozen dataclass with fields `config` and
  `output_size` whose network, `make_network(config, output_size)` (an hk.Transformed),
  is built once; `init`; the cost hints (H logits per query and key; `block_width`
  activations per token and layer); and no frozen parameters.
  Subclasses set `make_network` and `block_width`, and add `apply`, `sample_positions`, ..."""

  make_network: Callable[..., hk.Transformed]
  block_width: int  # Activations per token and layer (a property of the subclass).
  frozen_mask = None  # Every parameter is trained (a subclass may define the method).

  def __post_init__(self):
    object.__setattr__(self, "_net", type(self).make_network(self.config, self.output_size))

  def init(self, key, tokens):
    """Parameters for token batches like `tokens` (int [B, T])."""
    return self._net.init(key, tokens)

  def attention_logits_per_sequence(self, length: int) -> int:
    """Cost hint: attention logits one sequence of `length` tokens holds in one layer."""
    return self.config.num_heads * length * length

  def activation_floats_per_sequence(self, length: int, *, training: bool) -> int:
    """Cost hint for the memory check: per layer the attention logits and `block_width`
    activations per token; every layer for a training step (kept for the backward pass),
    one at a time for a forward pass."""
    per_layer = self.attention_logits_per_sequence(length) + length * self.block_width
    return per_layer * (self.config.num_layers if training else 1)
