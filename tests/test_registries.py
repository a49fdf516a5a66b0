"""The registries: samplers, encoding families, release behaviour and models.

What the redesign is for: a sampler or a family added by one entry (here, in this
test file) works end to end in a training run, from a config.
"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import randomized_pe as rpe
import tasks
from experiments.training import loop
from experiments.training import steps
from experiments.training import trained_run
from experiments.training import validation
from randomized_pe import attention as attn_lib
from randomized_pe import families
from randomized_pe import models
from randomized_pe import release
from randomized_pe import samplers
from tests import entry_points
from tests.test_training import ENV, ROOT, tiny_config

# Spread of jax.random.truncated_normal(-2, 2) (and Haiku's TruncatedNormal) per unit stddev.
TRUNCATED = stats.truncnorm(-2, 2).std()


def test_every_family_has_its_computation_and_names_resolve():
  assert families.family_names() == ("none", "sin_cos", "learned", "relative", "rope", "alibi",
                                     "geometric")
  assert set(families.names()) == {
      "none", "sin_cos", "learned", "relative", "rope", "alibi", "randomized_sin_cos",
      "randomized_learned", "randomized_relative", "randomized_rope", "randomized_alibi",
      "geometric", "randomized_geometric"}
  for name in families.names():
    encoding = families.get(name)
    family = encoding.family
    assert encoding.sampler == ("randomized" if name.startswith("randomized_") else "arange")
    assert (family.term is not None) == (family.acts == "embedding")
    assert (family.scorer is not None) == (family.acts == "attention")
    samplers.get(encoding.sampler)
  # Only the release's randomized relative, RoPE and ALiBi drew per layer (release item 2),
  # and only relative and ALiBi read offset tables (item 5).
  assert {f for f in families.family_names() if families.get_family(f).release_per_layer} == {
      "relative", "rope", "alibi"}
  assert {f for f in families.family_names() if families.get_family(f).release_offsets} == {
      "relative", "alibi"}
  assert families.families_accepting(floats=True) == ("none", "sin_cos", "relative", "rope",
                                                      "alibi", "geometric")


def test_a_family_without_its_computation_fails_where_it_is_defined():
  with pytest.raises(ValueError, match="acts in 'attention' and needs a scorer"):
    families.Family("broken", "attention")
  with pytest.raises(ValueError, match="acts in 'embedding' and needs a term"):
    families.Family("broken", "embedding", scorer=lambda *a: None)
  with pytest.raises(ValueError, match="acts must be one of none, embedding, attention"):
    families.Family("broken", "input")


def test_unknown_names_list_the_valid_ones():
  with pytest.raises(ValueError, match="valid names: none, sin_cos, learned, relative, rope"):
    families.get("rotary")
  with pytest.raises(ValueError, match="valid choices: none, sin_cos, learned"):
    families.get_family("rotary")
  with pytest.raises(ValueError, match="valid choices: arange, randomized, unsorted"):
    samplers.get("sorted")
  with pytest.raises(ValueError, match="unknown model 'gpt'; valid choices: encoder"):
    models.get("gpt")
  with pytest.raises(ValueError, match="unknown compat 'both'; valid choices: paper, release"):
    release.resolve("both")


def test_release_behaviour_is_one_record():
  paper, code = release.resolve("paper"), release.resolve("release")
  flags = [f for f in paper.__dataclass_fields__ if f != "compat"]
  assert len(flags) == 6
  assert not any(getattr(paper, f) for f in flags) and all(getattr(code, f) for f in flags)
  assert rpe.EncoderConfig(vocab_size=3, compat="release").behaviour is release.RELEASE


@pytest.mark.parametrize("name", ["arange", "randomized", "unsorted", "evenly_spaced"])
@pytest.mark.parametrize("compat", ["paper", "release"])
def test_every_sampler_is_usable_from_a_config_for_training_and_evaluation(name, compat):
  task = tasks.get("reverse_string")
  for pe in ("sin_cos", "randomized_rope", "relative"):
    config = tiny_config()
    config.model.pe, config.model.compat = pe, compat
    config.training.positions = name
    config.evaluation.positions = name
    offsets_family = families.get(pe).family.release_offsets
    if compat == "release" and offsets_family and name == "unsorted":
      # Unsorted positions make no table of distances (release item 5).
      with pytest.raises(ValueError, match="sampler 'unsorted' cannot give"):
        validation.validate(config)
      continue
    validation.validate(config)
    model = steps.build_model(config, task)
    key = jax.random.PRNGKey(3)
    # Release item 5: randomized relative draws a distance table; item 2: per layer.
    drawn = "offsets" if compat == "release" and offsets_family and name == "randomized" else name
    per_layer = (compat == "release" and samplers.get(drawn).random
                 and families.get(pe).family.release_per_layer)
    want = (samplers.get(drawn)(jax.random.split(key, 1)[0], 6, 64)[None] if per_layer
            else samplers.get(drawn)(key, 6, 64))
    for evaluation in (False, True):
      got = np.asarray(model.sample_positions(key, 6, evaluation=evaluation))
      np.testing.assert_array_equal(got, want)


def test_config_chooses_training_and_evaluation_samplers_separately():
  task = tasks.get("reverse_string")
  config = tiny_config()
  config.model.pe = "randomized_sin_cos"
  config.training.positions = "unsorted"
  config.evaluation.positions = "evenly_spaced"
  model = steps.build_model(config, task)
  key = jax.random.PRNGKey(0)
  train = np.asarray(model.sample_positions(key, 20))
  np.testing.assert_array_equal(train, samplers.unsorted(key, 20, 64))
  assert np.any(np.diff(train) < 0)
  evaluated = np.asarray(model.sample_positions(key, 16, padded_length=20, evaluation=True))
  np.testing.assert_array_equal(evaluated[:16], np.arange(16) * 4)
  # "" means: the encoding's sampler for training, the training sampler for evaluation.
  config.training.positions = config.evaluation.positions = ""
  model = steps.build_model(config, task)
  np.testing.assert_array_equal(model.sample_positions(key, 9, evaluation=True),
                                samplers.randomized(key, 9, 64))


def test_unsorted_training_and_evenly_spaced_evaluation_from_the_command_line(tmp_path):
  workdir = tmp_path / "run"
  cmd = [sys.executable, "-m", "experiments.train", "--config=configs/demo.py",
         "--pe=randomized_sin_cos", f"--workdir={workdir}",
         "--config.training.positions=unsorted", "--config.evaluation.positions=evenly_spaced",
         "--config.model.num_layers=1", "--config.model.d_model=16", "--config.model.num_heads=2",
         "--config.training.steps=2", "--config.training.batch_size=8",
         "--config.training.max_length=3", "--config.evaluation.max_length=5",
         "--config.evaluation.batch_size=8", "--config.evaluation.max_buckets=1",
         "--config.progress=False"]
  out = entry_points.run_command(cmd, env=ENV, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  config = json.loads((workdir / "config.json").read_text())
  assert config["training"]["positions"] == "unsorted"
  assert config["evaluation"]["positions"] == "evenly_spaced"
  assert json.loads((workdir / "eval.json").read_text())["lengths"] == [1, 2, 3, 4, 5]


# --------------------------------------------------------------------------
# Extension by one entry each: a float sampler and an attention family.


def _half_steps(key, length, max_position, padded_length=None):
  """Positions 0, 0.5, 1, ... (floats)."""
  del key, max_position
  size = length if padded_length is None else padded_length
  return jnp.arange(size, dtype=jnp.float32) * 0.5


def _distance_params(ctx):
  return {"slopes": families.ParamSpec((ctx.num_heads,), jax.nn.initializers.ones)}


def _distance_scorer(positions, params, ctx, query_shape, query_start):
  """A learned per-head penalty on |p_j - p_i| (ALiBi with learned slopes)."""
  del ctx
  queries = families.query_rows(positions, query_start, query_shape[1])
  distance = jnp.abs(positions[None, :] - queries[:, None])  # [Tq, T]
  bias = -params["slopes"][:, None, None] * distance[None]
  return lambda q, k: attn_lib.dot_scores(q, k) + bias[None]


@pytest.fixture
def added_entries():
  sampler = samplers.register(samplers.Sampler("half_steps", _half_steps, random=False,
                                               floats=True))
  family = families.register(families.Family(
      "distance_bias", "attention", scorer=_distance_scorer, params=_distance_params,
      randomized_twin=True))
  yield sampler, family
  samplers.SAMPLERS.unregister("half_steps")
  families.FAMILIES.unregister("distance_bias")


def test_a_sampler_and_a_family_added_by_one_entry_train_end_to_end(tmp_path, added_entries):
  assert "randomized_distance_bias" in families.names()
  config = tiny_config(steps=2, log_every=1, checkpoint_every=2)
  config.model.pe = "distance_bias"
  config.training.positions = "half_steps"
  result = loop.train_and_evaluate(config, str(tmp_path / "new"))
  assert result["step"] == 2 and len(result["accuracy"]) == 6
  state = trained_run.restore_run(str(tmp_path / "new")).state
  slopes = [np.asarray(v["slopes"]) for v in state.params.values() if "slopes" in v]
  assert len(slopes) == 1 and slopes[0].shape == (1, 2)  # [models, heads]: created, trained.
  assert np.all(slopes[0] != 1.0)
  # The float sampler with a learned table is refused before anything compiles, naming
  # the families that take floats (the new one among them).
  config.model.pe = "randomized_learned"
  with pytest.raises(ValueError, match="families that take floats: none, sin_cos, .*distance_bias"):
    validation.validate(config)


# --------------------------------------------------------------------------
# Initializers: the spread of every parameter kind against the release's formula.


def _spreads(pe, compat, seeds=4):
  config = rpe.EncoderConfig(vocab_size=64, pe=pe, compat=compat, num_layers=2, num_heads=8,
                             d_model=256, widening_factor=4, max_position=512)
  model = rpe.EncoderModel(config, 64)
  pooled = {}
  for seed in range(seeds):
    params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, 4), jnp.int32))
    for module, values in params.items():
      kind = module.split("/")[-1].rstrip("0123456789").rstrip("_")
      for name, value in values.items():
        pooled.setdefault(f"{kind}.{name}", []).append(np.ravel(np.asarray(value)))
  return {k: np.concatenate(v) for k, v in pooled.items()}


def _release_formula(kind: str, compat: str) -> tuple[str, float]:
  """(distribution, stddev) of the release's initializer for one parameter kind."""
  d_model, ffn = 256, 1024
  fan_in = {"query.w": d_model, "key.w": d_model, "value.w": d_model, "output.w": d_model,
            "ffn_in.w": d_model, "ffn_out.w": ffn, "logits.w": d_model}
  if kind in fan_in:  # hk.Linear's default.
    return "truncated", 1 / np.sqrt(fan_in[kind])
  if kind.endswith(".b") or kind.endswith(".offset"):
    return "constant", 0.0
  if kind.endswith(".scale"):
    return "constant", 1.0
  if kind == "embed.embeddings":
    return "truncated", 0.02
  if kind == "encoder.position_table":  # hk.Embed's default.
    return "truncated", 1.0
  if kind in ("attention.content_bias", "attention.relative_bias"):
    return "normal", 0.02
  if kind == "attention.relative_kernel":
    # Release item 6: hk.Linear's default; paper mode corrects for the truncation.
    return "truncated", 1 / np.sqrt(d_model) / (TRUNCATED if compat == "paper" else 1.0)
  raise AssertionError(f"no formula for {kind}")


@pytest.mark.parametrize("pe,compat", [("randomized_relative", "release"),
                                       ("relative", "paper"), ("randomized_learned", "release")])
def test_initial_spread_of_every_parameter_matches_the_release_formula(pe, compat):
  spreads = _spreads(pe, compat)
  expected_kinds = {"embed.embeddings", "query.w", "key.w", "value.w", "output.w", "ffn_in.w",
                    "ffn_in.b", "ffn_out.w", "ffn_out.b", "logits.w", "logits.b",
                    "attention_norm.scale", "attention_norm.offset", "ffn_norm.scale",
                    "ffn_norm.offset"}
  assert expected_kinds <= set(spreads)
  for kind, values in spreads.items():
    distribution, stddev = _release_formula(kind, compat)
    if distribution == "constant":
      np.testing.assert_array_equal(values, stddev, err_msg=kind)
      continue
    spread = stddev * (TRUNCATED if distribution == "truncated" else 1.0)
    # The std of n samples is off by about 1/sqrt(2n) relative; 5 of those, at least 1%.
    tolerance = max(0.01, 5 / np.sqrt(2 * values.size))
    assert abs(values.std() / spread - 1) < tolerance, (kind, values.std(), spread, values.size)
    assert abs(values.mean()) < 5 * spread / np.sqrt(values.size), kind
    if distribution == "truncated":
      assert np.max(np.abs(values)) <= 2 * stddev * (1 + 1e-6), kind
    else:
      assert np.max(np.abs(values)) > 2 * stddev, kind  # Not truncated.
