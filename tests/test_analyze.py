"""Issue 15 part 3: attention maps, PCA of activations and their numbers (experiments.analyze)."""
import dataclasses
import json
import math
import os

import jax
import matplotlib.image
import numpy as np
import pytest

import randomized_pe as rpe
import tasks
from experiments import analyze
from experiments import loop
from randomized_pe import families
from randomized_pe import probes
from tests.test_training import tiny_config

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------
# The numbers of attention on matrices known by construction.


def _reverse_source(n):
  return analyze.expected_source(tasks.get("reverse_string"), n)


def test_expected_sources():
  np.testing.assert_array_equal(_reverse_source(3), [-1, -1, -1, 2, 1, 0])
  np.testing.assert_array_equal(analyze.expected_source(tasks.get("duplicate_string"), 3),
                                [-1, -1, -1, 0, 1, 2, 0, 1, 2])
  # odds_first: 0 1 1 0 1 -> the inputs at 1, 3, then at 0, 2, 4.
  np.testing.assert_array_equal(analyze.expected_source(tasks.get("odds_first"), 5)[5:],
                                [1, 3, 0, 2, 4])
  assert analyze.expected_source(tasks.get("parity_check"), 4) is None


def test_anti_diagonal_fraction_of_known_matrices():
  n = 3
  t = 2 * n  # Inputs, then one empty token per output.
  source = _reverse_source(n)
  uniform = np.full((2, 1, t, t), 1.0 / t)
  mirror = uniform.copy()
  for row in range(n, t):  # Every output row on its mirror input, all its mass.
    mirror[:, :, row] = 0.0
    mirror[:, :, row, source[row]] = 1.0
  half = 0.5 * mirror + 0.5 * uniform
  weights = np.concatenate([mirror, uniform, half], axis=1).astype(np.float32)  # 3 heads
  stats = jax.jit(probes.attention_stats)(weights, source)
  np.testing.assert_allclose(stats["expected_source_mass"], [1.0, 1 / t, 0.5 + 0.5 / t],
                             atol=1e-7)
  # Entropy: log t for the uniform head; the mirror head is uniform on its 3 input rows only.
  np.testing.assert_allclose(stats["entropy"][1], math.log(t), rtol=1e-6)
  np.testing.assert_allclose(stats["entropy"][0], 0.5 * math.log(t), rtol=1e-6)
  # Mean attended distance of the uniform head: mean over t, s of |t - s|.
  rows = np.arange(t)
  expected = np.mean(np.abs(rows[:, None] - rows[None, :]))
  np.testing.assert_allclose(stats["mean_distance"][1], expected, rtol=1e-6)
  # Mirror rows: output n+i reads n-1-i, 2i+1 tokens away.
  np.testing.assert_allclose(
      stats["mean_distance"][0],
      (n * np.mean(np.abs(np.arange(n)[:, None] - rows[None, :]))
       + sum(2 * i + 1 for i in range(n))) / t, rtol=1e-6)
  assert "expected_source_mass" not in probes.attention_stats(weights)
  # Padded query rows do not count: the same numbers with two rows of padding appended.
  padded = np.zeros((2, 3, t + 2, t + 2), np.float32)
  padded[:, :, :t, :t] = weights
  padded[:, :, t:, :] = 1.0 / (t + 2)  # Whatever padded rows hold.
  masked = jax.jit(probes.attention_stats)(padded, np.concatenate([source, [-1, -1]]),
                                           np.arange(t + 2) < t)
  for name, values in stats.items():
    np.testing.assert_allclose(masked[name], values, rtol=1e-6)


def _tiny_encoder(pe="learned", **kwargs):
  config = rpe.EncoderConfig(vocab_size=3, pe=pe, num_layers=1, num_heads=2, d_model=16,
                             widening_factor=2, dropout_rate=0.0, max_position=16, **kwargs)
  return rpe.EncoderModel(config, output_size=2)


def test_forced_reversal_model_gives_anti_diagonal_one():
  """A 1-layer encoder whose head 0 is built so that output n+i attends to input n-1-i."""
  n, t = 3, 6
  model = _tiny_encoder("learned")
  params = jax.jit(model.init)(jax.random.PRNGKey(0), np.zeros((1, 2), np.int32))
  params = jax.tree_util.tree_map(np.array, params)  # Writable host copies.
  params["encoder/embed"]["embeddings"][:] = 0.0  # Only positions reach attention.
  scale = 10.0
  table = np.zeros((16, 16), np.float32)
  table[np.arange(t), np.arange(t)] = scale  # Position p -> scale * e_p.
  params["encoder"]["position_table"] = table
  w_k = np.eye(16, dtype=np.float32)  # Key of position s: scale * e_s (head 0: dims 0..7).
  w_q = np.zeros((16, 16), np.float32)
  source = _reverse_source(n)
  for row in range(n, t):  # The query of output row n+i points at its mirror's key.
    w_q[row, source[row]] = 1.0
  params["encoder/attention_0/key"]["w"] = w_k
  params["encoder/attention_0/query"]["w"] = w_q
  # Head 0: logits scale^2 / sqrt(8) = 35 on the mirror, 0 elsewhere; head 1 sees zeros.
  probe = jax.jit(analyze.make_probe(model, attention=True, activations=True))
  tokens = np.array([[0, 1, 1, 2, 2, 2], [1, 0, 0, 2, 2, 2]], np.int32)
  targets = tokens[:, :n][:, ::-1]
  out = jax.device_get(probe(params, jax.random.PRNGKey(1), tokens, targets,
                             np.ones_like(targets, bool), t, n, source))
  mass = out["stats"]["expected_source_mass"][0]  # Layer 0: [heads]
  np.testing.assert_allclose(mass, [1.0, 1 / t], atol=1e-6)
  assert out["maps"].shape == (1, t, t)
  np.testing.assert_allclose(out["maps"][0][np.arange(n, t), source[n:]], 1.0, atol=1e-6)
  assert analyze.check_reconstruction(out["error"], out["scale"], n) < 1e-5
  with pytest.raises(analyze.ReconstructionError, match="layer 1 differs"):
    analyze.check_reconstruction([0.0, 3e-4], [0.5, 2.0], n)  # 1.5e-4 of the scale: too far.
  analyze.check_reconstruction([0.0, 1.9e-4], [0.5, 2.0], n)  # 0.95e-4: within.
  assert out["activations"].shape == (2, 2, t, 16)  # Embeddings and the layer's output.


# --------------------------------------------------------------------------
# The reconstruction of attention weights.


@pytest.mark.parametrize("pe, settings", [
    ("alibi", dict(log_n_scaling=True, log_n_reference=4, log_n_scale_bias=True)),
    ("randomized_relative", dict(compat="release")),  # Positions drawn per layer.
    ("randomized_geometric", {}),  # Its own normalisation; its scorer reads the input.
])
def test_reconstruction_reproduces_module_output(pe, settings):
  """Weights @ v projected by the output weights equal the module's output to 1e-5 (float32;
  the tool asserts 1e-4 of the output scale)."""
  model = _tiny_encoder(pe, **settings)
  config = model.config
  tokens = np.random.default_rng(0).integers(0, 3, (3, 7)).astype(np.int32)
  key_mask = np.arange(7)[None, :] < np.array([7, 5, 2])[:, None]  # Padded rows.

  @jax.jit
  def run(key):
    params = model.init(key, tokens)
    positions = model.sample_positions(jax.random.fold_in(key, 1), 7, evaluation=True)
    logits, captured = analyze.capture(model, params, None, tokens, positions, key_mask)
    call = captured["attention"][0]
    a = call["args"]
    weights, rebuilt = probes.attention_weights(
        a["x"], analyze.layer_weights(params, call["module"]), config.family, config.context,
        a["positions"], key_mask=a["key_mask"], logit_scale=a["logit_scale"],
        scale_bias=config.log_n_scale_bias)
    plain = model.apply(params, None, tokens, positions, key_mask=key_mask)
    return logits, plain, weights, rebuilt, call["output"], a["logit_scale"]

  logits, plain, weights, rebuilt, output, logit_scale = jax.device_get(
      run(jax.random.PRNGKey(1)))
  if settings.get("log_n_scaling"):
    assert logit_scale is not None  # The captured call carried log-n scaling.
  np.testing.assert_allclose(rebuilt, output, atol=1e-5)
  np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
  masked = ~np.asarray(key_mask)[:, None, None, :] & np.ones(weights.shape, bool)
  assert np.all(weights[masked] == 0.0)
  np.testing.assert_allclose(logits, plain, atol=1e-6)  # Capturing changes nothing.


def test_non_softmax_family_is_refused_in_one_line():
  # A family with a field this module does not know, set away from its default (the shape
  # a geometric attention's own normalisation may take).
  @dataclasses.dataclass(frozen=True)
  class WithNormalisation(families.Family):
    normalise: object = None

  family = WithNormalisation("geometric", "attention", scorer=lambda *a: None,
                             normalise=lambda logits: logits)
  with pytest.raises(ValueError) as error:
    probes.check_softmax(family)
  message = str(error.value)
  assert "\n" not in message and "'geometric'" in message
  assert "supported families: none, sin_cos, learned, relative, rope, alibi, geometric" in message
  probes.check_softmax(WithNormalisation("plain", "attention", scorer=lambda *a: None))
  # Geometric attention's own normalisation is a field the rebuild applies.
  for name in ("none", "sin_cos", "learned", "relative", "rope", "alibi", "geometric"):
    probes.check_softmax(families.get_family(name))


# --------------------------------------------------------------------------
# PCA.


def test_pca_is_fitted_on_training_activations_only():
  rng = np.random.default_rng(0)
  inside = rng.normal(size=(200, 8)) * np.array([5, 3, 1, 1, 1, 1, 1, 1]) + 2.0
  near = rng.normal(size=(300, 8)) * np.array([5, 3, 1, 1, 1, 1, 1, 1]) + 2.0
  far = near + 40.0 * np.eye(8)[5]  # Off the training cloud, along a low-variance axis.
  fit_a, numbers_near, (inside_a, near_proj) = analyze.pca_numbers(inside, near)
  fit_b, numbers_far, (inside_b, _) = analyze.pca_numbers(inside, far)
  for a, b in zip(fit_a, fit_b):  # Other points do not move the fit.
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(inside_a, inside_b)
  np.testing.assert_allclose(inside_a.mean(axis=0), 0.0, atol=1e-10)  # Centred.
  # The fit is the training points' own: not the fit of all points together.
  together = probes.fit_pca(np.concatenate([inside, far]))
  assert not np.allclose(np.abs(together.components), np.abs(fit_a.components), atol=1e-2)
  # Components: the top eigenvectors of the training covariance (up to sign).
  values, vectors = np.linalg.eigh(np.cov(inside.T))
  np.testing.assert_allclose(np.abs(fit_a.components), np.abs(vectors[:, ::-1][:, :2].T),
                             atol=1e-8)
  np.testing.assert_allclose(fit_a.explained_variance, values[::-1][:2], rtol=1e-8)
  np.testing.assert_allclose(near_proj, (near - inside.mean(0)) @ fit_a.components.T)
  # The numbers: near points lie in the cloud, far points off it.
  assert numbers_near["nearest_training_distance"] < 0.5
  assert numbers_far["nearest_training_distance"] > 5 * numbers_near["nearest_training_distance"]
  assert numbers_far["centroid_shift"] == pytest.approx(40.0 / numbers_far["spread"], rel=0.05)
  assert numbers_near["mahalanobis_2d"]["training"] <= math.sqrt(2)
  same = probes.cloud_distances(inside, inside)
  assert same["nearest_training_distance"] < 1e-6 and same["centroid_shift"] < 1e-12


# --------------------------------------------------------------------------
# The command line on a tiny trained run.


def _tiny_run_config():
  # test_training's tiny model (1 layer, d_model 16, 2 heads, batch 8, lengths 1..3,
  # evaluation to 6): its programs are the ones many tests compile (a cached program).
  return tiny_config(steps=3)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("analyze") / "run")
  loop.train_and_evaluate(_tiny_run_config(), workdir)
  return workdir


def test_command_line_writes_figures_and_numbers(tiny_run, tmp_path, capsys):
  out = tmp_path / "out"
  analyze.command_line(["analyze", f"--workdir={tiny_run}", "--kind=all", f"--out={out}",
                        "--num_sequences=4"])
  printed = capsys.readouterr().out
  assert "anti-diagonal" in printed and "written:" in printed
  for name in ("attention.png", "pca.png"):
    assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
    assert matplotlib.image.imread(str(out / name)).ndim == 3  # A whole, readable image.
  result = json.loads((out / "analysis.json").read_text())
  assert result["lengths"] == {"training": 3, "beyond": 6}  # Longest; min(3 x 3, 6).
  assert result["sequence_tokens"] == {"training": 6, "beyond": 12}
  assert result["step"] == 3 and result["positions"] == "randomized"
  assert all(0.0 <= a <= 1.0 for a in result["accuracy"].values())
  attention = result["attention"]
  assert 0.0 <= attention["reconstruction_error"] <= 1e-4
  [layer] = attention["layers"]
  for which, tokens_seen in (("training", 6), ("beyond", 12)):
    numbers = layer[which]
    fraction = numbers["anti_diagonal_fraction"]
    assert fraction == numbers["expected_source_mass"]
    assert len(fraction["per_head"]) == 2
    assert all(0.0 <= f <= 1.0 for f in fraction["per_head"])
    assert fraction["max_over_heads"] == max(fraction["per_head"])
    assert all(0.0 <= e <= math.log(tokens_seen) + 1e-5 for e in numbers["entropy"]["per_head"])
    assert all(0.0 <= d <= tokens_seen - 1 for d in numbers["mean_distance"]["per_head"])
  pca = result["pca"]["layers"]
  assert [p["activations"] for p in pca] == ["embeddings", "layer 0"]
  for p in pca:
    assert all(0.0 <= r <= 1.0 + 1e-9 for r in p["explained_variance_ratio"])
    assert sum(p["explained_variance_ratio"]) <= 1.0 + 1e-9
    assert p["nearest_training_distance"] >= 0.0 and np.isfinite(p["centroid_shift"])
    assert 0.0 <= p["mahalanobis_2d"]["training"] <= math.sqrt(2) + 1e-9
  # Nothing was written into the run's own folder.
  assert not os.path.exists(os.path.join(tiny_run, analyze.OUT_FOLDER))


@pytest.mark.parametrize("args, message", [
    (["--workdir={missing}"], "no run folder at"),
    (["--workdir={run}", "--kind=maps"], "--kind"),
    (["--workdir={run}", "--length=5"], "not a training length"),
    (["--workdir={run}", "--beyond_length=65"], "max_position"),
    (["--workdir={empty}"], "no checkpoint"),
])
def test_bad_input_is_one_line_and_exit_2(tiny_run, tmp_path, capsys, args, message):
  empty = tmp_path / "empty"
  empty.mkdir()
  (empty / "config.json").write_text(json.dumps(_tiny_run_config().to_dict()))
  names = {"missing": tmp_path / "missing", "run": tiny_run, "empty": empty}
  with pytest.raises(SystemExit) as exit_info:
    analyze.command_line(["analyze", *[a.format(**names) for a in args],
                          f"--out={tmp_path / 'out'}"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error:") and "\n" not in err and message in err
  assert not (tmp_path / "out").exists()
