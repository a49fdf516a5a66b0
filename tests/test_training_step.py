"""The training step as three programs (experiments.training.steps.TrainingStep): the
step's keys and the update, one each per run, and the gradients, one per batch shape."""
import jax
import numpy as np
import pytest

import tasks
from experiments.training import data
from experiments.training import steps
from tests.test_training import tiny_config


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(x, np.float64))
                         for x in jax.tree_util.tree_leaves(tree)])


def _copy(tree):
  return jax.tree_util.tree_map(lambda x: x.copy(), tree)


@pytest.mark.parametrize("layout", ["vmap", "loop"])
def test_two_programs_train_the_one_program_steps_models(layout):
  config = tiny_config()
  config.model.update(num_layers=2, d_model=8, num_heads=2, widening_factor=1)
  # Plain SGD at rate 1: the updated parameters compare the gradients themselves (Adam's
  # first steps amplify the float noise of near-zero gradients to the learning rate).
  config.training.optimizer = "sgd"
  config.grid.seeds, config.grid.learning_rates, config.grid.layout = (0, 1), (1.0,), layout
  task = tasks.get("reverse_string")
  trainer = steps.build_trainer(config, task, jax.devices()[:1])
  one_program = jax.jit(steps.make_grid_step(
      trainer.model, steps.optimizer_for(trainer.model, config), layout))
  split, single = _copy(trainer.state), _copy(trainer.state)
  for i, length in enumerate((2, 3, 2)):
    batch = data.make_batch(task, jax.random.PRNGKey(i), 4, length)
    before = _flat(single.params)
    split, got = trainer.step(split, trainer.seeds, batch)
    single, want = one_program(single, trainer.seeds, batch)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-6)
    np.testing.assert_array_equal(got["accuracy"], want["accuracy"])
    moved = np.max(np.abs(_flat(single.params) - before))
    assert moved > 1e-3  # The step moved the parameters (by the gradients).
    np.testing.assert_allclose(_flat(split.params), _flat(single.params),
                               atol=1e-5 * moved, rtol=0)
  np.testing.assert_array_equal(split.step, [3, 3])
  np.testing.assert_array_equal(split.nonfinite, [False, False])
  # Two batch shapes: two gradient programs, and one update and one keys program for both.
  assert _compiled(trainer.step) == (1, 2, 1)


def _compiled(step):
  return tuple(p.num_compiled for p in (step.keys, step.gradients, step.update))


def test_the_keys_program_gives_the_keys_of_the_one_program_step():
  seeds, step_numbers = jax.numpy.array([0, 7, 2**31 - 1]), jax.numpy.array([0, 1, 12345])
  keys, _, _ = steps.make_grid_programs(None, None, "vmap")
  want = np.stack([np.asarray(jax.random.split(jax.random.fold_in(jax.random.fold_in(
      jax.random.PRNGKey(s), steps._MODEL), n))) for s, n in zip([0, 7, 2**31 - 1],
                                                                   [0, 1, 12345])])
  np.testing.assert_array_equal(jax.jit(keys)(step_numbers, seeds), want)
  assert len(np.unique(want.reshape(-1, 2), axis=0)) == 6


def test_compiled_step_runs_its_programs_and_sums_their_costs():
  config = tiny_config()
  task = tasks.get("reverse_string")
  trainer = steps.build_trainer(config, task, jax.devices()[:1])
  batch = data.make_batch(task, jax.random.PRNGKey(0), 8, 3)
  compiled = trainer.step.lower(trainer.state, trainer.seeds, batch).compile()
  assert _compiled(trainer.step) == (1, 1, 1)

  def flops(program):
    cost = program.cost_analysis()
    return (cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"]

  keys, gradients, update = (flops(compiled.keys), flops(compiled.gradients),
                             flops(compiled.update))
  # The update is elementwise: Adam, the parameters' update and the norm of the finite
  # check, a few tens of flops a parameter (23-30 measured). The gradients pass every
  # token through the parameters, forward and back: more than 2 flops a token-parameter.
  num_params = sum(x.size for x in jax.tree_util.tree_leaves(trainer.state.params))
  assert 5 * num_params < update < 40 * num_params
  assert gradients > 2 * batch["tokens"].size * num_params
  assert compiled.cost_analysis()["flops"] == pytest.approx(keys + gradients + update,
                                                            rel=1e-6)
  reference = _copy(trainer.state)
  state, metrics = compiled(trainer.state, trainer.seeds, batch)
  again, metrics_again = trainer.step(reference, trainer.seeds, batch)
  np.testing.assert_array_equal(_flat(state.params), _flat(again.params))
  np.testing.assert_array_equal(metrics["loss"], metrics_again["loss"])
  # Calling the step found the compiled programs: nothing compiled again.
  assert _compiled(trainer.step) == (1, 1, 1)
