"""The pure core's contract for use outside Haiku: shapes, dtypes, Context, sampling.

Each rule is tested against a brute-force numpy reference or by an error that must name
the valid shapes (issue #29, item 2).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from randomized_pe import attention as attn
from randomized_pe import encodings as enc
from randomized_pe import families
from randomized_pe import samplers


def _rope_reference(x, positions, max_timescale=enc.DEFAULT_MAX_TIMESCALE):
  """float64 RoPE of x [..., T, D] at positions broadcastable to [..., T]."""
  x = np.asarray(x, np.float64)
  dim = x.shape[-1]
  freqs = max_timescale ** -(np.arange(0, dim, 2) / dim)
  angles = np.asarray(positions, np.float64)[..., None] * freqs  # [..., T, D/2]
  even, odd = x[..., 0::2], x[..., 1::2]
  out = np.empty_like(x)
  out[..., 0::2] = even * np.cos(angles) - odd * np.sin(angles)
  out[..., 1::2] = odd * np.cos(angles) + even * np.sin(angles)
  return out


# --------------------------------------------------------------------------
# RoPE: the silent [B, T, D] case with B == T.


def test_rope_on_batch_time_features_with_batch_equal_to_length_matches_reference():
  x = jax.random.normal(jax.random.PRNGKey(0), (5, 5, 8))  # [B, T, D], B == T
  positions = jnp.array([0, 3, 10, 40, 99])
  got = enc.apply_rope(x, positions, heads=False)
  np.testing.assert_allclose(got, _rope_reference(x, positions), atol=2e-6)
  # The ambiguous call is an error, not a rotation along the batch axis.
  with pytest.raises(ValueError, match="ambiguous; pass heads=False"):
    enc.apply_rope(x, positions)


def test_rope_one_sequence_with_heads_and_batched_positions_match_reference():
  x = jax.random.normal(jax.random.PRNGKey(1), (6, 3, 8))  # [T, H, D] (as under vmap)
  positions = jnp.arange(6) * 7
  got = enc.apply_rope(x, positions, heads=True)
  np.testing.assert_allclose(got, _rope_reference(np.swapaxes(x, 0, 1), positions).swapaxes(0, 1),
                             atol=2e-6)
  xb = jax.random.normal(jax.random.PRNGKey(2), (2, 6, 3, 8))  # [B, T, H, D]
  pb = jnp.stack([jnp.arange(6), jnp.arange(6) * 11 + 5])  # [B, T]
  got = np.asarray(enc.apply_rope(xb, pb))
  for b in range(2):
    want = _rope_reference(np.swapaxes(xb[b], 0, 1), pb[b]).swapaxes(0, 1)
    np.testing.assert_allclose(got[b], want, atol=2e-6)


@pytest.mark.parametrize("shape, positions, match", [
    ((2, 6, 3, 8), np.arange(5), r"positions must be \[6\] or \[2, 6\]"),
    ((2, 6, 3, 8), np.zeros((3, 6)), r"positions must be \[6\] or \[2, 6\]"),
    ((2, 6, 3, 7), np.arange(6), "D even"),
])
def test_rope_bad_shapes_are_one_line_errors(shape, positions, match):
  with pytest.raises(ValueError, match=match) as error:
    enc.apply_rope(jnp.zeros(shape), positions)
  assert "\n" not in str(error.value)


# --------------------------------------------------------------------------
# [B, T] positions: every encoding function, against the per-sequence [T] result.


def test_alibi_bias_with_batched_positions_matches_each_row_and_the_formula():
  slopes = enc.alibi_slopes(4)
  pos = jnp.array([[0, 2, 9], [1, 5, 6]])
  got = np.asarray(enc.alibi_bias(pos, pos, slopes))
  assert got.shape == (2, 4, 3, 3)
  for b in range(2):
    d = np.asarray(pos[b])[None, :] - np.asarray(pos[b])[:, None]
    want = slopes[:, None, None] * (-np.abs(d) + 0.5 * (d < 0))
    np.testing.assert_allclose(got[b], want, rtol=0, atol=1e-6)
  with pytest.raises(ValueError, match=r"\[Tq\] and \[Tk\], or \[B, Tq\] and \[B, Tk\]"):
    enc.alibi_bias(pos, pos[0], slopes)


def test_relative_logits_with_batched_positions_match_brute_force():
  key = jax.random.PRNGKey(3)
  queries = jax.random.normal(key, (2, 4, 2, 6))
  kernel = jax.random.normal(jax.random.PRNGKey(4), (8, 2, 6))
  pos = jnp.array([[0, 3, 7, 20], [2, 4, 5, 100]])
  for method in ("pairwise", "factorized"):
    got = np.asarray(enc.relative_logits(queries, pos, kernel, method=method))
    assert got.shape == (2, 2, 4, 4)
    for b in range(2):
      p = np.asarray(pos[b], np.float64)
      dist = p[None, :] - p[:, None]  # [Tq, T]: p_j - p_i
      freqs = enc.DEFAULT_MAX_TIMESCALE ** -(np.arange(0, 8, 2) / 8)
      sinus = np.concatenate([np.sin(dist[..., None] * freqs), np.cos(dist[..., None] * freqs)],
                             axis=-1)  # [Tq, T, R]
      want = np.einsum("thd,tsr,rhd->hts", np.asarray(queries[b], np.float64), sinus,
                       np.asarray(kernel, np.float64))
      np.testing.assert_allclose(got[b], want, atol=1e-4)
  with pytest.raises(ValueError, match=r"positions must be \[T\] or \[2, T\]"):
    enc.relative_logits(queries, jnp.zeros((3, 4)), kernel)
  with pytest.raises(ValueError, match=r"relative kernel must be \[R, 2, 6\]"):
    enc.relative_logits(queries, pos, kernel.reshape(8, 12))


def test_relative_attention_logits_equal_the_family_scorer_and_a_reference():
  ctx = families.Context.create(16, 2)
  family = families.get("relative").family
  specs = family.params(ctx)
  keys = jax.random.split(jax.random.PRNGKey(5), len(specs) + 2)
  params = {n: s.init(k, s.shape, jnp.float32) for (n, s), k in zip(specs.items(), keys)}
  q = jax.random.normal(keys[-2], (3, 5, 2, 8))
  k = jax.random.normal(keys[-1], (3, 5, 2, 8))
  pos = samplers.randomized(jax.random.PRNGKey(6), 5, 64)
  want = family.scorer(pos, params, ctx, q.shape, 0)(q, k)
  got = enc.relative_attention_logits(q, k, pos, params["relative_kernel"],
                                      content_bias=params["content_bias"],
                                      relative_bias=params["relative_bias"])
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
  # The scale is 1/sqrt(D): without biases and with a zero kernel, plain dot products.
  plain = enc.relative_attention_logits(q, k, pos, jnp.zeros((16, 2, 8)))
  np.testing.assert_allclose(plain, np.einsum("bthd,bshd->bhts", q, k) / math.sqrt(8),
                             atol=1e-5)


# --------------------------------------------------------------------------
# dtypes: outputs follow the input.


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_outputs_follow_the_input_dtype(dtype):
  q = jnp.ones((2, 4, 2, 8), dtype)
  pos = jnp.arange(4)
  kernel = jnp.ones((8, 2, 8), jnp.float32)
  assert enc.apply_rope(q, pos).dtype == dtype
  assert enc.relative_logits(q, pos, kernel).dtype == dtype
  assert enc.relative_logits(q, pos, kernel, method="factorized").dtype == dtype
  assert enc.relative_logits_toeplitz(q, enc.signed_offsets(pos), kernel).dtype == dtype
  assert enc.relative_attention_logits(q, q, pos, kernel).dtype == dtype
  assert enc.sinusoid(pos.astype(dtype), 8).dtype == dtype
  assert enc.sinusoid(pos, 8).dtype == jnp.float32  # Integer positions.
  assert enc.sinusoid(pos, 8, dtype=dtype).dtype == dtype
  assert enc.alibi_bias(pos.astype(dtype), pos.astype(dtype), enc.alibi_slopes(2)).dtype == dtype
  mask = jnp.array([[True] * 4, [True, True, False, False]])
  bias = enc.alibi_bias(pos, pos, enc.alibi_slopes(2))  # float32
  for kwargs in ({}, {"key_mask": mask}, {"bias": bias}, {"key_mask": mask, "chunk_rows": 1}):
    assert attn.attention(q, q, q, **kwargs).dtype == dtype, kwargs


def test_attention_with_a_per_row_bias_equals_each_row_alone():
  q = jax.random.normal(jax.random.PRNGKey(7), (3, 4, 2, 8))
  pos = jnp.array([[0, 1, 2, 3], [0, 5, 9, 30], [2, 3, 50, 51]])
  bias = enc.alibi_bias(pos, pos, enc.alibi_slopes(2))  # [B, H, T, T]
  for chunk_rows in (None, 1, 2):
    got = attn.attention(q, q, q, bias=bias, chunk_rows=chunk_rows)
    for b in range(3):
      want = attn.attention(q[b:b + 1], q[b:b + 1], q[b:b + 1], bias=bias[b])
      np.testing.assert_allclose(got[b:b + 1], want, atol=1e-6)
  with pytest.raises(ValueError, match=r"bias must be \[2, 4, 4\] or \[3, 2, 4, 4\]"):
    attn.attention(q, q, q, bias=bias[:, :1])


# --------------------------------------------------------------------------
# Context and sampling without a model.


def test_context_create_has_defaults_is_hashable_and_feeds_every_family():
  ctx = families.Context.create(64, 8)
  assert ctx.head_size == 8 and ctx.max_position == 2048 and ctx.behaviour.compat == "paper"
  assert hash(ctx) == hash(families.Context.create(64, 8))
  assert ctx == families.Context.create(64, 8)
  assert ctx != families.Context.create(64, 8, max_timescale=100.0)
  assert jax.jit(lambda x, c: x * c.head_size, static_argnums=1)(2, ctx) == 16
  # A Context built by hand with no settings reads the declared defaults (no KeyError).
  bare = families.Context(d_model=16, num_heads=2)
  assert bare.head_size == 8 and bare.settings["max_timescale"] == enc.DEFAULT_MAX_TIMESCALE
  pos = jnp.arange(5)
  term = families.get("sin_cos").family.term(pos, {}, bare)
  np.testing.assert_array_equal(term, enc.sinusoid(pos, 16))
  with pytest.raises(ValueError, match="unknown setting max_timescal; valid settings: "):
    families.Context.create(64, 8, max_timescal=1.0)
  with pytest.raises(ValueError, match="valid choices: paper, release"):
    families.Context.create(64, 8, compat="relase")


def test_sample_positions_in_the_core_is_release_aware():
  key = jax.random.PRNGKey(8)
  paper = families.sample_positions("randomized_relative", key, 6, 64)
  assert paper.shape == (6,) and np.all(np.diff(paper) > 0)
  release = families.sample_positions("randomized_relative", key, np.int64(6), 64,
                                      compat="release", num_layers=3)
  assert release.shape == (3, 6) and np.all(release[:, 0] == 0)  # Offset tables, per layer.
  assert len({tuple(r) for r in np.asarray(release).tolist()}) == 3
  np.testing.assert_array_equal(families.sample_positions("rope", key, 4, 64), np.arange(4))
  padded = families.sample_positions("randomized_alibi", key, 4, 64, padded_length=7)
  np.testing.assert_array_equal(padded[:4], families.sample_positions("randomized_alibi", key,
                                                                      4, 64))


@pytest.mark.parametrize("length", [np.int64(5), np.int32(5), jnp.asarray(5), 5])
def test_samplers_accept_integer_like_lengths(length):
  key = jax.random.PRNGKey(9)
  want = samplers.randomized(key, 5, 40)
  np.testing.assert_array_equal(samplers.randomized(key, length, np.int64(40)), want)
  np.testing.assert_array_equal(samplers.get("randomized")(key, length, 40, np.int64(8))[:5],
                                want)


def test_samplers_refuse_non_integer_lengths_with_a_clear_message():
  with pytest.raises(ValueError, match="length must be a non-negative integer, got 2.5"):
    samplers.randomized(None, 2.5, 40)
