"""Position samplers: which positions a batch sees, one registry by name (no Haiku here).

Positions are data: a sampler is called once per batch, outside the model, and the
model receives the result as an argument. Every sampler has one signature,

    sampler(key, length, max_position, padded_length=None) -> positions

  key            a PRNG key (ignored by deterministic samplers; None is fine for them)
  length         T, the true sequence length; a Python int, or a traced int32 when
                 padded_length is given
  max_position   L, the range [0, L) positions come from (a Python int)
  padded_length  None: return [T]; an int P >= T: return [P] whose first T entries
                 equal the unpadded draw for `length` (a prefix of one draw), so one
                 compiled program serves every length up to P. Padding entries are
                 max_position - 1 unless a sampler says otherwise; the model masks
                 padded keys, so their value never matters.

Registered samplers (`names()`):

  arange         0..T-1, the classic positions
  randomized     T distinct positions uniform from [0, L), sorted (Ruoss et al. 2023)
  unsorted       the same draw in draw order (the paper's Table 3 ablation)
  evenly_spaced  floor(k L / T) for k < T: deterministic, spread over [0, L)
  offsets        the original release's sorted distance table for relative and ALiBi
                 (docs/release.md, item 5); the release plan of `randomized_pe.families`
                 substitutes it for `randomized` under compat="release"

A new sampler is one `register(Sampler(...))` call; configs then accept its name for
training (`training.positions`) and evaluation (`evaluation.positions`). Samplers may
return floats (set `floats=True`); encoding families that need integers (a learned
table) refuse them before anything compiles.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from randomized_pe import registry


def check_length(length: int, max_position: int) -> None:
  """Raises a one-line ValueError unless 0 <= length <= max_position (Python ints)."""
  if not isinstance(length, int) or length < 0:
    raise ValueError(f"length must be a non-negative int, got {length!r}")
  if not isinstance(max_position, int) or max_position < 1:
    raise ValueError(f"max_position must be a positive int, got {max_position!r}")
  if length > max_position:
    raise ValueError(
        f"cannot draw {length} distinct positions from [0, {max_position}): "
        f"length={length} > max_position={max_position}; raise max_position to "
        "at least the longest sequence the model sees (input plus output tokens)"
    )


def _static_size(length, padded_length) -> int:
  """The static output size: padded_length, or length (which must then be a Python int)."""
  if padded_length is None:
    if not isinstance(length, int):
      raise ValueError("a traced length needs a static padded_length")
    return length
  if not isinstance(padded_length, int) or padded_length < 0:
    raise ValueError(f"padded_length must be a non-negative int, got {padded_length!r}")
  if isinstance(length, int) and length > padded_length:
    raise ValueError(f"length={length} > padded_length={padded_length}")
  return padded_length


def _sorted_prefix(draws: jax.Array, length, fill) -> jax.Array:
  """Sorts the first `length` (maybe traced) entries of `draws`; the rest become `fill`."""
  valid = jnp.arange(draws.shape[0]) < length
  big = jnp.iinfo(jnp.int32).max
  ordered = jnp.sort(jnp.where(valid, draws, big))
  return jnp.where(valid, ordered, fill).astype(jnp.int32)


def arange(key, length, max_position: int = 1, padded_length: Optional[int] = None):
  """0..T-1 (int32[T]); padded: 0..P-1 (positions past T are masked by the model)."""
  del key, max_position
  return jnp.arange(_static_size(length, padded_length), dtype=jnp.int32)


def unsorted(key, length, max_position: int, padded_length: Optional[int] = None):
  """`length` distinct positions uniform from [0, max_position), in draw order.

  The draw is the first entries of a uniform random permutation of [0, L), so the
  draw for a shorter length is a prefix of the draw for a longer one with the same
  key (padding needs nothing else). int32[T] (or [P]).
  """
  size = _static_size(length, padded_length)
  check_length(size, max_position)
  draws = jax.random.permutation(key, max_position)[:size].astype(jnp.int32)
  if padded_length is None:
    return draws
  return jnp.where(jnp.arange(size) < length, draws, max_position - 1).astype(jnp.int32)


def randomized(key, length, max_position: int, padded_length: Optional[int] = None):
  """`length` distinct positions uniform from [0, max_position), sorted: int32[T], increasing.

  The randomized positional encoding of Ruoss et al. (2023): one sorted subset per
  batch, shared by every sequence of the batch and every layer.

  Raises:
    ValueError: if length > max_position (at trace time, never a silent clamp).
  """
  size = _static_size(length, padded_length)
  check_length(size, max_position)
  draws = jax.random.permutation(key, max_position)[:size]
  if padded_length is None:
    return jnp.sort(draws).astype(jnp.int32)
  return _sorted_prefix(draws, length, max_position - 1)


def evenly_spaced(key, length, max_position: int, padded_length: Optional[int] = None):
  """floor(k * max_position / length) for k < length: spread over [0, L) evenly, int32.

  The deterministic alternative at test time (Su Jianlin's blog, 均匀取点): distinct
  and sorted whenever length <= max_position. The key is unused.
  """
  del key
  size = _static_size(length, padded_length)
  check_length(size, max_position)
  k = jnp.arange(size, dtype=jnp.int32)
  spaced = (k * max_position) // jnp.maximum(length, 1)
  return jnp.where(k < length, spaced, max_position - 1).astype(jnp.int32)


def offsets(key, length, max_position: int, padded_length: Optional[int] = None):
  """The release's sorted distance table for relative and ALiBi (docs/release.md, item 5).

  The original release does not sample positions for these encodings: it samples
  `length - 1` sorted distinct distances r_1 < ... < r_{T-1} from [1, max_position)
  and gives the pair (query i, key j) the distance sign(j - i) * r_|j - i| (a
  Toeplitz pattern). This returns the table [0, r_1, ..., r_{T-1}]; the identity
  table arange(T) gives the classic distances j - i.

  Returns:
    int32[T] (or [P]) with entry 0 equal to 0 and the next T - 1 strictly increasing.
  """
  size = _static_size(length, padded_length)
  if size == 0:
    return jnp.zeros((0,), jnp.int32)
  check_length(size, max_position)
  draws = jax.random.permutation(key, max_position - 1)[: size - 1] + 1
  rest = (jnp.sort(draws).astype(jnp.int32) if padded_length is None
          else _sorted_prefix(draws, length - 1, max_position - 1))
  return jnp.concatenate([jnp.zeros((1,), jnp.int32), rest])


@dataclasses.dataclass(frozen=True)
class Sampler:
  """A position sampler and what the rest of the library needs to know about it.

  Attributes:
    name: registry name (the value of `training.positions` / `evaluation.positions`).
    fn: (key, length, max_position, padded_length=None) -> positions (see the module
      docstring for the contract).
    random: whether it draws from the key (random samplers are redrawn per layer where
      the release did so).
    floats: whether it returns float positions (learned tables refuse them).
    evaluation: the sampler used at evaluation when the config does not choose one
      (None: this sampler itself).
    description: one line for listings and docs.
  """

  name: str
  fn: Callable[..., jax.Array]
  random: bool
  floats: bool = False
  evaluation: Optional[str] = None
  description: str = ""

  def __call__(self, key, length, max_position: int, padded_length: Optional[int] = None):
    return self.fn(key, length, max_position, padded_length)


SAMPLERS: registry.Registry[Sampler] = registry.Registry("position sampler")


def register(sampler: Sampler) -> Sampler:
  """Adds a sampler to the registry (a name may be registered once)."""
  return SAMPLERS.register(sampler.name, sampler)


names = SAMPLERS.names
get = SAMPLERS.get


register(Sampler("arange", arange, random=False, description="0..T-1 (classic)"))
register(Sampler("randomized", randomized, random=True,
                 description="T distinct positions uniform from [0, L), sorted"))
register(Sampler("unsorted", unsorted, random=True,
                 description="the randomized draw, unsorted (Table 3 ablation)"))
register(Sampler("evenly_spaced", evenly_spaced, random=False,
                 description="floor(k L / T), spread evenly over [0, L)"))
register(Sampler("offsets", offsets, random=True,
                 description="the release's sorted distance table (relative, ALiBi)"))
