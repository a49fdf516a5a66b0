"""Su Jianlin's position robustness (docs/su.md): log-n attention scaling, equal-mean float
positions, evenly spaced test positions.

Models are tiny (1 layer, d_model 16) and most inputs have one shape, T = 6 (8 when padded),
so that the eager op-by-op runs reuse their compiled programs.
"""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import randomized_pe as rpe
import tasks
from experiments.training import data
from experiments.training import steps
from experiments.training import validation
from randomized_pe import attention as attn_lib
from randomized_pe import samplers
from tests.test_training import tiny_config

TINY = dict(vocab_size=5, num_layers=1, num_heads=2, d_model=16, widening_factor=2,
            max_position=64, dropout_rate=0.0)
FAMILIES = ("none", "sin_cos", "learned", "relative", "rope", "alibi")
FUNCTIONAL = ("sin_cos", "relative", "rope", "alibi")  # Take float positions.
LENGTH = 6


def _tokens(length=LENGTH, rows=2, seed=100):
  return jax.random.randint(jax.random.PRNGKey(seed), (rows, length), 0, TINY["vocab_size"])


def _model(config):
  model = rpe.make_encoder(config, 3)
  return model, model.init(jax.random.PRNGKey(0), _tokens())


@pytest.fixture
def captured_logits(monkeypatch):
  """The logits every attention call hands to the softmax, in call order (eager runs)."""
  seen = []
  softmax_attend = attn_lib.softmax_attend

  def spy(logits, v, key_mask=None):
    seen.append(np.asarray(logits))
    return softmax_attend(logits, v, key_mask)

  monkeypatch.setattr(attn_lib, "softmax_attend", spy)
  return seen


# --------------------------------------------------------------------------
# log-n scaling.


def test_log_n_scale_is_exactly_one_at_the_reference_and_the_log_ratio_elsewhere():
  for m in (2, 6, 40, 81):
    n = np.array([1, 2, 3, m, 2 * m, 500])
    got = np.asarray(attn_lib.log_n_scale(jnp.asarray(n), m))
    assert got[3] == 1.0  # Exactly.
    np.testing.assert_allclose(got, np.log(n) / np.log(m), rtol=1e-6, atol=1e-7)
  # No keys at all (a fully masked row) counts as one key: 0, not -inf.
  assert abs(float(attn_lib.log_n_scale(jnp.array([0]), 6)[0])) < 1e-7
  for m in (0, 1):
    with pytest.raises(ValueError, match=r"reference length must be an int >= 2 \(log 1 = 0\)"):
      attn_lib.log_n_scale(jnp.array([3]), m)


@pytest.mark.parametrize("family", FAMILIES)
def test_log_n_multiplies_the_logits_by_log_n_over_log_m(family, captured_logits):
  off = rpe.EncoderConfig(pe=family, **TINY)
  model, params = _model(off)
  tokens = _tokens()
  want = model.apply(params, None, tokens)
  off_logits = captured_logits[-1]  # [B, H, T, T] of the one layer.
  bias = np.zeros_like(off_logits[0])
  if off.family.bias is not None:  # ALiBi: the bias is scaled only on request.
    q_shape = (2, LENGTH, off.num_heads, off.head_size)
    bias = np.asarray(off.family.bias(jnp.arange(LENGTH), {}, off.context, q_shape, 0))
  for m, scale_bias in [(LENGTH, False), (3, False), (40, False), (3, True)]:
    on = dataclasses.replace(off, log_n_scaling=True, log_n_reference=m,
                             log_n_scale_bias=scale_bias)
    got = rpe.make_encoder(on, 3).apply(params, None, tokens)
    on_logits = captured_logits[-1]
    factor = math.log(LENGTH) / math.log(m)
    if m == LENGTH:  # A factor of exactly 1: the very same logits and outputs.
      np.testing.assert_array_equal(on_logits, off_logits)
      np.testing.assert_array_equal(got, want)
      continue
    if scale_bias:
      np.testing.assert_allclose(on_logits, factor * off_logits, rtol=1e-6, atol=1e-6)
    else:
      np.testing.assert_allclose(on_logits - bias, factor * (off_logits - bias),
                                 rtol=1e-6, atol=1e-6)
    assert np.max(np.abs(np.asarray(got - want))) > 1e-4  # The scaling reaches the output.
  if family == "alibi":  # The bias is large enough for scaling it or not to be told apart.
    assert np.max(np.abs(bias)) > 0.1


@pytest.mark.parametrize("family", ["relative", "rope", "alibi", "sin_cos"])
def test_padded_evaluation_with_log_n_equals_per_length_evaluation(family):
  # Two sequences of 4 and 6 true tokens in one batch padded to 8: each row's factor
  # comes from its own key count, as when the row is evaluated alone at its length.
  config = rpe.EncoderConfig(pe="randomized_" + family, log_n_scaling=True,
                             log_n_reference=3, **TINY)
  model, params = _model(config)
  padded = _tokens(length=8)
  positions = config.sample_positions(jax.random.PRNGKey(4), 6, padded_length=8)
  lengths = np.array([4, 6])
  key_mask = jnp.arange(8)[None, :] < lengths[:, None]
  got = model.apply(params, None, padded, positions, key_mask=key_mask)
  for row, n in enumerate(lengths):
    alone = model.apply(params, None, padded[row:row + 1, :n], positions[:n])
    np.testing.assert_allclose(got[row, :n], alone[0], rtol=0, atol=1e-6)


def test_log_n_off_is_bit_identical_whatever_its_other_settings():
  # With scaling off, the reference and the bias option are never read: the same bits
  # whatever their values. (That the off path is bit for bit the code before the option,
  # outputs and gradients, was checked against that commit when it was added; a factor of
  # exactly 1 giving the same bits is tested above.)
  for family in ("relative", "alibi"):
    plain = rpe.EncoderConfig(pe=family, **TINY)
    model, params = _model(plain)
    tokens = _tokens()
    want = jax.jit(model.apply)(params, None, tokens)
    for extra in (dict(log_n_reference=7), dict(log_n_scale_bias=True)):
      other = rpe.make_encoder(dataclasses.replace(plain, **extra), 3)
      np.testing.assert_array_equal(jax.jit(other.apply)(params, None, tokens), want)


def test_the_run_config_resolves_the_reference_to_the_longest_training_sequence():
  config = tiny_config()
  config.model.log_n_scaling = True
  task = tasks.get(config.task)
  model = steps.build_model(config, task)
  assert model.config.log_n_reference == data.sequence_length(task, config.training.max_length)
  assert model.config.beta_max_length == data.sequence_length(task, config.evaluation.max_length)
  assert config.model.log_n_reference == 0 and config.model.beta_max_length == 0  # Unchanged.
  config.model.log_n_reference = 5
  assert steps.build_model(config, task).config.log_n_reference == 5
  config.model.log_n_reference = 1
  with pytest.raises(ValueError, match=r"^model.log_n_reference must be 0 or an int >= 2 "
                                       r"\(log 1 = 0\), got 1$"):
    validation.validate(config)


# --------------------------------------------------------------------------
# Equal-mean float positions.

EQUAL_MEAN = {"equal_mean_exponential": {},
              "equal_mean_beta": {"beta_max_length": 500, "beta_concentration": 1.0}}


@pytest.mark.parametrize("name", EQUAL_MEAN)
def test_equal_mean_draws_are_sorted_floats_from_zero(name):
  sampler = samplers.get(name)
  assert sampler.floats and sampler.random and sampler.evaluation == "linspace"
  for length in (1, 2, 7, 40):
    for seed in range(3):
      p = np.asarray(sampler(jax.random.PRNGKey(seed), length, 64, **EQUAL_MEAN[name]))
      assert p.dtype == np.float32 and p.shape == (length,)
      assert p[0] == 0.0 and np.all(np.isfinite(p))
      assert np.all(np.diff(p) >= 0)
      # Evenly spaced over [0, s]: Su's linspace(0, 1, T) * s, s the last position.
      np.testing.assert_allclose(p, np.linspace(0, 1, length) * p[-1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name,length,tolerance", [
    # Exp(mean 40) has std 40: the mean of 40,000 spans has std 0.2; tolerance 1.0 (5 std).
    ("equal_mean_exponential", 40, 1.0),
    # M = 500, a + b = 1: the span's std is 500 sqrt(0.08 * 0.92 / 2) = 95.9, the mean's
    # 0.48; tolerance 2.0 (4 std).
    ("equal_mean_beta", 40, 2.0),
])
def test_the_mean_span_equals_the_length(name, length, tolerance):
  sampler = samplers.get(name)
  keys = jax.random.split(jax.random.PRNGKey(0), 40_000)
  spans = np.asarray(jax.vmap(lambda k: sampler(k, length, 64, **EQUAL_MEAN[name])[-1])(keys))
  assert abs(spans.mean() - length) < tolerance, spans.mean()
  assert spans.max() > 3 * length  # Really spread: single draws reach far beyond T.
  if name == "equal_mean_beta":
    assert spans.max() <= 500  # Never beyond M.


def test_beta_reaches_the_test_length_at_its_end_and_refuses_beyond():
  beta = samplers.get("equal_mean_beta")
  # T = M: the mean fraction is 1, Beta(a, 0) is the point 1: the span is M.
  np.testing.assert_allclose(beta(jax.random.PRNGKey(0), 20, 64, beta_max_length=20)[-1], 20.0,
                             rtol=1e-6)
  with pytest.raises(ValueError, match="mean length=21 > beta_max_length=20"):
    beta(jax.random.PRNGKey(0), 21, 64, beta_max_length=20)
  with pytest.raises(ValueError, match="has no setting beta_length"):
    beta(jax.random.PRNGKey(0), 2, 64, beta_length=20)


@pytest.mark.parametrize("name", EQUAL_MEAN)
def test_equal_mean_draws_are_deterministic_under_a_key(name):
  sampler = samplers.get(name)
  a = sampler(jax.random.PRNGKey(5), 12, 64, **EQUAL_MEAN[name])
  np.testing.assert_array_equal(a, sampler(jax.random.PRNGKey(5), 12, 64, **EQUAL_MEAN[name]))
  assert not np.array_equal(a, sampler(jax.random.PRNGKey(6), 12, 64, **EQUAL_MEAN[name]))


@pytest.mark.parametrize("name", EQUAL_MEAN)
def test_evaluation_positions_are_the_mean_draw(name):
  config = rpe.EncoderConfig(pe="rope", positions=name, beta_max_length=500, **TINY)
  assert config.eval_sampler.name == "linspace"
  for length in (1, 2, 6, 500):
    got = np.asarray(config.sample_positions(None, length, evaluation=True))
    np.testing.assert_allclose(got, np.linspace(0, 1, length) * length, rtol=1e-6, atol=0)
  # Padded (one program for every length): the prefix is the unpadded evaluation draw.
  padded = jax.jit(lambda n: config.sample_positions(None, n, padded_length=8, evaluation=True))
  np.testing.assert_array_equal(padded(5)[:5], config.sample_positions(None, 5, evaluation=True))
  # Training draws come from the configured sampler with the model's settings.
  key = jax.random.PRNGKey(2)
  np.testing.assert_array_equal(config.sample_positions(key, 9),
                                samplers.get(name)(key, 9, 64, **EQUAL_MEAN[name]))


@pytest.mark.parametrize("pe", ["learned", "randomized_learned"])
@pytest.mark.parametrize("where", ["positions", "eval_positions"])
def test_learned_tables_refuse_float_positions_naming_the_families_that_take_them(pe, where):
  for name in ("equal_mean_exponential", "equal_mean_beta", "linspace"):
    with pytest.raises(ValueError) as error:
      rpe.EncoderConfig(pe=pe, beta_max_length=100, **{where: name}, **TINY)
    message = str(error.value)
    assert "\n" not in message
    assert f"sampler {name!r} gives float positions" in message
    assert message.endswith(
        "families that take floats: none, sin_cos, relative, rope, alibi, geometric")


def test_a_run_config_with_a_learned_table_and_float_positions_fails_before_compiling():
  config = tiny_config()
  config.model.pe = "randomized_learned"
  config.training.positions = "equal_mean_beta"
  with pytest.raises(ValueError, match="training.positions: sampler 'equal_mean_beta' gives "
                                       "float positions"):
    validation.validate(config)
  config.model.pe = "randomized_rope"  # A functional family takes them; M from the task.
  validation.validate(config)
  model = steps.build_model(config, tasks.get(config.task))
  assert model.config.beta_max_length == data.sequence_length(tasks.get(config.task), 6)


@pytest.mark.parametrize("family", FUNCTIONAL)
def test_float_positions_give_finite_logits(family, captured_logits):
  config = rpe.EncoderConfig(pe=family, positions="equal_mean_exponential", **TINY)
  model, params = _model(config)
  positions = config.sample_positions(jax.random.PRNGKey(3), LENGTH)
  assert positions.dtype == jnp.float32 and np.any(np.asarray(positions) % 1 != 0)
  out = model.apply(params, None, _tokens(), positions)
  assert np.all(np.isfinite(captured_logits[-1])) and np.all(np.isfinite(np.asarray(out)))


@pytest.mark.parametrize("family,invariant", [
    ("relative", True), ("rope", True), ("alibi", True), ("sin_cos", False)])
def test_float_positions_enter_relative_and_rope_only_through_differences(family, invariant,
                                                                          captured_logits):
  # Shifting all positions by 100.25 (exact in float32) changes the float32 differences by
  # at most a rounding of positions near 130 (ulp 1.5e-5); the logits (size ~1) then move
  # by less than 1e-4. sin/cos, an absolute encoding, serves as the control.
  config = rpe.EncoderConfig(pe=family, positions="equal_mean_exponential", **TINY)
  model, params = _model(config)
  positions = config.sample_positions(jax.random.PRNGKey(3), LENGTH)
  tokens = _tokens()
  model.apply(params, None, tokens, positions)
  logits = captured_logits[-1]
  model.apply(params, None, tokens, positions + 100.25)
  moved = np.max(np.abs(captured_logits[-1] - logits))
  assert (moved < 1e-4) == invariant, moved
  if not invariant:
    assert moved > 1e-2


# --------------------------------------------------------------------------
# Evenly spaced test positions.


def test_evenly_spaced_is_su_example_exactly():
  # L = 2048, l = 512: [0, 4, 8, ..., 2044] (Su-zh L50), floor(k L / l) for k < l.
  want = np.arange(0, 2048, 4)
  assert want[-1] == 2044 and len(want) == 512
  got = samplers.get("evenly_spaced")(None, 512, 2048)
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, want)
  # One program for every length (traced length, padded): the same prefix.
  padded = jax.jit(lambda n: samplers.evenly_spaced(None, n, 2048, padded_length=520))(512)
  np.testing.assert_array_equal(padded[:512], want)
  # Where l does not divide L, the floor: L = 10, l = 4 gives 0, 2.5, 5, 7.5 floored.
  np.testing.assert_array_equal(samplers.evenly_spaced(None, 4, 10), [0, 2, 5, 7])
