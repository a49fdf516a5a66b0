"""Haiku encoder-only Transformer that takes positions as an argument.

Architecture (DESIGN.md section 5): token embedding without bias, scaled by
sqrt(d_model); `num_layers` post-layer-norm blocks of multi-head attention and
a ReLU feed-forward network of width `widening_factor * d_model`; dropout; a
final linear layer on every position.

Shape glossary: B batch, T sequence length, H heads, D head size,
M d_model, V vocabulary (input ids), O output size, N num_layers.

Encodings enter through two tables keyed by family (no if/elif over encoding
names): `_ADDITIVE` adds a term to the embeddings, `_SCORERS` computes the
attention logits.

compat="release" reproduces the original release (DESIGN.md section 4); each
item is marked "Release item k" where it is implemented.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import chex
import haiku as hk
import jax
import jax.numpy as jnp

from randomized_pe import attention as attn_lib
from randomized_pe import encodings as enc
from randomized_pe import registry

@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Hyperparameters of the encoder; defaults are the paper's (DESIGN.md section 5).

  Attributes:
    vocab_size: number of input token ids (task symbols plus the empty token).
    pe: positional encoding name (see `randomized_pe.registry.NAMES`).
    num_layers, num_heads, d_model, widening_factor: architecture.
    dropout_rate: dropout probability (0 disables dropout).
    emb_init_scale: std of the truncated-normal token embedding init.
    max_position: L, the range [0, L) randomized positions are drawn from; also
      the number of rows of a learned position table.
    max_timescale: longest wavelength of sin/cos, RoPE and relative encodings.
    learned_init_scale: std of the truncated-normal learned position table init
      (1.0 is Haiku's hk.Embed default, used by the release).
    compat: "paper" (default) or "release" (the original release's behaviour).
    attention_chunk_rows: batch rows per attention chunk (see
      `randomized_pe.attention`); None picks them for the backend (whole batch
      on accelerators, cache-sized chunks on CPU). Changes speed, not results.
  """

  vocab_size: int
  pe: str = "sin_cos"
  num_layers: int = 5
  num_heads: int = 8
  d_model: int = 64
  widening_factor: int = 4
  dropout_rate: float = 0.1
  emb_init_scale: float = 0.02
  max_position: int = 2048
  max_timescale: float = enc.DEFAULT_MAX_TIMESCALE
  learned_init_scale: float = 1.0
  compat: str = "paper"
  attention_chunk_rows: Optional[int] = None

  def __post_init__(self):
    registry.get(self.pe)  # Validates the name.
    registry.check_compat(self.compat)
    if self.vocab_size < 1:
      raise ValueError(f"vocab_size must be >= 1, got {self.vocab_size}")
    if self.d_model % self.num_heads:
      raise ValueError(
          f"d_model={self.d_model} must be divisible by num_heads={self.num_heads}"
      )
    if self.d_model % 2 or (self.d_model // self.num_heads) % 2:
      raise ValueError("d_model and the head size must be even for sin/cos and RoPE")
    if self.attention_chunk_rows is not None and self.attention_chunk_rows < 1:
      raise ValueError(f"attention_chunk_rows must be >= 1 or None, got {self.attention_chunk_rows}")
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")

  @property
  def encoding(self) -> registry.Encoding:
    return registry.get(self.pe)

  @property
  def head_size(self) -> int:
    return self.d_model // self.num_heads

  def sample_positions(self, key: jax.Array, length: int) -> jax.Array:
    """Positions for one batch of this model: int32[T], or [N, T] where the release draws per layer."""
    return self.encoding.sample_positions(
        key, length, self.max_position, compat=self.compat, num_layers=self.num_layers
    )


# --------------------------------------------------------------------------
# Additive encodings: (positions [T], config) -> [T, M].


def _sin_cos_term(positions, config: EncoderConfig):
  return enc.sinusoid(positions, config.d_model, config.max_timescale)


def _learned_term(positions, config: EncoderConfig):
  table = hk.get_parameter(
      "position_table", [config.max_position, config.d_model],
      init=hk.initializers.TruncatedNormal(config.learned_init_scale),
  )
  return enc.learned_lookup(table, positions)


_ADDITIVE = {"sin_cos": _sin_cos_term, "learned": _learned_term}


# --------------------------------------------------------------------------
# Attention scorers: (positions [T], config, query shape [B, Tq, H, D]) -> score_fn.
# A scorer runs in the Haiku context (parameters, tables that do not depend on
# the batch) and returns a pure score_fn(q, k) -> logits [b, H, Tq, T] that
# `attention.attention` applies chunk by chunk. The queries are those of the
# last Tq positions (Tq = T except in the last layer, see Encoder). Every
# score_fn returns logits already scaled by 1/sqrt(D) (ALiBi's bias is added
# after the scaling, as in the release).


def _plain_scorer(positions, config, shape):
  del positions, config, shape
  return attn_lib.dot_scores


def _rope_scorer(positions, config, shape):
  query_positions = positions[positions.shape[0] - shape[1]:]

  def score(q, k):
    return attn_lib.dot_scores(enc.apply_rope(q, query_positions, config.max_timescale),
                               enc.apply_rope(k, positions, config.max_timescale))

  return score


def _alibi_scorer(positions, config, shape):
  slopes = enc.alibi_slopes(shape[2])
  if config.compat == "release":
    # Release item 5: the positions are an offset table |j - i| -> distance.
    bias = enc.alibi_bias_from_distances(enc.toeplitz(enc.signed_offsets(positions)), slopes)
  else:
    bias = enc.alibi_bias(positions, positions, slopes)
  bias = bias[:, bias.shape[1] - shape[1]:]  # The last Tq query rows.
  return lambda q, k: attn_lib.dot_scores(q, k) + bias[None]


def _relative_scorer(positions, config, shape):
  batch, num_queries, num_heads, head_size = shape
  length = positions.shape[0]
  first_query = length - num_queries
  normal = hk.initializers.RandomNormal(stddev=0.02)
  content_bias = hk.get_parameter("content_bias", [num_heads, head_size], init=normal)
  relative_bias = hk.get_parameter("relative_bias", [num_heads, head_size], init=normal)
  rel_dim = num_heads * head_size  # The release encodes distances in d_model features.
  kernel = hk.get_parameter(
      "relative_kernel", [rel_dim, num_heads * head_size],
      init=hk.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal"),
  ).reshape(rel_dim, num_heads, head_size)
  pairwise = enc.use_pairwise(batch, length, num_heads, head_size, rel_dim)
  if config.compat == "release":
    # Release item 5: positions are an offset table; the classic encoding uses
    # sinusoid(j - i) directly.
    if config.encoding.randomized:
      # Release item 1: clamped lookup, zero and rightward distances collapse.
      offset_positions = enc.release_relative_positions(positions, config.max_position)
    else:
      offset_positions = enc.signed_offsets(positions)
    if pairwise:
      table = enc.relative_key_table_toeplitz(
          offset_positions, kernel, config.max_timescale, num_queries)
      relative = lambda q: enc.relative_logits_from_table(q, table)
    else:
      relative = lambda q: enc.relative_logits_toeplitz(
          q, offset_positions, kernel, config.max_timescale)
  elif pairwise:
    table = enc.relative_key_table(  # Once per batch and layer.
        positions, kernel, config.max_timescale, positions[first_query:])
    relative = lambda q: enc.relative_logits_from_table(q, table)
  else:
    relative = lambda q: enc.relative_logits(
        q, positions, kernel, config.max_timescale, method="factorized",
        query_positions=positions[first_query:])
  scale = 1.0 / math.sqrt(head_size)

  def score(q, k):
    content = jnp.einsum("bthd,bshd->bhts", (q + content_bias) * scale, k)
    return content + relative((q + relative_bias) * scale)

  return score


_SCORERS = {
    "none": _plain_scorer,
    "sin_cos": _plain_scorer,
    "learned": _plain_scorer,
    "rope": _rope_scorer,
    "alibi": _alibi_scorer,
    "relative": _relative_scorer,
}


class _Weight(hk.Module):
  """The weight of a bias-free hk.Linear (same name, shape and initializer)."""

  def __call__(self, input_size: int, output_size: int):
    init = hk.initializers.TruncatedNormal(stddev=1.0 / math.sqrt(input_size))
    return hk.get_parameter("w", [input_size, output_size], init=init)


class MultiHeadAttention(hk.Module):
  """Multi-head self-attention whose logits come from the encoding's scorer."""

  def __init__(self, config: EncoderConfig, name: Optional[str] = None):
    super().__init__(name=name)
    self._config = config

  def __call__(self, x, positions, key_mask=None, num_queries=None):
    """x: [B, T, M]; positions: [T]; key_mask: optional bool [B, T] -> [B, Tq, M].

    num_queries: only the last Tq positions ask (default all T); all T answer.
    """
    config = self._config
    batch, length, _ = x.shape
    num_queries = length if num_queries is None else num_queries
    heads, head_size = config.num_heads, config.head_size

    size = heads * head_size
    w_q, w_k, w_v = (_Weight(name=name)(x.shape[-1], size) for name in ("query", "key", "value"))
    if num_queries == length:  # One product for the three projections.
      q, k, v = jnp.split(x @ jnp.concatenate([w_q, w_k, w_v], axis=1), 3, axis=-1)
    else:
      q = x[:, length - num_queries:] @ w_q
      k, v = jnp.split(x @ jnp.concatenate([w_k, w_v], axis=1), 2, axis=-1)
    q, k, v = (y.reshape(batch, y.shape[1], heads, head_size) for y in (q, k, v))  # [B, T, H, D]
    score = _SCORERS[config.encoding.family](positions, config, q.shape)
    out = attn_lib.attention(q, k, v, score, key_mask, chunk_rows=config.attention_chunk_rows)
    return hk.Linear(config.d_model, with_bias=False, name="output")(
        out.reshape(batch, num_queries, heads * head_size))


def _layer_norm(x, name):
  return hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, name=name)(x)


class Encoder(hk.Module):
  """The encoder-only Transformer of the paper, returning logits on every position."""

  def __init__(self, config: EncoderConfig, output_size: int, name: Optional[str] = None):
    super().__init__(name=name)
    self._config = config
    self._output_size = output_size

  def _positions(self, positions, length):
    """Returns (positions for the embeddings [T], one position array per layer)."""
    config = self._config
    if positions is None:
      positions = jnp.arange(length, dtype=jnp.int32)
    positions = jnp.asarray(positions)
    per_layer = config.compat == "release" and config.encoding.release_per_layer
    if positions.shape == (length,):
      return positions, [positions] * config.num_layers
    if per_layer and positions.shape == (config.num_layers, length):
      # Only attention encodings draw per layer, so the embeddings never use these.
      return positions[0], [positions[i] for i in range(config.num_layers)]
    expected = f"[{length}]" + (f" or [{config.num_layers}, {length}]" if per_layer else "")
    raise ValueError(
        f"positions must have shape {expected} for pe={config.pe!r}, "
        f"compat={config.compat!r}; got {positions.shape}"
    )

  def __call__(self, tokens, positions=None, is_training: bool = False, key_mask=None,
               num_outputs: Optional[int] = None):
    """Logits for every position, or for the last `num_outputs`.

    Args:
      tokens: int [B, T] token ids in [0, vocab_size).
      positions: [T] positions shared by the batch and all layers (None: 0..T-1);
        [N, T] one row per layer where the release draws per layer.
      is_training: enables dropout (compat="release" keeps it on regardless).
      key_mask: optional bool [B, T]; False keys are ignored by attention
        (padding).
      num_outputs: only the logits of the last `num_outputs` positions (where
        the tasks put their answers). The last layer then computes queries,
        feed-forward and logits for those positions only: the same values as
        slicing the full output, for less work.

    Returns:
      float32 [B, T, O], or [B, num_outputs, O].
    """
    config = self._config
    chex.assert_rank(tokens, 2)
    batch, length = tokens.shape
    embedding_positions, layer_positions = self._positions(positions, length)
    family = config.encoding.family
    release = config.compat == "release"
    # Release item 3: dropout also at evaluation (the release has no switch).
    dropout_on = config.dropout_rate > 0 and (is_training or release)

    def dropout(x):
      return hk.dropout(hk.next_rng_key(), config.dropout_rate, x) if dropout_on else x

    embed = hk.Embed(
        config.vocab_size, config.d_model,
        w_init=hk.initializers.TruncatedNormal(config.emb_init_scale), name="embed",
    )
    # Scaling the [V, M] table rather than the [B, T, M] lookup: the same values.
    h = jnp.asarray(embed.embeddings * math.sqrt(config.d_model))[(tokens,)]  # [B, T, M]
    additive = _ADDITIVE.get(family)
    if additive is not None:
      h = h + additive(embedding_positions, config)[None]
    # Release item 4: embedding dropout only after additive encodings.
    if additive is not None or not release:
      h = dropout(h)

    if num_outputs is not None and not 1 <= num_outputs <= length:
      raise ValueError(f"num_outputs must be in [1, {length}], got {num_outputs}")
    for layer in range(config.num_layers):
      # Nothing after the last layer mixes positions: it needs only the outputs.
      queries = num_outputs if layer == config.num_layers - 1 else None
      attn = MultiHeadAttention(config, name=f"attention_{layer}")(
          h, layer_positions[layer], key_mask, queries
      )
      if queries is not None:
        h = h[:, length - queries:]
      h = _layer_norm(h + dropout(attn), name=f"attention_norm_{layer}")
      ff = hk.Linear(config.widening_factor * config.d_model, name=f"ffn_in_{layer}")(h)
      ff = hk.Linear(config.d_model, name=f"ffn_out_{layer}")(jax.nn.relu(ff))
      h = _layer_norm(h + dropout(ff), name=f"ffn_norm_{layer}")
    return hk.Linear(self._output_size, name="logits")(h)  # [B, T, O]


def make_encoder(config: EncoderConfig, output_size: int) -> hk.Transformed:
  """Returns hk.transform of the encoder.

  `init(rng, tokens, positions=None, is_training=False, key_mask=None, num_outputs=None)`
  and `apply(params, rng, tokens, positions=None, is_training=False, key_mask=None,
  num_outputs=None)` -> logits [B, T, output_size] ([B, num_outputs, output_size]).
  `rng` may be None when no dropout runs (paper mode with is_training=False).
  """
  if output_size < 1:
    raise ValueError(f"output_size must be >= 1, got {output_size}")

  def forward(tokens, positions=None, is_training=False, key_mask=None, num_outputs=None):
    return Encoder(config, output_size, name="encoder")(
        tokens, positions, is_training, key_mask, num_outputs)

  return hk.transform(forward)
