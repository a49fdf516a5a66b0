"""Training-length buckets: a padded step is the unpadded step, with fewer programs."""
import os

import jax
import numpy as np
import optax
import pytest

import tasks
from experiments.training import data
from experiments.training import loop
from experiments.training import steps
from randomized_pe import families
from tests.test_training import count_step_traces, tiny_config


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(tree)])


def _config(pe, compat):
  config = tiny_config()
  config.model.update(pe=pe, compat=compat, num_layers=2, d_model=8, num_heads=2,
                      widening_factor=1)  # Dropout stays on (0.1), as in training.
  config.training.batch_size = 4
  return config


def _unpadded_and_padded_steps(model, optimizer, seed):
  """One program: the train step's loss, accuracy, gradients and updated parameters (its
  positions and dropout keys, Adam's first step) for a batch and for its padded copy."""

  def one(state, batch):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), steps._MODEL),
                             0)  # pylint: disable=protected-access
    pos_key, dropout_key = jax.random.split(key)
    positions = model.sample_positions(pos_key, batch["sequence_length"][0],
                                       padded_length=batch["tokens"].shape[1])
    (loss, accuracy), grads = jax.value_and_grad(
        lambda p: steps.loss_and_accuracy(model, p, dropout_key, batch, positions),
        has_aux=True)(state.params)
    updates, _ = optimizer.update(grads, state.opt_state, state.params)
    return loss, accuracy, grads, optax.apply_updates(state.params, updates)

  return jax.jit(lambda state, batch, padded: (one(state, batch), one(state, padded)))


# Every encoding in both modes. Each case compiles a training step for two shapes (20-55 s
# on a 2-core CPU), so by default the suite runs the cases that cover the paths padding
# must not change: sampled positions (sorted prefix, per-layer draws and offset tables in
# release mode), a learned table, ALiBi's bias rows, relative logits and geometric
# attention's normalisation. RANDOMIZED_PE_TEST_EVERY_ENCODING=1 runs all 26.
CASES = [(pe, compat) for pe in families.names() for compat in ("paper", "release")]
DEFAULT_CASES = [("randomized_learned", "paper"), ("randomized_relative", "paper"),
                 ("randomized_relative", "release"), ("randomized_alibi", "release"),
                 ("randomized_geometric", "paper")]
EVERY_ENCODING = os.environ.get("RANDOMIZED_PE_TEST_EVERY_ENCODING", "0") not in ("", "0")


@pytest.mark.parametrize("pe,compat", CASES)
def test_padded_step_equals_the_unpadded_step(pe, compat):
  if not EVERY_ENCODING and (pe, compat) not in DEFAULT_CASES:
    pytest.skip("one of every encoding's cases: RANDOMIZED_PE_TEST_EVERY_ENCODING=1")
  task = tasks.get("reverse_string")  # Length 3: 6 tokens, 3 outputs; padded to 11 and 5.
  batch = data.make_batch(task, jax.random.PRNGKey(0), 4, 3)
  padded = data.pad_batch(task, batch, tokens=11, outputs=5, rows=4)
  config = _config(pe, compat)
  config.model.num_layers = 2 if compat == "release" else 1  # Per-layer draws need two.
  model = steps.build_model(config, task)
  state = jax.tree_util.tree_map(lambda x: x[0], steps.init_grid(model, config, [(7, 1e-3)]))
  want, got = _unpadded_and_padded_steps(model, steps.make_optimizer(config), 7)(
      state, batch, padded)
  (want_loss, want_acc, want_grads, want_params) = want
  (got_loss, got_acc, got_grads, got_params) = got
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
  np.testing.assert_allclose(got_acc, want_acc, atol=1e-6)
  grads = _flat(want_grads)  # Up to ~3: to 1e-6 of the largest.
  np.testing.assert_allclose(_flat(got_grads), grads, atol=1e-6 * np.max(np.abs(grads)), rtol=0)
  want_params, got_params = _flat(want_params), _flat(got_params)
  # Adam's first step moves each parameter by about lr * g / (|g| + 1e-8): where |g| is
  # below ~1e-6 it amplifies the float noise of g (~1e-9 here, from summing in another
  # order) beyond 1e-6, padded or not. Exact zeros (dead ReLUs, unused tokens) stay put.
  sensitive = (np.abs(grads) < 1e-6) & ((grads != 0) | (_flat(got_grads) != 0))
  assert sensitive.mean() < 0.05, sensitive.mean()
  np.testing.assert_allclose(got_params[~sensitive], want_params[~sensitive], atol=1e-6, rtol=0)
  assert np.max(np.abs(want_params - _flat(state.params))) > 1e-4  # The parameters moved.


def test_padded_grid_step_equals_the_unpadded_grid_step():
  task = tasks.get("reverse_string")
  config = _config("randomized_relative", "release")
  # Plain SGD at rate 1: each model's update is its (clipped) gradient, so the updated
  # parameters compare the gradients themselves (Adam's first step would amplify the float
  # noise of near-zero gradients; the single-model test above handles that).
  config.training.optimizer = "sgd"
  config.grid.seeds, config.grid.learning_rates = (0, 1), (1.0,)
  trainer = steps.build_trainer(config, task, jax.devices()[:1])
  batch = data.make_batch(task, jax.random.PRNGKey(1), 4, 2)
  grid_step = jax.jit(steps.make_grid_step(trainer.model, steps.make_optimizer(config)))
  want_state, want = grid_step(trainer.state, trainer.seeds, batch)
  got_state, got = grid_step(trainer.state, trainer.seeds,
                             data.pad_batch(task, batch, tokens=9, outputs=4, rows=4))
  np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-6)
  moved = _flat(want_state.params) - _flat(trainer.state.params)
  assert np.max(np.abs(moved)) > 1e-2  # The parameters moved (by the gradients).
  np.testing.assert_allclose(_flat(got_state.params), _flat(want_state.params),
                             atol=1e-6 * np.max(np.abs(moved)), rtol=0)


def test_bucket_shapes_cover_every_length_with_at_most_the_asked_programs():
  task = tasks.get("reverse_string")
  shapes = data.bucket_shapes(task, range(1, 41), 4)
  assert len({s for s, _ in shapes.values()}) == 4 and set(shapes) == set(range(1, 41))
  for n, (tokens, outputs) in shapes.items():
    assert tokens >= data.sequence_length(task, n) and outputs >= task.output_length(n)
  assert shapes[40] == (80, 40)
  config = tiny_config(max_length=40, max_programs=0)
  assert data.training_shapes(task, config) is None  # max_programs = 0: exact shapes.
  config.training.max_programs = 4
  assert data.training_shapes(task, config) == shapes


def test_training_over_lengths_1_to_40_compiles_at_most_max_programs(tmp_path, monkeypatch):
  traces = count_step_traces(monkeypatch)
  config = tiny_config(steps=16, max_length=40, log_every=16, checkpoint_every=16,
                       max_programs=2)
  config.model.max_position = 128
  config.evaluation.max_length = 2
  loop.train_and_evaluate(config, str(tmp_path / "run"))
  lengths = {int(data.data_for_step(tasks.get("reverse_string"), config, s)["sequence_length"][0])
             for s in range(1, 17)}
  assert len(lengths) > 8  # Many lengths were drawn...
  assert len(set(traces)) == len(traces) <= 2  # ...and at most 2 programs compiled.
