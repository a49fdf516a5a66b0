"""training.lr_schedule (experiments.training.steps.SCHEDULES): the learning rate's factor
per update, its checks, and that the default leaves the optimizer as it was."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import default
from experiments.training import steps
from experiments.training import validation


def _config(**training):
  config = default.get_config()
  config.training.update(optimizer="sgd", learning_rate=0.1, grad_clip_norm=0.0)
  config.training.update(training)
  return config


def _updates(optimizer, gradient, count):
  """The updates of `count` steps of a constant gradient."""
  params = jnp.zeros_like(gradient)
  state = optimizer.init(params)
  out = []
  for _ in range(count):
    update, state = optimizer.update(gradient, state, params)
    out.append(np.asarray(update))
  return np.stack(out), state


def _cosine_oracle(k, warmup, decay):
  if k < warmup:
    return k / warmup
  if k >= decay:
    return 0.0
  return 0.5 * (1.0 + math.cos(math.pi * (k - warmup) / (decay - warmup)))


def test_warmup_cosine_scales_each_update_by_the_closed_form_factor():
  warmup, decay, rate = 3, 10, 0.1
  gradient = jnp.array([1.0, -2.0, 0.5], jnp.float32)
  updates, _ = _updates(steps.make_optimizer(_config(
      lr_schedule="warmup_cosine", lr_warmup_steps=warmup, lr_decay_steps=decay)),
      gradient, 13)
  expected = np.stack([-rate * _cosine_oracle(k, warmup, decay) * np.asarray(gradient)
                       for k in range(13)])
  np.testing.assert_allclose(updates, expected, rtol=1e-6, atol=1e-9)
  assert np.all(updates[0] == 0) and np.all(updates[decay:] == 0)  # Starts and ends at 0.
  assert np.abs(updates[warmup]).max() == pytest.approx(rate * 2.0, rel=1e-6)  # The peak.


def test_each_grid_rate_is_scaled_by_the_same_factor():
  # The grid keeps each model's rate in its optimizer state (inject_hyperparams): the
  # schedule multiplies each member's own rate.
  config = _config(lr_schedule="warmup_cosine", lr_warmup_steps=2, lr_decay_steps=6)
  gradient = jnp.ones((2,), jnp.float32)

  def run(rate):
    optimizer = steps.make_optimizer(config, rate)
    params = jnp.zeros((2,))
    state = optimizer.init(params)
    out = []
    for _ in range(5):
      update, state = optimizer.update(gradient, state, params)
      out.append(update[0])
    return jnp.stack(out)

  both = jax.vmap(run)(jnp.array([0.1, 0.4]))
  factors = np.array([_cosine_oracle(k, 2, 6) for k in range(5)])
  np.testing.assert_allclose(np.asarray(both), -np.outer([0.1, 0.4], factors), rtol=1e-6,
                             atol=1e-9)


def test_the_constant_default_is_the_chain_without_a_schedule():
  config = default.get_config()
  assert config.training.lr_schedule == "constant"
  gradient = jnp.array([3.0, -4.0], jnp.float32)  # Norm 5: clipped to 1.
  ours, state = _updates(steps.make_optimizer(config), gradient, 4)
  before = optax.chain(optax.clip_by_global_norm(1.0),
                       optax.inject_hyperparams(optax.adam)(learning_rate=1e-4))
  theirs, their_state = _updates(before, gradient, 4)
  np.testing.assert_array_equal(ours, theirs)  # Bit for bit, and the same state layout.
  assert (jax.tree_util.tree_structure(state)
          == jax.tree_util.tree_structure(their_state))


@pytest.mark.parametrize("settings, message", [
    ({"lr_schedule": "linear"}, "unknown learning-rate schedule 'linear'; valid choices: "
                                "constant, warmup_cosine"),
    ({"lr_warmup_steps": 100}, "need a schedule that takes them (warmup_cosine), got "
                               "'constant'"),
    ({"lr_schedule": "warmup_cosine"}, "lr_decay_steps must be > training.lr_warmup_steps"),
    ({"lr_schedule": "warmup_cosine", "lr_warmup_steps": 10, "lr_decay_steps": 10},
     "got 10 and 10"),
    ({"lr_schedule": "warmup_cosine", "lr_decay_steps": -5}, "must be an integer >= 0"),
])
def test_bad_schedule_settings_fail_validation_in_one_line(settings, message):
  config = default.get_config()
  config.task = "reverse_string"
  config.training.update(settings)
  with pytest.raises(ValueError) as error:
    validation.validate(config)
  assert message in str(error.value) and "\n" not in str(error.value)
