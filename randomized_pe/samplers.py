"""Position samplers: which positions a batch sees, one registry by name (no Haiku here).

Positions are data: a sampler is called once per batch, outside the model, and the
model receives the result as an argument. Every sampler has one signature,

    sampler(key, length, max_position, padded_length=None, **settings) -> positions

  key            a PRNG key (ignored by deterministic samplers; None is fine for them)
  length         T, the true sequence length; a Python int, or a traced int32 when
                 padded_length is given
  max_position   L, the range [0, L) positions come from (a Python int)
  padded_length  None: return [T]; an int P >= T: return [P] whose first T entries
                 equal the unpadded draw for `length` (a prefix of one draw), so one
                 compiled program serves every length up to P. Padding entries are
                 max_position - 1 unless a sampler says otherwise; the model masks
                 padded keys, so their value never matters.
  settings       the model settings the sampler declares (`Sampler.settings`, with
                 defaults), by keyword; a model passes its own values

Registered samplers (`names()`):

  arange         0..T-1, the classic positions
  randomized     T distinct positions uniform from [0, L), sorted (Ruoss et al. 2023)
  unsorted       the same draw in draw order (the paper's Table 3 ablation)
  evenly_spaced  floor(k L / T) for k < T: deterministic, spread over [0, L)
  offsets        the original release's sorted distance table for relative and ALiBi
                 (docs/release.md, item 5); the release plan of `randomized_pe.families`
                 substitutes it for `randomized` under compat="release"
  equal_mean_exponential, equal_mean_beta
                 Su Jianlin's equal-mean positions (docs/su.md): one span s per batch
                 with mean T, positions linspace(0, 1, T) * s (floats)
  linspace       linspace(0, 1, T) * T (floats): the mean of those draws, their
                 evaluation positions

A new sampler is one `register(Sampler(...))` call; configs then accept its name for
training (`training.positions`) and evaluation (`evaluation.positions`). Samplers may
return floats (set `floats=True`); encoding families that need integers (a learned
table) refuse them before anything compiles.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np

from randomized_pe import registry


def static_int(value):
  """An integer-like value (int, np.int64, a concrete 0-d integer array) as a Python int;
  None for a traced value; anything else (floats, bools) unchanged, for the caller's
  one-line error."""
  if isinstance(value, (bool, np.bool_)) or value is None:
    return value
  if isinstance(value, jax.core.Tracer):
    return None
  if isinstance(value, (int, np.integer)) or (
      hasattr(value, "dtype") and jnp.ndim(value) == 0
      and jnp.issubdtype(value.dtype, jnp.integer)):
    return operator.index(value)
  return value


def integer_args(fn):
  """Lets a sampler take integer-like length, max_position and padded_length (np.int64,
  a concrete 0-d integer array) as Python ints; a traced length stays traced."""

  @functools.wraps(fn)
  def wrapped(key, length, max_position=1, padded_length=None, **settings):
    static = static_int(length)
    return fn(key, length if static is None else static, static_int(max_position),
              static_int(padded_length), **settings)

  return wrapped


def check_length(length: int, max_position: int) -> None:
  """Raises a one-line ValueError unless 0 <= length <= max_position (integers)."""
  length, max_position = static_int(length), static_int(max_position)
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
  """The static output size: padded_length, or length (which must then be static)."""
  static_length, padded_length = static_int(length), static_int(padded_length)
  if padded_length is None:
    if static_length is None:
      raise ValueError("a traced length needs a static padded_length")
    if not isinstance(static_length, int) or static_length < 0:
      raise ValueError(f"length must be a non-negative integer, got {length!r}")
    return static_length
  if not isinstance(padded_length, int) or padded_length < 0:
    raise ValueError(f"padded_length must be a non-negative int, got {padded_length!r}")
  if isinstance(static_length, int) and static_length > padded_length:
    raise ValueError(f"length={length} > padded_length={padded_length}")
  return padded_length


def _sorted_prefix(draws: jax.Array, length, fill) -> jax.Array:
  """Sorts the first `length` (maybe traced) entries of `draws`; the rest become `fill`."""
  valid = jnp.arange(draws.shape[0]) < length
  big = jnp.iinfo(jnp.int32).max
  ordered = jnp.sort(jnp.where(valid, draws, big))
  return jnp.where(valid, ordered, fill).astype(jnp.int32)


@integer_args
def arange(key, length, max_position: int = 1, padded_length: Optional[int] = None):
  """0..T-1 (int32[T]); padded: 0..P-1 (positions past T are masked by the model)."""
  del key, max_position
  return jnp.arange(_static_size(length, padded_length), dtype=jnp.int32)


@integer_args
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


@integer_args
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


@integer_args
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


@integer_args
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


def _stretched(span, length, size: int, fill) -> jax.Array:
  """linspace(0, 1, length) * span, float32[size]; entries from `length` on are `fill`.

  The spacing is span * (1 / (length - 1)), computed as such (not span / (length - 1))
  so that a traced length and a Python int give the same bits: a compiler may turn a
  division by a constant into a product with its reciprocal, but a reciprocal and a
  product are exact IEEE operations either way. length = 1 gives [0].
  """
  length = jnp.asarray(length, jnp.float32)
  spacing = span * (1.0 / jnp.maximum(length - 1.0, 1.0))
  k = jnp.arange(size, dtype=jnp.float32)
  return jnp.where(k < length, k * spacing, fill).astype(jnp.float32)


@integer_args
def equal_mean_exponential(key, length, max_position: int,
                           padded_length: Optional[int] = None):
  """Su's equal-mean positions, exponential span: linspace(0, 1, T) * s, s ~ Exp(mean T).

  等均值随机位置训练 (kexue.fm/archives/9444): the span s has mean T, so the mean
  draw is linspace(0, 1, T) * T, about 0..T-1 (the classic positions), while single
  draws reach far beyond (P(s > 4T) = e^-4). One span per call: shared by the batch
  and, as for `randomized`, by every layer. The draw of s does not depend on the
  length, so a padded draw's prefix is the unpadded draw.

  Returns:
    float32[T] (or [P], padding max_position - 1), sorted, starting at 0. Positions
    are not bounded by max_position (they never index a table: learned tables refuse
    float samplers).
  """
  size = _static_size(length, padded_length)
  span = jax.random.exponential(key, dtype=jnp.float32) * jnp.asarray(length, jnp.float32)
  return _stretched(span, length, size, max_position - 1)


@integer_args
def equal_mean_beta(key, length, max_position: int, padded_length: Optional[int] = None, *,
                    beta_max_length: int, beta_concentration: float):
  """Su's equal-mean positions, beta span: linspace(0, 1, T) * s, s = M u, u ~ Beta(a, b).

  Su takes the test length M as 1, so the training length is T / M, and draws
  u ~ Beta(a, b) with mean a / (a + b) = T / M: E[s] = T. The remaining degree of
  freedom, the concentration a + b (`beta_concentration`; Su gives no value), sets
  how much mass lies near u = 1, i.e. spans near the test length: small values put
  more there, large ones gather s around T. s never exceeds M.

  Args:
    beta_max_length: M, the longest evaluation sequence in tokens (a model setting;
      the encoder resolves 0 from the run, `models.encoder.from_config`); T may not exceed it.
    beta_concentration: a + b > 0.
    (The registry entry holds their defaults: 0, resolved by the model, and 1.0.)

  Returns:
    float32[T] (or [P], padding max_position - 1), sorted, starting at 0.

  Raises:
    ValueError: if M < 1, a + b <= 0, or a static T > M. A traced T > M cannot raise
      and takes s = M.
  """
  size = _static_size(length, padded_length)
  if not isinstance(beta_max_length, int) or beta_max_length < 1:
    raise ValueError(f"equal_mean_beta needs beta_max_length (M, the longest evaluation "
                     f"sequence) >= 1, got {beta_max_length!r}")
  if not beta_concentration > 0:
    raise ValueError(f"equal_mean_beta needs beta_concentration > 0, got {beta_concentration!r}")
  if isinstance(static_int(length), int) and length > beta_max_length:
    raise ValueError(f"equal_mean_beta cannot draw spans with mean length={length} > "
                     f"beta_max_length={beta_max_length} (M)")
  mean = jnp.minimum(jnp.asarray(length, jnp.float32) * (1.0 / beta_max_length), 1.0)  # T / M
  # At T = M, b = 0 and the draw is u = 1 (the span M), the limit of the distribution.
  u = jax.random.beta(key, beta_concentration * mean, beta_concentration * (1.0 - mean))
  return _stretched(u * beta_max_length, length, size, max_position - 1)


@integer_args
def linspace(key, length, max_position: int, padded_length: Optional[int] = None):
  """linspace(0, 1, T) * T, float32: the mean draw of the equal-mean samplers.

  Their evaluation positions (Su does not state them; docs/su.md): the first
  positions of a long evaluation sequence then match, on average, the positions
  seen in training. The key is unused.
  """
  del key
  size = _static_size(length, padded_length)
  return _stretched(jnp.asarray(length, jnp.float32), length, size, max_position - 1)


@dataclasses.dataclass(frozen=True)
class Sampler:
  """A position sampler and what the rest of the library needs to know about it.

  Attributes:
    name: registry name (the value of `training.positions` / `evaluation.positions`).
    fn: (key, length, max_position, padded_length=None, **settings) -> positions (see
      the module docstring for the contract).
    random: whether it draws from the key (random samplers are redrawn per layer where
      the release did so).
    floats: whether it returns float positions (learned tables refuse them).
    evaluation: the sampler used at evaluation when the config does not choose one
      (None: this sampler itself).
    description: one line for listings and docs.
    settings: the model settings it reads, with defaults, passed to `fn` by keyword
      (as families declare theirs); a model gives its own values.
  """

  name: str
  fn: Callable[..., jax.Array]
  random: bool
  floats: bool = False
  evaluation: Optional[str] = None
  description: str = ""
  settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __call__(self, key, length, max_position: int, padded_length: Optional[int] = None,
               **settings):
    unknown = sorted(set(settings) - set(self.settings))
    if unknown:
      raise ValueError(f"sampler {self.name!r} has no setting {', '.join(unknown)}; its "
                       f"settings: {', '.join(self.settings) or 'none'}")
    return self.fn(key, length, max_position, padded_length, **{**self.settings, **settings})


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
register(Sampler("linspace", linspace, random=False, floats=True,
                 description="linspace(0, 1, T) * T (floats): the mean equal-mean draw"))
register(Sampler("equal_mean_exponential", equal_mean_exponential, random=True, floats=True,
                 evaluation="linspace",
                 description="linspace(0, 1, T) * s, s ~ Exp(mean T) (Su, floats)"))
register(Sampler("equal_mean_beta", equal_mean_beta, random=True, floats=True,
                 evaluation="linspace",
                 settings={"beta_max_length": 0, "beta_concentration": 1.0},
                 description="linspace(0, 1, T) * M u, u ~ Beta, E = T (Su, floats)"))
