"""Ito et al. (2024)'s Transformer: parameter counts, initialisation, and the encodings' properties.

Forward passes run eagerly (no jit): one XLA program per operation, shared by every
model of the file, which costs far less on a slow CPU than compiling each model whole.
"""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tasks.latin_square import data
from randomized_pe import models
from randomized_pe.models import ito

# SPEC-EXTENSIONS B3: the original's parameter counts, measured by instantiating its code.
ORIGINAL_COUNTS = {
    "1d_fixed": 1_238_724, "2d_fixed": 1_238_724, "nope": 1_238_724, "randomized_2d": 1_238_724,
    "random": 1_238_724,  # Trainable; 10,240 more frozen (rnd2: 1,248,964 in all).
    "learn": 1_248_964, "relative": 1_145_924, "rope": 1_236_164, "c_nope": 1_236_164,
}
PAPER_ENCODINGS = ("1d_fixed", "2d_fixed", "learn", "random", "relative", "rope", "nope",
                   "c_nope")


@pytest.fixture(scope="module")
def tokens():
  puzzles = data.load().validation
  return jnp.asarray(puzzles.tokens[::27])  # [4, 16], one or two per condition.


def _model(pe, **settings):
  return ito.ItoModel(ito.ItoConfig(pe=pe, **settings), 4)


_PARAMS = {}


def _init(pe, tokens, seed=0, **settings):
  """(model, params), initialised once per setting for the whole file (eagerly)."""
  key = (pe, seed, tuple(sorted(settings.items())))
  if key not in _PARAMS:
    model = _model(pe, **settings)
    _PARAMS[key] = model, model.init(jax.random.PRNGKey(seed), tokens)
  return _PARAMS[key]


def test_registry_holds_every_encoding_of_the_paper():
  assert set(PAPER_ENCODINGS) < set(ito.names())
  assert "randomized_2d" in ito.names()
  with pytest.raises(ValueError, match="unknown Ito encoding 'alibi'.*2d_fixed"):
    ito.ItoConfig(pe="alibi")


@pytest.mark.parametrize("pe", sorted(ORIGINAL_COUNTS))
def test_parameter_counts_equal_the_originals(pe, tokens):
  model = _model(pe)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens)
  mask = model.frozen_mask(shapes)
  assert ito.parameter_count(shapes, mask) == ORIGINAL_COUNTS[pe]
  frozen = 4 * 16 * 160 if pe == "random" else 0
  assert ito.parameter_count(shapes, mask, trainable_only=False) == ORIGINAL_COUNTS[pe] + frozen


def test_bidirectional_relative_has_a_table_of_every_distance(tokens):
  model = _model("relative", relative_causal=False)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens)
  # 31 distances (-15..15) instead of the causal 16, in each of the 4 blocks.
  assert ito.parameter_count(shapes) == ORIGINAL_COUNTS["relative"] + 4 * 15 * 160


def test_built_through_the_model_registry():
  model_config = ml_collections.ConfigDict({"name": "ito", "pe": "learn", "pe_sigma": 0.2})
  model = models.build(model_config, data.VOCAB_SIZE, data.NUM_SHAPES, models.RunSpec())
  assert isinstance(model, ito.ItoModel)
  assert (model.config.pe, model.config.pe_sigma, model.config.d_model) == ("learn", 0.2, 160)
  assert model.description == "Ito et al. 2024 Transformer, encoding learn, σ=0.2"
  model.check_sequence_length(16)
  with pytest.raises(ValueError, match="exactly 16 tokens"):
    model.check_sequence_length(17, "input plus output")


def _cosine(a, b):
  a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
  return a @ b / np.linalg.norm(a) / np.linalg.norm(b)


def test_1d_and_2d_fixed_cosine_is_the_papers_072():
  one = _model("1d_fixed").position_terms({})[0]  # [16, 160]
  two = _model("2d_fixed").position_terms({})[0]
  assert one.shape == two.shape == (16, 160)
  # The paper (Ito L115) says 0.72; the original code's matrices give 0.7246. Other
  # readings give 0.7102 (rows first), 0.7125 (d_model in the exponent), 0.678 (1-based).
  assert _cosine(one, two) == pytest.approx(0.7246, abs=5e-4)


def test_fixed_encodings_closed_form():
  t = np.arange(16)
  col, row = t % 4, t // 4
  one = np.asarray(ito.raster_sinusoid(jnp.arange(16), 160), np.float64)
  w = 10_000.0 ** (-np.arange(0, 160, 2) / 160)
  np.testing.assert_allclose(one[:, 0::2], np.sin(t[:, None] * w), atol=1e-6)
  np.testing.assert_allclose(one[:, 1::2], np.cos(t[:, None] * w), atol=1e-6)
  two = np.asarray(_model("2d_fixed").position_terms({})[0], np.float64)
  w = 10_000.0 ** (-np.arange(0, 80, 2) / 80)  # Frequencies over the half (80), as the code.
  np.testing.assert_allclose(two[:, 0:80:2], np.sin(col[:, None] * w), atol=1e-6)
  np.testing.assert_allclose(two[:, 1:80:2], np.cos(col[:, None] * w), atol=1e-6)
  np.testing.assert_allclose(two[:, 80::2], np.sin(row[:, None] * w), atol=1e-6)
  np.testing.assert_allclose(two[:, 81::2], np.cos(row[:, None] * w), atol=1e-6)


@pytest.mark.parametrize("sigma", [0.2, 2.0])
def test_learned_encoding_initial_spread_is_sigma(sigma, tokens):
  model, params = _init("learn", tokens, pe_sigma=sigma)
  tables = model.position_terms(params)  # [4, 16, 160], one per block
  assert tables.shape == (4, 16, 160)
  values = np.asarray(tables, np.float64) / sigma
  # 10,240 draws: the SD estimate has a relative standard error of 0.7%.
  assert values.std() == pytest.approx(1.0, abs=0.03)
  assert abs(values.mean()) < 0.03
  for block in values:
    assert block.std() == pytest.approx(1.0, abs=0.05)
  # Not truncated: about 4.6% of N(0, 1) draws lie beyond 2 (none after truncation at 2).
  assert 0.03 < np.mean(np.abs(values) > 2.0) < 0.065
  assert np.abs(values).max() > 3.0
  # Four independent matrices, not one shared.
  assert abs(_cosine(values[0], values[1])) < 0.05


def test_pytorch_default_initialisation(tokens):
  """The scale σ is relative to: token embedding U(±1/sqrt(5)), MHA as torch's."""
  _, params = _init("learn", tokens, pe_sigma=0.2)
  embed = np.asarray(params["ito/embed"]["w"])
  bound = 1 / np.sqrt(5)
  assert np.abs(embed).max() <= bound and np.abs(embed).max() > 0.95 * bound
  assert embed.std() == pytest.approx(bound / np.sqrt(3), rel=0.1)  # Uniform's SD.
  qkv = params["ito/block_0/attention/qkv"]
  assert np.abs(qkv["w"]).max() <= np.sqrt(6 / 640) and np.abs(qkv["w"]).max() > 0.095
  np.testing.assert_array_equal(qkv["b"], 0.0)
  np.testing.assert_array_equal(params["ito/block_0/attention/output"]["b"], 0.0)
  assert np.abs(params["ito/block_0/mlp_out"]["w"]).max() <= 1 / np.sqrt(640)
  np.testing.assert_array_equal(params["ito/block_0/mlp_norm"]["scale"], 1.0)


def test_random_encoding_is_frozen_standard_normal(tokens):
  model, params = _init("random", tokens)
  tables = np.asarray(model.position_terms(params))
  assert tables.std() == pytest.approx(1.0, abs=0.03)
  assert abs(_cosine(tables[0], tables[1])) < 0.05  # One draw per block.
  mask = model.frozen_mask(params)
  assert sum(jax.tree_util.tree_leaves(mask)) == 4
  assert all(mask[f"ito/block_{i}"]["table"] for i in range(4))
  targets = jnp.arange(4)

  def loss(p):
    logits = model.classify(p, None, tokens)
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(4), targets])

  grads = jax.grad(loss)(params)
  for i in range(4):
    np.testing.assert_array_equal(grads[f"ito/block_{i}"]["table"], 0.0)
  assert np.abs(grads["ito/embed"]["w"]).max() > 0  # The rest is trained.


def test_nope_is_invariant_to_permuting_cells_0_to_14(tokens):
  model, params = _init("nope", tokens)
  order = np.random.default_rng(0).permutation(15)
  permuted = jnp.concatenate([tokens[:, order], tokens[:, 15:]], axis=1)
  assert not np.array_equal(permuted, tokens)
  base = model.classify(params, None, tokens)
  np.testing.assert_allclose(model.classify(params, None, permuted), base, atol=1e-5)


def _change_cells_after(tokens, cell):
  """The same puzzles with every cell after `cell` changed."""
  later = jnp.arange(16) > cell
  return jnp.where(later[None], (tokens + 1) % 6, tokens)


@pytest.mark.parametrize("pe", ["relative", "c_nope"])
def test_causal_variants_ignore_later_cells(pe, tokens):
  model, params = _init(pe, tokens)
  base = model.apply(params, None, tokens)  # [4, 16, 4]
  for cell in (4, 11):
    changed = model.apply(params, None, _change_cells_after(tokens, cell))
    np.testing.assert_allclose(changed[:, :cell + 1], base[:, :cell + 1], atol=1e-5)
    assert np.abs(changed[:, cell + 1:] - base[:, cell + 1:]).max() > 1e-3


def test_bidirectional_attention_sees_later_cells(tokens):
  # The same check fails for a bidirectional model: it can tell the causal ones apart.
  model, params = _init("nope", tokens)
  base = model.apply(params, None, tokens)
  changed = model.apply(params, None, _change_cells_after(tokens, 11))
  assert np.abs(changed[:, :12] - base[:, :12]).max() > 1e-3


def test_c_nope_logit_sharpening_is_an_option(tokens):
  model, params = _init("c_nope", tokens)
  sharp = np.asarray(model.attention_weights(params, None, tokens), np.float64)  # [4, B, 1, T, T]
  plain = np.asarray(_model("c_nope", c_nope_logit_scale=1.0).attention_weights(
      params, None, tokens), np.float64)
  np.testing.assert_array_equal(np.triu(sharp[:, :, 0], 1), 0.0)  # Causal.
  np.testing.assert_array_equal(np.triu(plain[:, :, 0], 1), 0.0)
  # Block 0 sees the same input in both: softmax(100 l) against softmax(l), so log-weight
  # differences are 100 times larger wherever the sharp weights have not underflowed.
  log_plain = np.log(np.where(plain[0] > 0, plain[0], 1.0))
  log_plain -= np.log(plain[0].max(-1, keepdims=True))
  kept = sharp[0] > 1e-6
  log_sharp = np.log(np.where(kept, sharp[0], 1.0)) - np.log(sharp[0].max(-1, keepdims=True))
  np.testing.assert_allclose(log_sharp[kept], 100 * log_plain[kept], atol=1e-2)
  assert sharp.max(-1).mean() > plain.max(-1).mean() + 0.3


def test_rope_logits_depend_only_on_position_differences():
  config = ito.ItoConfig(pe="rope")
  key_q, key_k = jax.random.split(jax.random.PRNGKey(1))
  q = jax.random.normal(key_q, (2, 16, 1, 160))
  k = jax.random.normal(key_k, (2, 16, 1, 160))
  score = lambda positions, q, k: ito.get("rope").scorer(positions, {}, config)(q, k)
  base = score(jnp.arange(16), q, k)  # [2, 1, 16, 16]
  for shift in (3, 1000):
    np.testing.assert_allclose(score(jnp.arange(16) + shift, q, k), base, atol=1e-4)
  # The same query and key at every cell: the logits are a function of j - i alone.
  repeat = lambda x: jnp.broadcast_to(x[:, :1], x.shape)
  same = score(jnp.arange(16), repeat(q), repeat(k))
  np.testing.assert_allclose(same[..., 1:, 1:], same[..., :-1, :-1], atol=1e-4)
  assert np.ptp(np.asarray(same[0, 0, 0])) > 1e-2  # And it does depend on j - i.
  # Every feature pair rotates (RoPE over the whole head, not a part of it).
  rotated = ito.enc.apply_rope(q, jnp.ones((16,), jnp.int32))
  assert np.all(np.abs(np.asarray(rotated - q)).reshape(2, 16, 80, 2).max(axis=(0, 1, 3)) > 0)


def test_rope_model_is_invariant_to_shifting_positions(tokens):
  model, params = _init("rope", tokens)
  base = model.apply(params, None, tokens)
  shifted = model.apply(params, None, tokens, jnp.arange(16) + 5)
  np.testing.assert_allclose(shifted, base, atol=1e-4)


def test_fixed_encoding_dropout_in_training_only_by_default(tokens):
  model, params = _init("2d_fixed", tokens)
  key1, key2 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
  evaluation = model.apply(params, key1, tokens)
  np.testing.assert_array_equal(model.apply(params, key2, tokens), evaluation)
  training = model.apply(params, key1, tokens, is_training=True)
  assert np.abs(training - evaluation).max() > 1e-3
  assert np.abs(model.apply(params, key2, tokens, is_training=True) - training).max() > 1e-3
  # The original's behaviour: dropout at evaluation too (it never called model.eval()).
  original = _model("2d_fixed", dropout_at_evaluation=True)
  np.testing.assert_array_equal(original.apply(params, key1, tokens), training)
  # Off: training is deterministic.
  off = _model("2d_fixed", fixed_pe_dropout=0.0)
  np.testing.assert_array_equal(off.apply(params, key1, tokens, is_training=True), evaluation)


def test_learned_encodings_have_no_dropout(tokens):
  model, params = _init("learn", tokens, pe_sigma=0.2)
  np.testing.assert_array_equal(model.apply(params, jax.random.PRNGKey(1), tokens,
                                            is_training=True), model.apply(params, None, tokens))


def test_readout_is_the_last_cell(tokens):
  model, params = _init("nope", tokens)
  full = model.apply(params, None, tokens)  # [4, 16, 4]
  np.testing.assert_array_equal(model.apply(params, None, tokens, num_outputs=1), full[:, 15:])
  np.testing.assert_array_equal(model.classify(params, None, tokens), full[:, 15])
  np.testing.assert_array_equal(
      model.apply(params, None, tokens, num_outputs=2, outputs_from=3), full[:, 3:5])


def test_randomized_grid_positions():
  model = _model("randomized_2d", max_position=16)
  draws = [np.asarray(model.sample_positions(jax.random.PRNGKey(s), 16)) for s in range(20)]
  for grid in draws:
    assert grid.shape == (16, 2)
    columns, rows = grid[:4, 0], grid[::4, 1]
    for axis in (columns, rows):
      assert np.all(np.diff(axis) > 0) and axis.min() >= 0 and axis.max() < 16
    # Every cell of a row shares the row's position; of a column, the column's.
    np.testing.assert_array_equal(grid[:, 0], np.tile(columns, 4))
    np.testing.assert_array_equal(grid[:, 1], np.repeat(rows, 4))
  assert any(not np.array_equal(g[:4, 0], g[::4, 1]) for g in draws)  # Drawn apart.
  assert len({g.tobytes() for g in draws}) > 10
  # Evaluation: random by default (as training); evenly spaced floor(k L / 4) on request.
  assert not np.array_equal(model.sample_positions(jax.random.PRNGKey(0), 16, evaluation=True),
                            model.sample_positions(jax.random.PRNGKey(1), 16, evaluation=True))
  even = _model("randomized_2d", max_position=16, eval_positions="evenly_spaced")
  grid = np.asarray(even.sample_positions(jax.random.PRNGKey(0), 16, evaluation=True))
  np.testing.assert_array_equal(grid[:4, 0], [0, 4, 8, 12])
  np.testing.assert_array_equal(grid[::4, 1], [0, 4, 8, 12])
  # 2d_fixed is the same term at positions 0..3 per axis.
  fixed = np.asarray(_model("2d_fixed").sample_positions(jax.random.PRNGKey(0), 16))
  np.testing.assert_array_equal(fixed, np.stack([np.arange(16) % 4, np.arange(16) // 4], -1))


def test_randomized_grid_term_is_the_2d_sinusoid_at_its_positions(tokens):
  model = _model("randomized_2d")
  grid = model.sample_positions(jax.random.PRNGKey(3), 16)
  terms = model.position_terms({}, grid)  # [4, 16, 160]
  np.testing.assert_allclose(terms[0], ito.grid_sinusoid(grid, 160), atol=0)
  np.testing.assert_allclose(_model("2d_fixed").position_terms({})[0],
                             ito.grid_sinusoid(model.config.default_positions(), 160), atol=0)


@pytest.mark.parametrize("settings,words", [
    (dict(pe="learn", positions="randomized"), "positions 0..T-1 only"),
    (dict(pe="randomized_2d", max_position=3), "max_position=3"),
    (dict(pe="learn", pe_sigma=0.0), "pe_sigma"),
    (dict(pe="2d_fixed", fixed_pe_dropout=1.0), "fixed_pe_dropout"),
    (dict(pe="2d_fixed", d_model=162), "divisible by 4"),
])
def test_bad_settings_give_one_line_errors(settings, words):
  with pytest.raises(ValueError, match=words) as info:
    ito.ItoConfig(**settings)
  assert "\n" not in str(info.value)


def test_wrong_length_or_positions_are_refused(tokens):
  model, params = _init("2d_fixed", tokens)
  with pytest.raises(ValueError, match="reads 16 cells"):
    model.apply(params, None, tokens[:, :15])
  with pytest.raises(ValueError, match=r"shape \[16, 2\]"):
    model.apply(params, None, tokens, jnp.arange(16))
  with pytest.raises(ValueError, match="no padding"):
    model.sample_positions(None, 16, padded_length=20)
