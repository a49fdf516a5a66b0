"""docs/extending.md's promise, tested: one of each kind of addition (a position sampler, an
encoding family with a setting, a task, a fixed dataset, a model), each added from this
file by the entries the docs' table counts, trains end to end through
experiments.training.loop; the new family in both models.

The entries are registered by the `added` fixture and taken out again afterwards, so no
other test sees them.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ml_collections

import tasks
from experiments.training import loop
from experiments.training import steps
from experiments.training import trained_run
from randomized_pe import attention as attn_lib
from randomized_pe import families
from randomized_pe import models
from randomized_pe import samplers
from randomized_pe.models import ito
from tasks import base
from tasks import datasets
from tests.test_latin_square_training import tiny_config as latin_square_tiny_config
from tests.test_model_protocol import BagOfTokens
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

DATASET_LENGTH = 16  # Ito's model reads grids of 4 x 4 cells.


def _parity_dataset() -> datasets.Dataset:
  """Parity of 16 bits (the answer read at the last token), grouped by the first bit."""
  rng = np.random.default_rng(0)

  def split(n):
    bits = rng.integers(0, 2, (n, DATASET_LENGTH)).astype(np.int32)
    return datasets.Examples(bits, bits.sum(1).astype(np.int32) % 2, bits[:, 0].copy())

  def accuracy(correct, groups):
    return {"overall": float(np.mean(correct)),
            **{g: float(np.mean(correct[groups == i])) for i, g in enumerate(("zero", "one"))}}

  return datasets.Dataset(name="bit_parity", vocab_size=2, output_size=2,
                          sequence_length=DATASET_LENGTH,
                          splits={"train": split(32), "test": split(16)}, train_split="train",
                          group_names=("zero", "one"), accuracy=accuracy)


# --------------------------------------------------------------------------
# A position sampler: one `samplers.register`.


def _every_other(key, length, max_position, padded_length=None):
  """Positions 0, 2, 4, ... (no randomness)."""
  del key, max_position
  return 2 * jnp.arange(length if padded_length is None else padded_length, dtype=jnp.int32)


# --------------------------------------------------------------------------
# An encoding family with a setting: one `families.register` (and, for Ito's model, one
# `ito.register`). The encoder reads its setting `penalty_scale` from
# `config.model.penalty_scale` without a field of its own.


def _penalty_params(ctx):
  return {"slopes": families.ParamSpec((ctx.num_heads,), jax.nn.initializers.ones)}


def _penalty_scorer(positions, params, ctx, query_shape, query_start):
  queries = families.query_rows(positions, query_start, query_shape[1])
  distance = jnp.abs(positions[None, :] - queries[:, None]).astype(jnp.float32)  # [Tq, T]
  bias = -ctx.settings["penalty_scale"] * params["slopes"][:, None, None] * distance[None]
  return lambda q, k: attn_lib.dot_scores(q, k) + bias[None]


# --------------------------------------------------------------------------
# A model: a class with the protocol and one `models.register` (the test model of
# tests/test_model_protocol.py, which has no `pe` and no `compat`).


def _bag(model_config, vocab_size, output_size, run):
  del run
  return BagOfTokens(vocab_size, output_size, model_config.get("width", 8))


@pytest.fixture
def added():
  task = tasks.register(CopyFirst())
  datasets.DATASETS.register("bit_parity", _parity_dataset)
  samplers.register(samplers.Sampler("every_other", _every_other, random=False))
  families.register(families.Family("penalty", "attention", scorer=_penalty_scorer,
                                    params=_penalty_params, settings={"penalty_scale": 1.0}))
  ito.register(ito.ItoEncoding("penalty", "a learned distance penalty (a test family)",
                               family="penalty", positions="raster"))
  models.register("bag_of_tokens", _bag)
  yield task
  tasks.TASKS.unregister("copy_first")
  datasets.DATASETS.unregister("bit_parity")
  samplers.SAMPLERS.unregister("every_other")
  families.FAMILIES.unregister("penalty")
  ito.ENCODINGS.unregister("penalty")
  models.MODELS.unregister("bag_of_tokens")


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


def test_a_family_with_a_setting_and_a_sampler_train_in_the_encoder(tmp_path, added):
  del added
  config = tiny_config(steps=2, log_every=1, checkpoint_every=2)
  config.task = "copy_first"
  config.model.pe = "randomized_penalty"  # The family's randomized twin, made by register.
  config.model.penalty_scale = 0.25  # The family's own setting, no field of the model's.
  config.evaluation.positions = "every_other"
  task = tasks.get("copy_first")
  model = steps.build_model(config, task)
  assert dict(model.config.family_settings) == {"penalty_scale": 0.25}
  assert model.config.context.settings["penalty_scale"] == 0.25
  np.testing.assert_array_equal(
      model.sample_positions(jax.random.PRNGKey(0), 5, evaluation=True), [0, 2, 4, 6, 8])
  # The setting reaches the computation: the logits move with it.
  tokens = jnp.array([[0, 1, 2, 0, 1, 3]])
  params = model.init(jax.random.PRNGKey(1), tokens)
  positions = jnp.arange(6) * 3
  config.model.penalty_scale = 0.0
  unscaled = steps.build_model(config, task)
  a = np.asarray(model.apply(params, None, tokens, positions))
  b = np.asarray(unscaled.apply(params, None, tokens, positions))
  assert np.max(np.abs(a - b)) > 1e-4
  config.model.penalty_scale = 0.25
  loop.train_and_evaluate(config, str(tmp_path / "family"))
  state = trained_run.restore_run(str(tmp_path / "family")).state
  slopes = [np.asarray(v["slopes"]) for v in state.params.values() if "slopes" in v]
  assert len(slopes) == 1 and np.all(slopes[0] != 1.0)  # Created and trained.


def test_a_dataset_trains_the_new_family_in_itos_model_and_the_encoder(tmp_path, added):
  del added
  config = latin_square_tiny_config("encoding=penalty,seeds=1", steps=4, batch_size=8,
                                    log_every=2, checkpoint_every=4)
  config.task = "bit_parity"
  config.evaluation.update(every_epochs=1, batch_size=8, splits=("train", "test"),
                           final_splits=("train", "test"))
  loop.train_and_evaluate(config, str(tmp_path / "ito"))
  result = json.loads((tmp_path / "ito" / "eval.json").read_text())
  assert result["splits"] == ["train", "test"] and result["step"] == 4
  state = trained_run.restore_run(str(tmp_path / "ito")).state
  slopes = [np.asarray(v["slopes"]) for v in state.params.values() if "slopes" in v]
  assert slopes and all(np.all(s != 1.0) for s in slopes)  # The family's, trained.
  encoder_config = tiny_config(steps=4, log_every=2, checkpoint_every=4)
  encoder_config.task = "bit_parity"
  encoder_config.model.pe = "penalty"
  encoder_config.evaluation.update(every_epochs=1, batch_size=8)
  loop.train_and_evaluate(encoder_config, str(tmp_path / "encoder"))
  result = json.loads((tmp_path / "encoder" / "eval.json").read_text())
  assert result["splits"] == ["train", "test"] and result["step"] == 4
  assert result["groups"] == ["overall", "zero", "one"]
  assert 0 <= result["accuracy"]["test"]["overall"] <= 1


def test_a_model_trains_on_the_new_task(tmp_path, added):
  del added
  config = tiny_config(steps=2, log_every=1, checkpoint_every=2)
  config.task = "copy_first"
  config.model = ml_collections.ConfigDict({"name": "bag_of_tokens", "width": 4})
  result = loop.train_and_evaluate(config, str(tmp_path / "model"))
  assert result["step"] == 2 and len(result["accuracy"]) == 6
  assert json.loads((tmp_path / "model" / "eval.json").read_text())["model_kind"] == "bag"


def test_tasks_registry_refuses_a_name_twice_and_names_the_valid_ones():
  with pytest.raises(ValueError, match="a task called 'reverse_string' is already registered"):
    tasks.register(tasks.get("reverse_string"))
  with pytest.raises(ValueError, match="unknown task 'reverse'; valid names: even_pairs, "):
    tasks.get("reverse")
  with pytest.raises(ValueError, match="takes a Task instance with a name"):
    tasks.register(CopyFirst)
