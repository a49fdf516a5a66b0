"""Issue 15 part 3: attention maps, PCA of activations and their numbers (experiments.analyze;
its machinery experiments/analysis/attention.py)."""
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
from experiments.analysis import attention as attention_lib
from experiments.training import loop
from randomized_pe import probes
from tests.test_training import tiny_config

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------
# The numbers of attention on matrices known by construction.


def _reverse_source(n):
  return attention_lib.expected_source(tasks.get("reverse_string"), n)


def test_expected_sources():
  np.testing.assert_array_equal(_reverse_source(3), [-1, -1, -1, 2, 1, 0])
  np.testing.assert_array_equal(attention_lib.expected_source(tasks.get("duplicate_string"), 3),
                                [-1, -1, -1, 0, 1, 2, 0, 1, 2])
  # odds_first: 0 1 1 0 1 -> the inputs at 1, 3, then at 0, 2, 4.
  np.testing.assert_array_equal(attention_lib.expected_source(tasks.get("odds_first"), 5)[5:],
                                [1, 3, 0, 2, 4])
  assert attention_lib.expected_source(tasks.get("parity_check"), 4) is None


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
  probe = jax.jit(attention_lib.make_probe(model, attention=True, activations=True))
  tokens = np.array([[0, 1, 1, 2, 2, 2], [1, 0, 0, 2, 2, 2]], np.int32)
  targets = tokens[:, :n][:, ::-1]
  out = jax.device_get(probe(params, jax.random.PRNGKey(1), tokens, targets,
                             np.ones_like(targets, bool), t, n, source))
  mass = out["stats"]["expected_source_mass"][0]  # Layer 0: [heads]
  np.testing.assert_allclose(mass, [1.0, 1 / t], atol=1e-6)
  assert out["maps"].shape == (1, t, t)
  np.testing.assert_allclose(out["maps"][0][np.arange(n, t), source[n:]], 1.0, atol=1e-6)
  assert out["activations"].shape == (2, 2, t, 16)  # Embeddings and the layer's output.


# --------------------------------------------------------------------------
# The weights and activations the model returns (EncoderModel.apply(intermediates=True)).


def _softmax(logits, key_mask):
  logits = np.where(key_mask[:, None, None, :], logits, -np.inf)
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _sinusoid(distances, dim, max_timescale):
  """Sin/cos of distances [...] in `dim` features: sines first, w_i = L^(-2i/dim)."""
  rates = max_timescale ** (-2.0 * np.arange(dim // 2) / dim)
  angles = distances[..., None] * rates
  return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)


def _returned(model, tokens, key_mask, seed=1):
  """(params, positions, logits, logits with intermediates, intermediates), float64."""
  @jax.jit
  def run(key):
    params = model.init(key, tokens)
    positions = model.sample_positions(jax.random.fold_in(key, 1), tokens.shape[1],
                                       evaluation=True)
    plain = model.apply(params, None, tokens, positions, key_mask=key_mask)
    logits, inner = model.apply(params, None, tokens, positions, key_mask=key_mask,
                                intermediates=True)
    return params, positions, plain, logits, inner

  params, positions, plain, logits, inner = jax.device_get(run(jax.random.PRNGKey(seed)))
  as64 = lambda tree: jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree)  # pylint: disable=unnecessary-lambda-assignment
  return as64(params), np.asarray(positions), plain, logits, as64(inner)


_TOKENS = np.random.default_rng(0).integers(0, 3, (3, 7)).astype(np.int32)
_KEY_MASK = np.arange(7)[None, :] < np.array([7, 5, 2])[:, None]  # Padded rows.


def _projected(params, layer, x, heads, head_size, name):
  """x [B, T, M] through the layer's `name` weights: [B, T, H, D]."""
  return (x @ params[f"encoder/attention_{layer}/{name}"]["w"]).reshape(
      *x.shape[:2], heads, head_size)


@pytest.mark.parametrize("pe", ["learned", "sin_cos"])
def test_returned_weights_of_a_dot_product_encoding_are_softmax_of_q_k(pe):
  """Additive encodings attend by softmax(q k^T / sqrt(D)) over the unmasked keys: computed
  here in float64 from the returned embeddings and the query/key weights."""
  model = _tiny_encoder(pe)
  params, _, _, _, inner = _returned(model, _TOKENS, _KEY_MASK)
  heads, head_size = model.config.num_heads, model.config.head_size
  x = inner.embeddings  # [B, T, M], the input of layer 0.
  q, k = (_projected(params, 0, x, heads, head_size, n) for n in ("query", "key"))
  expected = _softmax(np.einsum("bthd,bshd->bhts", q, k) / math.sqrt(head_size), _KEY_MASK)
  [weights] = inner.attention
  assert weights.shape == (3, heads, 7, 7)
  np.testing.assert_allclose(weights, expected, atol=2e-6, rtol=0)
  assert np.all(weights[~np.broadcast_to(_KEY_MASK[:, None, None, :], weights.shape)] == 0.0)


def test_returned_weights_of_relative_are_transformer_xl_softmax():
  """Transformer-XL: logits (q + u) k / sqrt(D) + (q + v) R(p_j - p_i) / sqrt(D), R the
  relative kernel applied to the sinusoid of the distance between the sampled positions."""
  model = _tiny_encoder("randomized_relative", max_timescale=10.0)
  params, positions, _, _, inner = _returned(model, _TOKENS, _KEY_MASK)
  heads, head_size = model.config.num_heads, model.config.head_size
  assert len(set(positions.tolist())) == 7 and positions[-1] > 7  # Random, distinct.
  x = inner.embeddings
  block = params["encoder/attention_0"]
  q, k = (_projected(params, 0, x, heads, head_size, n) for n in ("query", "key"))
  kernel = block["relative_kernel"].reshape(-1, heads, head_size)  # [R, H, D]
  distance = (positions[None, :] - positions[:, None]).astype(np.float64)  # [i, j]: p_j - p_i
  table = np.einsum("tsr,rhd->tshd", _sinusoid(distance, kernel.shape[0], 10.0), kernel)
  scale = 1.0 / math.sqrt(head_size)
  content = np.einsum("bthd,bshd->bhts", (q + block["content_bias"]) * scale, k)
  logits = content + np.einsum("bthd,tshd->bhts", (q + block["relative_bias"]) * scale, table)
  [weights] = inner.attention
  np.testing.assert_allclose(weights, _softmax(logits, _KEY_MASK), atol=2e-6, rtol=0)
  # The relative term matters here: without it the weights are far from the model's.
  assert np.max(np.abs(weights - _softmax(content, _KEY_MASK))) > 1e-3


def _layer_norm(x, params):
  mean = x.mean(-1, keepdims=True)
  variance = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(variance + 1e-5) * params["scale"] + params["offset"]


def _layer_from_weights(params, layer, x, weights):
  """A post-LN block's output from its input x [B, T, M] and attention weights [B, H, Tq, T]:
  (weights @ v) W_o, layer norm, feed-forward, layer norm (the last Tq rows of x)."""
  p = lambda name: params[f"encoder/{name}_{layer}"]  # pylint: disable=unnecessary-lambda-assignment
  batch, length, _ = x.shape
  heads, num_queries = weights.shape[1], weights.shape[2]
  v = (x @ params[f"encoder/attention_{layer}/value"]["w"]).reshape(batch, length, heads, -1)
  attended = np.einsum("bhts,bshd->bthd", weights, v).reshape(batch, num_queries, -1)
  u = _layer_norm(x[:, length - num_queries:]
                  + attended @ params[f"encoder/attention_{layer}/output"]["w"],
                  p("attention_norm"))
  hidden = np.maximum(u @ p("ffn_in")["w"] + p("ffn_in")["b"], 0.0)
  return _layer_norm(u + hidden @ p("ffn_out")["w"] + p("ffn_out")["b"], p("ffn_norm"))


@pytest.mark.parametrize("pe, settings", [
    ("alibi", dict(log_n_scaling=True, log_n_reference=4, log_n_scale_bias=True)),
    ("randomized_relative", dict(compat="release")),  # Positions drawn per layer.
    ("randomized_geometric", {}),  # Its own normalisation; its scorer reads the input.
    ("rope", {}),
])
def test_returned_weights_are_the_ones_the_layers_applied(pe, settings):
  """Every layer's returned output equals the block recomputed (float64) from its input and
  the returned attention weights: the weights are the ones the model applied, whatever the
  family computes. Rows sum to 1 over the unmasked keys; the logits are unchanged."""
  config = dataclasses.replace(_tiny_encoder(pe, **settings).config, num_layers=2)
  model = rpe.EncoderModel(config, output_size=2)
  params, _, plain, logits, inner = _returned(model, _TOKENS, _KEY_MASK)
  np.testing.assert_allclose(logits, plain, atol=1e-6, rtol=0)
  assert len(inner.attention) == len(inner.layers) == 2
  x = inner.embeddings
  for layer, (weights, output) in enumerate(zip(inner.attention, inner.layers)):
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    assert np.all(weights[np.broadcast_to(~_KEY_MASK[:, None, None, :], weights.shape)] == 0.0)
    np.testing.assert_allclose(_layer_from_weights(params, layer, x, weights), output,
                               atol=2e-5, rtol=0)
    x = output
  # Other weights do not pass: uniform attention over the unmasked keys.
  uniform = np.broadcast_to(_KEY_MASK[:, None, None, :] / _KEY_MASK.sum(-1)[:, None, None, None],
                            inner.attention[0].shape)
  assert np.max(np.abs(_layer_from_weights(params, 0, inner.embeddings, uniform)
                       - inner.layers[0])) > 1e-3


def test_intermediates_with_num_outputs_are_the_last_rows():
  """With num_outputs the last layer computes its last rows only: its weights and output are
  those rows of the full pass (the other layers are the full pass's)."""
  config = dataclasses.replace(_tiny_encoder("relative").config, num_layers=2)
  model = rpe.EncoderModel(config, output_size=2)

  @jax.jit
  def run(key):
    params = model.init(key, _TOKENS)
    full = model.apply(params, None, _TOKENS, intermediates=True)
    last = model.apply(params, None, _TOKENS, num_outputs=3, intermediates=True)
    return full, last

  (full_logits, full), (logits, last) = jax.device_get(run(jax.random.PRNGKey(2)))
  np.testing.assert_allclose(logits, full_logits[:, -3:], atol=1e-6)
  assert last.attention[1].shape == (3, 2, 3, 7) and last.layers[1].shape == (3, 3, 16)
  np.testing.assert_allclose(last.attention[1], full.attention[1][:, :, -3:], atol=1e-6)
  np.testing.assert_allclose(last.layers[1], full.layers[1][:, -3:], atol=1e-5)
  np.testing.assert_allclose(last.attention[0], full.attention[0], atol=1e-6)


# --------------------------------------------------------------------------
# PCA.


def test_pca_is_fitted_on_training_activations_only():
  rng = np.random.default_rng(0)
  inside = rng.normal(size=(200, 8)) * np.array([5, 3, 1, 1, 1, 1, 1, 1]) + 2.0
  near = rng.normal(size=(300, 8)) * np.array([5, 3, 1, 1, 1, 1, 1, 1]) + 2.0
  far = near + 40.0 * np.eye(8)[5]  # Off the training cloud, along a low-variance axis.
  fit_a, numbers_near, (inside_a, near_proj) = attention_lib.pca_numbers(inside, near)
  fit_b, numbers_far, (inside_b, _) = attention_lib.pca_numbers(inside, far)
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
  assert not os.path.exists(os.path.join(tiny_run, attention_lib.OUT_FOLDER))


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
