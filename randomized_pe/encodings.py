"""Positional encodings as pure jax.numpy functions of positions (no Haiku here).

Shape glossary:
  B  batch size            T  sequence length (Tq queries, Tk keys)
  H  attention heads        D  feature size of an encoding or of one head
  R  size of the sinusoid used by the relative encoding (Transformer-XL)
  k  number of position axes (only with per_axis=True; a 2-D grid has k=2)

Positions may be integers or floats. With `per_axis=True` the last axis of the
positions holds one coordinate per axis ([..., T, k]) and the feature size is
split evenly between the axes; each axis is encoded as a 1-D position.

The contract of the public functions (tests/test_core_contract.py):
  - positions are [T] (shared by the batch) or [B, T] (one row per sequence) for
    every function that takes a batch; other shapes are a one-line ValueError
    naming the shapes it takes (`relative_logits_toeplitz`, the release's offset
    tables, takes [2T - 1] only);
  - outputs follow the input's float dtype: the queries' or keys' for RoPE, the
    relative logits and tables; the float positions' for `sinusoid` and `alibi_bias`
    (integer positions give float32, or `dtype=`). Angles and distances are computed
    in float32 whatever the dtype, then cast;
  - shapes are checked where they enter: a mismatch is one ValueError line that
    names the shapes it got and the ones it takes.
"""

from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_MAX_TIMESCALE = 10_000.0


def _positions(positions, what: str = "positions") -> jax.Array:
  """positions as an integer or float array, or a one-line ValueError."""
  positions = jnp.asarray(positions)
  if not (jnp.issubdtype(positions.dtype, jnp.integer)
          or jnp.issubdtype(positions.dtype, jnp.floating)):
    raise ValueError(f"{what} must be integers or floats, got dtype {positions.dtype}")
  return positions


def _float_dtype(dtype, *arrays):
  """`dtype` if given; else the float dtype of the float arrays among `arrays`; else float32."""
  if dtype is not None:
    return jnp.dtype(dtype)
  floats = [a.dtype for a in arrays if jnp.issubdtype(a.dtype, jnp.floating)]
  return jnp.result_type(*floats) if floats else jnp.dtype(jnp.float32)


def _check_dim(dim, what: str = "dim") -> None:
  if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool) or dim < 2 or dim % 2:
    raise ValueError(f"sin/cos features need an even size >= 2, got {what}={dim!r}")


def _shape(dims) -> str:
  return "[" + ", ".join(str(d) for d in dims) + "]"


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
    per_axis: bool = False, dtype=None,
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
    dtype: of the result; None: the positions' float dtype, float32 for integers.

  Returns:
    [..., T, dim], computed in float32 and cast to `dtype`.
  """
  _check_dim(dim)
  positions = _positions(positions)
  out_dtype = _float_dtype(dtype, positions)
  if per_axis:
    if positions.ndim < 2:
      raise ValueError(f"per_axis positions are [..., T, k], got shape {positions.shape}")
    num_axes = positions.shape[-1]
    if dim % (2 * num_axes):
      raise ValueError(f"dim={dim} must be divisible by 2 * number of axes ({2 * num_axes})")
    return jnp.concatenate(
        [sinusoid(positions[..., a], dim // num_axes, max_timescale, dtype=out_dtype)
         for a in range(num_axes)],
        axis=-1,
    )
  sin, cos = _sin_cos(positions, dim, max_timescale)
  return jnp.concatenate([sin, cos], axis=-1).astype(out_dtype)


def interleave_sin_cos(features: jax.Array, num_axes: int = 1) -> jax.Array:
  """`sinusoid`'s layout (per axis: sines, then cosines) -> the interleaved one (per axis:
  sin w_0, cos w_0, sin w_1, cos w_1, ...), as PyTorch tutorials and Ito et al.'s code
  lay them out.

  A fixed permutation of the features [..., dim] (dim / num_axes features per axis); it
  matters only when two encodings are compared feature by feature or added to the same
  embeddings.
  """
  *lead, dim = features.shape
  half = dim // num_axes // 2
  per_axis = features.reshape(*lead, num_axes, 2, half)  # [..., axis, sin|cos, frequency]
  return jnp.swapaxes(per_axis, -1, -2).reshape(*lead, dim)


def apply_rope(
    x: jax.Array, positions, max_timescale: float = DEFAULT_MAX_TIMESCALE, *,
    per_axis: bool = False, heads: Optional[bool] = None,
) -> jax.Array:
  """Rotary position embedding (Su et al. 2021) of queries or keys.

  Feature pairs (2m, 2m + 1) are rotated by the angle p_t * w_m, as in the
  original release. Then <rope(q, p_i), rope(k, p_j)> depends on the positions
  only through p_j - p_i.

  A 3-D x is ambiguous ([B, T, D] without heads, or one sequence [T, H, D] as under
  vmap), so it needs `heads`: without it, a [B, T, D] input with B == T would be
  rotated by the wrong axis without any error.

  Args:
    x: queries or keys, D even: [B, T, H, D] or [T, D] by default; [..., T, H, D]
      with heads=True (e.g. [T, H, D]); [..., T, D] with heads=False (e.g. [B, T, D]).
    positions: [T] or [B, T] integer or float positions (the trailing axes of x before
      H and D; [..., T, k] with per_axis).
    max_timescale: the longest wavelength.
    per_axis: rotate D / k features by each of the k position axes.
    heads: whether x has a heads axis before D (None: from x's rank, 4 or 2).

  Returns:
    Array of the same shape and dtype as x.
  """
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"apply_rope rotates float queries or keys, got dtype {x.dtype}")
  if heads is None:
    if x.ndim not in (2, 4):
      raise ValueError(
          f"apply_rope: x of shape {x.shape} is ambiguous; pass heads=False for [..., T, D] "
          "(e.g. [B, T, D]) or heads=True for [..., T, H, D] (e.g. [T, H, D])")
    heads = x.ndim == 4
  seq_axis = x.ndim - (3 if heads else 2)
  if seq_axis < 0 or x.shape[-1] % 2:
    raise ValueError(f"apply_rope takes x [..., T, {'H, ' if heads else ''}D] with D even, "
                     f"got shape {x.shape}")
  positions = _positions(positions)
  lead = x.shape[:seq_axis + 1]  # (..., T)
  got = positions.shape[:-1] if per_axis else positions.shape
  if not 1 <= len(got) <= len(lead) or got != lead[len(lead) - len(got):]:
    k = ", k" if per_axis else ""
    valid = " or ".join(_shape(lead[i:]).replace("]", k + "]") for i in range(len(lead) - 1, -1, -1))
    raise ValueError(f"apply_rope: positions must be {valid} for x of shape {x.shape}, "
                     f"got {positions.shape}")
  sin, cos = _sin_cos(positions, x.shape[-1], max_timescale, per_axis)  # [..., T, D/2]
  if heads:  # [..., T, 1, D/2], broadcasts over heads.
    sin, cos = sin[..., :, None, :], cos[..., :, None, :]
  sin, cos = sin.astype(x.dtype), cos.astype(x.dtype)
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


def _slopes(slopes) -> jax.Array:
  slopes = jnp.asarray(slopes)
  if slopes.ndim != 1:
    raise ValueError(f"ALiBi slopes are [H] (`alibi_slopes(H)`), got shape {slopes.shape}")
  return slopes.astype(jnp.float32)


def alibi_bias_from_distances(distances, slopes, *, dtype=None) -> jax.Array:
  """ALiBi bias of a bidirectional encoder from signed distances key - query.

  bias[h, i, j] = slopes[h] * (-|d_ij| + 0.5 * [d_ij < 0]): the release's
  symmetric penalty plus 0.5 for keys on the left of the query, so that the
  model can tell left from right.

  Args:
    distances: [Tq, Tk] or [B, Tq, Tk] signed distances (key position minus query
      position).
    slopes: [H].
    dtype: of the result; None: the distances' float dtype, float32 for integers.

  Returns:
    [H, Tq, Tk] or [B, H, Tq, Tk].
  """
  distances = _positions(distances, "distances")
  if distances.ndim not in (2, 3):
    raise ValueError(f"ALiBi distances are [Tq, Tk] or [B, Tq, Tk], got shape {distances.shape}")
  out_dtype = _float_dtype(dtype, distances)
  distances = distances.astype(jnp.float32)
  penalty = -jnp.abs(distances) + 0.5 * (distances < 0)
  return (_slopes(slopes)[:, None, None] * penalty[..., None, :, :]).astype(out_dtype)


def alibi_bias(query_positions, key_positions, slopes, *, dtype=None) -> jax.Array:
  """ALiBi bias for arbitrary positions.

  With positions 0..T-1 this equals the original release's bidirectional bias.

  Args:
    query_positions: [Tq], or [B, Tq] (one row per sequence).
    key_positions: [Tk], or [B, Tk] (with [B, Tq] query positions).
    slopes: [H] (`alibi_slopes(H)`).
    dtype: of the result; None: the positions' float dtype, float32 for integers.

  Returns:
    [H, Tq, Tk], or [B, H, Tq, Tk] for positions [B, T]: the bias to add to the
    attention logits [B, H, Tq, Tk].
  """
  query_positions = _positions(query_positions, "query positions")
  key_positions = _positions(key_positions, "key positions")
  q_shape, k_shape = query_positions.shape, key_positions.shape
  if not (len(q_shape) == len(k_shape) and len(q_shape) in (1, 2)
          and q_shape[:-1] == k_shape[:-1]):
    raise ValueError(f"alibi_bias takes query and key positions [Tq] and [Tk], or [B, Tq] and "
                     f"[B, Tk]; got {q_shape} and {k_shape}")
  out_dtype = _float_dtype(dtype, query_positions, key_positions)
  query_positions = query_positions.astype(jnp.float32)
  key_positions = key_positions.astype(jnp.float32)
  distances = key_positions[..., None, :] - query_positions[..., :, None]
  return alibi_bias_from_distances(distances, slopes, dtype=out_dtype)


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


def _check_kernel(kernel, what: str, heads=None, head_size=None) -> jax.Array:
  """The relative kernel [R, H, D] (R even), matching the queries' H and D if given."""
  kernel = jnp.asarray(kernel)
  if (kernel.ndim != 3 or kernel.shape[0] % 2 or (heads is not None and kernel.shape[1] != heads)
      or (head_size is not None and kernel.shape[2] != head_size)):
    want = f"[R, {heads}, {head_size}]" if heads is not None else "[R, H, D]"
    raise ValueError(f"{what}: the relative kernel must be {want} with R even (the paper's "
                     f"encoder: R = d_model = H * D), got shape {kernel.shape}")
  return kernel


def _check_queries(queries, what: str) -> jax.Array:
  queries = jnp.asarray(queries)
  if queries.ndim != 4 or not jnp.issubdtype(queries.dtype, jnp.floating):
    raise ValueError(f"{what}: queries must be float [B, Tq, H, D], got {queries.dtype}"
                     f"{list(queries.shape)}")
  return queries


def _relative_positions(what: str, positions, query_positions, batch=None, num_queries=None):
  """(positions, query_positions) checked: [T] and [Tq], or [B, T] and [B, Tq]."""
  positions = _positions(positions)
  query_positions = positions if query_positions is None else _positions(
      query_positions, "query positions")
  ok = (positions.ndim in (1, 2) and query_positions.ndim == positions.ndim
        and positions.shape[:-1] == query_positions.shape[:-1]
        and (positions.ndim == 1 or batch is None or positions.shape[0] == batch)
        and (num_queries is None or query_positions.shape[-1] == num_queries))
  if not ok:
    b = "B" if batch is None else batch
    tq = "Tq" if num_queries is None else num_queries
    raise ValueError(f"{what}: positions must be [T] or [{b}, T], with query positions [{tq}] "
                     f"or [{b}, {tq}] (default: the positions); got {positions.shape} and "
                     f"{query_positions.shape}")
  return positions, query_positions


def relative_key_table(positions, kernel: jax.Array,
                       max_timescale: float = DEFAULT_MAX_TIMESCALE,
                       query_positions=None) -> jax.Array:
  """Projected sinusoid of every pairwise distance: [Tq, T, H, D] (or [B, Tq, T, H, D]).

  table[i, j, h] = W_h^T sinusoid(p_j - q_i), with W_h = kernel[:, h, :], p the
  key positions and q the query positions (default: q = p). It does not depend
  on the batch, so a model computes it once per batch and layer.

  Args:
    positions: [T] integer or float key positions, or [B, T] (one table per sequence).
    kernel: [R, H, D] projection of the R sinusoid features, R even.
    max_timescale: the longest wavelength of the sinusoid.
    query_positions: optional [Tq] query positions ([B, Tq] with [B, T] positions).

  Returns:
    in the kernel's dtype.
  """
  kernel = _check_kernel(kernel, "relative_key_table")
  positions, query_positions = _relative_positions("relative_key_table", positions,
                                                   query_positions)
  if positions.ndim == 2:
    return jax.vmap(lambda p, q: relative_key_table(p, kernel, max_timescale, q))(
        positions, query_positions)
  positions = positions.astype(jnp.float32)
  query_positions = query_positions.astype(jnp.float32)
  table = sinusoid(positions[None, :] - query_positions[:, None], kernel.shape[0], max_timescale)
  return jnp.einsum("tsr,rhd->tshd", table, kernel).astype(kernel.dtype)


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
  """<queries[b, i, h], table[i, j, h]>: [B, Tq, H, D] and [Tq, T, H, D] -> [B, H, Tq, T].

  A per-sequence table [B, Tq, T, H, D] (from [B, T] positions) works too. The result
  has the queries' dtype.
  """
  queries = _check_queries(queries, "relative_logits_from_table")
  table = jnp.asarray(table)
  batch, num_queries, heads, head_size = queries.shape
  if table.ndim == 4 and table.shape[0] == num_queries and table.shape[2:] == (heads, head_size):
    return jnp.einsum("bthd,tshd->bhts", queries, table).astype(queries.dtype)
  if table.ndim == 5 and table.shape[:2] == (batch, num_queries) and table.shape[3:] == (
      heads, head_size):
    return jnp.einsum("bthd,btshd->bhts", queries, table).astype(queries.dtype)
  raise ValueError(f"relative_logits_from_table: the table must be [{num_queries}, T, {heads}, "
                   f"{head_size}] or [{batch}, {num_queries}, T, {heads}, {head_size}] for "
                   f"queries {list(queries.shape)}, got {list(table.shape)}")


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
  faster than factorized on a CPU, inside chunked attention
  (`randomized_pe.attention`; docs/benchmark.md, "Figures behind code choices").

  These are the positional logits only, unscaled: the attention logits of the paper's
  encoder are `relative_attention_logits` (content + position, scaled by 1/sqrt(D)).

  Args:
    queries: [B, T, H, D] queries (the release adds the learned "relative bias").
    positions: [T] integer or float positions (sorted or not), or [B, T] (one row per
      sequence).
    kernel: [R, H, D] projection of the sinusoid features, R even. The paper's encoder
      uses R = d_model = H * D and stores it as [R, H * D] (the `relative` family's
      parameter `relative_kernel`): reshape it to [R, H, D].
    max_timescale: the longest wavelength of the sinusoid.
    method: "auto", "factorized" or "pairwise".
    query_positions: optional [Tq] positions of the queries when they are not
      `positions` (e.g. only the last Tq of them); queries is then [B, Tq, H, D]
      ([B, Tq] with [B, T] positions).

  Returns:
    [B, H, Tq, T] in the queries' dtype.
  """
  if method not in RELATIVE_METHODS:
    raise ValueError(f"unknown method {method!r}; valid choices: {', '.join(RELATIVE_METHODS)}")
  queries = _check_queries(queries, "relative_logits")
  batch, num_queries, heads, head_size = queries.shape
  kernel = _check_kernel(kernel, "relative_logits", heads, head_size)
  positions, query_positions = _relative_positions(
      "relative_logits", positions, query_positions, batch, num_queries)
  if positions.ndim == 2:  # One sequence at a time.
    return jax.vmap(lambda q, p, qp: relative_logits(
        q[None], p, kernel, max_timescale, method, qp)[0])(queries, positions, query_positions)
  if query_positions is positions:
    query_positions = None
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
  return jnp.einsum("bhtr,sr->bhts", rotated, keys).astype(queries.dtype)


def relative_attention_logits(
    queries: jax.Array, keys: jax.Array, positions, kernel: jax.Array, *,
    content_bias=None, relative_bias=None, max_timescale: float = DEFAULT_MAX_TIMESCALE,
    method: str = "auto", query_positions=None,
) -> jax.Array:
  """The attention logits of the `relative` family (Transformer-XL), as the paper's encoder.

    logits[b, h, i, j] = (<q_i + u_h, k_j> + <q_i + v_h, W_h^T sinusoid(p_j - p_i)>) / sqrt(D)

  with u = content_bias and v = relative_bias (Dai et al.'s learned biases; None: no
  bias). These are the logits to put through the softmax (or to pass as a score_fn to
  `randomized_pe.attention.attention`: `lambda q, k: relative_attention_logits(q, k, p,
  kernel, ...)`); they equal the `relative` family's scorer under compat="paper".

  Args:
    queries: [B, Tq, H, D].
    keys: [B, T, H, D].
    positions: [T] or [B, T] positions of the keys (and of the queries by default).
    kernel: [R, H, D], or [R, H * D] as the family stores it (R = d_model = H * D in the
      paper's encoder).
    content_bias, relative_bias: optional [H, D].
    max_timescale, method: see `relative_logits`.
    query_positions: optional [Tq] ([B, Tq]) positions of the queries.

  Returns:
    [B, H, Tq, T] in the queries' dtype.
  """
  queries = _check_queries(queries, "relative_attention_logits")
  batch, _, heads, head_size = queries.shape
  keys = jnp.asarray(keys)
  if keys.ndim != 4 or keys.shape[0] != batch or keys.shape[2:] != (heads, head_size):
    raise ValueError(f"relative_attention_logits: keys must be [{batch}, T, {heads}, "
                     f"{head_size}] for queries {list(queries.shape)}, got {list(keys.shape)}")
  kernel = jnp.asarray(kernel)
  if kernel.ndim == 2 and kernel.shape[1] == heads * head_size:
    kernel = kernel.reshape(kernel.shape[0], heads, head_size)
  for name, bias in [("content_bias", content_bias), ("relative_bias", relative_bias)]:
    if bias is not None and jnp.shape(bias) != (heads, head_size):
      raise ValueError(f"relative_attention_logits: {name} must be [{heads}, {head_size}], "
                       f"got {list(jnp.shape(bias))}")
  scale = 1.0 / math.sqrt(head_size)
  content_q = queries if content_bias is None else queries + content_bias
  relative_q = queries if relative_bias is None else queries + relative_bias
  content = jnp.einsum("bthd,bshd->bhts", content_q * scale, keys)
  relative = relative_logits(relative_q * scale, positions, kernel, max_timescale, method,
                             query_positions)
  return (content + relative).astype(queries.dtype)


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
    [B, H, Tq, T] in the queries' dtype.
  """
  queries = _check_queries(queries, "relative_logits_toeplitz")
  kernel = _check_kernel(kernel, "relative_logits_toeplitz", *queries.shape[2:])
  offset_positions = _positions(offset_positions, "offset positions")
  if offset_positions.ndim != 1 or offset_positions.shape[0] % 2 != 1:
    raise ValueError("relative_logits_toeplitz: offset positions are [2T - 1] (one per offset "
                     f"j - i, shared by the batch), got shape {offset_positions.shape}")
  rel_keys = _offset_keys(offset_positions, kernel, max_timescale)  # [2T-1, H, D]
  per_offset = jnp.einsum("bthd,ohd->bhto", queries, rel_keys)  # [B, H, Tq, 2T-1]
  index = _offset_index(rel_keys.shape[0], queries.shape[1], query_start)  # [Tq, T]
  return jnp.take_along_axis(per_offset, index[None, None], axis=-1).astype(queries.dtype)


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
