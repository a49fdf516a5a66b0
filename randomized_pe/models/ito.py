"""Ito et al. (2024)'s Transformer for the Latin Square Task (Haiku), with all its encodings.

Architecture (the original code, ljhearne/LSTNN_public `lstnn/transformer_main.py`;
docs/ito.md): the 16 cells of a 4x4 grid, each a one-hot of its symbol (blank = all
zeros) times a linear layer with bias; `num_layers` post-layer-norm blocks of one-head
attention and a GELU MLP (exact erf GELU after *both* linear layers); the positional
term added at the input of every block; a linear read-out. The class is read from the
last token (cell 15), whatever cell the probe is in. Initialisation copies PyTorch's
defaults, because the σ of the learned encodings only means something relative to the
token-embedding scale it sets.

    h_0 = onehot(x) W_e + b_e                                 [B, T, M]
    per block l:  e = h_l + P_l  (dropout on e for the fixed sinusoids, option)
                  u = LayerNorm(Attn_l(e) + e)
                  h_{l+1} = LayerNorm(GELU(GELU(u W_1 + b_1) W_2 + b_2) + u)
    logits = h_N W_o + b_o; the prediction is logits[:, 15]

Shape glossary: B batch, T = 16 cells (grid_size ** 2), M d_model (160), F mlp_size
(640), H heads (1), D head size (M / H), N num_layers (4), C classes (4), V vocabulary
(6: blank, four shapes, the probe), R rows of a relative-distance table.

Encodings are entries of `ENCODINGS` (one record each: `ItoEncoding`); the model reads a
record's fields and never tests an encoding's name. Each names a family of the core's
registry (`randomized_pe.families`) and the settings this model gives it: the sinusoids
are `sin_cos` in the original's interleaved layout (2-D through its per-axis positions),
RoPE is `rope`, the learned and frozen matrices are `table`, Shaw's relative logits are
`shaw` (its causal mask a bias), c-NoPE is `causal` (the mask a bias, its x100 a logit
scale). What stays here is how this model uses a family: an embedding family's term
enters at every block (not once), and each variant has its own projections (biases, no
output projection), as the original's three attention modules. The shared layers
(parameter creation, layer norm, dropout, initialisers) are `randomized_pe.models.layers`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from randomized_pe import encodings as enc
from randomized_pe import families
from randomized_pe import models
from randomized_pe import registry
from randomized_pe import samplers as samplers_lib
from randomized_pe.models import layers



# The initialisers: PyTorch's defaults (`layers.torch_uniform`, `layers.xavier_uniform`)
# and jax.nn's.
torch_uniform = layers.torch_uniform
xavier_uniform = layers.xavier_uniform
normal = jax.nn.initializers.normal  # N(0, stddev^2), not truncated: torch.randn(...) * stddev.
zeros = jax.nn.initializers.zeros


# --------------------------------------------------------------------------
# Position terms (the core's `sin_cos` family in the original's interleaved layout).

interleave_sin_cos = enc.interleave_sin_cos


def raster_sinusoid(positions, dim: int, max_timescale: float = enc.DEFAULT_MAX_TIMESCALE):
  """The original 1d-fixed term: PE[t, 2i] = sin(p_t w_i), PE[t, 2i + 1] = cos(p_t w_i),
  w_i = max_timescale^(-2i / dim). positions [T] -> float32 [T, dim]."""
  return interleave_sin_cos(enc.sinusoid(positions, dim, max_timescale))


def grid_sinusoid(positions, dim: int, max_timescale: float = enc.DEFAULT_MAX_TIMESCALE):
  """The original 2d-fixed term (`PositionalEncoding2D`) at grid positions [T, 2] = (col, row).

  Features 0..dim/2-1 encode the column, the rest the row, each interleaved sin/cos with
  w_k = max_timescale^(-2k / (dim / 2)) (frequencies over the half, not over dim).
  With positions (t % 4, t // 4) this is the original matrix; its cosine with the
  1d-fixed matrix is 0.7246, the paper's 0.72 (tests/test_ito_model.py).
  Returns float32 [T, dim].
  """
  return interleave_sin_cos(enc.sinusoid(positions, dim, max_timescale, per_axis=True), 2)


def grid_positions(columns, rows) -> jax.Array:
  """Cell positions [S*S, 2] (col, row), row-major, from per-axis positions [S] and [S]."""
  size = columns.shape[0]
  cells = jnp.arange(size * size)
  return jnp.stack([columns[cells % size], rows[cells // size]], axis=-1)


# --------------------------------------------------------------------------
# The projections of the attention variants (see `Attention`).


@dataclasses.dataclass(frozen=True)
class Projections:
  """How an attention variant projects: the original uses three different modules.

  Attributes:
    packed: q, k, v from one [M, 3M] matrix (else three [M, M] matrices).
    qkv_bias: biases on q, k, v.
    qkv_init: "xavier" (MultiheadAttention's in_proj, zero biases) or "linear"
      (torch.nn.Linear's default U(±1/sqrt(M)) for weights and biases).
    output: "mha" (U(±1/sqrt(M)) weight, zero bias), "no_bias" (weight only) or "none".
  """

  packed: bool
  qkv_bias: bool
  qkv_init: str
  output: str


# torch.nn.MultiheadAttention(160, 1): packed in_proj (xavier, zero bias), out_proj.
TORCH_MHA = Projections(packed=True, qkv_bias=True, qkv_init="xavier", output="mha")
# RotaryPE2 and CausalSelfAttention: Linear(M, 3M, bias=False), Linear(M, M, bias=False).
BIAS_FREE = Projections(packed=True, qkv_bias=False, qkv_init="linear", output="no_bias")
# RelativeGlobalAttention: three Linear(M, M) with bias, no output projection.
SEPARATE_NO_OUTPUT = Projections(packed=False, qkv_bias=True, qkv_init="linear", output="none")


# --------------------------------------------------------------------------
# The encodings: each is a family of the core registry (`randomized_pe.families`) with
# the settings this model gives it, and how this model uses it.


@dataclasses.dataclass(frozen=True)
class ItoEncoding:
  """One encoding of the paper: how positions enter Ito's Transformer.

  The positional computation is a family of `randomized_pe.families` (its term, scorer,
  bias, logit scale and parameters); this record says which, with which settings, and
  what this model does around it.

  Attributes:
    name: registry name (`model.pe`).
    description: one line.
    family: the core family's name (`families.get_family`). An embedding family's term
      is added to the input of every block (its parameters: one set per block); an
      attention family's scorer, bias and logit scale make the block's logits.
    settings: config -> the family's settings ({setting: value}); the others take the
      family's defaults.
    frozen: the per-block params are not trained (the `random` encoding): the forward
      pass stops their gradient, and `frozen_mask` marks them for the optimizer.
    term_dropout: the original's Dropout(fixed_pe_dropout) on h + PE (its sinusoid PE
      modules carry one; the others do not).
    projections: the attention module's projections.
    positions: what `positions` are: "raster" ([T], cell index), "grid" ([T, 2], (col,
      row)) or "none" (unused, or table rows: only arange).
    sampler: the training position sampler by default (`randomized_pe.samplers`).
  """

  name: str
  description: str
  family: str = "none"
  settings: Callable[["ItoConfig"], dict] = lambda config: {}
  frozen: bool = False
  term_dropout: bool = False
  projections: Projections = TORCH_MHA
  positions: str = "none"
  sampler: str = "arange"

  @property
  def takes_samplers(self) -> bool:
    """Whether positions other than arange mean anything (sinusoids and RoPE only)."""
    return self.positions in ("raster", "grid")

  @property
  def core_family(self) -> families.Family:
    return families.get_family(self.family)

  def params(self, config: "ItoConfig") -> dict:
    """{name: families.ParamSpec}: the family's parameters in this model."""
    return self.core_family.params(config.context)

  @property
  def term(self) -> Optional[Callable[..., jax.Array]]:
    """(positions, params, config) -> [T, M], the term added at every block; None for
    encodings that act in the attention (or not at all)."""
    family = self.core_family
    if family.acts != "embedding":
      return None
    return lambda positions, params, config: family.term(positions, params, config.context)

  @property
  def scorer(self) -> Optional[Callable[..., Callable]]:
    """(positions, params, config) -> score_fn(q, k) -> [b, H, T, T], the family's logits
    of all T queries before its bias and logit scale (for tests and analyses); None for
    encodings whose family does not act in the attention."""
    family = self.core_family
    if family.acts != "attention":
      return None
    return lambda positions, params, config: (
        lambda q, k: family.scorer(positions, params, config.context, q.shape, 0)(q, k))


ENCODINGS: registry.Registry[ItoEncoding] = registry.Registry("Ito encoding")
names = ENCODINGS.names
get = ENCODINGS.get


def register(encoding: ItoEncoding) -> ItoEncoding:
  """Adds an encoding (a name may be registered once); its family must be in the core's
  and take the positions the encoding gives it (grid positions are per-axis)."""
  family = families.get_family(encoding.family)  # Raises, listing the families, if absent.
  if encoding.positions == "grid" and not family.per_axis:
    raise ValueError(f"Ito encoding {encoding.name!r}: grid positions [T, 2] need a family "
                     f"that takes per-axis positions; {family.name} does not (those that do: "
                     f"{', '.join(f.name for f in families.FAMILIES if f.per_axis)})")
  return ENCODINGS.register(encoding.name, encoding)


def _sin_cos(config: "ItoConfig") -> dict:
  # The original's interleaved layout; grid positions [T, 2] take the per-axis path.
  return {"max_timescale": config.max_timescale, "sin_cos_interleaved": True}


def _table(stddev_of: Callable[["ItoConfig"], float]):
  # One [T, M] table per block, N(0, σ^2), read at the cells 0..T-1.
  return lambda config: {"table_rows": config.num_cells, "table_init_scale": stddev_of(config)}


register(ItoEncoding(
    "1d_fixed", "sin/cos of the raster index t = 4 row + col (Vaswani), interleaved",
    family="sin_cos", settings=_sin_cos, term_dropout=True, positions="raster"))
register(ItoEncoding(
    "2d_fixed", "sin/cos of (col, row), half the features each (the paper's ground truth)",
    family="sin_cos", settings=_sin_cos, term_dropout=True, positions="grid"))
register(ItoEncoding(
    "learn", "a learned [T, M] matrix per block, initialised N(0, pe_sigma^2)",
    family="table", settings=_table(lambda c: c.pe_sigma)))
register(ItoEncoding(
    "random", "a frozen N(0, 1) [T, M] matrix per block (not Ruoss et al.'s positions)",
    family="table", settings=_table(lambda c: 1.0), frozen=True))
register(ItoEncoding(
    "relative", "Shaw et al. relative logits, a learned distance table per block, causal",
    family="shaw", settings=lambda c: {"shaw_max_distance": c.num_cells - 1,
                                       "shaw_causal": c.relative_causal,
                                       "shaw_init_scale": 1.0},
    projections=SEPARATE_NO_OUTPUT))
register(ItoEncoding(
    "rope", "rotary embeddings over the whole head, raster positions 0..15",
    family="rope", settings=lambda c: {"max_timescale": c.max_timescale},
    projections=BIAS_FREE, positions="raster"))
register(ItoEncoding("nope", "no positional information, bidirectional attention"))
register(ItoEncoding(
    "c_nope", "no positional encoding, causal attention (logits x c_nope_logit_scale)",
    family="causal", settings=lambda c: {"causal_logit_scale": c.c_nope_logit_scale},
    projections=BIAS_FREE))
register(ItoEncoding(
    "randomized_2d", "2d_fixed fed sorted random row and column positions from [0, L)",
    family="sin_cos", settings=_sin_cos, term_dropout=True, positions="grid",
    sampler="randomized"))


# --------------------------------------------------------------------------
# Configuration.


@dataclasses.dataclass(frozen=True)
class ItoConfig:
  """Hyperparameters of Ito's Transformer; defaults are the original's (docs/ito.md).

  Attributes:
    vocab_size: input ids; id 0 (blank) embeds to the bias alone, ids 1..V-1 are one-hot
      channels (the original's Linear(5, 160) for V = 6).
    pe: the encoding (`names()`).
    positions, eval_positions: position samplers of training and evaluation for the
      encodings that take them (`ItoEncoding.takes_samplers`); "" takes the encoding's
      (arange, randomized for randomized_2d) and, for evaluation, the training sampler's
      evaluation default. Grid encodings draw the columns and the rows separately.
    grid_size: the side of the grid (sequences are grid_size^2 tokens).
    num_layers, num_heads, d_model, mlp_size: architecture.
    pe_sigma: σ of the `learn` encoding: the standard deviation of its N(0, σ^2) init.
    fixed_pe_dropout: dropout on h + PE at every block for the sinusoid encodings (the
      original's Dropout(0.1), which the paper's text does not mention); 0 turns it off.
    dropout_at_evaluation: also drop at evaluation, as the original did (it never
      called model.eval()); off by default, so that evaluation is deterministic.
    relative_causal: the `relative` encoding masks later keys, as the original (the
      paper's text says bidirectional); False uses a 2T - 1 row table, no mask.
    c_nope_logit_scale: the factor on c_nope's logits (the original's temperature
      1/100 gives 100; 1 is plain causal NoPE).
    max_position: L, the range [0, L) sampled positions come from (per axis for grids).
    max_timescale: the longest wavelength of the sinusoids and RoPE.
    attention_chunk_rows: batch rows per attention chunk (`randomized_pe.attention`);
      speed only.
  """

  vocab_size: int = 6
  pe: str = "2d_fixed"
  positions: str = ""
  eval_positions: str = ""
  grid_size: int = 4
  num_layers: int = 4
  num_heads: int = 1
  d_model: int = 160
  mlp_size: int = 640
  pe_sigma: float = 1.0
  fixed_pe_dropout: float = 0.1
  dropout_at_evaluation: bool = False
  relative_causal: bool = True
  c_nope_logit_scale: float = 100.0
  max_position: int = 16
  max_timescale: float = enc.DEFAULT_MAX_TIMESCALE
  attention_chunk_rows: Optional[int] = None

  def __post_init__(self):
    encoding = get(self.pe)  # Validates the name.
    for name, low in [("vocab_size", 2), ("grid_size", 1), ("num_layers", 1), ("num_heads", 1),
                      ("d_model", 1), ("mlp_size", 1), ("max_position", 1)]:
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"model.{name} must be an int >= {low}, got {value!r}")
    if self.d_model % self.num_heads:
      raise ValueError(f"model.d_model={self.d_model} must be divisible by "
                       f"model.num_heads={self.num_heads}")
    if self.d_model % 4 or self.head_size % 2:
      raise ValueError(f"model.d_model={self.d_model} must be divisible by 4 and the head size "
                       "even (sin/cos per grid axis, RoPE pairs)")
    if not 0.0 <= self.fixed_pe_dropout < 1.0:
      raise ValueError(f"model.fixed_pe_dropout must be in [0, 1), got {self.fixed_pe_dropout}")
    for name in ("pe_sigma", "c_nope_logit_scale", "max_timescale"):
      if not getattr(self, name) > 0:
        raise ValueError(f"model.{name} must be > 0, got {getattr(self, name)!r}")
    for setting, sampler in (("training.positions", self.train_sampler),
                             ("evaluation.positions", self.eval_sampler)):
      if sampler.name != "arange" and not encoding.takes_samplers:
        raise ValueError(f"{setting}={sampler.name!r}: the {self.pe} encoding reads positions "
                         "0..T-1 only (a table or none); samplers apply to "
                         f"{', '.join(n for n in names() if get(n).takes_samplers)}")
      if sampler.floats and (encoding.positions == "none" or not self.family.floats):
        raise ValueError(f"{setting}={sampler.name!r} gives float positions, which {self.pe} "
                         "cannot take")
    per_sample = self.grid_size if encoding.positions == "grid" else self.num_cells
    if encoding.takes_samplers and self.max_position < per_sample:
      raise ValueError(f"model.max_position={self.max_position} is below the {per_sample} "
                       f"distinct positions {self.pe} draws; raise it to at least {per_sample}")

  @property
  def encoding(self) -> ItoEncoding:
    return get(self.pe)

  @property
  def family(self) -> families.Family:
    """The core family of the encoding (`randomized_pe.families`)."""
    return self.encoding.core_family

  @property
  def context(self) -> families.Context:
    """What the encoding's family reads about this model: its sizes and the settings the
    encoding gives it."""
    return families.Context(d_model=self.d_model, num_heads=self.num_heads,
                            head_size=self.head_size, max_position=self.max_position,
                            settings=self.encoding.settings(self))

  @property
  def num_cells(self) -> int:
    return self.grid_size * self.grid_size

  @property
  def head_size(self) -> int:
    return self.d_model // self.num_heads

  @property
  def train_sampler(self) -> samplers_lib.Sampler:
    return families.samplers_of(self.positions, "", get(self.pe).sampler)[0]

  @property
  def eval_sampler(self) -> samplers_lib.Sampler:
    return families.samplers_of(self.positions, self.eval_positions, get(self.pe).sampler)[1]

  def default_positions(self) -> jax.Array:
    """The unsampled positions: [T] cell indices, or [T, 2] (col, row) for grids."""
    if self.encoding.positions == "grid":
      axis = jnp.arange(self.grid_size, dtype=jnp.int32)
      return grid_positions(axis, axis)
    return jnp.arange(self.num_cells, dtype=jnp.int32)

  def sample_positions(self, key, evaluation: bool = False) -> jax.Array:
    """Positions of one batch: [T], or [T, 2] for grids (columns and rows drawn apart)."""
    encoding = self.encoding
    sampler = self.eval_sampler if evaluation else self.train_sampler
    if not encoding.takes_samplers or sampler.name == "arange":
      return self.default_positions()
    if encoding.positions == "grid":
      column_key, row_key = jax.random.split(key) if sampler.random else (key, key)
      return grid_positions(sampler(column_key, self.grid_size, self.max_position),
                            sampler(row_key, self.grid_size, self.max_position))
    return sampler(key, self.num_cells, self.max_position)


# --------------------------------------------------------------------------
# Haiku modules.


class TorchLinear(hk.Module):
  """x W + b with PyTorch's initialisers (by default torch.nn.Linear's)."""

  def __init__(self, output_size: int, with_bias: bool = True, w_init=None, b_init=None,
               name: Optional[str] = None):
    super().__init__(name=name)
    self._output_size = output_size
    self._with_bias = with_bias
    self._w_init = w_init
    self._b_init = b_init

  def __call__(self, x):  # [..., I] -> [..., O]
    fan_in = x.shape[-1]
    w_init = self._w_init or torch_uniform(fan_in)
    w = hk.get_parameter("w", [fan_in, self._output_size], x.dtype,
                         init=lambda s, d: w_init(hk.next_rng_key(), tuple(s), d))
    out = x @ w
    if self._with_bias:
      b_init = self._b_init or torch_uniform(fan_in)
      b = hk.get_parameter("b", [self._output_size], x.dtype,
                           init=lambda s, d: b_init(hk.next_rng_key(), tuple(s), d))
      out = out + b
    return out


class Attention(hk.Module):
  """Self-attention of one block: its projections as the encoding declares, its logits
  and weights as the encoding's core family gives them (`randomized_pe.families`: scorer,
  bias, logit scale, normalisation) through `randomized_pe.attention`, as the encoder's
  `MultiHeadAttention` does."""

  def __init__(self, config: ItoConfig, name: Optional[str] = None):
    super().__init__(name=name)
    self._config = config

  def __call__(self, x, positions, key_mask=None, return_weights: bool = False):
    """x [B, T, M] -> [B, T, M] (and the attention weights [B, H, T, T] if asked)."""
    config = self._config
    projections = config.encoding.projections
    batch, length, width = x.shape
    heads, head_size = config.num_heads, config.head_size
    if projections.packed:
      w_init = (xavier_uniform(width, 3 * width) if projections.qkv_init == "xavier"
                else torch_uniform(width))
      qkv = TorchLinear(3 * width, projections.qkv_bias, w_init=w_init,
                        b_init=zeros if projections.qkv_init == "xavier" else None,
                        name="qkv")(x)
      q, k, v = jnp.split(qkv, 3, axis=-1)
    else:
      q, k, v = (TorchLinear(width, projections.qkv_bias, name=n)(x)
                 for n in ("query", "key", "value"))
    q, k, v = (y.reshape(batch, length, heads, head_size) for y in (q, k, v))  # [B, T, H, D]
    family, ctx = config.family, config.context
    # The family's parameters after the projections' (the order of the initial draws).
    params = layers.get_params(family.params(ctx)) if family.acts == "attention" else {}
    out = families.attend(family, positions, params, ctx, q, k, v, key_mask,
                          chunk_rows=config.attention_chunk_rows, query_input=x,
                          return_weights=return_weights)
    out, weights = out if return_weights else (out, None)
    out = out.reshape(batch, length, width)  # [B, T, M]
    if projections.output == "mha":
      out = TorchLinear(width, b_init=zeros, name="output")(out)
    elif projections.output == "no_bias":
      out = TorchLinear(width, with_bias=False, name="output")(out)
    return (out, weights) if return_weights else out


class ItoTransformer(hk.Module):
  """The network; see the module docstring."""

  def __init__(self, config: ItoConfig, output_size: int, name: Optional[str] = None):
    super().__init__(name=name)
    self._config = config
    self._output_size = output_size

  def _check_positions(self, positions):
    config = self._config
    if positions is None:
      return config.default_positions()
    positions = jnp.asarray(positions)
    want = {"grid": (config.num_cells, 2)}.get(config.encoding.positions, (config.num_cells,))
    if positions.shape != want:
      raise ValueError(f"positions must have shape {list(want)} for pe={config.pe!r}, "
                       f"got {list(positions.shape)}")
    return positions

  def __call__(self, tokens, positions=None, is_training: bool = False, key_mask=None,
               return_attention: bool = False, embedding_noise=None):
    """Logits [B, T, C] on every cell (the prediction is cell T - 1's).

    Args:
      tokens: int [B, T] ids in [0, vocab_size); 0 is the blank cell.
      positions: [T] or [T, 2] (grid encodings); None: the unsampled ones.
      is_training: enables the fixed-PE dropout (with dropout_at_evaluation, always on).
      key_mask: optional bool [B, T]; False keys get no attention.
      return_attention: also return the attention weights [N, B, H, T, T].
      embedding_noise: optional [B, T, M] added to the output of the embedding layer
        (the analyses' noise robustness); None adds nothing.
    """
    config, encoding = self._config, self._config.encoding
    chex.assert_rank(tokens, 2)
    if tokens.shape[1] != config.num_cells:
      raise ValueError(f"the ito model reads {config.num_cells} cells (a {config.grid_size}x"
                       f"{config.grid_size} grid), got {tokens.shape[1]} tokens")
    positions = self._check_positions(positions)
    channels = jax.nn.one_hot(tokens, config.vocab_size, dtype=jnp.float32)[..., 1:]  # [B, T, V-1]
    h = TorchLinear(config.d_model, name="embed")(channels)  # [B, T, M]; a blank is the bias.
    if embedding_noise is not None:
      h = h + embedding_noise
    drop = (encoding.term_dropout and config.fixed_pe_dropout > 0
            and (is_training or config.dropout_at_evaluation))
    family, ctx = config.family, config.context
    weights = []
    for layer in range(config.num_layers):
      with hk.experimental.name_scope(f"block_{layer}"):
        e = h
        if family.acts == "embedding":  # The core family's term, at every block.
          params = layers.get_params(family.params(ctx))
          if encoding.frozen:
            params = jax.lax.stop_gradient(params)
          e = e + family.term(positions, params, ctx)[None]  # [B, T, M]
        if drop:  # Drawn as [B, T, M].
          e = layers.dropout(e, config.fixed_pe_dropout)
        attention = Attention(config, name="attention")
        if return_attention:
          a, w = attention(e, positions, key_mask, return_weights=True)
          weights.append(w)
        else:
          a = attention(e, positions, key_mask)
        u = layers.layer_norm(a + e, "attention_norm")
        f = jax.nn.gelu(TorchLinear(config.mlp_size, name="mlp_in")(u), approximate=False)
        f = jax.nn.gelu(TorchLinear(config.d_model, name="mlp_out")(f), approximate=False)
        h = layers.layer_norm(f + u, "mlp_norm")
    logits = TorchLinear(self._output_size, name="logits")(h)  # [B, T, C]
    if return_attention:
      return logits, jnp.stack(weights)  # [N, B, H, T, T]
    return logits


def make_network(config: ItoConfig, output_size: int) -> hk.Transformed:
  """hk.transform of the network: init(rng, tokens, positions=None, is_training=False,
  key_mask=None, return_attention=False, embedding_noise=None) and apply(params, rng,
  ...the same)."""
  if output_size < 1:
    raise ValueError(f"output_size must be >= 1, got {output_size}")

  def forward(tokens, positions=None, is_training=False, key_mask=None, return_attention=False,
              embedding_noise=None):
    return ItoTransformer(config, output_size, name="ito")(
        tokens, positions, is_training, key_mask, return_attention, embedding_noise)

  return hk.transform(forward)


# --------------------------------------------------------------------------
# Frozen parameters and counts.


def frozen_mask(params, pe: str) -> Any:
  """A pytree of bools like `params` of encoding `pe`: True for frozen tables (`random`).

  Their gradient is already zero (the forward stops it), so Adam and SGD leave them as
  they are; an optimizer with weight decay must skip them (optax's `mask=` takes the
  negation), as PyTorch's AdamW skips parameters that have no gradient.
  """
  encoding = get(pe)
  # The family's term parameters (created in the blocks); an attention family's live in
  # the blocks' attention modules.
  frozen = (set(families.get_family(encoding.family).params(ItoConfig(pe=pe).context))
            if encoding.frozen else set())
  return {module: {name: name in frozen and module.split("/")[-1].startswith("block_")
                   for name in values} for module, values in params.items()}


def parameter_count(params, mask=None, trainable_only: bool = True) -> int:
  """Number of parameters; with trainable_only and a `frozen_mask`, the trainable ones."""
  leaves = jax.tree_util.tree_leaves(params)
  if mask is None or not trainable_only:
    return int(sum(np.size(x) for x in leaves))
  flags = jax.tree_util.tree_leaves(mask)
  return int(sum(np.size(x) for x, frozen in zip(leaves, flags) if not frozen))


# --------------------------------------------------------------------------
# The model protocol (`randomized_pe.models`).


@dataclasses.dataclass(frozen=True)
class ItoModel(layers.TransformedModel):
  """Ito's Transformer behind the model protocol of `randomized_pe.models`.

  Differences from the protocol's assumptions (docs/ito.md): the sequence length is
  fixed (grid_size^2 cells; `check_sequence_length` refuses any other), there is no
  padding, and the `random` encoding's frozen tables live in `params` with their gradient
  stopped (the protocol has no separate state): use `frozen_mask` for weight decay.
  """

  config: ItoConfig
  output_size: int
  make_network = staticmethod(make_network)

  @property
  def block_width(self) -> int:
    """Activations per token a block keeps: q, k, v, output and the MLP's hidden layer."""
    return 4 * self.config.d_model + self.config.mlp_size

  @property
  def description(self) -> str:
    c = self.config
    extra = f", σ={c.pe_sigma:g}" if c.pe == "learn" else ""
    return f"Ito et al. 2024 Transformer, encoding {c.pe}{extra}"

  @property
  def label(self) -> str:
    return self.config.pe

  @property
  def record(self) -> dict:
    """What results record of the model: its encoding (the σ of `learn` is in
    `description`, which a dataset's record holds as "model")."""
    return {"pe": self.config.pe}

  def apply(self, params, key, tokens, positions=None, *, is_training=False, key_mask=None,
            num_outputs=None, outputs_from=None, intermediates=False, embedding_noise=None):
    """Logits [B, T, C], or [B, num_outputs, C] from outputs_from (default: the last ones).

    The model's answer is the last cell's: num_outputs=1 gives [B, 1, C]. With
    intermediates=True, (those logits, the attention weights [N, B, H, T, T]) of the same
    pass. embedding_noise: optional [B, T, M] added to the embedding layer's output.
    """
    out = self._net.apply(params, key, tokens, positions, is_training=is_training,
                          key_mask=key_mask, return_attention=intermediates,
                          embedding_noise=embedding_noise)
    logits, weights = out if intermediates else (out, None)
    if num_outputs is not None:
      length = logits.shape[1]
      if not 1 <= num_outputs <= length:
        raise ValueError(f"num_outputs must be in [1, {length}], got {num_outputs}")
      start = length - num_outputs if outputs_from is None else outputs_from
      logits = jax.lax.dynamic_slice_in_dim(logits, start, num_outputs, axis=1)
    return (logits, weights) if intermediates else logits

  def classify(self, params, key, tokens, positions=None, *, is_training=False):
    """Class logits [B, C] read from the last cell, as the original."""
    return self.apply(params, key, tokens, positions, is_training=is_training, num_outputs=1)[:, 0]

  def attention_weights(self, params, key, tokens, positions=None, *, is_training=False):
    """Attention probabilities of every block, [N, B, H, T, T] (for the analyses)."""
    _, weights = self._net.apply(params, key, tokens, positions, is_training=is_training,
                                 return_attention=True)
    return weights

  def position_terms(self, params, positions=None) -> jax.Array:
    """The additive term of every block, [N, T, M] (zeros for attention encodings)."""
    config, family, ctx = self.config, self.config.family, self.config.context
    positions = config.default_positions() if positions is None else jnp.asarray(positions)
    terms = []
    for layer in range(config.num_layers):
      if family.acts != "embedding":
        terms.append(jnp.zeros((config.num_cells, config.d_model)))
        continue
      block = {name: params[f"ito/block_{layer}"][name] for name in family.params(ctx)}
      terms.append(family.term(positions, block, ctx))
    return jnp.stack(terms)

  def frozen_mask(self, params):
    """True for parameters that are not trained (the `random` encoding's tables)."""
    return frozen_mask(params, self.config.pe)

  def sample_positions(self, key, length, *, padded_length=None, evaluation=False):
    # The training step reads `length` from its batch, so it may be traced; the padded
    # length is a static shape then, and must itself be the grid's (no padding).
    if isinstance(length, jax.core.Tracer):
      length = self.config.num_cells if padded_length is None else padded_length
    self.check_sequence_length(length)
    if padded_length is not None and padded_length != length:
      raise ValueError(f"the ito model takes no padding (length {length}, padded_length "
                       f"{padded_length})")
    return self.config.sample_positions(key, evaluation)

  def check_sequence_length(self, length, what: str = "") -> None:
    """The grid has exactly grid_size^2 cells: no other length."""
    if length != self.config.num_cells:
      raise ValueError(
          f"the ito model reads exactly {self.config.num_cells} tokens (a "
          f"{self.config.grid_size}x{self.config.grid_size} grid), got {length}"
          + (f" ({what})" if what else "") + "; set model.grid_size to match the task")


def from_config(model_config, vocab_size: int, output_size: int,
                run: models.RunSpec = models.RunSpec()) -> ItoModel:
  """Ito's Transformer from a run's `config.model` (fields named as ItoConfig's; absent
  ones take ItoConfig's defaults) with the samplers of `run`."""
  settings = models.settings_of(ItoConfig, model_config,
                                ("vocab_size", "positions", "eval_positions"))
  return ItoModel(ItoConfig(vocab_size=vocab_size, positions=run.positions,
                            eval_positions=run.eval_positions, **settings), output_size)
