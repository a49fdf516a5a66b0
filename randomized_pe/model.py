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

from randomized_pe import encodings as enc
from randomized_pe import registry

_MASKED = jnp.finfo(jnp.float32).min


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
# Attention scorers: (q [B,T,H,D], k [B,T,H,D], positions, config) -> logits [B,H,T,T].
# Every scorer returns logits already scaled by 1/sqrt(D) (ALiBi's bias is
# added after the scaling, as in the release).


def _dot(q, k):
  return jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1])


def _plain_scores(q, k, positions, config):
  del positions, config
  return _dot(q, k)


def _rope_scores(q, k, positions, config):
  return _dot(
      enc.apply_rope(q, positions, config.max_timescale),
      enc.apply_rope(k, positions, config.max_timescale),
  )


def _alibi_scores(q, k, positions, config):
  slopes = enc.alibi_slopes(config.num_heads)
  if config.compat == "release":
    # Release item 5: the positions are an offset table |j - i| -> distance.
    bias = enc.alibi_bias_from_distances(enc.toeplitz(enc.signed_offsets(positions)), slopes)
  else:
    bias = enc.alibi_bias(positions, positions, slopes)
  return _dot(q, k) + bias[None]


def _relative_scores(q, k, positions, config):
  num_heads, head_size = q.shape[-2:]
  normal = hk.initializers.RandomNormal(stddev=0.02)
  content_bias = hk.get_parameter("content_bias", [num_heads, head_size], init=normal)
  relative_bias = hk.get_parameter("relative_bias", [num_heads, head_size], init=normal)
  rel_dim = num_heads * head_size  # The release encodes distances in d_model features.
  kernel = hk.get_parameter(
      "relative_kernel", [rel_dim, num_heads * head_size],
      init=hk.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal"),
  ).reshape(rel_dim, num_heads, head_size)
  content = jnp.einsum("bthd,bshd->bhts", q + content_bias, k)
  if config.compat == "release":
    # Release item 5: positions are an offset table; the classic encoding uses
    # sinusoid(j - i) directly.
    if config.encoding.randomized:
      # Release item 1: clamped lookup, zero and rightward distances collapse.
      offset_positions = enc.release_relative_positions(positions, config.max_position)
    else:
      offset_positions = enc.signed_offsets(positions)
    rel = enc.relative_logits_toeplitz(
        q + relative_bias, offset_positions, kernel, config.max_timescale
    )
  else:
    rel = enc.relative_logits(q + relative_bias, positions, kernel, config.max_timescale)
  return (content + rel) / math.sqrt(head_size)


_SCORERS = {
    "none": _plain_scores,
    "sin_cos": _plain_scores,
    "learned": _plain_scores,
    "rope": _rope_scores,
    "alibi": _alibi_scores,
    "relative": _relative_scores,
}


class MultiHeadAttention(hk.Module):
  """Multi-head self-attention whose logits come from the encoding's scorer."""

  def __init__(self, config: EncoderConfig, name: Optional[str] = None):
    super().__init__(name=name)
    self._config = config

  def __call__(self, x, positions, key_mask=None):
    """x: [B, T, M]; positions: [T]; key_mask: optional bool [B, T] -> [B, T, M]."""
    config = self._config
    batch, length, _ = x.shape
    heads, head_size = config.num_heads, config.head_size

    def project(name):
      y = hk.Linear(heads * head_size, with_bias=False, name=name)(x)
      return y.reshape(batch, length, heads, head_size)  # [B, T, H, D]

    q, k, v = project("query"), project("key"), project("value")
    logits = _SCORERS[config.encoding.family](q, k, positions, config)  # [B, H, T, T]
    if key_mask is not None:
      logits = jnp.where(key_mask[:, None, None, :], logits, _MASKED)
    out = _softmax_attend(logits, v).reshape(batch, length, heads * head_size)
    return hk.Linear(config.d_model, with_bias=False, name="output")(out)


def _softmax_attend(logits, v):
  """softmax(logits) @ v, normalised after the product.

  Dividing the [B, T, H, D] result instead of the [B, H, T, T] weights gives the
  same values (up to rounding) with one fewer pass over the largest tensor, in
  the forward and the backward pass (about 30% of attention time on CPU).
  """
  shift = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  unnormalised = jnp.exp(logits - shift)  # [B, H, T, S]
  total = jnp.sum(unnormalised, axis=-1)  # [B, H, T]
  out = jnp.einsum("bhts,bshd->bthd", unnormalised, v)
  return out / jnp.transpose(total, (0, 2, 1))[..., None]


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

  def __call__(self, tokens, positions=None, is_training: bool = False, key_mask=None):
    """Logits for every position.

    Args:
      tokens: int [B, T] token ids in [0, vocab_size).
      positions: [T] positions shared by the batch and all layers (None: 0..T-1);
        [N, T] one row per layer where the release draws per layer.
      is_training: enables dropout (compat="release" keeps it on regardless).
      key_mask: optional bool [B, T]; False keys are ignored by attention
        (padding).

    Returns:
      float32 [B, T, O].
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
    h = embed(tokens) * math.sqrt(config.d_model)  # [B, T, M]
    additive = _ADDITIVE.get(family)
    if additive is not None:
      h = h + additive(embedding_positions, config)[None]
    # Release item 4: embedding dropout only after additive encodings.
    if additive is not None or not release:
      h = dropout(h)

    for layer in range(config.num_layers):
      attn = MultiHeadAttention(config, name=f"attention_{layer}")(
          h, layer_positions[layer], key_mask
      )
      h = _layer_norm(h + dropout(attn), name=f"attention_norm_{layer}")
      ff = hk.Linear(config.widening_factor * config.d_model, name=f"ffn_in_{layer}")(h)
      ff = hk.Linear(config.d_model, name=f"ffn_out_{layer}")(jax.nn.relu(ff))
      h = _layer_norm(h + dropout(ff), name=f"ffn_norm_{layer}")
    return hk.Linear(self._output_size, name="logits")(h)  # [B, T, O]


def make_encoder(config: EncoderConfig, output_size: int) -> hk.Transformed:
  """Returns hk.transform of the encoder.

  `init(rng, tokens, positions=None, is_training=False, key_mask=None)` and
  `apply(params, rng, tokens, positions=None, is_training=False, key_mask=None)`
  -> logits [B, T, output_size]. `rng` may be None when no dropout runs (paper
  mode with is_training=False).
  """
  if output_size < 1:
    raise ValueError(f"output_size must be >= 1, got {output_size}")

  def forward(tokens, positions=None, is_training=False, key_mask=None):
    return Encoder(config, output_size, name="encoder")(tokens, positions, is_training, key_mask)

  return hk.transform(forward)
