"""The Haiku encoder: parameter counts, shapes, compilations, twins and compat modes."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import randomized_pe as rpe
from randomized_pe import families
from randomized_pe.models import encoder as model_lib

TINY = dict(num_layers=2, num_heads=2, d_model=16, widening_factor=2, max_position=64)


def _param_count(params):
  return sum(x.size for x in jax.tree_util.tree_leaves(params))


def _init(config, output_size=3, length=6, seed=0):
  model = rpe.make_encoder(config, output_size)
  tokens = jax.random.randint(jax.random.PRNGKey(seed + 100), (2, length), 0, config.vocab_size)
  params = model.init(jax.random.PRNGKey(seed), tokens)
  return model, params, tokens


@pytest.mark.parametrize("pe,count", [
    ("sin_cos", 248_962), ("relative", 270_082), ("randomized_relative", 270_082),
    ("none", 248_962), ("rope", 248_962), ("randomized_alibi", 248_962),
    ("randomized_learned", 248_962 + 2048 * 64),
])
def test_parameter_counts_match_release(pe, count):
  # Input vocabulary 3 (two symbols plus the empty token), output size 2.
  config = rpe.EncoderConfig(vocab_size=3, pe=pe)
  model = rpe.make_encoder(config, 2)
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
  assert _param_count(params) == count


@pytest.mark.parametrize("pe", families.names())
def test_output_shape_and_finite(pe):
  config = rpe.EncoderConfig(vocab_size=5, pe=pe, **TINY)
  model, params, tokens = _init(config, output_size=3, length=7)
  positions = config.sample_positions(jax.random.PRNGKey(1), 7)
  logits = model.apply(params, jax.random.PRNGKey(2), tokens, positions, is_training=True)
  assert logits.shape == (2, 7, 3) and logits.dtype == jnp.float32
  assert np.all(np.isfinite(np.asarray(logits)))


def test_one_compilation_per_input_shape():
  config = rpe.EncoderConfig(vocab_size=4, pe="randomized_relative", **TINY)
  model = rpe.make_encoder(config, 2)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((2, 5), jnp.int32))
  traces = []

  def apply(params, tokens, positions):
    traces.append(tokens.shape)
    return model.apply(params, None, tokens, positions)

  apply = jax.jit(apply)
  for step, length in enumerate([5, 5, 8, 5, 8, 8]):
    positions = config.sample_positions(jax.random.PRNGKey(step), length)
    apply(params, jnp.zeros((2, length), jnp.int32), positions)
  assert traces == [(2, 5), (2, 8)]


@pytest.mark.parametrize("family", ["sin_cos", "learned", "relative", "rope", "alibi"])
def test_randomized_twin_with_arange_equals_classic(family):
  base = rpe.EncoderConfig(vocab_size=5, pe=family, **TINY)
  twin = dataclasses.replace(base, pe="randomized_" + family)
  model, params, tokens = _init(base)
  twin_model = rpe.make_encoder(twin, 3)
  want = model.apply(params, None, tokens)
  got = twin_model.apply(params, None, tokens, jnp.arange(tokens.shape[1]))
  np.testing.assert_allclose(got, want, atol=1e-5)
  # Other positions really change the output.
  moved = twin_model.apply(params, None, tokens, jnp.arange(tokens.shape[1]) * 3 + 1)
  assert np.max(np.abs(np.asarray(moved - want))) > 1e-4


def test_release_relative_twin_differs_because_of_the_clamp():
  base = rpe.EncoderConfig(vocab_size=5, pe="relative", compat="release", dropout_rate=0.0, **TINY)
  twin = dataclasses.replace(base, pe="randomized_relative")
  model, params, tokens = _init(base)
  want = model.apply(params, None, tokens)
  got = rpe.make_encoder(twin, 3).apply(params, None, tokens, jnp.arange(tokens.shape[1]))
  assert np.max(np.abs(np.asarray(got - want))) > 1e-4
  # In paper mode the same comparison agrees (previous test); here the classic
  # release relative still equals the paper's classic relative.
  paper = rpe.make_encoder(dataclasses.replace(base, compat="paper"), 3)
  np.testing.assert_allclose(paper.apply(params, None, tokens), want, atol=1e-5)


@pytest.mark.parametrize("pe", ["randomized_relative", "randomized_rope", "randomized_alibi"])
def test_release_layers_see_different_positions(pe):
  config = rpe.EncoderConfig(vocab_size=5, pe=pe, compat="release", dropout_rate=0.0, **TINY)
  model, params, tokens = _init(config)
  sample = np.asarray(config.sample_positions(jax.random.PRNGKey(3), 6))
  assert sample.shape == (2, 6) and np.any(sample[0] != sample[1])
  out = model.apply(params, None, tokens, sample)
  # The second layer reads its own row: changing it alone changes the output.
  other = sample.copy()
  other[1] = np.asarray(config.sample_positions(jax.random.PRNGKey(4), 6))[1]
  assert np.max(np.abs(np.asarray(model.apply(params, None, tokens, other) - out))) > 1e-5
  # Paper mode: one draw shared by all layers, and per-layer input is refused.
  paper = dataclasses.replace(config, compat="paper")
  assert paper.sample_positions(jax.random.PRNGKey(3), 6).shape == (6,)
  with pytest.raises(ValueError, match="positions must have shape"):
    rpe.make_encoder(paper, 3).apply(params, None, tokens, sample)


def test_release_randomized_relative_scorer_uses_the_clamped_lookup():
  # With zero queries and keys the model's relative scorer returns the
  # positional term alone: under the release's clamp a query scores all keys
  # at or right of it equally; in paper mode it tells them apart.
  config = rpe.EncoderConfig(vocab_size=5, pe="randomized_relative", compat="release",
                             dropout_rate=0.0, **TINY)
  zeros = jnp.zeros((1, 6, config.num_heads, config.head_size))

  def scores(cfg, positions):
    family, ctx = cfg.family, cfg.context
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    params = {name: spec.init(k, spec.shape, jnp.float32)
              for k, (name, spec) in zip(keys, family.params(ctx).items())}
    return np.asarray(family.scorer(positions, params, ctx, zeros.shape, 0)(zeros, zeros))[0]

  release = scores(config, config.sample_positions(jax.random.PRNGKey(6), 6)[0])
  for i in range(6):
    np.testing.assert_allclose(release[:, i, i:], np.repeat(release[:, i, i:i + 1], 6 - i, -1), atol=1e-6)
  assert np.max(np.abs(release[:, 5, :5] - release[:, 5, 5:])) > 1e-4  # Left still varies.
  paper = dataclasses.replace(config, compat="paper")
  got = scores(paper, paper.sample_positions(jax.random.PRNGKey(6), 6))
  assert np.max(np.abs(got[:, 0, 1:] - got[:, 0, :1])) > 1e-4


def test_dropout_at_evaluation_only_in_release_mode():
  for compat, varies in [("release", True), ("paper", False)]:
    config = rpe.EncoderConfig(vocab_size=5, pe="sin_cos", compat=compat, **TINY)
    model, params, tokens = _init(config)
    a = model.apply(params, jax.random.PRNGKey(1), tokens, is_training=False)
    b = model.apply(params, jax.random.PRNGKey(2), tokens, is_training=False)
    assert (np.max(np.abs(np.asarray(a - b))) > 1e-6) == varies, compat
    if not varies:
      np.testing.assert_array_equal(a, model.apply(params, None, tokens, is_training=False))


@pytest.mark.parametrize("pe,compat,varies", [
    ("none", "release", False), ("rope", "release", False), ("sin_cos", "release", True),
    ("none", "paper", True), ("rope", "paper", True),
])
def test_embedding_dropout_only_after_additive_encodings_in_release_mode(pe, compat, varies,
                                                                        monkeypatch):
  # The first attention layer's input is the (dropped-out or not) embeddings.
  inputs = []
  call = model_lib.MultiHeadAttention.__call__

  def spy(self, x, *args, **kwargs):
    inputs.append(np.asarray(x))
    return call(self, x, *args, **kwargs)

  monkeypatch.setattr(model_lib.MultiHeadAttention, "__call__", spy)
  config = rpe.EncoderConfig(vocab_size=5, pe=pe, compat=compat, **{**TINY, "num_layers": 1})
  model, params, tokens = _init(config)
  for seed in (1, 2):
    model.apply(params, jax.random.PRNGKey(seed), tokens, is_training=True)
  assert (np.max(np.abs(inputs[-1] - inputs[-2])) > 1e-6) == varies


def test_key_mask_makes_padding_invisible():
  config = rpe.EncoderConfig(vocab_size=5, pe="randomized_relative", **TINY)
  model, params, tokens = _init(config, length=5)
  positions = config.sample_positions(jax.random.PRNGKey(9), 5)
  want = model.apply(params, None, tokens, positions)
  padded = jnp.concatenate([tokens, jnp.full((2, 3), 4)], axis=1)
  padded_pos = jnp.concatenate([positions, jnp.array([60, 61, 62])])
  mask = jnp.arange(8)[None, :] < 5
  got = model.apply(params, None, padded, padded_pos, key_mask=jnp.broadcast_to(mask, (2, 8)))
  np.testing.assert_allclose(got[:, :5], want, atol=1e-5)


def test_config_errors_list_valid_choices():
  with pytest.raises(ValueError, match="^model.pe: unknown positional encoding 'nope'; valid"):
    rpe.EncoderConfig(vocab_size=3, pe="nope")
  with pytest.raises(ValueError, match="^model.compat: .*valid choices: paper, release"):
    rpe.EncoderConfig(vocab_size=3, compat="both")
  with pytest.raises(ValueError, match="^training.positions: unknown position sampler 'grid'"):
    rpe.EncoderConfig(vocab_size=3, positions="grid")
  with pytest.raises(ValueError, match="^evaluation.positions: unknown position sampler 'grid'"):
    rpe.EncoderConfig(vocab_size=3, eval_positions="grid")


@pytest.mark.parametrize("fields,message", [
    (dict(vocab_size=0), "vocab_size must be an int >= 1, got 0"),
    (dict(num_layers=0), "model.num_layers must be an int >= 1, got 0"),
    (dict(num_heads=0), "model.num_heads must be an int >= 1, got 0"),
    (dict(num_heads=2.0), "model.num_heads must be an int >= 1, got 2.0"),
    (dict(d_model=0), "model.d_model must be an int >= 1, got 0"),
    (dict(d_model=30, num_heads=4), "model.d_model=30 must be divisible by model.num_heads=4"),
    (dict(d_model=12, num_heads=4), "model.d_model=12 and the head size 3 must be even"),
    (dict(widening_factor=0), "model.widening_factor must be an int >= 1, got 0"),
    (dict(dropout_rate=1.0), r"model.dropout_rate must be a number in \[0, 1\), got 1.0"),
    (dict(dropout_rate=-0.1), r"model.dropout_rate must be a number in \[0, 1\), got -0.1"),
    (dict(max_position=0), "model.max_position must be an int >= 1, got 0"),
    (dict(max_timescale=0.0), "model.max_timescale must be > 0, got 0.0"),
    (dict(emb_init_scale=-0.1), "model.emb_init_scale must be >= 0, got -0.1"),
    (dict(learned_init_scale=-1.0), "model.learned_init_scale must be >= 0, got -1.0"),
    (dict(log_n_scaling=1), "model.log_n_scaling must be a bool, got 1"),
    (dict(log_n_scale_bias="no"), "model.log_n_scale_bias must be a bool, got 'no'"),
    (dict(log_n_scaling=True), r"model.log_n_reference must be >= 2 with log_n_scaling on, "
                               r"got 0 \(0, the longest training sequence, is resolved"),
    (dict(log_n_scaling=True, log_n_reference=1),
     r"model.log_n_reference must be 0 or an int >= 2 \(log 1 = 0\), got 1"),
    (dict(log_n_reference=-3),
     r"model.log_n_reference must be 0 or an int >= 2 \(log 1 = 0\), got -3"),
    (dict(beta_max_length=-1), "model.beta_max_length must be an int >= 0, got -1"),
    (dict(beta_concentration=0.0), "model.beta_concentration must be > 0, got 0.0"),
    (dict(positions="equal_mean_beta"),
     r"training.positions: equal_mean_beta needs beta_max_length \(M, the longest evaluation "
     r"sequence\) >= 1, got 0"),
    (dict(attention_chunk_rows=0), "attention_chunk_rows must be >= 1 or None, got 0"),
])
def test_every_config_field_is_checked_with_a_one_line_message_naming_its_key(fields, message):
  with pytest.raises(ValueError, match="^" + message) as error:
    rpe.EncoderConfig(**{"vocab_size": 3, **fields})
  assert "\n" not in str(error.value)
  # The defaults (and the new settings off) are valid.
  rpe.EncoderConfig(vocab_size=3, log_n_scaling=True, log_n_reference=2, emb_init_scale=0.0)


@pytest.mark.parametrize("pe,compat", [
    ("sin_cos", "paper"), ("randomized_relative", "paper"), ("randomized_relative", "release"),
    ("relative", "release"), ("randomized_rope", "paper"), ("randomized_alibi", "paper"),
    ("randomized_alibi", "release"), ("randomized_learned", "paper"),
])
@pytest.mark.parametrize("pairwise", [True, False])
def test_num_outputs_equals_slicing_the_full_output(pe, compat, pairwise, monkeypatch):
  # The last layer computes only the last positions' queries: same values.
  # pairwise=False forces the relative encodings' table-free paths.
  if not pairwise:
    monkeypatch.setattr(model_lib.enc, "PAIRWISE_MAX_ELEMENTS", 0)
  config = rpe.EncoderConfig(vocab_size=5, pe=pe, compat=compat, dropout_rate=0.0, **TINY)
  model, params, tokens = _init(config, length=7)
  positions = config.sample_positions(jax.random.PRNGKey(5), 7)
  full = model.apply(params, None, tokens, positions)
  for n in (1, 3, 7):
    got = model.apply(params, None, tokens, positions, num_outputs=n)
    assert got.shape == (2, n, 3)
    np.testing.assert_allclose(got, full[:, 7 - n:], atol=1e-5)
  with pytest.raises(ValueError, match=r"num_outputs must be in \[1, 7\]"):
    model.apply(params, None, tokens, positions, num_outputs=8)


@pytest.mark.parametrize("pe", ["randomized_relative", "randomized_rope", "sin_cos"])
def test_attention_chunks_change_nothing(pe):
  # One batch row per attention chunk against the whole batch at once:
  # the same logits and the same parameter gradients.
  whole = rpe.EncoderConfig(vocab_size=5, pe=pe, dropout_rate=0.0, **TINY)
  chunked = dataclasses.replace(whole, attention_chunk_rows=1)
  model, params, _ = _init(whole, length=6)
  tokens = jax.random.randint(jax.random.PRNGKey(7), (3, 6), 0, 5)
  positions = whole.sample_positions(jax.random.PRNGKey(8), 6)
  target = jax.random.normal(jax.random.PRNGKey(9), (3, 6, 3))

  def loss(params, config):
    return jnp.vdot(rpe.make_encoder(config, 3).apply(params, None, tokens, positions), target)

  np.testing.assert_allclose(rpe.make_encoder(chunked, 3).apply(params, None, tokens, positions),
                             model.apply(params, None, tokens, positions), atol=1e-5)
  # Compiled whole: run op by op, the chunk loop's backward compiles some 200 programs.
  grad = jax.jit(jax.grad(loss), static_argnums=1)
  grads_whole, grads_chunked = grad(params, whole), grad(params, chunked)
  for a, b in zip(jax.tree_util.tree_leaves(grads_whole), jax.tree_util.tree_leaves(grads_chunked)):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-5)  # Gradients reach ~100.
  with pytest.raises(ValueError, match="attention_chunk_rows must be >= 1"):
    dataclasses.replace(whole, attention_chunk_rows=0)
