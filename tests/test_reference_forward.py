"""Forward passes against direct NumPy references written from the definitions (issue #30).

Two references, each in float64 from the formulas alone (no library function of
randomized_pe is called to build them, only its parameters are read):

1. The whole Ito model (randomized_pe.models.ito) at 2 layers: embedding, the position
   term at the input of every block, one attention variant per encoding (Shaw's relative
   logits, RoPE, the causal masks, c_nope's x100), post-layer-norm residuals, the MLP with
   the exact erf GELU after both linear layers, the read-out. Evaluation mode, so no
   dropout. The weights are the Haiku init's, with the MLP's multiplied by MLP_SPREAD so
   that GELU sees inputs where exact and tanh GELU differ most. Tolerance:
   max |model - reference| <= 1e-5 * max |reference| (float32 model; measured 2e-7 to
   5e-7). A copy of the model with the tanh-approximate GELU swapped in (monkeypatch)
   must miss by over 10x the tolerance (measured ~2.6e-4): the test would notice the swap.

2. The paper encoder's relative (Transformer-XL) score, the `relative` family's scorer,
   against ((q + u).k + (q + v).W^T r(p_j - p_i)) / sqrt(D) with distinct random u
   (content bias) and v (position bias), for classic and randomized positions (and the
   release's offset tables), by both contraction orders (pairwise, factorized). Measured
   ~6e-8 relative; the reference with u and v exchanged, and the scorer fed exchanged
   parameters, miss by ~0.4-0.7 (checked: > 100x the tolerance).

Forward passes run eagerly (no jit), as tests/test_ito_model.py's: the monkeypatched
GELU is then certainly the one that runs.
"""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from randomized_pe import families
from randomized_pe.models import encoder as model_lib
from randomized_pe.models import ito

RTOL = 1e-5  # Of the largest reference value; the model runs in float32.
MAX_TIMESCALE = 10_000.0

# --------------------------------------------------------------------------
# 1. The Ito model.

TINY_ITO = dict(d_model=16, mlp_size=32, num_layers=2)
BATCH = 3


def _w(params, module):
  return {name: np.asarray(value, np.float64) for name, value in params[module].items()}


def _layer_norm(x, scale, offset, eps=1e-5):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + offset


def _gelu(x):
  """Exact GELU: x * Phi(x) = x / 2 * (1 + erf(x / sqrt(2)))."""
  return 0.5 * x * (1.0 + special.erf(x / math.sqrt(2.0)))


def _softmax(logits):
  shifted = logits - logits.max(-1, keepdims=True)
  e = np.exp(shifted)
  return e / e.sum(-1, keepdims=True)


def _interleaved(angles):
  """[T, K] angles -> [T, 2K] features: sin a_0, cos a_0, sin a_1, cos a_1, ..."""
  out = np.empty((angles.shape[0], 2 * angles.shape[1]))
  out[:, 0::2], out[:, 1::2] = np.sin(angles), np.cos(angles)
  return out


def _frequencies(dim):
  """w_i = max_timescale^(-2i / dim), i < dim / 2."""
  return MAX_TIMESCALE ** (-np.arange(0, dim, 2) / dim)


def _position_term(pe, positions, block, d_model):
  """The additive term of one block [T, M] (None for the attention encodings)."""
  if pe == "1d_fixed":  # PE[t, 2i] = sin(p_t w_i), PE[t, 2i + 1] = cos(p_t w_i).
    return _interleaved(positions[:, None] * _frequencies(d_model))
  if pe in ("2d_fixed", "randomized_2d"):  # Column in the first half, row in the second.
    w = _frequencies(d_model // 2)
    return np.concatenate([_interleaved(positions[:, 0, None] * w),
                           _interleaved(positions[:, 1, None] * w)], axis=-1)
  if pe in ("learn", "random"):
    return block["table"]
  return None


def _rope(x, positions):
  """x [B, T, H, D]: pairs (2m, 2m + 1) rotated by p_t w_m, w_m = max_timescale^(-2m/D)."""
  angles = positions[:, None] * _frequencies(x.shape[-1])  # [T, D/2]
  cos, sin = np.cos(angles)[None, :, None], np.sin(angles)[None, :, None]
  even, odd = x[..., 0::2], x[..., 1::2]
  out = np.empty_like(x)
  out[..., 0::2], out[..., 1::2] = even * cos - odd * sin, odd * cos + even * sin
  return out


def _attention(pe, x, positions, params, prefix, config):
  """One block's attention of encoding `pe`, x [B, T, M] -> [B, T, M]."""
  batch, length, width = x.shape
  heads = config.num_heads
  size = width // heads
  if pe == "relative":  # Three Linear(M, M) with bias, no output projection.
    q, k, v = (x @ _w(params, f"{prefix}/{n}")["w"] + _w(params, f"{prefix}/{n}")["b"]
               for n in ("query", "key", "value"))
  else:  # One packed [M, 3M] projection; biases except for rope and c_nope.
    qkv = _w(params, f"{prefix}/qkv")
    y = x @ qkv["w"] + qkv.get("b", 0.0)
    q, k, v = y[..., :width], y[..., width:2 * width], y[..., 2 * width:]
  q, k, v = (a.reshape(batch, length, heads, size) for a in (q, k, v))
  if pe == "rope":
    q, k = _rope(q, positions), _rope(k, positions)
  logits = np.einsum("bthd,bshd->bhts", q, k)
  if pe == "relative":  # Shaw: + q_i . E[T - 1 + j - i], one table shared by the heads.
    table = _w(params, prefix)["distance_table"]  # [R, D]
    for i in range(length):
      for j in range(length):
        row = min(length - 1 + j - i, table.shape[0] - 1)
        logits[:, :, i, j] += np.einsum("bhd,d->bh", q[:, i], table[row])
  logits = logits / math.sqrt(size)
  if pe == "c_nope":
    logits = logits * config.c_nope_logit_scale
  if pe == "c_nope" or (pe == "relative" and config.relative_causal):
    later = np.triu(np.ones((length, length), bool), 1)  # Key j > query i.
    logits = np.where(later, -np.inf, logits)
  out = np.einsum("bhts,bshd->bthd", _softmax(logits), v).reshape(batch, length, width)
  if pe in ("rope", "c_nope"):
    return out @ _w(params, f"{prefix}/output")["w"]
  if pe != "relative":
    output = _w(params, f"{prefix}/output")
    return out @ output["w"] + output["b"]
  return out


def ito_reference(config: ito.ItoConfig, params, tokens, positions):
  """Logits [B, T, C] of Ito's Transformer in float64, from the definitions."""
  pe = config.pe
  tokens = np.asarray(tokens)
  positions = np.asarray(positions, np.float64)
  embed = _w(params, "ito/embed")
  # Symbol s >= 1 is one-hot channel s - 1 of a Linear(V - 1, M); a blank is the bias.
  onehot = np.eye(config.vocab_size)[tokens][..., 1:]
  h = onehot @ embed["w"] + embed["b"]
  for layer in range(config.num_layers):
    prefix = f"ito/block_{layer}"
    term = _position_term(pe, positions, params.get(prefix, {}), config.d_model)
    e = h if term is None else h + np.asarray(term, np.float64)[None]
    a = _attention(pe, e, positions, params, f"{prefix}/attention", config)
    norm = _w(params, f"{prefix}/attention_norm")
    u = _layer_norm(a + e, norm["scale"], norm["offset"])
    mlp_in, mlp_out = _w(params, f"{prefix}/mlp_in"), _w(params, f"{prefix}/mlp_out")
    f = _gelu(u @ mlp_in["w"] + mlp_in["b"])
    f = _gelu(f @ mlp_out["w"] + mlp_out["b"])
    norm = _w(params, f"{prefix}/mlp_norm")
    h = _layer_norm(f + u, norm["scale"], norm["offset"])
  out = _w(params, "ito/logits")
  return h @ out["w"] + out["b"]


def _relative_error(got, want):
  return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


MLP_SPREAD = 4.0


def _spread_mlp(params):
  """The MLP weights times MLP_SPREAD: PyTorch's init gives GELU inputs of std ~0.6, where
  the tanh approximation is off by ~1e-5 only; spread to std ~2.3 they reach |x| ~ 3,
  where it is off by up to 4.7e-4 (its largest error, at x = 2.7)."""
  return {module: {name: value * MLP_SPREAD if module.endswith(("mlp_in", "mlp_out"))
                   and name == "w" else value for name, value in values.items()}
          for module, values in params.items()}


def _ito_case(pe, num_heads=1, seed=0):
  """(config, model, params, tokens, positions) of a tiny Ito model."""
  config = ito.ItoConfig(pe=pe, num_heads=num_heads, **TINY_ITO)
  model = ito.ItoModel(config, 4)
  tokens = jax.random.randint(jax.random.PRNGKey(seed + 100), (BATCH, config.num_cells), 0,
                              config.vocab_size)
  params = _spread_mlp(model.init(jax.random.PRNGKey(seed), tokens))
  positions = config.sample_positions(jax.random.PRNGKey(seed + 200))  # Sampled for randomized_2d.
  return config, model, params, tokens, positions


@pytest.mark.parametrize("pe,num_heads", [(pe, 1) for pe in ito.names()]
                         + [("relative", 2), ("rope", 2), ("2d_fixed", 2)])
def test_ito_model_equals_the_numpy_reference(pe, num_heads):
  config, model, params, tokens, positions = _ito_case(pe, num_heads)
  got = model.apply(params, jax.random.PRNGKey(1), tokens, positions)
  want = ito_reference(config, params, tokens, positions)
  assert got.shape == want.shape == (BATCH, 16, 4)
  assert _relative_error(got, want) <= RTOL, _relative_error(got, want)


@pytest.mark.parametrize("pe", ["2d_fixed", "relative"])
def test_reference_catches_the_tanh_gelu(pe, monkeypatch):
  # The test above would notice the exact GELU replaced by its tanh approximation: the
  # model with that swap misses the reference by far more than the tolerance.
  config, model, params, tokens, positions = _ito_case(pe)
  want = ito_reference(config, params, tokens, positions)
  exact_error = _relative_error(model.apply(params, None, tokens, positions), want)
  gelu = jax.nn.gelu
  monkeypatch.setattr(jax.nn, "gelu", lambda x, approximate=True: gelu(x, approximate=True))
  tanh_error = _relative_error(model.apply(params, None, tokens, positions), want)
  assert exact_error <= RTOL < tanh_error / 10, (exact_error, tanh_error)


def test_reference_catches_a_missing_causal_mask_and_scale():
  # The reference itself is not vacuous: reading the relative model as bidirectional, or
  # c_nope without its x100, misses the model's output.
  for pe, change in [("relative", dict(relative_causal=False)),
                     ("c_nope", dict(c_nope_logit_scale=1.0))]:
    config, model, params, tokens, positions = _ito_case(pe)
    got = model.apply(params, None, tokens, positions)
    wrong = ito_reference(dataclasses.replace(config, **change), params, tokens, positions)
    assert _relative_error(got, wrong) > 100 * RTOL, pe


# --------------------------------------------------------------------------
# 2. The paper encoder's relative score (the `relative` family, Transformer-XL).


def _sinusoid(x, dim):
  """sin/cos of positions x [...] -> [..., dim]: sines in the first half, then cosines."""
  angles = np.asarray(x, np.float64)[..., None] * _frequencies(dim)
  return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)


def relative_reference(q, k, u, v, kernel, distances):
  """((q_i + u).k_j + (q_i + v).W^T r_ij) / sqrt(D) in float64: [B, H, Tq, T].

  q [B, Tq, H, D], k [B, T, H, D], u and v [H, D], kernel W [R, H * D] (the family's
  storage), distances [Tq, T]: the value whose sinusoid r_ij (R features) is read.
  """
  q, k, u, v = (np.asarray(a, np.float64) for a in (q, k, u, v))
  heads, size = u.shape
  kernel = np.asarray(kernel, np.float64).reshape(-1, heads, size)  # [R, H, D]
  r = _sinusoid(distances, kernel.shape[0])  # [Tq, T, R]
  content = np.einsum("bihd,bjhd->bhij", q + u, k)
  position = np.einsum("bihd,ijr,rhd->bhij", q + v, r, kernel)
  return (content + position) / math.sqrt(size)


def _release_offset_value(d, table, max_position, clamped):
  """The release's sinusoid input for offset d = j - i (docs/release.md, items 1 and 5)."""
  value = np.sign(d) * table[abs(d)]
  return np.clip(max_position + value, 0, max_position - 1) if clamped else value


CASES = [  # (encoding, compat, Tq or None for all)
    ("relative", "paper", None), ("randomized_relative", "paper", None),
    ("randomized_relative", "paper", 3), ("relative", "release", None),
    ("randomized_relative", "release", None),
]


def _relative_case(pe, compat, num_queries, seed=0):
  """(scorer output [B, H, Tq, T], q, k, params, distances [Tq, T])."""
  config = model_lib.EncoderConfig(vocab_size=5, pe=pe, compat=compat, num_layers=1,
                                   num_heads=2, d_model=16, max_position=64)
  length, batch = 7, 4  # Batch 4: the "auto" order is pairwise (enc.use_pairwise).
  family, ctx = config.family, config.context
  positions = config.sample_positions(jax.random.PRNGKey(seed + 1), length)
  if positions.ndim == 2:  # The release's per-layer draws (item 2): one layer's row.
    positions = positions[0]
  keys = jax.random.split(jax.random.PRNGKey(seed), 5)
  specs = family.params(ctx)
  params = {name: spec.init(key, spec.shape, jnp.float32)
            for key, (name, spec) in zip(keys, specs.items())}
  # Distinct biases of the size of the queries (the initial N(0, 0.02^2) would hide them).
  params["content_bias"] = jax.random.normal(keys[3], specs["content_bias"].shape)
  params["relative_bias"] = jax.random.normal(keys[4], specs["relative_bias"].shape)
  num_queries = num_queries or length
  query_start = length - num_queries
  q = jax.random.normal(jax.random.PRNGKey(seed + 2),
                        (batch, num_queries, config.num_heads, config.head_size))
  k = jax.random.normal(jax.random.PRNGKey(seed + 3),
                        (batch, length, config.num_heads, config.head_size))
  rows = np.arange(query_start, length)
  if compat == "paper":  # r_ij = sinusoid(p_j - p_i).
    p = np.asarray(positions, np.float64)
    distances = p[None, :] - p[rows, None]
  else:  # The release reads a table |j - i| -> distance (items 1 and 5).
    table = np.asarray(positions)
    clamped = config.train_sampler.name != "arange"
    distances = np.array([[_release_offset_value(j - i, table, config.max_position, clamped)
                           for j in range(length)] for i in rows], np.float64)

  def score(params):
    scorer = family.scorer(positions, params, ctx, q.shape, query_start)
    return np.asarray(scorer(q, k), np.float64)

  return score, q, k, params, distances


@pytest.mark.parametrize("pairwise", [True, False])
@pytest.mark.parametrize("pe,compat,num_queries", CASES)
def test_relative_score_equals_the_transformer_xl_formula(pe, compat, num_queries, pairwise,
                                                          monkeypatch):
  if not pairwise:  # The table-free (factorized or per-offset) path.
    monkeypatch.setattr(families.enc, "PAIRWISE_MAX_ELEMENTS", 0)
  score, q, k, params, distances = _relative_case(pe, compat, num_queries)
  assert families.enc.use_pairwise(*q.shape[:1], k.shape[1], *q.shape[2:], 16) == pairwise
  u, v, kernel = params["content_bias"], params["relative_bias"], params["relative_kernel"]
  assert np.max(np.abs(np.asarray(u - v))) > 0.5  # Distinct biases.
  got = score(params)
  want = relative_reference(q, k, u, v, kernel, distances)
  assert _relative_error(got, want) <= RTOL, _relative_error(got, want)
  # The comparison would notice u and v swapped, in the reference or in the model.
  swapped_reference = relative_reference(q, k, v, u, kernel, distances)
  swapped_model = score({**params, "content_bias": v, "relative_bias": u})
  assert _relative_error(got, swapped_reference) > 100 * RTOL
  assert _relative_error(swapped_model, want) > 100 * RTOL
