"""The two models share their layers and their encodings' computations (issue #30, item 3).

Parameter creation, layer norm, dropout and the initialisers are defined once
(`randomized_pe.models.layers`); neither model file builds its own.
"""
import pathlib
import re

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from randomized_pe import families
from randomized_pe.models import encoder as encoder_lib
from randomized_pe.models import ito
from randomized_pe.models import layers

MODELS = pathlib.Path(encoder_lib.__file__).parent


@pytest.mark.parametrize("model", ["encoder.py", "ito.py"])
def test_models_do_not_repeat_the_shared_layers(model):
  source = (MODELS / model).read_text()
  for pattern, what in [(r"hk\.LayerNorm\(", "layer norm"),
                        (r"random\.bernoulli\(", "dropout"),
                        (r"spec\.init\(", "parameter creation from ParamSpecs"),
                        (r"def (torch_uniform|xavier_uniform|normal|zeros)\(", "initialisers"),
                        (r"jax\.nn\.softmax\(", "softmax (randomized_pe.attention has it)")]:
    assert not re.search(pattern, source), f"{model} defines its own {what}: use layers.py"


def test_both_models_create_parameters_with_the_shared_function(monkeypatch):
  assert encoder_lib._get_params is layers.get_params
  created, original = [], layers.get_params

  def spy(specs):
    created.append(tuple(specs))
    return original(specs)

  monkeypatch.setattr(layers, "get_params", spy)
  for pe in ("relative", "learn"):
    model = ito.ItoModel(ito.ItoConfig(pe=pe, d_model=16, mlp_size=32, num_layers=1), 4)
    model.init(jax.random.PRNGKey(0), jnp.zeros((1, 16), jnp.int32))
  assert ("distance_table",) in created and ("table",) in created


def test_layer_norm_is_torchs_and_haikus():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 8)) * 3 + 1
  f = hk.transform(lambda x: layers.layer_norm(x, "norm"))
  params = f.init(None, x)
  mean = x.mean(-1, keepdims=True)
  want = (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(f.apply(params, None, x), want, atol=1e-5)
  assert {k: v.shape for k, v in params["norm"].items()} == {"scale": (8,), "offset": (8,)}


@pytest.mark.parametrize("position_major", [False, True])
def test_dropout_keeps_and_rescales(position_major):
  x = jnp.ones((4, 50, 20))
  out = np.asarray(layers.dropout(x, 0.25, position_major=position_major,
                                  key=jax.random.PRNGKey(3)))
  assert set(np.unique(out)) <= {0.0, np.float32(1.0) / np.float32(0.75)}
  assert abs((out == 0).mean() - 0.25) < 0.03


def test_position_major_dropout_of_a_prefix_is_the_prefix_of_the_dropout():
  # The encoder's padded batches drop what the unpadded ones drop.
  key = jax.random.PRNGKey(5)
  x = jax.random.normal(jax.random.PRNGKey(1), (3, 12, 8))
  long = layers.dropout(x, 0.5, position_major=True, key=key)
  short = layers.dropout(x[:, :7], 0.5, position_major=True, key=key)
  np.testing.assert_array_equal(long[:, :7], short)


def test_dropout_drawn_for_more_positions_keeps_the_bits_of_its_own_draw():
  key = jax.random.PRNGKey(7)
  x = jax.random.normal(jax.random.PRNGKey(1), (3, 5, 8))
  np.testing.assert_array_equal(
      layers.dropout(x, 0.3, position_major=True, positions=13, key=key),
      layers.dropout(x, 0.3, position_major=True, key=key))
  with pytest.raises(ValueError, match="at least"):
    layers.dropout(x, 0.3, position_major=True, positions=4, key=key)


@pytest.mark.parametrize("reserved", [0, 2, 5])
def test_keys_split_in_one_loop_are_the_keys_of_as_many_next_rng_key_calls(reserved):
  def draw(in_order):
    if reserved:
      hk.reserve_rng_keys(reserved)  # Keys Haiku has split already come first.
    first = hk.next_rng_key()
    keys = (layers.next_rng_keys_in_order(4) if in_order
            else [hk.next_rng_key() for _ in range(4)])
    return jnp.stack([first, *keys, hk.next_rng_key(), hk.next_rng_key()])

  key = jax.random.PRNGKey(11)
  want = hk.transform(lambda: draw(False)).apply({}, key)
  got = hk.transform(lambda: draw(True)).apply({}, key)
  np.testing.assert_array_equal(got, want)
  assert len(np.unique(np.asarray(want), axis=0)) == 7


@pytest.mark.parametrize("pe,compat", [("randomized_relative", "paper"), ("rope", "release"),
                                       ("sin_cos", "release")])
def test_encoder_dropout_equals_one_draw_per_call(pe, compat, monkeypatch):
  # The encoder splits its dropout keys in one loop and draws the last layer's masks
  # at full length: the same bits as a key from Haiku and a mask of its own shape for
  # every dropout (the encoder before; parameters at init, where dropout runs in
  # release mode, too).
  config = encoder_lib.EncoderConfig(pe=pe, compat=compat, num_layers=2, d_model=16,
                                     num_heads=2, vocab_size=5)
  model = encoder_lib.EncoderModel(config, 4)
  tokens = jax.random.randint(jax.random.PRNGKey(0), (3, 10), 0, 5)

  def run():
    params = model.init(jax.random.PRNGKey(1), tokens)
    def loss(p):
      out = model.apply(p, jax.random.PRNGKey(2), tokens, is_training=True, num_outputs=4)
      return jnp.sum(out ** 2), out
    (_, out), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return params, out, grads

  got = run()
  dropout = layers.dropout
  monkeypatch.setattr(layers, "next_rng_keys_in_order",
                      lambda n: [hk.next_rng_key() for _ in range(n)])
  monkeypatch.setattr(layers, "dropout", lambda x, rate, positions=None, **kw:
                      dropout(x, rate, **kw))
  want = run()
  jax.tree_util.tree_map(np.testing.assert_array_equal, got, want)


def test_torch_initialisers_bounds():
  w = layers.torch_uniform(160)(jax.random.PRNGKey(0), (160, 160))
  assert 0.075 < float(jnp.max(jnp.abs(w))) <= 1 / np.sqrt(160)
  w = layers.xavier_uniform(160, 480)(jax.random.PRNGKey(0), (160, 480))
  assert 0.09 < float(jnp.max(jnp.abs(w))) <= np.sqrt(6 / 640)


def test_both_model_wrappers_share_the_protocol_methods():
  for cls in (encoder_lib.EncoderModel, ito.ItoModel):
    assert issubclass(cls, layers.TransformedModel)
    for method in ("__post_init__", "init", "attention_logits_per_sequence"):
      assert method not in vars(cls), f"{cls.__name__} defines its own {method}"
  model = ito.ItoModel(ito.ItoConfig(num_heads=2, d_model=16, mlp_size=32, num_layers=1), 4)
  assert model.attention_logits_per_sequence(16) == 2 * 16 * 16
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 16), jnp.int32))
  assert "ito/embed" in params


def test_both_attention_modules_attend_through_the_family(monkeypatch):
  calls, original = [], families.attend

  def spy(family, *args, **kwargs):
    calls.append(family.name)
    return original(family, *args, **kwargs)

  monkeypatch.setattr(families, "attend", spy)
  tokens = jnp.zeros((1, 16), jnp.int32)
  ito.ItoModel(ito.ItoConfig(pe="c_nope", d_model=16, mlp_size=32, num_layers=1), 4).init(
      jax.random.PRNGKey(0), tokens)
  encoder_lib.EncoderModel(encoder_lib.EncoderConfig(vocab_size=5, pe="alibi", num_layers=1,
                                                     d_model=16, num_heads=2), 3).init(
      jax.random.PRNGKey(0), tokens)
  assert calls == ["causal", "alibi"]
