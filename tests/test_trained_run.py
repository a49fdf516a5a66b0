"""experiments.training.trained_run.restore_run: the one reader of a trained run (issue #30)."""
import json
import os
import shutil

import jax
import numpy as np
import pytest

from experiments.training import evaluation
from experiments.training import loop
from experiments.training import steps
from experiments.training import trained_run
from tests.test_training import tiny_config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """The tiny run of tests/test_training.py, checkpoints at steps 2 and 4."""
  workdir = str(tmp_path_factory.mktemp("trained_run") / "run")
  config = tiny_config(steps=4, checkpoint_every=2)
  final = loop.train_and_evaluate(config, workdir)
  return workdir, config, final


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(tree)])


def test_restored_run_is_the_trained_one(run):
  workdir, config, final = run
  restored = trained_run.restore_run(workdir)
  assert restored.workdir == os.path.abspath(workdir) and restored.step == 4
  assert restored.config.to_dict() == json.loads(open(os.path.join(workdir, "config.json")).read())
  assert restored.members == steps.grid_members(config) and restored.task.name == config.task
  assert restored.state.step.tolist() == [4] and restored.epoch() is None  # Generated task.
  # The restored parameters give the run's own final evaluation, accuracy for accuracy.
  e = config.evaluation
  evaluated = evaluation.RangeEvaluator(restored.model, restored.task).evaluate(
      restored.params(0), range(e.min_length, e.max_length + 1), e.batch_size, e.seed,
      e.max_buckets)
  assert evaluated["accuracy"] == final["accuracy"]
  # One model's parameters, without the grid axis, on the host.
  assert all(isinstance(p, np.ndarray) for p in jax.tree_util.tree_leaves(restored.params(0)))
  np.testing.assert_array_equal(_flat(restored.params(0)), _flat(restored.state.params))


def test_an_older_step_and_the_errors(run, tmp_path):
  workdir, _, _ = run
  older = trained_run.restore_run(workdir, step=2)
  assert older.step == 2 and older.state.step.tolist() == [2]
  assert not np.array_equal(_flat(older.state.params),
                            _flat(trained_run.restore_run(workdir).state.params))
  with pytest.raises(FileNotFoundError, match="no checkpoint of step 3"):
    trained_run.restore_run(workdir, step=3)
  with pytest.raises(FileNotFoundError, match="has no config.json"):
    trained_run.restore_run(str(tmp_path))
  shutil.copy(os.path.join(workdir, "config.json"), tmp_path / "config.json")
  with pytest.raises(FileNotFoundError, match="no readable checkpoint"):
    trained_run.restore_run(str(tmp_path))
