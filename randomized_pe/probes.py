"""What a trained model attends to and where its activations lie (pure JAX/numpy, no Haiku).

The pieces of `python -m experiments.analyze` (docs/analyze.md) that do not depend on a
framework. The attention weights and activations themselves are the model's own
(`EncoderModel.apply(..., intermediates=True)`); this module turns them into numbers:

  attention_stats(weights, expected_source)
      numbers a picture of attention claims: the mass on the key each query should read
      (for reverse_string the anti-diagonal of the output-to-input block), the entropy and
      the mean attended distance, per head
  fit_pca / project / cloud_distances
      a 2-D PCA fitted on training-range activations only, and how far other activations
      lie from that training cloud

Shapes: B batch, T queries, S keys, H heads, N points, M features.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np


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
