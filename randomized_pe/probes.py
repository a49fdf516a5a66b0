"""What a trained model attends to and where its activations lie (pure JAX/numpy, no Haiku).

The pieces of `python -m experiments.analyze` (docs/analyze.md) that do not depend on a
framework:

  attention_weights(x, weights, family, ctx, positions, ...)
      one layer's attention weights rebuilt from its input and parameters, the way
      `randomized_pe.models.encoder.MultiHeadAttention` computes them (the family's
      scorer and bias, `attention.attention_logits`, a softmax over the unmasked keys or
      the family's own normalisation, `families.weights_fn`),
      and the layer's output from them, to check against the output the model produced
  attention_stats(weights, expected_source)
      numbers a picture of attention claims: the mass on the key each query should read
      (for reverse_string the anti-diagonal of the output-to-input block), the entropy and
      the mean attended distance, per head
  fit_pca / project / cloud_distances
      a 2-D PCA fitted on training-range activations only, and how far other activations
      lie from that training cloud

A family that sets a `Family` field this module does not know (a new way to compute
attention) is refused by `check_softmax` with one line naming the supported ones.

Shapes: B batch, T queries, S keys, H heads, D head size, M d_model, N points.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from randomized_pe import attention as attn_lib
from randomized_pe import families as families_lib

# The fields a Family had when this module was written: their meaning is known here. Any
# other field that a family sets away from its default (a hook of its own normalisation,
# say) may change how attention weights arise, which this module cannot know.
_KNOWN_FAMILY_FIELDS = frozenset({
    "name", "acts", "term", "scorer", "bias", "params", "settings", "floats", "per_axis",
    "randomized_twin", "release_offsets", "release_per_layer", "description", "normalize",
    "reads_input"})
# Values of an unknown field that mean "a softmax, as before".
_SOFTMAX_VALUES = (None, "softmax")


def unsupported_fields(family: families_lib.Family) -> dict[str, Any]:
  """{field: value} of the fields this module does not know that `family` sets.

  A field at its declared default, None, or "softmax" counts as not set.
  """
  out = {}
  for field in dataclasses.fields(family):
    if field.name in _KNOWN_FAMILY_FIELDS:
      continue
    value = getattr(family, field.name)
    default = (field.default if field.default is not dataclasses.MISSING
               else field.default_factory() if field.default_factory is not dataclasses.MISSING
               else dataclasses.MISSING)
    if isinstance(value, str) or value is None:
      if value in _SOFTMAX_VALUES:
        continue
    if default is not dataclasses.MISSING:
      try:
        if value is default or value == default:
          continue
      except Exception:  # pylint: disable=broad-except  (arrays compare elementwise)
        pass
    out[field.name] = value
  return out


def supported_families() -> tuple[str, ...]:
  """Registered families whose attention weights are a softmax of their logits."""
  return tuple(f.name for f in families_lib.FAMILIES if not unsupported_fields(f))


def check_softmax(family: families_lib.Family) -> None:
  """Raises a one-line ValueError if `family` normalises attention other than by a softmax."""
  fields = unsupported_fields(family)
  if fields:
    what = ", ".join(f"{k}={getattr(v, '__name__', v)}" for k, v in fields.items())
    raise ValueError(
        f"cannot rebuild the attention weights of family {family.name!r}: it sets {what}, "
        f"which the softmax rebuild does not apply (a normalisation or scorer input of its "
        f"own); supported families: {', '.join(supported_families())}")


class LayerWeights(NamedTuple):
  """One attention layer's parameters.

  query, key, value: [M, H * D]; output: [H * D, M]; family: the family's own
  parameters (`Family.params`), e.g. the relative kernel and biases ({} for none).
  """

  query: jax.Array
  key: jax.Array
  value: jax.Array
  output: jax.Array
  family: Mapping[str, jax.Array]


def attention_weights(x: jax.Array, weights: LayerWeights, family: families_lib.Family,
                      ctx: families_lib.Context, positions: jax.Array, *,
                      key_mask: Optional[jax.Array] = None,
                      logit_scale: Optional[jax.Array] = None, scale_bias: bool = False,
                      num_queries: Optional[int] = None, query_start=None):
  """One layer's attention weights and output, as the encoder's MultiHeadAttention computes them.

  Args:
    x: [B, S, M] the layer's input (every position answers as a key).
    weights: the layer's parameters.
    family: the encoding family (its scorer and bias give the logits of attention families;
      other families attend by scaled dot products).
    ctx: the family's context (`EncoderConfig.context`).
    positions: the positions the layer saw ([S], or [S, k] per axis).
    key_mask: optional bool [B, S]; False keys get no weight.
    logit_scale, scale_bias: log-n scaling as in `attention.attention_logits`.
    num_queries, query_start: only these query rows (default all S, from 0).

  Returns:
    (weights [B, H, T, S] summing to 1 over the unmasked keys,
     output [B, T, M] = (weights @ v) projected by the output weights).

  Raises:
    ValueError: a family with a normalisation of its own (`check_softmax`).
  """
  check_softmax(family)  # Fields added to Family since this was written must be known.
  batch, length, _ = x.shape
  num_queries = length if num_queries is None else num_queries
  query_start = length - num_queries if query_start is None else query_start
  heads, head_size = ctx.num_heads, ctx.head_size
  q = families_lib.query_rows(x, query_start, num_queries, axis=1) @ weights.query
  k, v = x @ weights.key, x @ weights.value
  q, k, v = (y.reshape(batch, y.shape[1], heads, head_size) for y in (q, k, v))  # [B, ., H, D]
  score, bias, weights_fn, query_input = attn_lib.dot_scores, None, None, None
  if family.acts == "attention":
    params = dict(weights.family)
    score = family.scorer(positions, params, ctx, q.shape, query_start)
    if family.bias is not None:
      bias = family.bias(positions, params, ctx, q.shape, query_start)
    # A softmax unless the family normalises on its own (geometric attention).
    weights_fn = families_lib.weights_fn(family, positions, params, ctx, q.shape, query_start)
    if family.reads_input:  # The scorer also reads the layer input at the query rows.
      query_input = families_lib.query_rows(x, query_start, num_queries, axis=1)
  logits = attn_lib.attention_logits(q, k, score, bias, logit_scale, scale_bias,
                                     query_input=query_input)  # [B, H, T, S]
  probabilities = attn_lib.attention_weights(logits, key_mask, weights_fn)
  out = jnp.einsum("bhts,bshd->bthd", probabilities, v).reshape(batch, num_queries,
                                                                  heads * head_size)
  return probabilities, out @ weights.output


def attention_stats(weights: jax.Array, expected_source=None, query_mask=None,
                    query_offset: int = 0) -> dict[str, jax.Array]:
  """Per-head numbers of attention weights [B, H, T, S] (rows summing to 1), averaged over
  the batch and the query rows (traceable: the arguments may be traced).

  Args:
    weights: attention weights of query rows query_offset .. query_offset + T - 1.
    expected_source: optional int [T]: the key each query row should read, -1 where the
      task says nothing (for reverse_string the outputs' mirror inputs: the anti-diagonal
      of the output-to-input block).
    query_mask: optional bool [T]: the rows to average over (False: padding); default all.
    query_offset: the token index of the first query row (distances are between token
      indices, not sampled positions).

  Returns:
    {"entropy": [H] mean over queries of -sum_s w log w (nats),
     "mean_distance": [H] mean over queries of sum_s w |t - s| (tokens),
     "expected_source_mass": [H] (with expected_source) mean over the queries with a source
       of the weight on it: the fraction of their attention mass there; 0 if no row has one}.
  """
  weights = jnp.asarray(weights)
  batch, _, num_queries, num_keys = weights.shape
  valid = (jnp.ones((num_queries,), bool) if query_mask is None
           else jnp.asarray(query_mask, bool))

  def mean_over_rows(values, rows):  # values [B, H, T], rows bool [T] -> [H]
    count = batch * jnp.maximum(jnp.sum(rows), 1)
    return jnp.sum(jnp.where(rows[None, None, :], values, 0.0), axis=(0, 2)) / count

  logs = jnp.log(jnp.where(weights > 0, weights, 1.0))  # 0 log 0 = 0.
  out = {"entropy": mean_over_rows(-jnp.sum(weights * logs, axis=-1), valid)}
  rows = query_offset + jnp.arange(num_queries)
  distance = jnp.abs(rows[:, None] - jnp.arange(num_keys)[None, :]).astype(weights.dtype)
  out["mean_distance"] = mean_over_rows(jnp.sum(weights * distance, axis=-1), valid)
  if expected_source is not None:
    source = jnp.asarray(expected_source, jnp.int32)
    if source.shape != (num_queries,):
      raise ValueError(f"expected_source must have shape [{num_queries}], got {source.shape}")
    index = jnp.broadcast_to(jnp.maximum(source, 0)[None, None, :, None],
                             (*weights.shape[:3], 1))
    picked = jnp.take_along_axis(weights, index, axis=-1)[..., 0]  # [B, H, T]
    out["expected_source_mass"] = mean_over_rows(picked, valid & (source >= 0))
  return out


# --------------------------------------------------------------------------
# PCA of activations (numpy).


class PCA(NamedTuple):
  """A PCA fit: mean [M], components [k, M] (orthonormal rows), explained variance [k]
  and its ratio to the total variance [k]."""

  mean: np.ndarray
  components: np.ndarray
  explained_variance: np.ndarray
  explained_variance_ratio: np.ndarray


def fit_pca(points: np.ndarray, num_components: int = 2) -> PCA:
  """Non-whitened PCA of points [N, M] by SVD (float64).

  The sign of each component is fixed (its largest-magnitude coordinate positive), so
  the same points give the same fit. Components beyond the rank of the centred points
  have zero variance.
  """
  points = np.asarray(points, np.float64)
  if points.ndim != 2 or len(points) < 1:
    raise ValueError(f"fit_pca needs points [N, M] with N >= 1, got shape {points.shape}")
  mean = points.mean(axis=0)
  _, singular, vt = np.linalg.svd(points - mean, full_matrices=False)
  k = num_components
  components = np.zeros((k, points.shape[1]))
  variance = np.zeros(k)
  available = min(k, len(singular))
  components[:available] = vt[:available]
  variance[:available] = singular[:available] ** 2 / max(len(points) - 1, 1)
  signs = np.sign(components[np.arange(k), np.argmax(np.abs(components), axis=1)])
  components *= np.where(signs == 0, 1.0, signs)[:, None]
  total = np.sum(singular ** 2) / max(len(points) - 1, 1)
  ratio = variance / total if total > 0 else np.zeros(k)
  return PCA(mean, components, variance, ratio)


def project(pca: PCA, points: np.ndarray) -> np.ndarray:
  """points [N, M] in the fitted components: [N, k]."""
  return (np.asarray(points, np.float64) - pca.mean) @ pca.components.T


def _nearest_distances(points: np.ndarray, reference: np.ndarray, chunk: int = 2048):
  """Distance of every point [N, M] to its nearest reference point [R, M]: [N]."""
  ref_sq = np.sum(reference ** 2, axis=1)
  out = np.empty(len(points))
  for start in range(0, len(points), chunk):
    part = points[start:start + chunk]
    sq = np.sum(part ** 2, axis=1)[:, None] - 2 * part @ reference.T + ref_sq[None, :]
    out[start:start + chunk] = np.sqrt(np.maximum(sq.min(axis=1), 0.0))
  return out


def cloud_distances(train: np.ndarray, other: np.ndarray, pca: Optional[PCA] = None) -> dict:
  """How far `other` points [N, M] lie from the `train` cloud [R, M], relative to its spread.

  Returns:
    {"spread": sqrt(mean ||train - mean||^2), the training cloud's RMS radius,
     "nearest_training_distance": mean over `other` of the distance to the nearest
       training point, divided by spread (0 on the cloud's points; grows as they leave it),
     "centroid_shift": ||mean(other) - mean(train)|| / spread,
     "mahalanobis_2d": {"training", "other"}: mean Mahalanobis distance in the plane of
       `pca` (fitted on train; the default fits it), the training projection's variances;
       the training points' value is at most sqrt(2) (their mean squared distance is 2)}.
    Distances other than mahalanobis_2d are in the full activation space.
  """
  train = np.asarray(train, np.float64)
  other = np.asarray(other, np.float64)
  pca = fit_pca(train) if pca is None else pca
  mean = train.mean(axis=0)
  spread = float(np.sqrt(np.mean(np.sum((train - mean) ** 2, axis=1))))
  scale = spread if spread > 0 else 1.0
  variance = np.where(pca.explained_variance > 0, pca.explained_variance, np.inf)

  def mahalanobis(points):
    return float(np.mean(np.sqrt(np.sum(project(pca, points) ** 2 / variance, axis=1))))

  return {"spread": spread,
          "nearest_training_distance": float(np.mean(_nearest_distances(other, train))) / scale,
          "centroid_shift": float(np.linalg.norm(other.mean(axis=0) - mean)) / scale,
          "mahalanobis_2d": {"training": mahalanobis(train), "other": mahalanobis(other)}}
