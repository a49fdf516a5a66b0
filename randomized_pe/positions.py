"""Position samplers: pure functions that turn a key into the positions of a batch.

Positions are data (DESIGN.md section 3): a sampler is called once per batch,
outside the model, and the model receives the result as an argument.

Shapes: T = sequence length, L = max_position (the range positions come from).
All samplers return int32 arrays. `length` and `max_position` are Python ints
(static under jit), so bad values fail at trace time with a clear message.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _check(length: int, max_position: int, available: int | None = None) -> None:
  if not isinstance(length, int) or length < 0:
    raise ValueError(f"length must be a non-negative int, got {length!r}")
  if not isinstance(max_position, int) or max_position < 1:
    raise ValueError(f"max_position must be a positive int, got {max_position!r}")
  available = max_position if available is None else available
  if length > available:
    raise ValueError(
        f"cannot draw {length} distinct positions from [0, {max_position}): "
        f"length={length} > max_position={max_position}; raise max_position to "
        "at least the longest sequence the model sees (input plus output tokens)"
    )


def arange(length: int) -> jax.Array:
  """Returns the classic positions 0..length-1, int32[T]."""
  if not isinstance(length, int) or length < 0:
    raise ValueError(f"length must be a non-negative int, got {length!r}")
  return jnp.arange(length, dtype=jnp.int32)


def unsorted(key: jax.Array, length: int, max_position: int) -> jax.Array:
  """`length` distinct positions drawn uniformly from [0, max_position), in draw order.

  This is the unsorted ablation of the paper's Table 3. The draw is the first
  `length` entries of a uniform random permutation of [0, max_position), so a
  prefix of the draw for a longer length is the draw for a shorter one with the
  same key (the range evaluation relies on this to pad sequences).

  Returns:
    int32[T].
  """
  _check(length, max_position)
  return jax.random.permutation(key, max_position)[:length].astype(jnp.int32)


def randomized(key: jax.Array, length: int, max_position: int) -> jax.Array:
  """`length` distinct positions drawn uniformly from [0, max_position), sorted.

  The randomized positional encoding of Ruoss et al. (2023): one sorted subset
  per batch, shared by every sequence in the batch and every layer.

  Raises:
    ValueError: if length > max_position (at trace time, never a silent clamp).

  Returns:
    int32[T], strictly increasing.
  """
  return jnp.sort(unsorted(key, length, max_position))


def sorted_offsets(key: jax.Array, length: int, max_position: int) -> jax.Array:
  """Release semantics for randomized relative and ALiBi (DESIGN.md section 4, item 5).

  The original release does not sample positions for these encodings: it samples
  `length - 1` sorted distinct distances r_1 < ... < r_{T-1} from [1, max_position)
  and gives the pair (query i, key j) the distance sign(j - i) * r_|j - i|
  (a Toeplitz pattern). This returns the table [0, r_1, ..., r_{T-1}]; the
  identity table arange(T) gives the classic distances j - i.

  Returns:
    int32[T] with entry 0 equal to 0 and the rest strictly increasing.
  """
  if length == 0:
    return jnp.zeros((0,), jnp.int32)
  _check(length, max_position, available=max_position)
  draws = jax.random.permutation(key, max_position - 1)[: length - 1] + 1
  return jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.sort(draws).astype(jnp.int32)])
