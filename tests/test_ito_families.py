"""Ito's encodings are families of the core registry (issue #30, item 3).

Each Ito encoding names a family of `randomized_pe.families` (the sinusoids `sin_cos`,
2-D through per-axis positions; RoPE `rope`; the matrices `table`; Shaw's table `shaw`,
its causal mask a bias; c-NoPE `causal`, its x100 a logit scale), and a family added to
the core is available to the Ito model by one `ito.register` entry. That the outputs did
not change is tests/test_pinned_outputs.py's and tests/test_reference_forward.py's.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from randomized_pe import attention as attn_lib
from randomized_pe import encodings as enc
from randomized_pe import families
from randomized_pe.models import encoder as encoder_lib
from randomized_pe.models import ito

TINY_ITO = dict(d_model=16, mlp_size=32, num_layers=2)

FAMILY_OF = {"1d_fixed": "sin_cos", "2d_fixed": "sin_cos", "randomized_2d": "sin_cos",
             "learn": "table", "random": "table", "relative": "shaw", "rope": "rope",
             "nope": "none", "c_nope": "causal"}


def test_every_ito_encoding_is_a_core_family():
  assert set(ito.names()) == set(FAMILY_OF)
  for name in ito.names():
    encoding = ito.get(name)
    assert encoding.family == FAMILY_OF[name]
    assert encoding.core_family is families.FAMILIES.get(FAMILY_OF[name])
  # Ito's model defines no computation of its own any more.
  assert not hasattr(ito, "_relative_scorer") and not hasattr(ito, "_rope_scorer")
  assert not hasattr(ito, "relative_offset_index")


def test_the_parts_are_not_encodings_of_their_own():
  for name in ("table", "shaw", "causal"):
    assert not families.get_family(name).standalone
    assert name not in families.family_names() and name not in families.names()
    with pytest.raises(ValueError, match="unknown positional encoding"):
      encoder_lib.EncoderConfig(vocab_size=5, pe=name)


def test_register_refuses_a_family_the_core_lacks():
  with pytest.raises(ValueError, match="valid choices: none, sin_cos"):
    ito.register(ito.ItoEncoding("mystery", "no such family", family="mystery"))
  assert "mystery" not in ito.names()


def _ctx(**settings):
  return families.Context(d_model=16, num_heads=2, max_position=16, settings=settings)


def test_causal_bias_masks_later_positions_for_any_query_rows():
  positions = jnp.array([0, 2, 3, 7, 9])
  bias = families.causal_bias(positions, {}, _ctx(), (1, 2, 2, 8), 2)  # Queries 3 and 7.
  assert bias.shape == (2, 2, 5)
  np.testing.assert_array_equal(np.asarray(bias[0]) == 0,
                                [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
  assert float(bias.min()) == float(jnp.finfo(jnp.float32).min)


def test_shaw_scorer_equals_its_definition():
  key_q, key_k, key_t = jax.random.split(jax.random.PRNGKey(0), 3)
  positions = jnp.array([0, 1, 3, 4, 8, 9])
  q = jax.random.normal(key_q, (2, 3, 2, 8))  # Queries 3.. 5 of 6.
  k = jax.random.normal(key_k, (2, 6, 2, 8))
  for causal in (False, True):
    ctx = _ctx(shaw_max_distance=4, shaw_causal=causal)
    spec = families.get_family("shaw").params(ctx)["distance_table"]
    assert spec.shape == ((5 if causal else 9), 8)
    table = spec.init(key_t, spec.shape)
    got = families.get_family("shaw").scorer(positions, {"distance_table": table}, ctx,
                                              q.shape, 3)(q, k)
    want = np.zeros((2, 2, 3, 6))
    for i in range(3):
      for j in range(6):
        d = int(np.clip(positions[j] - positions[3 + i], -4, 0 if causal else 4))
        want[:, :, i, j] = (np.einsum("bhd,bhd->bh", q[:, i], k[:, j])
                            + np.einsum("bhd,d->bh", q[:, i], table[d + 4])) / math.sqrt(8)
    np.testing.assert_allclose(got, want, atol=1e-5)
    bias = families.get_family("shaw").bias(positions, {}, ctx, q.shape, 3)
    assert (bias is None) == (not causal)


def test_table_and_interleaved_sin_cos_terms():
  ctx = _ctx(table_rows=6, table_init_scale=0.5)
  spec = families.get_family("table").params(ctx)["table"]
  assert spec.shape == (6, 16)
  table = spec.init(jax.random.PRNGKey(0), spec.shape)
  np.testing.assert_array_equal(
      families.get_family("table").term(jnp.array([5, 0, 2]), {"table": table}, ctx),
      table[np.array([5, 0, 2])])
  grid = jnp.stack([jnp.arange(16) % 4, jnp.arange(16) // 4], axis=-1)
  term = families.get_family("sin_cos").term(grid, {}, _ctx(sin_cos_interleaved=True))
  np.testing.assert_array_equal(term, ito.grid_sinusoid(grid, 16))
  term = families.get_family("sin_cos").term(jnp.arange(16), {}, _ctx(sin_cos_interleaved=True))
  np.testing.assert_array_equal(term, ito.raster_sinusoid(jnp.arange(16), 16))
  # The interleaving: per axis sin w_0, cos w_0, sin w_1, ...
  plain = enc.sinusoid(jnp.arange(3), 8)
  np.testing.assert_array_equal(enc.interleave_sin_cos(plain)[:, 0::2], plain[:, :4])


def test_c_nope_scale_is_the_causal_familys_logit_scale():
  config = ito.ItoConfig(pe="c_nope", c_nope_logit_scale=7.0, **TINY_ITO)
  assert families.logit_scale_of(config.family, config.context) == 7.0
  assert families.logit_scale_of(
      config.family, ito.ItoConfig(pe="c_nope", c_nope_logit_scale=1.0).context) is None


# --------------------------------------------------------------------------
# A family added to the core is available to the Ito model by one entry.


def _diagonal_bias(positions, params, ctx, query_shape, query_start):
  """Every query attends to itself only (a bias of 0 on the diagonal, -1e9 elsewhere)."""
  del params, ctx
  rows = families.query_rows(positions, query_start, query_shape[1])
  bias = jnp.where(rows[:, None] == positions[None, :], 0.0, -1e9)
  return jnp.broadcast_to(bias, (query_shape[2], *bias.shape))


@pytest.fixture
def self_only():
  family = families.Family("self_only", "attention", scorer=families._dot_scorer,
                           bias=_diagonal_bias, randomized_twin=False, standalone=False)
  families.register(family)
  ito.register(ito.ItoEncoding("self_only", "attend to oneself only", family="self_only"))
  yield
  ito.ENCODINGS.unregister("self_only")
  families.FAMILIES.unregister("self_only")


def test_a_new_core_family_runs_in_the_ito_model(self_only):
  model = ito.ItoModel(ito.ItoConfig(pe="self_only", **TINY_ITO), 4)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 6)
  params = model.init(jax.random.PRNGKey(0), tokens)
  weights = np.asarray(model.attention_weights(params, None, tokens))  # [N, B, H, T, T]
  np.testing.assert_allclose(weights, np.broadcast_to(np.eye(16), weights.shape), atol=1e-6)
  # So every cell's output depends on its own token only.
  logits = np.asarray(model.apply(params, None, tokens))
  changed = tokens.at[:, 3].set((tokens[:, 3] + 1) % 6)
  moved = np.abs(np.asarray(model.apply(params, None, changed)) - logits).max(-1)  # [B, T]
  assert np.all(moved[:, 3] > 1e-4) and np.all(np.delete(moved, 3, axis=1) == 0)


def test_the_encoder_applies_a_familys_logit_scale():
  # A standalone family with a logit scale of 3 gives the encoder the logits of a
  # scorer that multiplies by 3 itself.
  def tripled(positions, params, ctx, query_shape, query_start):
    return lambda q, k: 3.0 * attn_lib.dot_scores(q, k)

  scaled = families.Family("scaled3", "attention", scorer=families._dot_scorer,
                           logit_scale=lambda ctx: 3.0, randomized_twin=False)
  by_hand = families.Family("tripled", "attention", scorer=tripled, randomized_twin=False)
  for family in (scaled, by_hand):
    families.register(family)
  try:
    tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 7), 0, 5)
    out = {}
    for pe in ("scaled3", "tripled", "none"):
      config = encoder_lib.EncoderConfig(vocab_size=5, pe=pe, num_layers=2, num_heads=2,
                                         d_model=16)
      net = encoder_lib.make_encoder(config, 3)
      params = net.init(jax.random.PRNGKey(0), tokens)
      out[pe] = np.asarray(net.apply(params, None, tokens))
  finally:
    for family in (scaled, by_hand):
      families.FAMILIES.unregister(family.name)
  np.testing.assert_allclose(out["scaled3"], out["tripled"], atol=1e-6)
  assert np.abs(out["scaled3"] - out["none"]).max() > 1e-3


# --------------------------------------------------------------------------
# One sampler resolution for both models.


@pytest.mark.parametrize("training,evaluation", [("", ""), ("randomized", ""),
                                                 ("equal_mean_exponential", ""),
                                                 ("randomized", "evenly_spaced")])
def test_both_models_resolve_samplers_the_same_way(training, evaluation):
  train, test = families.samplers_of(training, evaluation, "arange")
  assert train.name == (training or "arange")
  assert test.name == (evaluation or {"equal_mean_exponential": "linspace"}.get(training)
                       or train.name)
  for pe, default in (("randomized_2d", "randomized"), ("1d_fixed", "arange")):
    config = ito.ItoConfig(pe=pe, positions=training, eval_positions=evaluation)
    assert (config.train_sampler, config.eval_sampler) == families.samplers_of(
        training, evaluation, default)
  config = encoder_lib.EncoderConfig(vocab_size=5, pe="rope", positions=training,
                                     eval_positions=evaluation)
  assert (config.train_sampler, config.eval_sampler) == (train, test)


def test_register_and_config_check_the_familys_positions():
  with pytest.raises(ValueError, match="grid positions .* need a family that takes per-axis"):
    ito.register(ito.ItoEncoding("grid_table", "a table at grid positions", family="table",
                                 positions="grid"))
  assert "grid_table" not in ito.names()
  # A raster encoding of a family that takes integers only refuses float samplers.
  ito.register(ito.ItoEncoding("raster_table", "a table at raster positions", family="table",
                               settings=lambda c: {"table_rows": c.max_position},
                               positions="raster"))
  try:
    ito.ItoConfig(pe="raster_table", positions="randomized")  # Integers: fine.
    with pytest.raises(ValueError, match="gives float positions, which raster_table cannot"):
      ito.ItoConfig(pe="raster_table", positions="equal_mean_exponential")
  finally:
    ito.ENCODINGS.unregister("raster_table")
