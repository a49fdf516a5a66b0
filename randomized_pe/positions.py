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


def _sorted_prefix(draws: jax.Array, length, fill) -> jax.Array:
  """Sorts the first `length` (traced) entries of `draws`; the rest become `fill`."""
  valid = jnp.arange(draws.shape[0]) < length
  big = jnp.iinfo(jnp.int32).max
  ordered = jnp.sort(jnp.where(valid, draws, big))
  return jnp.where(valid, ordered, fill).astype(jnp.int32)


def randomized_padded(key: jax.Array, length, padded_length: int, max_position: int) -> jax.Array:
  """`randomized(key, length, ...)` padded to a static `padded_length`, with `length` traced.

  Entries [0, length) equal `randomized(key, length, max_position)` exactly (the
  draw is a prefix of one permutation); the padding repeats max_position - 1.
  One compiled program then serves every length up to `padded_length`.

  Returns:
    int32[padded_length].
  """
  _check(padded_length, max_position)
  draws = jax.random.permutation(key, max_position)[:padded_length]
  return _sorted_prefix(draws, length, max_position - 1)


def arange_padded(key, length, padded_length: int, max_position: int) -> jax.Array:
  """0..padded_length-1 (the padded twin of `arange`; key and length are unused)."""
  del key, length, max_position
  return arange(padded_length)


def evenly_spaced(length: int, max_position: int) -> jax.Array:
  """floor(i * max_position / length) for i < length: spread over [0, max_position) evenly.

  The deterministic alternative at test time (Su Jianlin's blog): distinct and
  sorted whenever length <= max_position.
  """
  _check(length, max_position)
  return evenly_spaced_padded(None, length, length, max_position)


def evenly_spaced_padded(key, length, padded_length: int, max_position: int) -> jax.Array:
  """`evenly_spaced(length, ...)` padded to `padded_length`, `length` traced."""
  del key
  i = jnp.arange(padded_length, dtype=jnp.int32)
  spaced = (i * max_position) // jnp.maximum(length, 1)
  return jnp.where(i < length, spaced, max_position - 1).astype(jnp.int32)


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
  _check(length, max_position)
  draws = jax.random.permutation(key, max_position - 1)[: length - 1] + 1
  return jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.sort(draws).astype(jnp.int32)])


def sorted_offsets_padded(key: jax.Array, length, padded_length: int, max_position: int) -> jax.Array:
  """`sorted_offsets(key, length, ...)` padded to a static `padded_length`, `length` traced."""
  _check(padded_length, max_position)
  draws = jax.random.permutation(key, max_position - 1)[: padded_length - 1] + 1
  rest = _sorted_prefix(draws, length - 1, max_position - 1)
  return jnp.concatenate([jnp.zeros((1,), jnp.int32), rest])
