"""The paper's encoder-only Transformer (Haiku), taking positions as an argument.

Architecture (Ruoss et al. 2023, Appendix A): token embedding without bias, scaled
by sqrt(d_model); `num_layers` post-layer-norm blocks of multi-head attention and a
ReLU feed-forward network of width `widening_factor * d_model`; dropout; a final
linear layer on every position.

Shape glossary: B batch, T sequence length, H heads, D head size,
M d_model, V vocabulary (input ids), O output size, N num_layers.

Encodings enter through their family (`randomized_pe.families`): the model creates
the parameters a family declares and calls its pure `term` (added to the embeddings)
or `scorer` and `bias` (the attention logits); nothing here tests an encoding's name.
log-n attention scaling (`log_n_scaling`, docs/su.md) works with every family: the
model multiplies the logits of each sequence by a factor from its unmasked key count.
compat="release" reproduces the original release: the behaviour record
(`randomized_pe.release`) is resolved once, and each use is marked "release item k"
(docs/release.md).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Optional

import chex
import haiku as hk
import jax
import jax.numpy as jnp

from randomized_pe import attention as attn_lib
from randomized_pe import encodings as enc
from randomized_pe import families
from randomized_pe import release as release_lib
from randomized_pe import models
from randomized_pe import samplers as samplers_lib
from randomized_pe.models import layers as layers_lib


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Hyperparameters of the encoder; defaults are the paper's.

  Attributes:
    vocab_size: number of input token ids (task symbols plus the empty token).
    pe: positional encoding name (see `randomized_pe.families.names()`): a family,
      or `randomized_<family>` (the family fed by the `randomized` sampler).
    positions: the training sampler (`randomized_pe.samplers.names()`); "" takes
      the encoding's (arange, or randomized for `randomized_<family>`).
    eval_positions: the evaluation sampler; "" takes the training sampler's
      evaluation default (for the built-in integer samplers: the training sampler
      itself; for the equal-mean samplers: `linspace`).
    num_layers, num_heads, d_model, widening_factor: architecture.
    dropout_rate: dropout probability (0 disables dropout).
    emb_init_scale: std (before truncation) of the truncated-normal token embedding init.
    max_position: L, the range [0, L) sampled positions come from; also the number
      of rows of a learned position table.
    max_timescale: longest wavelength of sin/cos, RoPE and relative encodings.
    learned_init_scale: std (before truncation) of the learned position table init
      (1.0 is Haiku's hk.Embed default, used by the release).
    compat: "paper" (default) or "release" (the original release's behaviour).
    attention_chunk_rows: batch rows per attention chunk (see
      `randomized_pe.attention`); None picks them for the backend (whole batch
      on accelerators, cache-sized chunks on CPU). Changes speed, not results.
    log_n_scaling: multiply every attention logit by log(n) / log(m) before the
      softmax (Su; docs/su.md), n the number of unmasked keys of the sequence and m
      `log_n_reference`. Off: the computation is exactly the one without the option.
    log_n_reference: m, an int >= 2 when log_n_scaling is on (0 in a run's config
      means the longest training sequence, resolved by `from_config` from the run).
    log_n_scale_bias: log-n scaling also multiplies a family's separate position
      bias (ALiBi's); off, only the scorer's logits are scaled (Su's formula scales
      Q K^T). Ignored without log_n_scaling.
    beta_max_length, beta_concentration: M and a + b of the `equal_mean_beta`
      sampler (see there; 0 in a run's config means the longest evaluation
      sequence, resolved by `from_config` from the run). Read by samplers that
      declare them only.
    family_settings: the settings a registered family declares (`Family.settings`)
      that are not fields above, as the run's config sets them (`model.<setting>`;
      `from_config` collects them): a family with a setting of its own needs no field
      here. A setting left out reads as its family's default.
  """

  vocab_size: int
  pe: str = "sin_cos"
  positions: str = ""
  eval_positions: str = ""
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
  log_n_scaling: bool = False
  log_n_reference: int = 0
  log_n_scale_bias: bool = False
  beta_max_length: int = 0
  beta_concentration: float = 1.0
  family_settings: families.Settings = dataclasses.field(default_factory=families.Settings)

  def __post_init__(self):
    self.validate()

  def validate(self) -> None:
    """Raises a one-line ValueError naming the config key of the first bad field.

    Fields come from a run's config (`from_config`): `model.<field>`, except
    `positions` (training.positions), `eval_positions` (evaluation.positions), both
    through `models.RunSpec`, vocab_size (from the task) and attention_chunk_rows (set
    in code).
    """
    # (config key, value, predicate, what it must be)
    rules = [("vocab_size", self.vocab_size, lambda v: _is_int(v) and v >= 1, "an int >= 1")]
    for name in ("num_layers", "num_heads", "d_model", "widening_factor", "max_position"):
      rules.append((name, getattr(self, name), lambda v: _is_int(v) and v >= 1, "an int >= 1"))
    rules += [
        ("dropout_rate", self.dropout_rate, lambda v: _is_number(v) and 0 <= v < 1,
         "a number in [0, 1)"),
        ("max_timescale", self.max_timescale, lambda v: _is_number(v) and v > 0, "> 0"),
        ("emb_init_scale", self.emb_init_scale, lambda v: _is_number(v) and v >= 0, ">= 0"),
        ("learned_init_scale", self.learned_init_scale, lambda v: _is_number(v) and v >= 0,
         ">= 0"),
        ("log_n_scaling", self.log_n_scaling, lambda v: isinstance(v, bool), "a bool"),
        ("log_n_scale_bias", self.log_n_scale_bias, lambda v: isinstance(v, bool), "a bool"),
        ("log_n_reference", self.log_n_reference, lambda v: _is_int(v) and (v == 0 or v >= 2),
         "0 or an int >= 2 (log 1 = 0)"),
        ("beta_max_length", self.beta_max_length, lambda v: _is_int(v) and v >= 0,
         "an int >= 0"),
        ("beta_concentration", self.beta_concentration, lambda v: _is_number(v) and v > 0,
         "> 0"),
    ]
    for name, value, check, phrase in rules:
      if not check(value):
        key = name if name == "vocab_size" else f"model.{name}"
        raise ValueError(f"{key} must be {phrase}, got {value!r}")
    if self.log_n_scaling and self.log_n_reference == 0:
      raise ValueError("model.log_n_reference must be >= 2 with log_n_scaling on, got 0 (0, "
                       "the longest training sequence, is resolved from the run by "
                       "randomized_pe.models.encoder.from_config)")
    if self.d_model % self.num_heads:
      raise ValueError(f"model.d_model={self.d_model} must be divisible by "
                       f"model.num_heads={self.num_heads}")
    if self.d_model % 2 or (self.d_model // self.num_heads) % 2:
      raise ValueError(f"model.d_model={self.d_model} and the head size "
                       f"{self.d_model // self.num_heads} must be even (sin/cos and RoPE "
                       "pair features)")
    if self.attention_chunk_rows is not None and not (
        _is_int(self.attention_chunk_rows) and self.attention_chunk_rows >= 1):
      raise ValueError(f"attention_chunk_rows must be >= 1 or None, got "
                       f"{self.attention_chunk_rows!r}")
    for key, lookup in [("model.pe", lambda: self.encoding),
                        ("model.compat", lambda: self.behaviour),
                        ("training.positions", lambda: self.train_sampler),
                        ("evaluation.positions", lambda: self.eval_sampler)]:
      try:
        lookup()
      except ValueError as error:
        raise ValueError(f"{key}: {error}") from None
    family, behaviour = self.family, self.behaviour
    for key, sampler in [("training.positions", self.train_sampler),
                         ("evaluation.positions", self.eval_sampler)]:
      if sampler.floats and not family.floats:
        raise ValueError(
            f"{key}: sampler {sampler.name!r} gives float positions, which {self.pe} cannot "
            f"take (a table needs integers); families that take floats: "
            f"{', '.join(families.families_accepting(floats=True))}")
      families.release_sampler(family, sampler, behaviour)  # Raises if impossible.
      try:  # A sampler's own checks of its settings: traced, not compiled.
        jax.eval_shape(lambda key, sampler=sampler: self._draw(sampler, key, 1),
                       jax.ShapeDtypeStruct((2,), jnp.uint32))
      except ValueError as error:
        raise ValueError(f"{key}: {error}") from None

  @property
  def encoding(self) -> families.Encoding:
    return families.get(self.pe)

  @property
  def family(self) -> families.Family:
    return self.encoding.family

  @property
  def behaviour(self) -> release_lib.Behaviour:
    return release_lib.resolve(self.compat)

  @property
  def train_sampler(self) -> samplers_lib.Sampler:
    return families.samplers_of(self.positions, "", self.encoding.sampler)[0]

  @property
  def eval_sampler(self) -> samplers_lib.Sampler:
    return families.samplers_of(self.positions, self.eval_positions, self.encoding.sampler)[1]

  @property
  def head_size(self) -> int:
    return self.d_model // self.num_heads

  @property
  def context(self) -> families.Context:
    """What the encoding family reads about this model."""
    family = self.family
    return families.Context(
        d_model=self.d_model, num_heads=self.num_heads, head_size=self.head_size,
        max_position=self.max_position,
        settings={k: self.family_settings.get(k, getattr(self, k, default))
                  for k, default in family.settings.items()},
        behaviour=self.behaviour, randomized=self.train_sampler.name != "arange")

  def sample_positions(self, key: jax.Array, length, padded_length: Optional[int] = None,
                       evaluation: bool = False) -> jax.Array:
    """Positions for one batch: the one function training and evaluation use.

    Args:
      key: PRNG key of this batch.
      length: T (a traced int is fine with padded_length).
      padded_length: pad to this static size (see `randomized_pe.samplers`).
      evaluation: use the evaluation sampler.

    Returns:
      [T] (or [padded_length]); [N, T] where the release draws per layer (release item 2).
    """
    # The pure core's function (release items 2 and 5), with this config's settings.
    return families.sample_positions(
        self.encoding, key, length, self.max_position,
        sampler=self.eval_sampler if evaluation else self.train_sampler, compat=self.compat,
        num_layers=self.num_layers, padded_length=padded_length, settings=vars(self))

  def _draw(self, sampler: samplers_lib.Sampler, key, length, padded_length=None):
    """One draw of `sampler` with the settings it declares taken from this config."""
    settings = {name: getattr(self, name, default) for name, default in sampler.settings.items()}
    return sampler(key, length, self.max_position, padded_length, **settings)


# Called through this module's name (tests may replace it here).
_get_params = layers_lib.get_params


class _Weight(hk.Module):
  """The weight of a bias-free hk.Linear (same name, shape and initializer)."""

  def __call__(self, input_size: int, output_size: int):
    init = hk.initializers.TruncatedNormal(stddev=1.0 / math.sqrt(input_size))
    return hk.get_parameter("w", [input_size, output_size], init=init)


class MultiHeadAttention(hk.Module):
  """Multi-head self-attention whose logits come from the encoding family's scorer.

  The weights are a softmax of the logits unless the family brings its own normalisation
  (`Family.normalize`: geometric attention's stick-breaking).
  """

  def __init__(self, config: EncoderConfig, name: Optional[str] = None):
    super().__init__(name=name)
    self._config = config

  def __call__(self, x, positions, key_mask=None, num_queries=None, query_start=None,
               logit_scale=None, return_weights: bool = False):
    """x: [B, T, M]; positions: [T]; key_mask: optional bool [B, T] -> [B, Tq, M].

    num_queries: only Tq positions ask (default all T), from query_start (default
    the last Tq; may be traced); all T answer. logit_scale: optional float [B]
    multiplying each sequence's logits (log-n scaling; the family's separate bias
    only with log_n_scale_bias). return_weights: also return the attention weights
    [B, H, Tq, T] (`Encoder` asks for them with return_intermediates). They are computed
    beside the output, from the same logits function (`attention.attention_logits`) and
    normalisation (`attention.attention_weights`); the output is computed exactly as
    without the option.
    """
    config = self._config
    batch, length, _ = x.shape
    num_queries = length if num_queries is None else num_queries
    query_start = length - num_queries if query_start is None else query_start
    heads, head_size = config.num_heads, config.head_size

    size = heads * head_size
    w_q, w_k, w_v = (_Weight(name=name)(x.shape[-1], size) for name in ("query", "key", "value"))
    if num_queries == length:  # One product for the three projections.
      q, k, v = jnp.split(x @ jnp.concatenate([w_q, w_k, w_v], axis=1), 3, axis=-1)
    else:
      q = families.query_rows(x, query_start, num_queries, axis=1) @ w_q
      k, v = jnp.split(x @ jnp.concatenate([w_k, w_v], axis=1), 2, axis=-1)
    q, k, v = (y.reshape(batch, y.shape[1], heads, head_size) for y in (q, k, v))  # [B, T, H, D]
    family, ctx, params, query_input = config.family, config.context, {}, None
    if family.acts == "attention":
      params = _get_params(family.params(ctx))
      if family.reads_input:
        query_input = (x if num_queries == length
                       else families.query_rows(x, query_start, num_queries, axis=1))
    out = families.attend(family, positions, params, ctx, q, k, v, key_mask,
                          query_start=query_start, logit_scale=logit_scale,
                          scale_bias=config.log_n_scale_bias,
                          chunk_rows=config.attention_chunk_rows, query_input=query_input,
                          return_weights=return_weights)
    out, weights = out if return_weights else (out, None)
    out = hk.Linear(config.d_model, with_bias=False, name="output")(
        out.reshape(batch, num_queries, heads * head_size))
    return (out, weights) if return_weights else out


_layer_norm = layers_lib.layer_norm  # eps 1e-5, Haiku's default.


class Intermediates(NamedTuple):
  """What the encoder computes on the way to its logits (`return_intermediates=True`).

  Attributes:
    embeddings: [B, T, M] the input of layer 0 (token embedding, any additive encoding
      term, embedding dropout where it runs).
    attention: one [B, H, Tq, T] per layer: the attention weights (rows sum to 1 over
      the unmasked keys; Tq = T except in the last layer with num_outputs).
    layers: one [B, Tq, M] per layer: the layer's output (after its feed-forward layer
      norm), the input of the next layer.
  """

  embeddings: jax.Array
  attention: tuple
  layers: tuple


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
    family = config.family
    per_layer = config.behaviour.per_layer_positions and family.release_per_layer
    if not family.floats and not jnp.issubdtype(positions.dtype, jnp.integer):
      raise ValueError(f"{config.pe} needs integer positions, got {positions.dtype}")
    if positions.shape == (length,):
      return positions, [positions] * config.num_layers
    if per_layer and positions.shape == (config.num_layers, length):
      # Only attention encodings draw per layer, so the embeddings never use these.
      return positions[0], [positions[i] for i in range(config.num_layers)]
    if family.per_axis and positions.ndim == 2 and positions.shape[0] == length:
      return positions, [positions] * config.num_layers
    expected = f"[{length}]" + (f" or [{config.num_layers}, {length}]" if per_layer else "")
    expected += f" or [{length}, k]" if family.per_axis else ""
    raise ValueError(
        f"positions must have shape {expected} for pe={config.pe!r}, "
        f"compat={config.compat!r}; got {positions.shape}"
    )

  def __call__(self, tokens, positions=None, is_training: bool = False, key_mask=None,
               num_outputs: Optional[int] = None, outputs_from=None,
               return_intermediates: bool = False):
    """Logits for every position, or for the last `num_outputs`.

    Args:
      tokens: int [B, T] token ids in [0, vocab_size).
      positions: [T] positions shared by the batch and all layers (None: 0..T-1);
        [N, T] one row per layer where the release draws per layer; [T, k] per-axis
        positions for families that take them.
      is_training: enables dropout (compat="release" keeps it on regardless).
      key_mask: optional bool [B, T]; False keys are ignored by attention
        (padding).
      num_outputs: only the logits of `num_outputs` positions (where the tasks
        put their answers). The last layer then computes queries, feed-forward
        and logits for those positions only: the same values as slicing the full
        output (up to rounding), for less work. Where dropout runs at evaluation
        (compat="release", is_training=False) every row is computed and the full
        output sliced, so that the rows keep the dropout masks of the full pass.
      outputs_from: the first of those positions (default: the last
        `num_outputs`); may be traced, so padded batches of different lengths
        share one program.
      return_intermediates: also return the `Intermediates` (attention weights, the
        embeddings and every layer's output), for analyses. Off, the computation is
        exactly the one without the option; on, the logits are the same.

    Returns:
      float32 [B, T, O], or [B, num_outputs, O]; with return_intermediates,
      (those logits, `Intermediates`).
    """
    config = self._config
    chex.assert_rank(tokens, 2)
    batch, length = tokens.shape
    embedding_positions, layer_positions = self._positions(positions, length)
    family, behaviour = config.family, config.behaviour
    # Release item 3: dropout also at evaluation (the release has no switch).
    dropout_on = config.dropout_rate > 0 and (is_training or behaviour.dropout_at_evaluation)
    # Release item 4: embedding dropout only after additive encodings.
    embedding_dropout = (family.acts == "embedding"
                         or not behaviour.embedding_dropout_needs_term)
    # Every dropout's key, in the order the dropouts draw them, split in one loop; at
    # init, where parameters draw keys between the dropouts, each draws its own (None).
    num_dropouts = int(embedding_dropout) + 2 * config.num_layers
    if not dropout_on:
      dropout_keys = iter(())
    elif hk.running_init():
      dropout_keys = iter([None] * num_dropouts)
    else:
      dropout_keys = iter(layers_lib.next_rng_keys_in_order(num_dropouts))

    def dropout(x):  # [B, T, M]
      if not dropout_on:
        return x
      # Drawn position-major, [T, B, M]: the mask of a position does not depend on how
      # many positions follow it, so a padded batch drops exactly what the unpadded
      # batch drops (with JAX's partitionable threefry, a draw of a shape is a prefix
      # of the draw of a longer one). The last layer's rows (the outputs only) take the
      # first rows of a full-length draw: the same bits, one random-bit kernel a program.
      return layers_lib.dropout(x, config.dropout_rate, position_major=True,
                                positions=length, key=next(dropout_keys))

    embed = hk.Embed(
        config.vocab_size, config.d_model,
        w_init=hk.initializers.TruncatedNormal(config.emb_init_scale), name="embed",
    )
    # Scaling the [V, M] table rather than the [B, T, M] lookup: the same values.
    h = jnp.asarray(embed.embeddings * math.sqrt(config.d_model))[(tokens,)]  # [B, T, M]
    if family.acts == "embedding":
      ctx = config.context
      h = h + family.term(embedding_positions, _get_params(family.params(ctx)), ctx)[None]
    if embedding_dropout:
      h = dropout(h)

    if num_outputs is not None and not 1 <= num_outputs <= length:
      raise ValueError(f"num_outputs must be in [1, {length}], got {num_outputs}")
    if num_outputs is not None and outputs_from is None:
      outputs_from = length - num_outputs
    if isinstance(outputs_from, int) and not 0 <= outputs_from <= length - num_outputs:
      raise ValueError(f"outputs_from must be in [0, {length - num_outputs}], got {outputs_from}")
    logit_scale = None  # None, not a factor of 1: with the option off nothing changes.
    if config.log_n_scaling:
      # n: the keys each sequence really has (padded keys are masked), [B].
      num_keys = (jnp.full((batch,), length) if key_mask is None
                  else jnp.sum(key_mask, axis=-1, dtype=jnp.int32))
      logit_scale = attn_lib.log_n_scale(num_keys, config.log_n_reference)  # [B]
    # Nothing after the last layer mixes positions: it computes only the outputs' rows,
    # except where dropout runs at evaluation (release item 3): its masks are drawn for
    # the rows a layer computes, so there every row is computed and the outputs' read
    # afterwards, the rows of the full forward pass.
    last_rows = num_outputs if (is_training or not dropout_on) else None
    embeddings, weights, layers = h, [], []
    for layer in range(config.num_layers):
      queries = last_rows if layer == config.num_layers - 1 else None
      attn = MultiHeadAttention(config, name=f"attention_{layer}")(
          h, layer_positions[layer], key_mask, queries, outputs_from if queries else None,
          logit_scale, return_weights=return_intermediates)
      if return_intermediates:
        attn, layer_weights = attn
        weights.append(layer_weights)
      if queries is not None:
        h = families.query_rows(h, outputs_from, queries, axis=1)
      h = _layer_norm(h + dropout(attn), name=f"attention_norm_{layer}")
      ff = hk.Linear(config.widening_factor * config.d_model, name=f"ffn_in_{layer}")(h)
      ff = hk.Linear(config.d_model, name=f"ffn_out_{layer}")(jax.nn.relu(ff))
      h = _layer_norm(h + dropout(ff), name=f"ffn_norm_{layer}")
      layers.append(h)
    assert next(dropout_keys, None) is None, "a dropout key was split and not used"
    logits = hk.Linear(self._output_size, name="logits")(h)  # [B, T or O, C]
    if num_outputs is not None and last_rows is None:
      logits = families.query_rows(logits, outputs_from, num_outputs, axis=1)
    if not return_intermediates:
      return logits
    return logits, Intermediates(embeddings, tuple(weights), tuple(layers))


def make_encoder(config: EncoderConfig, output_size: int) -> hk.Transformed:
  """Returns hk.transform of the encoder.

  `init(rng, tokens, positions=None, is_training=False, key_mask=None, num_outputs=None,
  outputs_from=None, return_intermediates=False)` and `apply(params, rng, tokens, ...the
  same)` -> logits [B, T, output_size] ([B, num_outputs, output_size]); with
  return_intermediates, (logits, `Intermediates`).
  `rng` may be None when no dropout runs (paper mode with is_training=False).
  """
  if output_size < 1:
    raise ValueError(f"output_size must be >= 1, got {output_size}")

  def forward(tokens, positions=None, is_training=False, key_mask=None, num_outputs=None,
              outputs_from=None, return_intermediates=False):
    return Encoder(config, output_size, name="encoder")(
        tokens, positions, is_training, key_mask, num_outputs, outputs_from,
        return_intermediates)

  return hk.transform(forward)


@dataclasses.dataclass(frozen=True)
class EncoderModel(layers_lib.TransformedModel):
  """The encoder behind the model protocol of `randomized_pe.models`."""

  config: EncoderConfig
  output_size: int
  make_network = staticmethod(make_encoder)

  @property
  def block_width(self) -> int:
    """Activations per token a block keeps: q, k, v, output and the MLP's hidden layer."""
    return self.config.d_model * (self.config.widening_factor + 4)

  @property
  def description(self) -> str:
    c = self.config
    return f"encoding {c.pe} ({c.compat} semantics)"

  @property
  def label(self) -> str:
    return self.config.pe

  @property
  def record(self) -> dict:
    """What results record of the encoder: its encoding and semantics."""
    return {"pe": self.config.pe, "compat": self.config.compat}

  def apply(self, params, key, tokens, positions=None, *, is_training=False, key_mask=None,
            num_outputs=None, outputs_from=None, intermediates=False):
    """Logits (`Encoder.__call__`); with intermediates=True, (logits, `Intermediates`):
    the attention weights, embeddings and layer outputs of the same forward pass."""
    return self._net.apply(params, key, tokens, positions, is_training=is_training,
                           key_mask=key_mask, num_outputs=num_outputs,
                           outputs_from=outputs_from, return_intermediates=intermediates)

  def sample_positions(self, key, length, *, padded_length=None, evaluation=False):
    return self.config.sample_positions(key, length, padded_length, evaluation)

  def check_sequence_length(self, length: int, what: str = "") -> None:
    """Sampled positions are distinct in [0, max_position): no longer sequences."""
    if self.config.max_position < length:
      raise ValueError(
          f"model.max_position={self.config.max_position} is smaller than the longest "
          f"sequence the model sees ({length} tokens" + (f": {what}" if what else "")
          + f"); raise model.max_position to at least {length}")


# Settings whose 0 in a run's config means a sequence length of the run, which only the
# run knows: setting -> the `models.RunSpec` field that gives it.
LENGTH_SETTINGS = {
    "log_n_reference": "max_length",  # m of log-n scaling: the longest training sequence.
    "beta_max_length": "eval_max_length",  # M of equal_mean_beta: the longest evaluation one.
}
# EncoderConfig fields that are not settings of `config.model`: the task's vocabulary, the
# run's samplers (`models.RunSpec`), and a speed setting made in code.
_NOT_SETTINGS = ("vocab_size", "positions", "eval_positions", "attention_chunk_rows")


def from_config(model_config, vocab_size: int, output_size: int,
                run: models.RunSpec = models.RunSpec()) -> EncoderModel:
  """The encoder of a run's `config.model` (fields named as EncoderConfig's; absent ones,
  e.g. in configs saved before a setting was added, take its defaults) for `run`.

  A length setting (`LENGTH_SETTINGS`) that the config sets to 0 takes the run's length
  where the run knows it (>= 1); otherwise it stays 0, for `EncoderConfig.validate` to
  report where it is needed.
  """
  settings = models.settings_of(EncoderConfig, model_config,
                                _NOT_SETTINGS + ("family_settings",))
  fields = {field.name for field in dataclasses.fields(EncoderConfig)}
  settings["family_settings"] = families.Settings(
      {name: model_config[name] for name in families.declared_settings()
       if name not in fields and name in model_config})
  for name, length in LENGTH_SETTINGS.items():
    if settings.get(name) == 0 and getattr(run, length) >= 1:
      settings[name] = getattr(run, length)
  return EncoderModel(EncoderConfig(vocab_size=vocab_size, positions=run.positions,
                                    eval_positions=run.eval_positions, **settings),
                      output_size)
