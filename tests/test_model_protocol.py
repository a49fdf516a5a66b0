"""The model protocol as the training code uses it (issue #30, item 2).

A model is built from `config.model` and a `models.RunSpec` alone; the training code reads
none of its fields (a model without `pe` or `compat` trains and is recorded), declares
its frozen parameters in the protocol, resolves its own length settings, and is built
once per run.
"""
import dataclasses
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import tasks
from configs import default
from experiments.training import data
from experiments.training import loop
from experiments.training import steps
from experiments.training import validation
from randomized_pe import models
from randomized_pe.models import encoder
from tests.test_training import tiny_config


@dataclasses.dataclass(frozen=True)
class BagOfTokens:
  """A model that is no Transformer: each output reads its token's embedding and the
  mean of the sequence's (masked) embeddings. It has no `pe` and no `compat`."""

  vocab_size: int
  output_size: int
  width: int

  description = "a bag of tokens (a test model)"
  label = "bag"
  record = {"model_kind": "bag"}
  frozen_mask = None

  def init(self, key, tokens):
    del tokens
    embed_key, out_key = jax.random.split(key)
    return {"embed": 0.1 * jax.random.normal(embed_key, (self.vocab_size, self.width)),
            "out": 0.1 * jax.random.normal(out_key, (2 * self.width, self.output_size))}

  def apply(self, params, key, tokens, positions=None, *, is_training=False, key_mask=None,
            num_outputs=None, outputs_from=None):
    del key, positions, is_training
    h = params["embed"][tokens]  # [B, T, W]
    mask = (jnp.ones(tokens.shape, bool) if key_mask is None else key_mask)[..., None]
    mean = jnp.sum(jnp.where(mask, h, 0.0), axis=1, keepdims=True) / jnp.sum(mask, axis=1,
                                                                              keepdims=True)
    logits = jnp.concatenate([h, jnp.broadcast_to(mean, h.shape)], axis=-1) @ params["out"]
    if num_outputs is not None:
      start = logits.shape[1] - num_outputs if outputs_from is None else outputs_from
      logits = jax.lax.dynamic_slice_in_dim(logits, start, num_outputs, axis=1)
    return logits  # [B, T, C] or [B, num_outputs, C]

  def sample_positions(self, key, length, *, padded_length=None, evaluation=False):
    del key, evaluation
    return jnp.arange(length if padded_length is None else padded_length)

  def attention_logits_per_sequence(self, length):
    return length * length

  def activation_floats_per_sequence(self, length, *, training):
    del training  # One layer: the embeddings and their mean.
    return 2 * length * self.width

  def check_sequence_length(self, length, what=""):
    del length, what


BUILT = []  # The RunSpec of every build of the test models.


def _bag(model_config, vocab_size, output_size, run):
  BUILT.append(run)
  return BagOfTokens(vocab_size, output_size, model_config.get("width", 8))


def _counted_encoder(model_config, vocab_size, output_size, run):
  BUILT.append(run)
  return encoder.from_config(model_config, vocab_size, output_size, run)


@pytest.fixture(autouse=True)
def _test_models():
  models.register("bag_of_tokens", _bag)
  models.register("counted_encoder", _counted_encoder)
  BUILT.clear()
  yield
  models.MODELS.unregister("bag_of_tokens")
  models.MODELS.unregister("counted_encoder")


def _bag_config():
  config = tiny_config()
  config.model = ml_collections.ConfigDict({"name": "bag_of_tokens", "width": 4})
  config.training.positions = "randomized"  # The run's, whatever the model makes of it.
  return config


def test_a_model_without_pe_or_compat_trains_and_is_recorded(tmp_path, monkeypatch):
  sources = []
  real_source = data.source
  monkeypatch.setattr(data, "source", lambda config: sources.append(1) or real_source(config))
  config = _bag_config()
  result = loop.train_and_evaluate(config, str(tmp_path / "run"))
  # Validated, and its source and model built, once.
  assert len(BUILT) == 1 and len(sources) == 1
  task = tasks.get(config.task)
  assert BUILT[0] == models.RunSpec(
      positions="randomized", eval_positions="",
      max_length=data.sequence_length(task, config.training.max_length),
      eval_max_length=data.sequence_length(task, config.evaluation.max_length))
  written = json.loads((tmp_path / "run" / "eval.json").read_text())
  assert written["model_kind"] == "bag" and "pe" not in written and "compat" not in written
  assert written["step"] == config.training.steps == result["step"]
  assert len(written["accuracy"]) == config.evaluation.max_length


def test_a_validated_run_builds_nothing_again(tmp_path):
  config = tiny_config()
  config.model.name = "counted_encoder"
  validated = validation.validate(config, jax.device_count())
  assert len(BUILT) == 1
  source, model = validated
  assert isinstance(model, encoder.EncoderModel) and source.task.name == config.task
  result = loop.train_and_evaluate(config, str(tmp_path / "run"), validated)
  assert len(BUILT) == 1
  # The encoder's record: the fields eval.json held before the protocol gave them.
  assert (result["pe"], result["compat"]) == (config.model.pe, config.model.compat)


def _old_resolution(config, task):
  """The length settings as experiments.training.steps resolved them on a copy of the
  config before the model resolved its own (the code of that version)."""
  resolved = {name: data.sequence_length(task, config[section].max_length)
              for name, section in {"log_n_reference": "training",
                                    "beta_max_length": "evaluation"}.items()
              if config.model.get(name) == 0 and config[section].get("max_length", 0) >= 1}
  return {name: resolved.get(name, config.model.get(name, 0))
          for name in ("log_n_reference", "beta_max_length")}


@pytest.mark.parametrize("task_name", ["reverse_string", "duplicate_string", "parity_check",
                                       "bucket_sort"])
@pytest.mark.parametrize("log_n_reference,beta_max_length", [(0, 0), (7, 0), (0, 90), (3, 5)])
def test_length_settings_resolved_by_the_model_equal_the_old_resolution(
    task_name, log_n_reference, beta_max_length):
  config = default.get_config()
  config.task = task_name
  config.model.update(log_n_reference=log_n_reference, beta_max_length=beta_max_length)
  config.training.max_length, config.evaluation.max_length = 6, 17
  task = tasks.get(task_name)
  model = steps.build_model(config, task)
  got = {name: getattr(model.config, name) for name in ("log_n_reference", "beta_max_length")}
  assert got == _old_resolution(config, task)
  # The run's config keeps its settings.
  assert (config.model.log_n_reference, config.model.beta_max_length) == (log_n_reference,
                                                                          beta_max_length)


def test_length_settings_stay_0_where_the_run_knows_no_length():
  model = models.build(default.get_config().model, 5, 3)  # RunSpec(): no lengths.
  assert (model.config.log_n_reference, model.config.beta_max_length) == (0, 0)
  with pytest.raises(ValueError, match="log_n_reference must be >= 2 with log_n_scaling on"):
    models.build(ml_collections.ConfigDict({"name": "encoder", "log_n_scaling": True}), 5, 3)


def test_from_config_reads_every_setting_and_old_configs():
  # Every EncoderConfig field but the run's and the task's is a config.model setting.
  model_config = default.get_config().model
  fields = {f.name for f in dataclasses.fields(encoder.EncoderConfig)}
  assert set(model_config) - {"name"} <= fields
  changed = dict(pe="rope", num_layers=3, num_heads=4, d_model=32, widening_factor=2,
                 dropout_rate=0.2, emb_init_scale=0.5, max_position=99, max_timescale=500.0,
                 learned_init_scale=0.3, compat="release", log_n_scaling=True,
                 log_n_reference=9, log_n_scale_bias=True, beta_max_length=11,
                 beta_concentration=2.0)
  model_config.update(changed)
  run = models.RunSpec(positions="randomized", eval_positions="linspace")
  config = models.build(model_config, 7, 2, run).config
  assert {name: getattr(config, name) for name in changed} == changed
  assert (config.positions, config.eval_positions, config.vocab_size) == ("randomized",
                                                                           "linspace", 7)
  # A config saved before the later settings: they read as off.
  old = ml_collections.ConfigDict({k: v for k, v in default.get_config().model.items()
                                   if not k.startswith(("log_n", "beta_"))})
  config = models.build(old, 7, 2).config
  assert (config.log_n_scaling, config.log_n_scale_bias, config.beta_concentration) == (
      False, False, 1.0)


def test_frozen_parameters_are_declared_in_the_protocol():
  model = models.build(default.get_config().model, 5, 3)
  assert model.frozen_mask is None  # Nothing frozen: the optimizer as it is.
  config = tiny_config()
  # Shapes only (jax.eval_shape): the optimizer states' structures need no numbers, and
  # the paper model's init run op by op compiles hundreds of one-op programs.
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 2), jnp.int32))
  plain, masked = steps.make_optimizer(config), steps.optimizer_for(model, config)
  assert (jax.tree_util.tree_structure(jax.eval_shape(plain.init, params))
          == jax.tree_util.tree_structure(jax.eval_shape(masked.init, params)))
  ito_config = ml_collections.ConfigDict({"name": "ito", "pe": "random", "d_model": 16,
                                          "mlp_size": 32, "num_layers": 1})
  ito_model = models.build(ito_config, 6, 4)
  params = jax.jit(ito_model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 16), jnp.int32))
  mask = ito_model.frozen_mask(params)
  assert any(jax.tree_util.tree_leaves(mask)) and not all(jax.tree_util.tree_leaves(mask))
  config.training.update(optimizer="adamw", weight_decay=0.5)
  optimizer = steps.optimizer_for(ito_model, config)
  grads = jax.tree_util.tree_map(jnp.ones_like, params)
  updates, _ = jax.jit(optimizer.update)(grads, optimizer.init(params), params)
  for frozen, update in zip(jax.tree_util.tree_leaves(mask),
                            jax.tree_util.tree_leaves(updates)):
    assert (np.abs(np.asarray(update)).max() == 0) == frozen


def test_the_memory_check_counts_any_model_by_its_own_hints(monkeypatch):
  from experiments.training import memory  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv(memory.LIMIT_ENV, str(2**30))  # A fake limit of 1 GiB.
  config = _bag_config()
  config.training.batch_size = 4
  validation.check_fits(config)  # 2 x T x 4 floats a sequence: fits.
  config.model.width = 2**28  # 8 GiB a token: the bag's own hint says it cannot fit.
  with pytest.raises(ValueError, match=r"the evaluation would need at least [0-9.]+ GiB"):
    validation.check_fits(config)


def test_the_encoders_memory_hint_counts_logits_and_block_activations():
  config = encoder.EncoderConfig(vocab_size=5, num_layers=3, num_heads=2, d_model=8,
                                 widening_factor=4)
  model = encoder.EncoderModel(config, 5)
  length = 7
  per_layer = 2 * length * length + length * 8 * (4 + 4)
  assert model.activation_floats_per_sequence(length, training=False) == per_layer
  assert model.activation_floats_per_sequence(length, training=True) == 3 * per_layer
