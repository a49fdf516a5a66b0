"""Geometric attention with directional encoding (NDR; randomized_pe.geometric, docs/geometric.md).

The weights and the whole attention are checked against a direct, slow implementation of
the definition written here (numpy, float64, loops over queries and keys with the order
by distance spelled out) to 1e-5; then the model: nearest match, padding, query subsets,
chunks, gradients, one training step, the Table 5 config.
"""
import dataclasses
import functools

import haiku as hk
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import randomized_pe as rpe
import tasks
from configs import table5
from experiments.training import data
from experiments.training import steps
from experiments.training import jobs as sweep
from experiments.training import validation
from randomized_pe import attention as attn_lib
from randomized_pe import families
from randomized_pe import geometric
from tests.test_training import tiny_config

TOL = 1e-5  # float32 against the float64 reference, absolute, on weights and outputs.
TINY = dict(num_layers=1, num_heads=2, d_model=16, widening_factor=2, max_position=64)
B, T, H, D, M = 2, 6, 2, 4, 8  # Shapes of the attention-level tests.
POSITIONS = {  # Key positions: ties (arange), gaps (randomized), unsorted, floats.
    "arange": np.arange(T),
    "randomized": np.array([0, 3, 4, 9, 15, 16]),
    "unsorted": np.array([5, 0, 3, 1, 4, 2]),
    "floats": np.array([0.0, 0.5, 1.5, 1.75, 3.0, 4.5], np.float32),
}


def _precedes(k, j, i, positions):
  """Key k comes before key j in query i's order: closer, or as close and later (NDR)."""
  d_k, d_j = abs(positions[k] - positions[i]), abs(positions[j] - positions[i])
  return d_k < d_j or (d_k == d_j and k > j)


def _reference_weights(logits, positions, query_start=0, key_mask=None, normalize=True):
  """A_ij = P_ij prod_{k before j} (1 - P_ik), loops over b, h, i, j, k (float64)."""
  logits = np.asarray(logits, np.float64)
  batch, heads, num_queries, num_keys = logits.shape
  p = 1.0 / (1.0 + np.exp(-logits))
  out = np.zeros_like(p)
  for b in range(batch):
    valid = [key_mask is None or bool(key_mask[b, j]) for j in range(num_keys)]
    for h in range(heads):
      for r in range(num_queries):
        i = query_start + r
        for j in range(num_keys):
          if j == i or not valid[j]:
            continue  # Never the query itself (NDR), never padding.
          weight = p[b, h, r, j]
          for k in range(num_keys):
            if k != i and k != j and valid[k] and _precedes(k, j, i, positions):
              weight *= 1.0 - p[b, h, r, k]
          out[b, h, r, j] = weight
        if normalize:
          out[b, h, r] /= max(out[b, h, r].sum(), 1e-12)
  return out


def _reference_logits(q, k, x, positions, query_start, params):
  """NDR's logits: s <q + c, k> + s_pos (W x + b)[left | right] + s_bias (float64 loops)."""
  q, k, x = (np.asarray(a, np.float64) for a in (q, k, x))
  par = {n: np.asarray(v, np.float64) for n, v in params.items()}
  batch, num_queries, heads, _ = q.shape
  out = np.zeros((batch, heads, num_queries, k.shape[1]))
  for b in range(batch):
    for h in range(heads):
      for r in range(num_queries):
        i = query_start + r
        direction = (x[b, r] @ par["direction_kernel"][:, h] + par["direction_bias"][h])
        direction = direction * par["direction_scale"]
        for j in range(k.shape[1]):
          logit = par["content_scale"] * (q[b, r, h] + par["content_bias"][h]) @ k[b, j, h]
          if positions[j] < positions[i]:
            logit += direction[0]  # A key on the left.
          elif positions[j] > positions[i]:
            logit += direction[1]  # A key on the right.
          out[b, h, r, j] = logit + par["score_bias"]
  return out


def _normal(seed, shape, scale=1.0):
  """Random inputs from numpy (jax.random would compile a program per shape)."""
  return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _ctx(**settings):
  config = rpe.EncoderConfig(vocab_size=3, pe="geometric", num_heads=H, d_model=H * D)
  ctx = config.context
  return dataclasses.replace(ctx, d_model=M, settings={**ctx.settings, **settings})


def _random_params(seed=0):
  return {"content_bias": _normal(seed, (H, D), 0.3),
          "content_scale": jnp.float32(0.7),
          "direction_kernel": _normal(seed + 1, (M, H, 2), 0.5),
          "direction_bias": _normal(seed + 2, (H, 2)),
          "direction_scale": jnp.float32(1.3),
          "score_bias": jnp.float32(-0.4)}


# Every computation below is jitted: one compilation per shape instead of one per
# operation, which keeps this file fast on a busy CPU.


@functools.partial(jax.jit, static_argnames=("query_start", "num_queries", "variants"))
def _weights(logits, positions, key_mask, query_start, num_queries, variants):
  """Geometric weights for each (normalize, masked) of variants (masked: key_mask, else None)."""
  return {(normalize, masked): geometric.weights_fn(positions, query_start, num_queries,
                                                    normalize)(logits, key_mask if masked else None)
          for normalize, masked in variants}


ALL = ((True, True), (True, False), (False, True), (False, False))


@jax.jit
def _family_attention(q, k, v, x, params, positions, key_mask, scale, query_start):
  """The geometric family through attention.attention (query_start traced), and its
  explicit weights."""
  family, ctx = families.get_family("geometric"), _ctx()
  score = family.scorer(positions, params, ctx, q.shape, query_start)
  weights_fn = families.weights_fn(family, positions, params, ctx, q.shape, query_start)
  out = attn_lib.attention(q, k, v, score, key_mask, logit_scale=scale, weights_fn=weights_fn,
                           query_input=x)
  logits = attn_lib.attention_logits(q, k, score, logit_scale=scale, query_input=x)
  return out, attn_lib.attention_weights(logits, key_mask, weights_fn)


# --------------------------------------------------------------------------
# The definition.


@pytest.mark.parametrize("name", list(POSITIONS))
def test_weights_equal_the_loop_definition(name):
  positions = POSITIONS[name]
  logits = _normal(1, (B, H, T, T), 2.0)
  mask = np.ones((B, T), bool)
  mask[1, [1, 4]] = False
  got = _weights(logits, jnp.asarray(positions), jnp.asarray(mask), 0, T, ALL)
  for (normalize, masked), weights in got.items():
    want = _reference_weights(logits, positions, 0, mask if masked else None, normalize)
    np.testing.assert_allclose(weights, want, atol=TOL, err_msg=f"{normalize}, {masked}")
  # A subset of the queries (start 2, 3 queries).
  some = _weights(logits[:, :, 2:5], jnp.asarray(positions), jnp.asarray(mask), 2, 3,
                  ((True, True),))[True, True]
  np.testing.assert_allclose(some, _reference_weights(logits[:, :, 2:5], positions, 2, mask),
                             atol=TOL)
  # A stick-breaking: at most 1 in all; never the query itself.
  assert np.all(np.sum(np.asarray(got[False, True]), -1) <= 1 + 1e-6)
  assert np.all(np.diagonal(np.asarray(got[True, False]), axis1=-2, axis2=-1) == 0)


@pytest.mark.parametrize("name", ["arange", "unsorted"])
def test_family_attention_equals_the_loop_definition(name):
  """Logits (content, directional terms, scales, bias; log-n), weights and output, for a
  subset of the queries (the last layer's case), with padding. (One row per chunk:
  test_padding_query_subsets_and_chunks_leave_the_output_unchanged.)"""
  positions = jnp.asarray(POSITIONS[name])
  q, k, v = (_normal(10 + i, (B, T, H, D)) for i in range(3))
  x = _normal(13, (B, T, M))
  params = _random_params()
  key_mask = jnp.array([[True] * T, [True] * 4 + [False] * 2])
  scale = jnp.array([1.0, 1.5])  # log-n scaling multiplies every logit of the row.
  for query_start in (1, 3):  # Queries 1..3 and 3..5 (keys on both sides, padding).
    qs, xs = q[:, query_start:query_start + 3], x[:, query_start:query_start + 3]
    out, explicit = _family_attention(qs, k, v, xs, params, positions, key_mask, scale,
                                      jnp.int32(query_start))
    logits = _reference_logits(qs, k, xs, np.asarray(positions), query_start, params)
    logits = logits * np.asarray(scale)[:, None, None, None]
    weights = _reference_weights(logits, np.asarray(positions), query_start,
                                 np.asarray(key_mask))
    want = np.einsum("bhts,bshd->bthd", weights, np.asarray(v, np.float64))
    np.testing.assert_allclose(out, want, atol=TOL)
    np.testing.assert_allclose(explicit, weights, atol=TOL)


def test_softmax_families_keep_their_path_and_explicit_weights():
  q, k, v = (_normal(20 + i, (B, T, H, D)) for i in range(3))
  key_mask = jnp.array([[True] * T, [True] * 3 + [False] * 3])
  weights = attn_lib.attention_weights(attn_lib.dot_scores(q, k), key_mask)
  np.testing.assert_allclose(np.sum(weights, -1), 1.0, atol=1e-6)
  assert np.all(np.asarray(weights)[1, :, :, 3:] == 0)
  # Softmax as an explicit weights_fn gives what the default path gives.
  np.testing.assert_allclose(
      attn_lib.attention(q, k, v, key_mask=key_mask, weights_fn=attn_lib.softmax_weights),
      attn_lib.attention(q, k, v, key_mask=key_mask), atol=1e-6)
  assert families.weights_fn(families.get_family("rope"), jnp.arange(T), {}, None, q.shape,
                             0) is attn_lib.softmax_weights


def test_only_attention_families_take_a_normalisation():
  with pytest.raises(ValueError, match="only attention families take a normalize hook"):
    families.Family("broken", "embedding", term=lambda *a: None, normalize=lambda *a: None)
  with pytest.raises(ValueError, match="only attention families take reads_input"):
    families.Family("broken", "none", reads_input=True)


# --------------------------------------------------------------------------
# The model.


@jax.jit
def _one_query(positions, query_index, is_match):
  """(geometric, softmax) weights [S] of query `query_index` over keys equal to it where
  is_match (logit 12 - 6) and orthogonal elsewhere (logit -6); no directional term."""
  family, ctx = families.get_family("geometric"), _ctx()
  params = {name: jnp.zeros(spec.shape) for name, spec in family.params(ctx).items()}
  params.update(content_scale=jnp.float32(1.0), score_bias=jnp.float32(-6.0))
  k = jnp.where(is_match[None, :, None, None], jnp.eye(D)[0], jnp.eye(D)[1])  # [1, S, 1, D]
  k = jnp.broadcast_to(k, (1, T, H, D))
  q = jnp.zeros((1, 1, H, D)).at[..., 0].set(12.0)
  score = family.scorer(positions, params, ctx, q.shape, query_index)
  logits = attn_lib.attention_logits(q, k, score, query_input=jnp.zeros((1, 1, M)))
  weights = families.weights_fn(family, positions, params, ctx, q.shape, query_index)(logits, None)
  return weights[0, 0, 0], attn_lib.attention_weights(logits)[0, 0, 0]


def _matching_scores(positions, query_index, matches):
  is_match = np.zeros(T, bool)
  is_match[matches] = True
  weights, softmax = _one_query(jnp.asarray(positions, jnp.int32), query_index, is_match)
  return np.asarray(weights), np.asarray(softmax)


def test_attends_to_the_nearest_match():
  # Query 3, matches at 4 (distance 1) and 0 (distance 3): the nearer takes the weight.
  weights, softmax = _matching_scores(np.arange(T), 3, [0, 4])
  assert weights[4] > 0.99 and weights[0] < 0.01
  assert abs(softmax[0] - softmax[4]) < 1e-6  # Softmax cannot tell them apart.
  weights, _ = _matching_scores(np.arange(T), 1, [0, 4])
  assert weights[0] > 0.99 and weights[4] < 0.01
  # Two matches at the same distance: the right-hand one, as in NDR's kernel.
  weights, _ = _matching_scores(np.arange(T), 2, [1, 3])
  assert weights[3] > 0.99 and weights[1] < 0.01
  # Randomized positions decide the distance: index 3 is next to the query by index
  # but far by position (2 -> 10), so the match at index 0 (position 0) wins.
  weights, _ = _matching_scores([0, 1, 2, 10, 30, 31], 2, [0, 3])
  assert weights[0] > 0.99 and weights[3] < 0.01
  # The query's own key is never attended, even when it matches best.
  weights, _ = _matching_scores(np.arange(T), 2, [2, 5])
  assert weights[2] == 0 and weights[5] > 0.99


# The model tests share one set of parameters: every geometric encoder of these sizes has
# the same (compat, log-n, dropout and the sampler do not change them), with
# reverse_string's vocabulary and outputs (the task of tiny_config). Random values from
# numpy on the initialiser's shapes: no program to compile (test_model.py checks the init).
VOCAB, OUTPUTS = 3, 2


def _config(pe="randomized_geometric", **overrides):
  return rpe.EncoderConfig(vocab_size=VOCAB, pe=pe, **{**TINY, **overrides})


@functools.lru_cache(maxsize=None)
def _params():
  model = rpe.make_encoder(_config(), OUTPUTS)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 2), jnp.int32))
  rng = np.random.default_rng(0)
  return jax.tree_util.tree_map(
      lambda s: jnp.asarray(0.4 * rng.standard_normal(s.shape), s.dtype), shapes)


def _tokens(length=T):
  return jnp.asarray(np.random.default_rng(7).integers(0, VOCAB, (B, length)), jnp.int32)


def test_padding_query_subsets_and_chunks_leave_the_output_unchanged():
  config = _config(dropout_rate=0.0)
  model = rpe.make_encoder(config, OUTPUTS)
  chunked = rpe.make_encoder(dataclasses.replace(config, attention_chunk_rows=1), OUTPUTS)
  length = 4
  key_mask = jnp.broadcast_to(jnp.arange(T) < length, (B, T))

  @jax.jit
  def outputs(params, tokens, key):
    # Randomized positions drawn for the true length, padded (the sampler's contract).
    positions = config.sample_positions(key, length, padded_length=T)
    return (model.apply(params, None, tokens[:, :length], positions[:length]),
            model.apply(params, None, tokens, positions, key_mask=key_mask),
            # The last layer's query subset (traced start), as training computes it.
            model.apply(params, None, tokens, positions, key_mask=key_mask, num_outputs=2,
                        outputs_from=jnp.int32(1)),
            chunked.apply(params, None, tokens, positions, key_mask=key_mask))

  want, padded, some, by_rows = outputs(_params(), _tokens(), jax.random.PRNGKey(5))
  np.testing.assert_allclose(padded[:, :length], want, atol=TOL)
  np.testing.assert_allclose(some, padded[:, 1:3], atol=TOL)
  np.testing.assert_allclose(by_rows, padded, atol=TOL)  # One batch row per chunk (CPU path).


def test_multi_head_attention_returns_its_weights():
  config = _config()
  net = hk.transform(lambda x: rpe.MultiHeadAttention(config, name="attention_0")(
      x, jnp.arange(T), return_weights=True))
  params = {name[len("encoder/"):]: value for name, value in _params().items()
            if name.startswith("encoder/attention_0")}  # The encoder's first layer.
  x = _normal(30, (B, T, TINY["d_model"]))
  out, weights = jax.jit(net.apply)(params, None, x)
  assert out.shape == (B, T, TINY["d_model"]) and weights.shape == (B, 2, T, T)
  np.testing.assert_allclose(np.sum(weights, -1), 1.0, atol=1e-5)  # NDR's normalisation.
  assert np.all(np.diagonal(np.asarray(weights), axis1=-2, axis2=-1) == 0)


# --------------------------------------------------------------------------
# Training and the Table 5 config.


def test_one_training_step_with_finite_gradients_from_a_config():
  """The loop's training step (experiments.training.steps.make_train_step: jax.value_and_grad of
  the loss, clipping, Adam) on a tiny config: randomized_geometric with compat="release"
  (dropout), log-n scaling and a padded batch (max_programs=1: masked keys)."""
  config = tiny_config(steps=1, max_programs=1)
  config.model.update(pe="randomized_geometric", compat="release", log_n_scaling=True)
  validation.validate(config)
  source = data.source(config)
  model = steps.build_model(config, source.task)
  assert (model.config.vocab_size, model.output_size) == (VOCAB, OUTPUTS)
  assert model.config.log_n_reference == 6  # The longest training sequence.
  c = model.config  # One position draw per batch, shared by the layers (no release item 2).
  assert c.behaviour.per_layer_positions and not families.draws_per_layer(
      c.family, c.train_sampler, c.behaviour)
  optimizer = steps.optimizer_for(model, config)
  params = _params()
  state = steps.TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32),
                           jnp.zeros((), bool))
  batch = next(b for b in map(source.batch, range(20))  # A padded one: keys masked.
               if b["sequence_length"][0] < b["tokens"].shape[1])
  state, metrics = jax.jit(steps.make_train_step(model, optimizer, 0))(state, batch)
  # Finite loss and updates: `nonfinite` is set by a non-finite loss or update norm, which
  # any non-finite gradient gives (clipping by the global norm, then Adam).
  assert np.isfinite(float(metrics["loss"])) and not bool(state.nonfinite)
  before = params["encoder/attention_0"]
  moved = {name: bool(np.any(np.asarray(value) != np.asarray(before[name])))
           for name, value in state.params["encoder/attention_0"].items()}
  assert set(moved) == {"content_bias", "content_scale", "direction_kernel", "direction_bias",
                        "direction_scale", "score_bias"}
  assert all(moved.values()), moved  # Adam moves exactly the parameters with a gradient.
  assert int(state.step) == 1
  # Per-axis positions have no order by distance: refused, naming the encoding.
  per_axis = jnp.zeros((3, 2), jnp.int32)
  with pytest.raises(ValueError, match="must have shape .* for pe='randomized_geometric'"):
    model.apply(params, None, jnp.zeros((1, 3), jnp.int32), per_axis)


@pytest.mark.parametrize("scale", ["full", "small"])
def test_table5_config_resolves_and_its_model_builds(scale, tmp_path):
  config = table5.get_config(f"scale={scale}")
  jobs = sweep.make_jobs(config, str(tmp_path / "sweep"))  # Validates every job.
  encodings = table5.ENCODINGS + (table5.SMALL_BASELINES if scale == "small" else ())
  assert len(jobs) == len(config.sweep.tasks) * len(encodings)
  assert {job.pe for job in jobs} == set(encodings)
  assert config.model.compat == "release"
  if scale == "full":
    assert len(config.sweep.tasks) == 15 and config.training.steps == 2_000_000
    return
  job = next(j for j in jobs if j.pe == "randomized_geometric")
  job_config = ml_collections.ConfigDict(job.config)
  validation.validate(job_config)
  model = steps.build_model(job_config, tasks.get(job.task))
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
  assert shapes["encoder/attention_1"]["direction_kernel"].shape == (32, 4, 2)
  with pytest.raises(ValueError, match="unknown scale 'huge'; valid choices: full, small"):
    table5.get_config("scale=huge")
