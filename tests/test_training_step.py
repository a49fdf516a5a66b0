"""The training step as two programs (experiments.training.steps.TrainingStep): the
gradients, one per batch shape, and the update, one per run."""
import json

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
  # Two batch shapes: two gradient programs and one update for both.
  assert (trainer.step.gradients.num_compiled, trainer.step.update.num_compiled) == (2, 1)


def test_compiled_step_runs_both_programs_and_sums_their_costs():
  config = tiny_config()
  task = tasks.get("reverse_string")
  trainer = steps.build_trainer(config, task, jax.devices()[:1])
  batch = data.make_batch(task, jax.random.PRNGKey(0), 8, 3)
  compiled = trainer.step.lower(trainer.state, trainer.seeds, batch).compile()
  assert (trainer.step.gradients.num_compiled, trainer.step.update.num_compiled) == (1, 1)

  def flops(program):
    cost = program.cost_analysis()
    return (cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"]

  gradients, update = flops(compiled.gradients), flops(compiled.update)
  assert gradients > 10 * update > 0  # The update is elementwise, the gradients are not.
  assert compiled.cost_analysis()["flops"] == pytest.approx(gradients + update, rel=1e-6)
  reference = _copy(trainer.state)
  state, metrics = compiled(trainer.state, trainer.seeds, batch)
  again, metrics_again = trainer.step(reference, trainer.seeds, batch)
  np.testing.assert_array_equal(_flat(state.params), _flat(again.params))
  np.testing.assert_array_equal(metrics["loss"], metrics_again["loss"])
  # Calling the step found the compiled programs: nothing compiled again.
  assert (trainer.step.gradients.num_compiled, trainer.step.update.num_compiled) == (1, 1)


def test_compiling_ahead_builds_each_offered_shape_once_in_the_background():
  config = tiny_config()
  task = tasks.get("reverse_string")
  trainer = steps.build_trainer(config, task, jax.devices()[:1])
  ahead = steps.AheadCompiler(trainer.step, trainer.state, trainer.seeds, workers=2)
  batches = [data.make_batch(task, jax.random.PRNGKey(i), 4, n)
             for i, n in enumerate((2, 3, 2, 4, 3))]
  assert [ahead.offer(b) is b for b in batches] == [True] * 5
  ahead.join()
  ahead.close()
  assert ahead.submitted == 3
  assert (trainer.step.gradients.num_compiled, trainer.step.update.num_compiled) == (3, 0)
  # The loop's step then finds its program compiled.
  trainer.step(trainer.state, trainer.seeds, batches[0])
  assert trainer.step.gradients.num_compiled == 3
  off = steps.AheadCompiler(trainer.step, trainer.state, trainer.seeds, workers=0)
  off.offer(data.make_batch(task, jax.random.PRNGKey(9), 4, 5))
  off.close()
  assert off.submitted == 0 and trainer.step.gradients.num_compiled == 3


def test_a_run_compiling_ahead_trains_the_same_models(tmp_path):
  from experiments.training import loop  # pylint: disable=import-outside-toplevel
  runs = {}
  for ahead in (0, 2):
    # max_programs=0: a program per length (1..4), so that there is something to compile
    # ahead while the first steps run.
    config = tiny_config(steps=6, max_length=4, max_programs=0, compile_ahead=ahead)
    runs[ahead] = loop.train_and_evaluate(config, str(tmp_path / f"ahead{ahead}"))
    runs[ahead]["metrics"] = (tmp_path / f"ahead{ahead}" / "metrics.jsonl").read_text()
  strip = lambda r: {k: v for k, v in r.items() if k not in ("train_seconds",  # pylint: disable=unnecessary-lambda-assignment
                                                             "train_cpu_seconds", "metrics")}
  assert strip(runs[0]) == strip(runs[2])
  metrics = [[{k: v for k, v in json.loads(line).items() if k != "steps_per_second"}
              for line in runs[a]["metrics"].splitlines()] for a in (0, 2)]
  assert metrics[0] == metrics[1] and len(metrics[0]) == 3
