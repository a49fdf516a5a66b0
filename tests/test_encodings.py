"""Encodings against closed forms, brute-force oracles and invariances."""
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from randomized_pe import encodings as enc
from randomized_pe import samplers as pos


@pytest.mark.parametrize("positions", [np.arange(9), np.array([0.5, 3.25, 7.0, 100.75, 2047.0])])
def test_sinusoid_closed_form(positions):
  dim, timescale = 12, 10_000.0
  got = np.asarray(enc.sinusoid(jnp.asarray(positions), dim, timescale))
  want = np.zeros((len(positions), dim))
  for t, p in enumerate(positions):
    for i in range(dim // 2):
      want[t, i] = math.sin(p / timescale ** (2 * i / dim))
      want[t, dim // 2 + i] = math.cos(p / timescale ** (2 * i / dim))
  np.testing.assert_allclose(got, want, atol=2e-4)


def _sinusoid_float64(positions, dim, timescale=10_000.0):
  """The release's table: float64 products, sin and cos, then (here) no cast."""
  angles = np.asarray(positions, np.float64)[:, None] * timescale ** -(np.arange(0, dim, 2) / dim)
  return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)


@pytest.mark.parametrize("dim,timescale", [(64, 10_000.0), (6, 10.0)])
def test_sinusoid_accurate_at_integer_positions_up_to_65535(dim, timescale):
  # A float32 product p * w is off by up to 7e-5 near p = 2048 (far more at 65535).
  positions = np.concatenate([np.arange(0, 65_536), -np.arange(1, 4096)]).astype(np.int32)
  got = np.asarray(jax.jit(lambda p: enc.sinusoid(p, dim, timescale))(positions))
  assert np.max(np.abs(got - _sinusoid_float64(positions, dim, timescale))) <= 2e-6
  # The naive float32 product really is worse: the test can tell them apart.
  naive = positions[:, None].astype(np.float32) * enc.inverse_frequencies(dim, timescale)
  naive = np.concatenate([np.sin(naive), np.cos(naive)], axis=-1)
  assert np.max(np.abs(naive - _sinusoid_float64(positions, dim, timescale))) > 2e-5


def test_sinusoid_accurate_at_float_positions_and_in_rope():
  rng = np.random.default_rng(0)
  positions = rng.uniform(-5_000, 65_000, 4096).astype(np.float32)
  got = np.asarray(enc.sinusoid(jnp.asarray(positions), 32))
  assert np.max(np.abs(got - _sinusoid_float64(positions, 32))) <= 2e-6
  # RoPE rotates by the same accurate angles: pair (0, 1) of a unit vector.
  x = jnp.zeros((1, 3, 1, 4)).at[..., 0].set(1.0)
  p = jnp.array([2047, 40_000, 65_535], jnp.int32)
  rotated = np.asarray(enc.apply_rope(x, p))[0, :, 0]
  want = _sinusoid_float64(np.asarray(p), 4)
  np.testing.assert_allclose(rotated[:, 0], want[:, 2], atol=2e-6)  # cos(p w_0)
  np.testing.assert_allclose(rotated[:, 1], want[:, 0], atol=2e-6)  # sin(p w_0)


def test_sinusoid_per_axis_splits_features_by_axis():
  grid = jnp.array([[r, c] for r in range(4) for c in range(4)])  # A 4x4 grid, k=2.
  got = enc.sinusoid(grid, 16, per_axis=True)
  assert got.shape == (16, 16)
  np.testing.assert_allclose(got[:, :8], enc.sinusoid(grid[:, 0], 8), atol=1e-6)
  np.testing.assert_allclose(got[:, 8:], enc.sinusoid(grid[:, 1], 8), atol=1e-6)


def _rope_scores(q, k, positions, **kw):
  return jnp.einsum("bthd,bshd->bhts", enc.apply_rope(q, positions, **kw), enc.apply_rope(k, positions, **kw))


def test_rope_matches_explicit_rotations():
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 3, 1, 4))
  p = np.array([0.0, 2.0, 5.5])
  got = np.asarray(enc.apply_rope(x, p))
  xs = np.asarray(x)
  for t in range(3):
    for m in range(2):
      theta = p[t] * 10_000 ** (-2 * m / 4)
      rot = np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
      np.testing.assert_allclose(got[0, t, 0, 2 * m:2 * m + 2], rot @ xs[0, t, 0, 2 * m:2 * m + 2], atol=1e-5)


@pytest.mark.parametrize("positions,shift", [
    (np.array([0, 3, 4, 10, 11, 30]), 37),
    (np.array([0.0, 0.5, 2.25, 7.0, 7.5, 19.0]), 3.25),
])
def test_rope_scores_depend_only_on_position_differences(positions, shift):
  kq, kk = jax.random.split(jax.random.PRNGKey(1))
  q = jax.random.normal(kq, (2, 6, 3, 8))
  k = jax.random.normal(kk, (2, 6, 3, 8))
  base = _rope_scores(q, k, jnp.asarray(positions))
  shifted = _rope_scores(q, k, jnp.asarray(positions) + shift)
  np.testing.assert_allclose(base, shifted, atol=1e-4)
  # ...and they do depend on the positions themselves.
  other = _rope_scores(q, k, jnp.asarray(positions) * 2)
  assert np.max(np.abs(np.asarray(other - base))) > 1e-2


def test_rope_per_axis_depends_only_on_per_axis_differences():
  grid = jnp.array([[r, c] for r in range(3) for c in range(3)], jnp.float32)
  kq, kk = jax.random.split(jax.random.PRNGKey(2))
  q = jax.random.normal(kq, (1, 9, 2, 8))
  k = jax.random.normal(kk, (1, 9, 2, 8))
  base = _rope_scores(q, k, grid, per_axis=True)
  shifted = _rope_scores(q, k, grid + jnp.array([5.0, -2.0]), per_axis=True)
  np.testing.assert_allclose(base, shifted, atol=1e-4)


def test_alibi_slopes_formula():
  np.testing.assert_allclose(enc.alibi_slopes(8), [2.0 ** -(i + 1) for i in range(8)], rtol=1e-6)
  # 12 heads: the 8-head slopes, then slopes 1, 3, 5, 7 (1-based) of 16 heads.
  want = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -(k / 2) for k in (1, 3, 5, 7)]
  np.testing.assert_allclose(enc.alibi_slopes(12), want, rtol=1e-6)


def test_alibi_bias_brute_force_and_release_form():
  slopes = enc.alibi_slopes(4)
  q_pos = np.array([0.0, 3.0, 4.5, 9.0])
  k_pos = np.array([1.0, 3.0, 8.0])
  got = np.asarray(enc.alibi_bias(q_pos, k_pos, slopes))
  want = np.zeros((4, 4, 3))
  for h in range(4):
    for i in range(4):
      for j in range(3):
        d = k_pos[j] - q_pos[i]
        want[h, i, j] = slopes[h] * (-abs(d) + (0.5 if d < 0 else 0.0))
  np.testing.assert_allclose(got, want, atol=1e-6)
  # Positions 0..T-1: the release's bias built from triangular matrices.
  t = 6
  release = np.zeros((t, t))
  release -= sum(np.tri(t, t, k=-i) for i in range(1, t))
  release -= sum(np.tri(t, t, k=-i).T for i in range(1, t))
  release += 0.5 * np.tri(t, t, k=-1)
  got = np.asarray(enc.alibi_bias(np.arange(t), np.arange(t), slopes))
  np.testing.assert_allclose(got, slopes[:, None, None] * release[None], atol=1e-6)


def _relative_brute_force(queries, positions, kernel):
  """[B, T, T, R] reference: sinusoid of every pairwise difference, projected."""
  p = np.asarray(positions, np.float64)
  rel = enc.sinusoid(jnp.asarray(p[None, :] - p[:, None], jnp.float32), kernel.shape[0])  # [T, T, R]
  rel_keys = jnp.einsum("ijr,rhd->ijhd", rel, kernel)
  return jnp.einsum("bihd,ijhd->bhij", queries, rel_keys)


def _relative_shift_reference(queries, kernel):
  """Transformer-XL's relative shift (the release's reshape trick) for positions 0..T-1."""
  b, t, h, d = queries.shape
  table = enc.sinusoid(jnp.arange(-t, t), kernel.shape[0])  # [2T, R]
  rel_keys = jnp.einsum("or,rhd->ohd", table, kernel)
  logits = jnp.einsum("bthd,ohd->bhto", queries, rel_keys)  # [B, H, T, 2T]

  def shift(x):  # [T, 2T] -> [T, T]
    x = x.reshape(2 * t, t)[1:].reshape(t, 2 * t - 1)
    return x[:, :t]

  return jax.vmap(jax.vmap(shift))(logits)


def _rel_inputs(t, seed=0):
  kq, kw = jax.random.split(jax.random.PRNGKey(seed))
  return jax.random.normal(kq, (2, t, 2, 4)), jax.random.normal(kw, (16, 2, 4)) * 0.3


@pytest.mark.parametrize("method", ["factorized", "pairwise", "auto"])
def test_relative_logits_match_brute_force_for_sorted_noncontiguous_positions(method):
  queries, kernel = _rel_inputs(9)
  p = pos.randomized(jax.random.PRNGKey(4), 9, 2048)
  assert np.any(np.diff(np.asarray(p)) > 1)
  np.testing.assert_allclose(enc.relative_logits(queries, p, kernel, method=method),
                             _relative_brute_force(queries, p, kernel), atol=2e-4)
  # Float positions too.
  pf = jnp.array([0.0, 0.5, 1.75, 3.0, 10.25, 11.0, 40.5, 41.0, 400.0])
  np.testing.assert_allclose(enc.relative_logits(queries, pf, kernel, method=method),
                             _relative_brute_force(queries, pf, kernel), atol=2e-4)


def test_relative_factorized_path_builds_no_pairwise_tensor():
  # Under "factorized" no intermediate has two sequence axes of length T.
  queries, kernel = _rel_inputs(11)
  p = pos.randomized(jax.random.PRNGKey(5), 11, 2048)
  jaxpr = jax.make_jaxpr(lambda q: enc.relative_logits(q, p, kernel, method="factorized"))(queries)
  shapes = [v.aval.shape for eqn in jaxpr.eqns for v in eqn.outvars]
  pairwise = [s for s in shapes if list(s).count(11) >= 2]
  assert pairwise == [(2, 2, 11, 11)], pairwise  # Only the [B, H, T, T] result itself.
  with pytest.raises(ValueError, match="valid choices: auto, factorized, pairwise"):
    enc.relative_logits(queries, p, kernel, method="fast")


def test_relative_logits_with_arange_equal_relative_shift():
  queries, kernel = _rel_inputs(7, seed=1)
  want = _relative_shift_reference(queries, kernel)
  np.testing.assert_allclose(enc.relative_logits(queries, jnp.arange(7), kernel), want, atol=1e-4)
  offsets = enc.signed_offsets(jnp.arange(7))
  np.testing.assert_allclose(enc.relative_logits_toeplitz(queries, offsets, kernel), want, atol=1e-4)


def test_release_relative_lookup_collapses_zero_and_rightward_distances():
  max_position = 64
  table = pos.offsets(jax.random.PRNGKey(0), 6, max_position)
  rows = np.asarray(enc.release_relative_positions(table, max_position))  # offsets -5..5
  assert np.all(rows[5:] == max_position - 1)  # d >= 0 all read the last row.
  assert len(set(rows[:5].tolist())) == 5  # Leftward distances stay distinct.
  # Consequence for the logits: for every query, all keys at or right of it get
  # the same positional term.
  queries, kernel = _rel_inputs(6, seed=2)
  logits = np.asarray(enc.relative_logits_toeplitz(queries, rows, kernel))
  for i in range(6):
    np.testing.assert_allclose(logits[..., i, i:], logits[..., i, i:i + 1] * np.ones(6 - i), atol=1e-5)


def test_toeplitz_and_signed_offsets():
  np.testing.assert_array_equal(enc.signed_offsets(jnp.array([0, 2, 5])), [-5, -2, 0, 2, 5])
  np.testing.assert_array_equal(
      enc.toeplitz(enc.signed_offsets(jnp.array([0, 2, 5]))),
      [[0, 2, 5], [-2, 0, 2], [-5, -2, 0]])


def test_learned_lookup_rows_and_clamp():
  table = jnp.arange(12.0).reshape(6, 2)
  np.testing.assert_array_equal(enc.learned_lookup(table, jnp.array([0, 5, 2])), [[0, 1], [10, 11], [4, 5]])
  np.testing.assert_array_equal(enc.learned_lookup(table, jnp.array([9])), [[10, 11]])
  with pytest.raises(TypeError):
    enc.learned_lookup(table, jnp.array([0.5]))


def test_pure_core_does_not_import_haiku():
  code = ("import sys, randomized_pe, randomized_pe.encodings, randomized_pe.samplers, "
          "randomized_pe.families, randomized_pe.release, randomized_pe.models; "
          "randomized_pe.families.get('randomized_relative'); "
          "assert 'haiku' not in sys.modules, 'haiku imported'")
  subprocess.run([sys.executable, "-c", code], check=True)
