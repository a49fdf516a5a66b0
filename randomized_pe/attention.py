"""Softmax attention over the batch in cache-sized chunks (pure JAX, no Haiku).

Shape glossary: B batch, T queries, S keys, H heads, D head size.

On a CPU the [B, H, T, S] logits of a training batch (21 MB at B=128, H=8,
T=S=72) do not fit in cache, and each of the dozen passes the forward and
backward make over them (logits, exp, sum, the two products, the softmax
gradient) goes to memory. `attention` runs the batch in chunks of rows whose
logits fit in cache, and recomputes a chunk's forward in the backward pass
(`jax.checkpoint`) instead of storing its [b, H, T, S] tensors. The result is
exactly the same function; on a 2-core CPU one layer of the paper's model
(fwd + bwd, batch 128, T = 80) ran 1.6x faster, 2.5-3x when every step's
buffers were freshly page-faulted (`python -m experiments.benchmark
--sections=attention`; see experiments/runtime.py).
Accelerators get the whole batch in one piece by default.

The logits come from a `score_fn(q, k) -> [b, H, T, S]` that is applied chunk by
chunk. It may close over arrays that do not depend on the batch (a relative
position table, an ALiBi bias); they are shared by all chunks and their
gradients are summed over them.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp

# Elements of one chunk's [b, H, T, S] logits on a CPU: 2.8 MB, chosen by
# measurement on a 2-core CPU (700k beat 300k and 1.4M at T = 40 and 72).
CPU_CHUNK_ELEMENTS = 700_000

_MASKED = jnp.finfo(jnp.float32).min

ScoreFn = Callable[[jax.Array, jax.Array], jax.Array]


def dot_scores(q: jax.Array, k: jax.Array) -> jax.Array:
  """<q_t, k_s> / sqrt(D) for [b, T, H, D] and [b, S, H, D] -> [b, H, T, S].

  The scale is applied to the queries (a [b, T, H, D] pass) rather than to the
  logits (a [b, H, T, S] pass).
  """
  return jnp.einsum("bthd,bshd->bhts", q * (1.0 / math.sqrt(q.shape[-1])), k)


def default_chunk_rows(batch: int, heads: int, q_len: int, k_len: int,
                       backend: Optional[str] = None) -> int:
  """Rows per chunk: the whole batch off CPU; on CPU rows whose logits fit CPU_CHUNK_ELEMENTS.

  Among the row counts in [ideal / 2, ideal] the one that pads the batch least
  is taken (ties: the larger), so that e.g. a batch of 500 runs in chunks of 10
  rather than padding to 512.
  """
  backend = backend or jax.default_backend()
  if backend != "cpu":
    return batch
  ideal = max(1, CPU_CHUNK_ELEMENTS // (heads * q_len * k_len))
  if ideal >= batch:
    return batch
  candidates = range(max(1, ideal // 2), ideal + 1)
  return min(candidates, key=lambda rows: (-(-batch // rows) * rows, -rows))


def softmax_attend(logits: jax.Array, v: jax.Array, key_mask=None) -> jax.Array:
  """softmax(logits) @ v, normalised after the product: [b, H, T, S], [b, S, H, D] -> [b, T, H, D].

  Dividing the [b, T, H, D] result instead of the [b, H, T, S] weights gives
  the same values (up to rounding) with one fewer pass over the largest tensor.
  key_mask: optional bool [b, S]; False keys get no weight.
  """
  if key_mask is not None:
    logits = jnp.where(key_mask[:, None, None, :], logits, _MASKED)
  shift = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  unnormalised = jnp.exp(logits - shift)  # [b, H, T, S]
  total = jnp.sum(unnormalised, axis=-1)  # [b, H, T]
  out = jnp.einsum("bhts,bshd->bthd", unnormalised, v)
  return out / jnp.transpose(total, (0, 2, 1))[..., None]


def attention(q: jax.Array, k: jax.Array, v: jax.Array, score_fn: ScoreFn = dot_scores,
              key_mask=None, *, chunk_rows: Optional[int] = None) -> jax.Array:
  """softmax(score_fn(q, k)) @ v, computed `chunk_rows` batch rows at a time.

  Args:
    q: [B, T, H, D] queries.
    k, v: [B, S, H, D] keys and values.
    score_fn: (q, k) of a chunk -> logits [b, H, T, S], scaled and biased as
      the model wants (default: `dot_scores`).
    key_mask: optional bool [B, S]; False keys (padding) get no weight.
    chunk_rows: batch rows per chunk; None picks `default_chunk_rows`. A value
      >= B computes the whole batch at once.

  Returns:
    [B, T, H, D].
  """
  batch, q_len, heads, head_size = q.shape
  if chunk_rows is None:
    chunk_rows = default_chunk_rows(batch, heads, q_len, k.shape[1])
  if chunk_rows < 1:
    raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")

  def one(args):
    cq, ck, cv, *cmask = args
    return softmax_attend(score_fn(cq, ck), cv, cmask[0] if cmask else None)

  inputs = (q, k, v) if key_mask is None else (q, k, v, key_mask)
  if chunk_rows >= batch:
    return one(inputs)

  num_chunks = -(-batch // chunk_rows)
  padded = num_chunks * chunk_rows

  def split(x):
    # Row b goes to chunk b % num_chunks: a batch split over devices stays split
    # along the rows of every chunk, and the loop runs over an unsplit axis.
    # Padding rows are rows of their own (ones, all keys visible), later dropped.
    if padded != batch:
      x = jnp.pad(x, [(0, padded - batch)] + [(0, 0)] * (x.ndim - 1), constant_values=1)
    return jnp.swapaxes(x.reshape(chunk_rows, num_chunks, *x.shape[1:]), 0, 1)

  body = jax.checkpoint(one, prevent_cse=False)  # Recompute, do not store, in the backward.
  out = jax.lax.map(body, tuple(split(x) for x in inputs))
  out = jnp.swapaxes(out, 0, 1).reshape(padded, q_len, heads, head_size)
  return out[:batch]
