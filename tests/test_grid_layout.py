"""grid.layout (experiments/training/members.py): the loop layout trains each model of a
grid bitwise as it trains alone, and stays within float rounding of the vmap layout."""
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.training import data
from experiments.training import evaluation
from experiments.training import members
from experiments.training import steps
from experiments.training import validation
import tasks
from tests.test_training import tiny_config


def _train(seeds, layout, num_steps=3):
  """(initial params, params after num_steps) of a grid of `seeds`, copied off the
  donated state."""
  config = tiny_config()
  config.grid.seeds, config.grid.layout = tuple(seeds), layout
  task = tasks.get(config.task)
  trainer = steps.build_trainer(config, task, jax.devices()[:1])
  initial = jax.tree.map(np.asarray, trainer.state.params)
  state = trainer.state
  for i in range(num_steps):
    batch = data.make_batch(task, jax.random.PRNGKey(i), 8, 3)
    state, _ = trainer.step(state, trainer.seeds, batch)
  return initial, jax.tree.map(np.asarray, state.params), trainer.model


def _member(params, i):
  return jax.tree.map(lambda x: x[i], params)


def _max_diff(a, b):
  return max(float(np.max(np.abs(x - y))) for x, y in
             zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def grids():
  return {layout: _train((0, 1, 2), layout) for layout in members.LAYOUTS}


def test_loop_member_is_bitwise_the_model_trained_alone(grids):
  _, trained, _ = grids["loop"]
  _, alone, _ = _train((1,), "loop")
  assert _max_diff(_member(trained, 1), _member(alone, 0)) == 0.0


def test_a_one_model_grid_runs_the_model_alone_under_either_layout(grids):
  # One model has nothing to lay out: vmap and loop give it the same program, bitwise
  # what the loop grid's member gets (before, vmap batched it over an axis of size 1).
  _, trained, _ = grids["loop"]
  _, vmap_alone, _ = _train((1,), "vmap")
  _, loop_alone, _ = _train((1,), "loop")
  assert _max_diff(vmap_alone, loop_alone) == 0.0
  assert _max_diff(_member(trained, 1), _member(vmap_alone, 0)) == 0.0


def _dot_batch_dims(fn, *args):
  """The batch dimensions of every matrix product in fn's program (nested ones too)."""
  found = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "dot_general":
        found.append(tuple(eqn.params["dimension_numbers"][1][0]))
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return found


@pytest.mark.parametrize("layout", list(members.LAYOUTS))
def test_one_model_runs_unbatched_products_and_gets_the_models_axis_back(layout):
  lifted = members.over_members(lambda a, b: {"ab": a @ b, "sum": a.sum()}, layout, (0, 0))
  one = (jnp.ones((1, 4, 3)), jnp.ones((1, 3, 2)))
  assert _dot_batch_dims(lifted, *one) == [()]  # The model's own product, no models axis.
  out = lifted(*one)
  assert out["ab"].shape == (1, 4, 2) and out["sum"].shape == (1,)
  np.testing.assert_array_equal(out["ab"], np.full((1, 4, 2), 3.0))
  if layout == "vmap":  # Two models: one product batched over the models axis.
    assert _dot_batch_dims(lifted, jnp.ones((2, 4, 3)), jnp.ones((2, 3, 2))) == [(0,)]


def test_layouts_start_equal_and_stay_within_rounding(grids):
  (init_v, trained_v, _), (init_l, trained_l, _) = grids["vmap"], grids["loop"]
  assert _max_diff(init_v, init_l) == 0.0  # One initialisation program for both.
  difference = _max_diff(trained_v, trained_l)
  assert difference < 1e-5
  # The models differ from each other far more than the layouts do.
  assert _max_diff(_member(trained_l, 0), _member(trained_l, 1)) > 1e-3


def test_loop_evaluation_of_a_grid_equals_each_model_evaluated_alone(grids):
  _, trained, model = grids["loop"]
  task = tasks.get("reverse_string")
  stacked = evaluation.RangeEvaluator(model, task, stacked=True, layout="loop")
  got = stacked.evaluate(trained, range(1, 7), 8, 0, 1)["accuracy"]  # [lengths][M]
  for i in range(3):
    alone = evaluation.RangeEvaluator(model, task).evaluate(
        _member(trained, i), range(1, 7), 8, 0, 1)["accuracy"]
    assert [row[i] for row in got] == alone


def test_bad_layout_is_refused_naming_the_choices():
  config = tiny_config()
  config.grid.layout = "scan"
  with pytest.raises(ValueError, match=r"grid.layout must be one of vmap, loop, got 'scan'"):
    validation.check_rules(config)
  with pytest.raises(ValueError, match=r"unknown grid.layout 'scan'; valid choices: vmap, loop"):
    members.over_members(lambda x: x, "scan", (0,))


def test_loop_maps_the_leading_axis_or_nothing():
  lifted = members.over_members(lambda x, y: x * y, "loop", (0, None))
  np.testing.assert_array_equal(lifted(jnp.arange(3.0), 2.0), [0.0, 2.0, 4.0])
  with pytest.raises(ValueError, match="axis 0 or nothing"):
    members.over_members(lambda x: x, "loop", (1,))


def test_a_config_stored_before_the_setting_trained_with_vmap():
  config = tiny_config()
  del config.grid["layout"]
  assert members.of(config) == "vmap"
