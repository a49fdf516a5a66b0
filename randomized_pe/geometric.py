"""Geometric attention with directional encoding (Csordás, Irie, Schmidhuber 2022), pure JAX.

The Neural Data Router (NDR, ICLR 2022, github.com/robertcsordas/ndr) replaces the softmax
of attention by a stick-breaking over the keys ordered by their distance from the query:
each key j gets a probability P_ij = sigmoid(logit_ij) of being "the one", and key j is
attended with

    A_ij = P_ij * prod over keys k before j in query i's order of (1 - P_ik),

so a query takes the *closest* key that matches and looks past it only where the closer
keys do not match. Ruoss et al. (2023, Table 5) compare this "geometric attention with
directional encoding" with their randomized encodings. docs/geometric.md has the reading
of NDR's code this module follows; in short:

- Order. Keys are ordered by |p_j - p_i|, the distance of their positions from the
  query's; of two keys at the same distance the later one (larger index: in NDR the
  right-hand one) comes first. NDR's CUDA kernel (its "window sum") does exactly that
  for positions 0..T-1; here the order is computed from the positions, so randomized
  positions (or any sampler's) change which keys count as closer.
- Self. The query's own key is never attended (NDR sets its logit to -inf): P_ii = 0.
- Padding. Masked keys get P = 0, so they neither take weight nor block farther keys
  (NDR's -inf logits do the same): a padded batch gives the unpadded weights.
- Directional encoding. Every query projects its layer input to two logits per head,
  one added to every key on its left (earlier positions), one to every key on its
  right (later positions); nothing is added at equal positions. NDR:
  logit_ij = s * <q_i + c, k_j> + s_pos * (W x_i + b)[left or right] + s_bias, with
  learned scalars s (from 1/sqrt(D)), s_pos (from 1) and s_bias (from 0) and a learned
  per-head content bias c (from 0).
- Normalisation. NDR's layer divides the weights of a query by their sum (an L1
  normalisation, floor 1e-12) unless told not to; `normalize` chooses.

The stick-breaking costs O(Tq * S) per batch row and head, like NDR's kernel: the order
is computed once per position draw (it does not depend on the batch); the log(1 - P) are
gathered into that order, summed cumulatively (exclusive), and gathered back. That runs
in a [Tq, S, b * H] layout, where a gather moves contiguous rows of b * H values, and the
gathers are permutations, so their gradient is the inverse gather (no scatter). On a
CPU this is faster than gathers along the last axis. The exclusive sum is a
shifted cumsum, not cumsum - x, which was several times slower: XLA fuses the cumulative
sum into its consumer and recomputes it. Figures: docs/benchmark.md, "Figures behind
code choices".
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

# NDR's normalisation is torch.nn.functional.normalize(p=1): x / max(sum |x|, 1e-12).
NORMALIZE_FLOOR = 1e-12


def key_order(positions: jax.Array, query_positions: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Each query's keys, closest first: (order, rank), both int32 [Tq, S].

  order[i, n] is the key at place n of query i's order; rank[i, j] the place of key j
  (rank is the inverse permutation of order). Keys are ordered by |p_j - q_i|; at equal
  distances the key with the larger index comes first (NDR's rule: the right-hand key).

  Args:
    positions: [S] key positions (int or float).
    query_positions: [Tq] positions of the queries.
  """
  num_keys = positions.shape[0]
  distance = jnp.abs(positions[None, :] - query_positions[:, None])  # [Tq, S]
  # A stable sort of the keys taken in reverse index order puts, among equal
  # distances, the larger index first.
  reversed_order = jnp.argsort(distance[:, ::-1], axis=-1, stable=True)
  order = (num_keys - 1 - reversed_order).astype(jnp.int32)
  rank = jnp.argsort(order, axis=-1).astype(jnp.int32)
  return order, rank


def not_self(query_start, num_queries: int, num_keys: int) -> jax.Array:
  """bool [Tq, S]: False where key j is query i itself (j = query_start + i)."""
  queries = query_start + jnp.arange(num_queries)
  return jnp.arange(num_keys)[None, :] != queries[:, None]


def direction_logits(query_input: jax.Array, kernel: jax.Array, bias: jax.Array,
                     scale: jax.Array, positions: jax.Array,
                     query_positions: jax.Array) -> jax.Array:
  """NDR's directional encoding: [b, Tq, M] -> logits [b, H, Tq, S] to add.

  Args:
    query_input: [b, Tq, M] the layer input at the query rows.
    kernel: [M, H, 2] and bias: [H, 2]: per head, the logit for keys on the left
      (index 0, earlier positions) and on the right (index 1, later positions).
    scale: scalar multiplying both (NDR's learned `scale_pos`).
    positions: [S] key positions; query_positions: [Tq].
  """
  terms = (jnp.einsum("btm,mhc->bhtc", query_input, kernel) + bias[None, :, None, :]) * scale
  left = positions[None, :] < query_positions[:, None]  # [Tq, S]
  right = positions[None, :] > query_positions[:, None]
  return (jnp.where(left, terms[..., 0:1], 0.0) + jnp.where(right, terms[..., 1:2], 0.0))


@jax.custom_vjp
def _permute(x: jax.Array, index: jax.Array, inverse: jax.Array) -> jax.Array:
  """out[i, n] = x[i, index[i, n]] for x [Tq, S, R]; index [Tq, S] a permutation of each
  row, `inverse` its inverse."""
  return jnp.take_along_axis(x, index[:, :, None], axis=1)


def _permute_fwd(x, index, inverse):
  return _permute(x, index, inverse), (index, inverse)


def _permute_bwd(residuals, cotangent):
  index, inverse = residuals
  return _permute(cotangent, inverse, index), None, None


_permute.defvjp(_permute_fwd, _permute_bwd)


def stick_breaking(logits: jax.Array, order: jax.Array, rank: jax.Array, valid: jax.Array,
                   normalize: bool = True) -> jax.Array:
  """Geometric attention weights from logits: [b, H, Tq, S] -> [b, H, Tq, S].

  A_ij = P_ij prod_{k before j} (1 - P_ik), P = sigmoid(logits) where `valid`, else 0.

  Args:
    logits: [b, H, Tq, S].
    order, rank: [Tq, S] from `key_order`.
    valid: bool, broadcastable to [b, H, Tq, S]: keys that may be attended (not
      padding, not the query itself).
    normalize: divide each row by its sum (floor NORMALIZE_FLOOR), as NDR's layer does
      by default.
  """
  batch, heads, num_queries, num_keys = logits.shape
  softplus = jax.nn.softplus(logits)
  log_p = logits - softplus  # log sigmoid(x) = x - log(1 + e^x)
  log_not = jnp.where(valid, -softplus, 0.0)  # log(1 - P); 0 for P = 0.
  rows = jnp.transpose(log_not, (2, 3, 0, 1)).reshape(num_queries, num_keys, batch * heads)
  ordered = _permute(rows, order, rank)  # [Tq, S, b * H], closest key first.
  before = jnp.cumsum(ordered, axis=1)  # The keys strictly before each place:
  before = jnp.concatenate([jnp.zeros_like(before[:, :1]), before[:, :-1]], axis=1)
  blocked = _permute(before, rank, order)  # back in key order,
  blocked = jnp.transpose(blocked.reshape(num_queries, num_keys, batch, heads), (2, 3, 0, 1))
  weights = jnp.where(valid, jnp.exp(log_p + blocked), 0.0)
  if normalize:
    weights = weights / jnp.maximum(jnp.sum(weights, axis=-1, keepdims=True), NORMALIZE_FLOOR)
  return weights


def weights_fn(positions: jax.Array, query_start, num_queries: int, normalize: bool = True):
  """(logits [b, H, Tq, S], key_mask bool [b, S] or None) -> weights [b, H, Tq, S].

  The positions fix the order (computed here, once, shared by every batch row and chunk);
  query i is the position query_start + i (query_start may be traced).
  """
  query_positions = jax.lax.dynamic_slice_in_dim(positions, query_start, num_queries)
  order, rank = key_order(positions, query_positions)
  allowed = not_self(query_start, num_queries, positions.shape[0])[None, None]  # [1,1,Tq,S]

  def weights(logits: jax.Array, key_mask: Optional[jax.Array] = None) -> jax.Array:
    valid = allowed if key_mask is None else allowed & key_mask[:, None, None, :]
    return stick_breaking(logits, order, rank, valid, normalize)

  return weights
