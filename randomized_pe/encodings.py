"""Positional encodings as pure jax.numpy functions of positions (no Haiku here).

Shape glossary:
  B  batch size            T  sequence length (Tq queries, Tk keys)
  H  attention heads        D  feature size of an encoding or of one head
  R  size of the sinusoid used by the relative encoding (Transformer-XL)
  k  number of position axes (only with per_axis=True; a 2-D grid has k=2)

Positions may be integers or floats. With `per_axis=True` the last axis of the
positions holds one coordinate per axis ([..., T, k]) and the feature size is
split evenly between the axes; each axis is encoded as a 1-D position.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_MAX_TIMESCALE = 10_000.0


def inverse_frequencies(dim: int, max_timescale: float = DEFAULT_MAX_TIMESCALE) -> jax.Array:
  """max_timescale ** (-2i / dim) for i < dim / 2, float32[dim // 2]."""
  if dim % 2:
    raise ValueError(f"sin/cos features need an even size, got dim={dim}")
  exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
  return jnp.asarray(max_timescale**-exponents, dtype=jnp.float32)


def _angle_constants(dim: int, max_timescale: float):
  """Per frequency w_i, from float64 on the host: the high word (uint32) of w_i / 2pi in
  64-bit fixed point, 2pi times its low word's value, and w_i itself (float32)."""
  frequencies = np.asarray(max_timescale, np.float64) ** -(np.arange(0, dim, 2) / dim)
  fixed = [int(round(t * 2.0**64)) % 2**64 for t in frequencies / (2 * np.pi)]  # Exact.
  high = np.array([f >> 32 for f in fixed], np.uint32)
  low_angle = np.array([2 * np.pi * (f & 0xFFFFFFFF) * 2.0**-64 for f in fixed], np.float32)
  return high, low_angle, frequencies.astype(np.float32)


def _sin_cos(positions, dim: int, max_timescale: float, per_axis: bool = False):
  """(sin, cos) of positions * w_i, float32[..., T, dim // 2], accurate to about 5e-7.

  A float32 product p * w_i is off by up to 7e-5 near p = 2048 (and worse beyond),
  while the release builds its tables in float64 (docs/release.md, item 7). Here the
  angle is reduced modulo 2 pi exactly instead: with p = n + r (n the nearest integer),
  p w_i / 2pi = n * F_i / 2^64 + r w_i / 2pi, where F_i is w_i / 2pi in 64-bit fixed
  point. The high word of n * F_i wraps modulo 2^32 in uint32 arithmetic (the whole
  turns drop out exactly); the rest is small and added in float32. Works for integer
  and float positions and under jit, without 64-bit mode. Measured against float64:
  at most 4e-7 for integers up to 65,535, 5e-7 for floats
  (tests/test_encodings.py).
  """
  positions = jnp.asarray(positions)
  if per_axis:
    num_axes = positions.shape[-1]
    if dim % (2 * num_axes):
      raise ValueError(f"dim={dim} must be divisible by 2 * number of axes ({2 * num_axes})")
    parts = [_sin_cos(positions[..., a], dim // num_axes, max_timescale)
             for a in range(num_axes)]
    return (jnp.concatenate([s for s, _ in parts], axis=-1),
            jnp.concatenate([c for _, c in parts], axis=-1))
  if dim % 2:
    raise ValueError(f"sin/cos features need an even size, got dim={dim}")
  high, low_angle, frequencies = _angle_constants(dim, max_timescale)
  if jnp.issubdtype(positions.dtype, jnp.integer):
    whole, rest = positions.astype(jnp.int32), None
  else:
    positions = positions.astype(jnp.float32)
    rounded = jnp.round(positions)
    whole, rest = rounded.astype(jnp.int32), positions - rounded
  wrapped = jax.lax.bitcast_convert_type(whole, jnp.uint32)[..., None] * high  # mod 2^32
  # As a signed word the high part is the fraction of a turn in [-1/2, 1/2).
  signed = jax.lax.bitcast_convert_type(wrapped, jnp.int32).astype(jnp.float32)
  angles = (signed * np.float32(2 * np.pi * 2.0**-32)
            + whole.astype(jnp.float32)[..., None] * low_angle)  # In [-pi, pi] + tiny.
  if rest is not None:
    angles = angles + rest[..., None] * frequencies
  return jnp.sin(angles), jnp.cos(angles)


def sinusoid(
    positions, dim: int, max_timescale: float = DEFAULT_MAX_TIMESCALE, *,
    per_axis: bool = False,
) -> jax.Array:
  """Sin/cos encodings (Vaswani et al. 2017) at arbitrary positions.

  Layout as in the original release: sines in the first half, cosines in the
  second, out[t, i] = sin(p_t * w_i) and out[t, dim/2 + i] = cos(p_t * w_i)
  with w_i = max_timescale ** (-2i / dim).

  Args:
    positions: [..., T] integer or float positions ([..., T, k] with per_axis).
    dim: even feature size.
    max_timescale: the longest wavelength.
    per_axis: encode each of the k axes in dim / k features (sin/cos per axis).

  Returns:
    float32[..., T, dim].
  """
  if per_axis:
    positions = jnp.asarray(positions)
    num_axes = positions.shape[-1]
    if dim % (2 * num_axes):
      raise ValueError(f"dim={dim} must be divisible by 2 * number of axes ({2 * num_axes})")
    return jnp.concatenate(
        [sinusoid(positions[..., a], dim // num_axes, max_timescale) for a in range(num_axes)],
        axis=-1,
    )
  sin, cos = _sin_cos(positions, dim, max_timescale)
  return jnp.concatenate([sin, cos], axis=-1)


def apply_rope(
    x: jax.Array, positions, max_timescale: float = DEFAULT_MAX_TIMESCALE, *,
    per_axis: bool = False,
) -> jax.Array:
  """Rotary position embedding (Su et al. 2021) of queries or keys.

  Feature pairs (2m, 2m + 1) are rotated by the angle p_t * w_m, as in the
  original release. Then <rope(q, p_i), rope(k, p_j)> depends on the positions
  only through p_j - p_i.

  Args:
    x: [B, T, H, D] queries or keys, D even.
    positions: [T] or [B, T] integer or float positions ([..., T, k] with per_axis).
    max_timescale: the longest wavelength.
    per_axis: rotate D / k features by each of the k position axes.

  Returns:
    Array of the same shape and dtype as x.
  """
  sin, cos = _sin_cos(positions, x.shape[-1], max_timescale, per_axis)  # [..., T, D/2]
  # [..., T, 1, D/2], broadcasts over heads.
  sin, cos = sin[..., :, None, :].astype(x.dtype), cos[..., :, None, :].astype(x.dtype)
  even, odd = x[..., 0::2], x[..., 1::2]
  rotated = jnp.stack([even * cos - odd * sin, odd * cos + even * sin], axis=-1)
  return rotated.reshape(x.shape)


def alibi_slopes(num_heads: int) -> np.ndarray:
  """ALiBi head slopes (Press et al. 2022), as in the official implementation.

  For a power of two n the slopes are 2^(-8/n), 2^(-16/n), ..., 2^(-8); other
  head counts take the slopes of the largest power of two below, then every
  other slope of twice that power.

  Returns:
    float32[num_heads].
  """
  if num_heads < 1:
    raise ValueError(f"num_heads must be >= 1, got {num_heads}")

  def power_of_two(n: int) -> list[float]:
    start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
    return [start * start**i for i in range(n)]

  if math.log2(num_heads).is_integer():
    slopes = power_of_two(num_heads)
  else:
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_two(closest) + list(alibi_slopes(2 * closest)[0::2][: num_heads - closest])
  return np.asarray(slopes, dtype=np.float32)


def alibi_bias_from_distances(distances, slopes) -> jax.Array:
  """ALiBi bias of a bidirectional encoder from signed distances key - query.

  bias[h, i, j] = slopes[h] * (-|d_ij| + 0.5 * [d_ij < 0]): the release's
  symmetric penalty plus 0.5 for keys on the left of the query, so that the
  model can tell left from right.

  Args:
    distances: [Tq, Tk] signed distances (key position minus query position).
    slopes: [H].

  Returns:
    float32[H, Tq, Tk].
  """
  distances = jnp.asarray(distances, jnp.float32)
  penalty = -jnp.abs(distances) + 0.5 * (distances < 0)
  return jnp.asarray(slopes, jnp.float32)[:, None, None] * penalty[None]


def alibi_bias(query_positions, key_positions, slopes) -> jax.Array:
  """ALiBi bias for arbitrary positions: float32[H, Tq, Tk].

  With positions 0..T-1 this equals the original release's bidirectional bias.
  """
  query_positions = jnp.asarray(query_positions, jnp.float32)
  key_positions = jnp.asarray(key_positions, jnp.float32)
  return alibi_bias_from_distances(key_positions[None, :] - query_positions[:, None], slopes)


def signed_offsets(offset_table) -> jax.Array:
  """Distance for every offset d = j - i in (-T, T) from a table of |d| -> distance.

  Returns:
    [2T - 1] array whose entry d + T - 1 is sign(d) * offset_table[|d|].
    With offset_table = arange(T) this is simply -(T-1)..T-1.
  """
  offset_table = jnp.asarray(offset_table)
  return jnp.concatenate([-offset_table[:0:-1], offset_table])


def toeplitz(values_by_offset) -> jax.Array:
  """[2T - 1] values indexed by offset d = j - i (at d + T - 1) -> [..., T, T] matrix."""
  return values_by_offset[..., _offset_index(values_by_offset.shape[-1])]


def _offset_index(num_offsets: int, num_queries=None, query_start=None):
  """[Tq, T] index d + T - 1 of offset d = j - i for Tq (default all) of T queries.

  The queries are rows [query_start, query_start + Tq) (default: the last Tq);
  query_start may be traced.
  """
  length = (num_offsets + 1) // 2
  num_queries = length if num_queries is None else num_queries
  start = length - num_queries if query_start is None else query_start
  rows = start + jnp.arange(num_queries)
  return jnp.arange(length)[None, :] - rows[:, None] + length - 1


def _offset_keys(offset_positions, kernel, max_timescale) -> jax.Array:
  """Projected sinusoid of every offset's position: [2T - 1, H, D]."""
  return jnp.einsum(
      "or,rhd->ohd", sinusoid(offset_positions, kernel.shape[0], max_timescale), kernel)


RELATIVE_METHODS = ("auto", "factorized", "pairwise")
# "auto" builds a pairwise table of at most this many elements (16 MB).
PAIRWISE_MAX_ELEMENTS = 1 << 22


def relative_key_table(positions, kernel: jax.Array,
                       max_timescale: float = DEFAULT_MAX_TIMESCALE,
                       query_positions=None) -> jax.Array:
  """Projected sinusoid of every pairwise distance: float32[Tq, T, H, D].

  table[i, j, h] = W_h^T sinusoid(p_j - q_i), with W_h = kernel[:, h, :], p the
  key positions and q the query positions (default: q = p). It does not depend
  on the batch, so a model computes it once per batch and layer.

  Args:
    positions: [T] integer or float key positions.
    kernel: [R, H, D] projection of the R sinusoid features, R even.
    max_timescale: the longest wavelength of the sinusoid.
    query_positions: optional [Tq] query positions.
  """
  positions = jnp.asarray(positions, jnp.float32)
  query_positions = positions if query_positions is None else jnp.asarray(
      query_positions, jnp.float32)
  table = sinusoid(positions[None, :] - query_positions[:, None], kernel.shape[0], max_timescale)
  return jnp.einsum("tsr,rhd->tshd", table, kernel)


def relative_key_table_toeplitz(offset_positions, kernel: jax.Array,
                                max_timescale: float = DEFAULT_MAX_TIMESCALE,
                                num_queries=None, query_start=None) -> jax.Array:
  """Like `relative_key_table` when the encoding depends only on j - i: float32[Tq, T, H, D].

  table[i, j, h] = W_h^T sinusoid(offset_positions[j - i + T - 1]); see
  `relative_logits_toeplitz` for the meaning of offset_positions. With
  num_queries, only the rows of Tq queries from query_start (default: the last Tq).
  """
  rel_keys = _offset_keys(offset_positions, kernel, max_timescale)  # [2T-1, H, D]
  return rel_keys[_offset_index(rel_keys.shape[0], num_queries, query_start)]


def relative_logits_from_table(queries: jax.Array, table: jax.Array) -> jax.Array:
  """<queries[b, i, h], table[i, j, h]> for [B, T, H, D] and [T, T, H, D] -> [B, H, T, T]."""
  return jnp.einsum("bthd,tshd->bhts", queries, table)


def use_pairwise(batch: int, length: int, heads: int, head_size: int, rel_dim: int) -> bool:
  """Whether "auto" takes the pairwise order (see `relative_logits`)."""
  table = length * length * heads * head_size
  return table <= PAIRWISE_MAX_ELEMENTS and table <= batch * length * heads * rel_dim


def relative_logits(
    queries: jax.Array, positions, kernel: jax.Array,
    max_timescale: float = DEFAULT_MAX_TIMESCALE, method: str = "auto",
    query_positions=None,
) -> jax.Array:
  """Transformer-XL positional logits for arbitrary positions.

  Computes logits[b, h, i, j] = <queries[b, i, h], W_h^T sinusoid(p_j - p_i)>, where
  W_h = kernel[:, h, :] maps the R-dim sinusoid of a distance to a head's key
  space. Two exact contraction orders:

  "pairwise" projects sinusoid(p_j - p_i) once for all pairs
  (`relative_key_table`, independent of the batch), then contracts the head
  dimension: O(T^2 H D (R + B)) flops and O(T^2 H D) memory.

  "factorized" never builds a [T, T, ...] tensor. Because sin/cos of a
  difference expands into products of sin/cos of each position,
    s(a - b) = s(a)c(b) - c(a)s(b),  c(a - b) = c(a)c(b) + s(a)s(b),
  the query is projected into sinusoid space by a kernel rotated by the query's
  own position (like RoPE), then dotted with sinusoid(p_j):
  O(B T H R (D + T)) flops, R / D times more than pairwise for long batches,
  but only O(B T H R) memory.

  "auto" takes "pairwise" when its table has at most PAIRWISE_MAX_ELEMENTS
  elements and is no larger than the factorized [B, T, H, R] intermediate
  (so memory never exceeds the factorized bound); it measured as fast or
  faster than factorized at every length from 8 to 80 on a 2-core CPU, inside
  chunked attention (`randomized_pe.attention`).

  Args:
    queries: [B, T, H, D] queries (the release adds the learned "relative bias").
    positions: [T] integer or float positions (sorted or not).
    kernel: [R, H, D] projection of the sinusoid features, R even.
    max_timescale: the longest wavelength of the sinusoid.
    method: "auto", "factorized" or "pairwise".
    query_positions: optional [Tq] positions of the queries when they are not
      `positions` (e.g. only the last Tq of them); queries is then [B, Tq, H, D].

  Returns:
    float32[B, H, Tq, T].
  """
  if method not in RELATIVE_METHODS:
    raise ValueError(f"unknown method {method!r}; valid choices: {', '.join(RELATIVE_METHODS)}")
  batch, _, heads, head_size = queries.shape
  length = jnp.shape(positions)[0]
  rel_dim = kernel.shape[0]
  if method == "auto":
    method = "pairwise" if use_pairwise(batch, length, heads, head_size, rel_dim) else "factorized"
  if method == "pairwise":
    return relative_logits_from_table(
        queries, relative_key_table(positions, kernel, max_timescale, query_positions))
  positions = jnp.asarray(positions, jnp.float32)
  query_positions = positions if query_positions is None else query_positions
  # Rotate the kernel's sinusoid axis by each query position: [Tq, R, H, D].
  sin_q, cos_q = _sin_cos(query_positions, rel_dim, max_timescale)
  sin_q, cos_q = sin_q[:, :, None, None], cos_q[:, :, None, None]
  sin_rows, cos_rows = jnp.split(kernel, 2, axis=0)  # [R/2, H, D] each
  rotated_kernel = jnp.concatenate(
      [cos_q * sin_rows + sin_q * cos_rows, cos_q * cos_rows - sin_q * sin_rows], axis=1)
  rotated = jnp.einsum("bthd,trhd->bhtr", queries, rotated_kernel)  # [B, H, T, R]
  keys = sinusoid(positions, rel_dim, max_timescale)  # [T, R]
  return jnp.einsum("bhtr,sr->bhts", rotated, keys)


def relative_logits_toeplitz(
    queries: jax.Array, offset_positions, kernel: jax.Array,
    max_timescale: float = DEFAULT_MAX_TIMESCALE, query_start=None,
) -> jax.Array:
  """Transformer-XL positional logits when the encoding depends only on j - i.

  The pair (i, j) uses sinusoid(offset_positions[j - i + T - 1]). This is the
  original release's computation (a logits matrix per offset, then a shift);
  it serves the release semantics, where the encoded value per offset is not a
  difference of positions (see `release_relative_positions`).

  Args:
    queries: [B, T, H, D], or [B, Tq, H, D] for Tq of T positions.
    offset_positions: [2T - 1] position fed to the sinusoid for each offset.
    kernel: [R, H, D].
    query_start: the position of the first query (default: the last Tq; may be traced).

  Returns:
    float32[B, H, Tq, T].
  """
  rel_keys = _offset_keys(offset_positions, kernel, max_timescale)  # [2T-1, H, D]
  per_offset = jnp.einsum("bthd,ohd->bhto", queries, rel_keys)  # [B, H, Tq, 2T-1]
  index = _offset_index(rel_keys.shape[0], queries.shape[1], query_start)  # [Tq, T]
  return jnp.take_along_axis(per_offset, index[None, None], axis=-1)


def release_relative_positions(offset_table, max_position: int) -> jax.Array:
  """Sinusoid position per offset used by the release's randomized relative encoding.

  The release (docs/release.md, item 1; public issue #2 of
  google-deepmind/randomized_positional_encodings) builds the sin/cos table for
  positions [0, max_position) and indexes it with max_position + distance. JAX
  clamps out-of-range gathers, so the zero distance and every positive distance
  read row max_position - 1: only leftward distances are told apart.

  Args:
    offset_table: [T] table of |d| -> sampled distance (`samplers.offsets`).
    max_position: L.

  Returns:
    int32[2T - 1], the clamped table row per offset d (at d + T - 1).
  """
  rows = max_position + signed_offsets(offset_table)
  return jnp.clip(rows, 0, max_position - 1).astype(jnp.int32)


def learned_lookup(table: jax.Array, positions) -> jax.Array:
  """Rows of a learned [N, D] table at integer positions [..., T] -> [..., T, D].

  Positions outside [0, N) are clamped to the nearest row, as JAX gathers do by
  default (a jitted function cannot raise on data).
  """
  positions = jnp.asarray(positions)
  if not jnp.issubdtype(positions.dtype, jnp.integer):
    raise TypeError(f"a learned table needs integer positions, got {positions.dtype}")
  return jnp.take(table, positions, axis=0, mode="clip")
