"""Chunked attention (randomized_pe.attention): the same function as the whole batch at once."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from randomized_pe import attention
from randomized_pe import encodings as enc
from randomized_pe import samplers as pos


def _inputs(batch, length, heads=2, head_size=4, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  q, k, v, cot = (jax.random.normal(keys[i], (batch, length, heads, head_size)) for i in range(4))
  return q, k, v, cot


def _brute_force(q, k, v, key_mask=None):
  """softmax(q k^T / sqrt(D)) v row by row in numpy (float64)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  batch, length, heads, head_size = q.shape
  out = np.zeros_like(q)
  for b in range(batch):
    for h in range(heads):
      logits = q[b, :, h] @ k[b, :, h].T / math.sqrt(head_size)
      if key_mask is not None:
        logits = np.where(np.asarray(key_mask)[b][None, :], logits, -np.inf)
      weights = np.exp(logits - logits.max(-1, keepdims=True))
      out[b, :, h] = (weights / weights.sum(-1, keepdims=True)) @ v[b, :, h]
  return out


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7])
def test_chunks_equal_whole_batch_values_and_gradients(rows):
  # batch 7 with 2 or 3 rows per chunk pads the batch; 7 rows is one piece.
  q, k, v, cot = _inputs(7, 5)
  mask = jnp.arange(5)[None, :] < jnp.array([5, 3, 1, 5, 2, 4, 5])[:, None]

  def loss(q, k, v, chunk):
    return jnp.vdot(attention.attention(q, k, v, key_mask=mask, chunk_rows=chunk), cot)

  out = attention.attention(q, k, v, key_mask=mask, chunk_rows=rows)
  np.testing.assert_allclose(out, _brute_force(q, k, v, mask), atol=1e-5)
  whole = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, 7)
  chunked = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)(q, k, v, rows)
  for a, b in zip(whole, chunked):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_gradient_of_a_table_shared_by_all_chunks_is_summed():
  # The relative table does not depend on the batch: every chunk reads it and
  # its gradient (hence the kernel's) must add up over the chunks.
  q, k, v, cot = _inputs(6, 5, heads=2, head_size=4, seed=1)
  p = pos.randomized(jax.random.PRNGKey(2), 5, 64)
  kernel = jax.random.normal(jax.random.PRNGKey(3), (8, 2, 4)) * 0.3

  def loss(q, kernel, chunk):
    table = enc.relative_key_table(p, kernel)
    score = lambda cq, ck: attention.dot_scores(cq, ck) + enc.relative_logits_from_table(cq, table)
    return jnp.vdot(attention.attention(q, k, v, score, chunk_rows=chunk), cot)

  whole = jax.grad(loss, argnums=(0, 1))(q, kernel, 6)
  for rows in (1, 4):
    chunked = jax.grad(loss, argnums=(0, 1))(q, kernel, rows)
    for a, b in zip(whole, chunked):
      np.testing.assert_allclose(a, b, atol=1e-5)
  assert float(jnp.max(jnp.abs(whole[1]))) > 1e-3  # The kernel does get a gradient.


def test_default_chunk_rows():
  # Off CPU the whole batch; on CPU cache-sized chunks that waste few rows.
  assert attention.default_chunk_rows(128, 8, 72, 72, backend="gpu") == 128
  assert attention.default_chunk_rows(128, 8, 20, 20, backend="cpu") == 128  # Fits: one piece.
  rows = attention.default_chunk_rows(128, 8, 72, 72, backend="cpu")
  assert rows * 8 * 72 * 72 <= attention.CPU_CHUNK_ELEMENTS and 128 % rows == 0 and rows >= 8
  assert attention.default_chunk_rows(500, 8, 72, 72, backend="cpu") == 10  # Divides 500.
  assert attention.default_chunk_rows(4, 8, 2000, 2000, backend="cpu") == 1
  for batch in (1, 7, 127, 500, 513):
    for length in (1, 50, 300):
      rows = attention.default_chunk_rows(batch, 8, length, length, backend="cpu")
      padded = -(-batch // rows) * rows
      assert 1 <= rows <= batch and padded - batch < rows


def _flops(fn, *args) -> float:
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  return float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])


def test_whole_batch_chunks_count_the_arithmetic_of_every_row():
  """XLA's cost analysis counts a loop's body once: a program traced in chunks reports
  one chunk's attention. Traced within whole_batch_chunks, the same call is one piece
  and costs what the whole batch costs, with a backward pass too."""
  q, k, v, _ = _inputs(8, 6, heads=2, head_size=4)
  whole = lambda *a: attention.attention(*a, chunk_rows=8)
  chunked = lambda *a: attention.attention(*a, chunk_rows=2)  # Explicit: not affected.
  assert _flops(chunked, q, k, v) < 0.5 * _flops(whole, q, k, v)  # 1 chunk of 4 counted.

  def grads(fn):
    return lambda q, k, v: jax.grad(lambda *a: jnp.sum(jnp.sin(fn(*a))), (0, 1, 2))(q, k, v)

  # A batch whose logits exceed CPU_CHUNK_ELEMENTS gets chunks by default on CPU.
  big = _inputs(4, 300, heads=8, head_size=2)[:3]
  by_default = lambda *a: attention.attention(*a, chunk_rows=None)
  rows = attention.default_chunk_rows(4, 8, 300, 300, backend="cpu")
  assert rows < 4
  if jax.default_backend() == "cpu":
    with attention.whole_batch_chunks():
      assert attention.default_chunk_rows(4, 8, 300, 300) == 4
      one_piece = _flops(grads(by_default), *big)
    assert attention.default_chunk_rows(4, 8, 300, 300) == rows  # Scoped.
    assert one_piece == _flops(grads(lambda *a: attention.attention(*a, chunk_rows=4)), *big)
    assert _flops(grads(by_default), *big) < 0.7 * one_piece
  with attention.whole_batch_chunks():
    assert attention.default_chunk_rows(4, 8, 300, 300, backend="cpu") == 4
    with attention.forward_only_chunks():  # Evaluation's programs: costing wins.
      assert attention.default_chunk_rows(4, 8, 300, 300, backend="cpu") == 4
  with attention.forward_only_chunks():
    assert attention.default_chunk_rows(4, 8, 300, 300, backend="cpu") == rows


def test_invalid_chunk_rows():
  q, k, v, _ = _inputs(2, 3)
  with pytest.raises(ValueError, match="chunk_rows must be >= 1"):
    attention.attention(q, k, v, chunk_rows=0)
