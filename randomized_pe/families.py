"""Encoding families: how positions enter a model, one registry by name (no Haiku here).

A family is one `Family` record: where it acts, the parameters it needs, the settings
it reads, which positions it accepts, its release behaviour, and its computation as
pure functions of positions and parameters. A model creates the declared parameters
(with its own framework: both Haiku models use `randomized_pe.models.layers.get_params`)
and calls the pure functions, so the same families serve Haiku, Flax or plain JAX models.
`attend` is the attention of any family given a model's q, k and v; both models'
attention modules call it between their projections.

  name      acts in     settings            floats  per-axis  release (docs/release.md)
  none      -           -                   yes     yes       -
  sin_cos   embedding   max_timescale       yes     yes       -
  learned   embedding   learned_init_scale  no      no        -
  relative  attention   max_timescale       yes     no        offset tables, per layer,
                                                              clamped lookup, init
  rope      attention   max_timescale       yes     yes       per layer
  alibi     attention   -                   yes     no        offset tables, per layer
            (a bias)
  geometric attention   geometric_normalize yes     no        -
            (its own normalisation: NDR's stick-breaking, `randomized_pe.geometric`)

Families that are parts a model composes, not encodings of their own (`standalone=False`:
not in `names()` or `family_names()`; Ito et al.'s model, `randomized_pe.models.ito`,
builds its encodings from them and from the ones above):

  name      acts in     settings                          floats
  table     embedding   table_rows, table_init_scale      no      a learned table, N(0, s^2)
  shaw      attention   shaw_max_distance, shaw_causal,   no      Shaw et al.'s distance
                        shaw_init_scale                           table (+ the causal bias)
  causal    attention   causal_logit_scale                yes     a causal mask as a bias,
            (a bias, a logit scale)                               logits times a factor

Encoding names (`names()`): each family's name (classic positions, sampler `arange`),
and `randomized_<family>` (the same family fed by sampler `randomized`) where the
family declares a randomized twin. Any sampler can also be chosen by config.

Function signatures (Shapes: T positions, Tq queries, B batch, H heads, D head size,
M d_model):
  params(ctx) -> {name: ParamSpec}             parameters the family needs
  term(positions [T], params, ctx) -> [T, M]   embedding families: added to the
                                               token embeddings
  scorer(positions [T], params, ctx, query_shape (B, Tq, H, D), query_start)
      -> score_fn(q, k)                        attention families: score_fn maps
                                               queries [b, Tq, H, D] (the positions
                                               query_start .. query_start + Tq - 1;
                                               query_start may be traced) and keys
                                               [b, T, H, D] to logits [b, H, Tq, T],
                                               already scaled by 1/sqrt(D)
  bias(positions [T], params, ctx, query_shape, query_start) -> [H, Tq, T]
                                               optional, attention families: logits
                                               added to the scorer's that do not
                                               depend on the content (ALiBi's)
  normalize(positions [T], params, ctx, query_shape, query_start)
      -> weights_fn(logits, key_mask)          optional, attention families: replaces
                                               the softmax; maps logits [b, H, Tq, T]
                                               and key_mask (bool [b, T] or None) to
                                               weights [b, H, Tq, T] (None: softmax)
  With reads_input=True the score_fn takes a third argument, the layer input at the
  query rows [b, Tq, M] (NDR's directional encoding projects it).
  logit_scale(ctx) -> float                    optional, attention families: a constant
                                               factor on the scorer's logits, applied as
                                               log-n scaling's (before the bias); c-NoPE's
                                               temperature

A scorer's whole output is one logit; a `bias` is kept apart so that the model can
treat it differently: log-n attention scaling (`randomized_pe.attention`) multiplies
the scorer's logits, and the bias only with `log_n_scale_bias` (Su's formula scales
Q K^T alone). A family whose scorer adds its own bias gets it scaled. A family's
`normalize` sees the logits after scaling and bias; `weights_fn` gives the weights of any
family (softmax where it has none), for analyses (`attend(..., return_weights=True)`
gives them beside the output).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from randomized_pe import attention as attn_lib
from randomized_pe import encodings as enc
from randomized_pe import geometric as geometric_lib
from randomized_pe import registry
from randomized_pe import release as release_lib
from randomized_pe import samplers as samplers_lib

ACTS = ("none", "embedding", "attention")


@dataclasses.dataclass(frozen=True)
class ParamSpec:
  """A parameter a family needs: its shape and initializer (key, shape, dtype) -> array."""

  shape: tuple[int, ...]
  init: Callable[..., jax.Array]


class Settings(Mapping[str, Any]):
  """A read-only, hashable mapping of setting names to values (a Context's settings)."""

  def __init__(self, items=()):
    self._items = dict(items)

  def __getitem__(self, name):
    return self._items[name]

  def __iter__(self):
    return iter(self._items)

  def __len__(self):
    return len(self._items)

  def __hash__(self):
    return hash(tuple(sorted(self._items.items())))

  def __repr__(self):
    return f"Settings({self._items!r})"


def declared_settings() -> dict[str, Any]:
  """Every setting a registered family declares, with its default."""
  out = {}
  for family in FAMILIES:
    for name, default in family.settings.items():
      out.setdefault(name, default)
  return out


@dataclasses.dataclass(frozen=True)
class Context:
  """What a family may read about the model it is in; hashable (a static jit argument).

  Outside a model, build one with `Context.create(d_model, num_heads, ...)`.

  Attributes:
    d_model, num_heads, head_size: the model's sizes (head_size 0: d_model // num_heads).
    max_position: L, the range sampled positions come from (rows of a learned table).
    settings: the family's settings, resolved from the model's config; a setting left
      out reads as the default its family declares (`Family.settings`).
    behaviour: the release behaviour record (`randomized_pe.release`; default: the paper).
    randomized: the training positions are sampled (not arange): the release's
      randomized code path (release item 1 applies to it only).
  """

  d_model: int
  num_heads: int
  head_size: int = 0
  max_position: int = 2048
  settings: Mapping[str, Any] = dataclasses.field(default_factory=Settings)
  behaviour: release_lib.Behaviour = release_lib.PAPER
  randomized: bool = False

  def __post_init__(self):
    if self.head_size == 0 and self.num_heads and self.d_model % self.num_heads == 0:
      object.__setattr__(self, "head_size", self.d_model // self.num_heads)
    object.__setattr__(self, "settings", Settings({**declared_settings(), **self.settings}))

  @classmethod
  def create(cls, d_model: int, num_heads: int, *, max_position: int = 2048,
             compat: str = "paper", randomized: bool = False, **settings) -> "Context":
    """A checked Context with defaults: e.g. `Context.create(64, 8, max_timescale=1e4)`.

    Args:
      d_model, num_heads: the model's sizes; d_model / num_heads must be an even int.
      max_position: L.
      compat: "paper" or "release" (`randomized_pe.release`).
      randomized: the training positions are sampled (release item 1).
      **settings: family settings (`declared_settings()` lists them with their defaults).

    Raises:
      ValueError: one line naming the bad argument (and the valid settings).
    """
    for name, value in [("d_model", d_model), ("num_heads", num_heads),
                        ("max_position", max_position)]:
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Context.create: {name} must be an int >= 1, got {value!r}")
    if d_model % num_heads or (d_model // num_heads) % 2:
      raise ValueError(f"Context.create: d_model={d_model} must be num_heads={num_heads} times "
                       "an even head size")
    valid = declared_settings()
    unknown = sorted(set(settings) - set(valid))
    if unknown:
      raise ValueError(f"Context.create: unknown setting {', '.join(unknown)}; valid settings: "
                       f"{', '.join(sorted(valid))}")
    return cls(int(d_model), int(num_heads), int(d_model) // int(num_heads), int(max_position),
               Settings(settings), release_lib.resolve(compat), bool(randomized))


def no_params(ctx: Context) -> dict:
  del ctx
  return {}


@dataclasses.dataclass(frozen=True)
class Family:
  """One way positions enter a model (see the module docstring for the signatures).

  Attributes:
    name: registry name.
    acts: "none", "embedding" (needs `term`) or "attention" (needs `scorer`).
    term, scorer: the computation (exactly one, matching `acts`; none for "none").
    bias: optional, attention families only: a content-free position bias added to the
      scorer's logits (see the module docstring for why it is apart).
    normalize: optional, attention families only: builds the weights_fn that replaces
      the softmax (see the module docstring); None keeps the softmax.
    logit_scale: optional, attention families only: ctx -> a constant factor on the
      scorer's logits (not on the bias); None: no factor (`logit_scale_of`).
    reads_input: attention families only: the scorer's score_fn takes the layer input
      at the query rows as a third argument.
    params: ctx -> {name: ParamSpec}.
    settings: the model config fields it reads, with defaults for models that lack them.
    floats: accepts float positions.
    per_axis: accepts per-axis positions [T, k] (a 2-D grid has k = 2).
    randomized_twin: `randomized_<name>` exists (the family fed by `randomized`).
    release_offsets: under compat="release" positions are an offset table |j - i| ->
      distance, and `randomized` draws the release's `offsets` (release item 5).
    release_per_layer: under compat="release" random samplers draw once per layer
      (release item 2).
    standalone: an encoding of its own, listed by `names()` and `family_names()` (with
      its randomized twin); False for parts a model composes into its own encodings (Ito's
      model: `randomized_pe.models.ito`), found by `get_family` only.
    description: one line for listings and docs.
  """

  name: str
  acts: str
  term: Optional[Callable[..., jax.Array]] = None
  scorer: Optional[Callable[..., Callable]] = None
  bias: Optional[Callable[..., jax.Array]] = None
  normalize: Optional[Callable[..., Callable]] = None
  logit_scale: Optional[Callable[[Context], float]] = None
  reads_input: bool = False
  params: Callable[[Context], dict] = no_params
  settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  floats: bool = True
  per_axis: bool = False
  randomized_twin: bool = True
  release_offsets: bool = False
  release_per_layer: bool = False
  standalone: bool = True
  description: str = ""

  def __post_init__(self):
    if self.acts not in ACTS:
      raise ValueError(f"family {self.name!r}: acts must be one of {', '.join(ACTS)}, "
                       f"got {self.acts!r}")
    needs = {"none": (False, False), "embedding": (True, False), "attention": (False, True)}
    if needs[self.acts] != (self.term is not None, self.scorer is not None):
      want = {"none": "neither term nor scorer", "embedding": "a term and no scorer",
              "attention": "a scorer and no term"}[self.acts]
      raise ValueError(f"family {self.name!r} acts in {self.acts!r} and needs {want}")
    for hook, present in [("a bias", self.bias is not None),
                          ("a normalize hook", self.normalize is not None),
                          ("a logit scale", self.logit_scale is not None),
                          ("reads_input", self.reads_input)]:
      if present and self.acts != "attention":
        raise ValueError(f"family {self.name!r} acts in {self.acts!r}; only attention "
                         f"families take {hook}")


@dataclasses.dataclass(frozen=True)
class Encoding:
  """An encoding name resolved: a family and the sampler that feeds it in training."""

  name: str
  family: Family
  sampler: str


# --------------------------------------------------------------------------
# Release behaviour of positions (items 2 and 5).


def release_sampler(family: Family, sampler: samplers_lib.Sampler,
                    behaviour: release_lib.Behaviour) -> samplers_lib.Sampler:
  """The sampler the release's code would use in place of `sampler` (release item 5)."""
  if not (behaviour.offset_tables and family.release_offsets):
    return sampler
  if sampler.name == "randomized":
    return samplers_lib.get("offsets")
  if sampler.name not in ("arange", "evenly_spaced", "offsets"):
    raise ValueError(
        f"compat='release' reads {family.name} positions as a table of distances, which "
        f"sampler {sampler.name!r} cannot give; valid choices there: arange, randomized, "
        "evenly_spaced, offsets (or use compat='paper')")
  return sampler


def samplers_of(training: str, evaluation: str, default: str
                ) -> tuple[samplers_lib.Sampler, samplers_lib.Sampler]:
  """A model's (training, evaluation) samplers from its config, as every model resolves them.

  Args:
    training: training.positions; "" takes `default` (the encoding's own sampler).
    evaluation: evaluation.positions; "" takes the training sampler's evaluation default
      (for the built-in integer samplers the training sampler itself; `linspace` for the
      equal-mean ones).
    default: the encoding's training sampler (arange, or randomized for its twin).

  Raises:
    ValueError: an unknown sampler name (listing the valid ones).
  """
  train = samplers_lib.get(training or default)
  return train, samplers_lib.get(evaluation or train.evaluation or train.name)


def draws_per_layer(family: Family, sampler: samplers_lib.Sampler,
                    behaviour: release_lib.Behaviour) -> bool:
  """Whether every layer gets its own draw (release item 2)."""
  return behaviour.per_layer_positions and family.release_per_layer and sampler.random


def sample_positions(encoding, key: jax.Array, length, max_position: int, *,
                     sampler=None, compat: str = "paper", num_layers: int = 1,
                     padded_length: Optional[int] = None,
                     settings: Optional[Mapping[str, Any]] = None) -> jax.Array:
  """Positions for one batch, as the paper's encoder draws them (release-aware).

  Args:
    encoding: an encoding name (`names()`) or an `Encoding`.
    key: PRNG key of this batch.
    length: T (any integer, e.g. np.int64; a traced int with padded_length).
    max_position: L.
    sampler: a sampler name or `Sampler` replacing the encoding's own (e.g. the
      evaluation sampler); None: the encoding's.
    compat: "paper" or "release". Under "release" relative and ALiBi read the release's
      offset table (item 5) and random draws are per layer (item 2).
    num_layers: N, the number of draws where the release draws per layer.
    padded_length: pad to this static size (see `randomized_pe.samplers`).
    settings: the model settings samplers may declare (e.g. beta_max_length); each
      sampler takes the ones it declares, its defaults for the others.

  Returns:
    [T] (or [padded_length]); [N, T] where the release draws per layer.
  """
  if not isinstance(encoding, Encoding):
    encoding = get(encoding)
  if sampler is None:
    sampler = encoding.sampler
  if not isinstance(sampler, samplers_lib.Sampler):
    sampler = samplers_lib.get(sampler)
  behaviour = release_lib.resolve(compat)
  sampler = release_sampler(encoding.family, sampler, behaviour)  # Release item 5.
  settings = {} if settings is None else settings
  draw_settings = {name: settings.get(name, default)
                   for name, default in sampler.settings.items()}

  def draw(k):
    return sampler(k, length, max_position, padded_length, **draw_settings)

  if draws_per_layer(encoding.family, sampler, behaviour):  # Release item 2.
    return jax.vmap(draw)(jax.random.split(key, num_layers))
  return draw(key)


# --------------------------------------------------------------------------
# The families' computations.


def query_rows(x, query_start, num_queries: int, axis: int = 0):
  """Rows [query_start, query_start + num_queries) of x along `axis` (start may be traced)."""
  return jax.lax.dynamic_slice_in_dim(x, query_start, num_queries, axis=axis)


def weights_fn(family: Family, positions, params, ctx: Context, query_shape,
               query_start) -> attn_lib.WeightsFn:
  """The family's (logits, key_mask) -> attention weights [b, H, Tq, T]: softmax by default.

  With `randomized_pe.attention.attention_logits` this gives the explicit attention
  weights of any family (`attention.attention_weights`), e.g. for plots of attention maps.
  """
  if family.normalize is None:
    return attn_lib.softmax_weights
  return family.normalize(positions, params, ctx, query_shape, query_start)


def logit_scale_of(family: Family, ctx: Context) -> Optional[float]:
  """The family's constant factor on its logits, or None where it has none (or it is 1)."""
  if family.logit_scale is None:
    return None
  scale = float(family.logit_scale(ctx))
  return None if scale == 1.0 else scale


def attend(family: Family, positions, params, ctx: Context, q: jax.Array, k: jax.Array,
           v: jax.Array, key_mask=None, *, query_start=0, logit_scale=None,
           scale_bias: bool = False, chunk_rows: Optional[int] = None, query_input=None,
           return_weights: bool = False):
  """Attention of q over k, v as the family makes it: its scorer (plain scaled dot
  products for a family that does not act in the attention), bias, logit scale and
  normalisation, through `randomized_pe.attention`. Every model's attention module calls
  this between its projections (each creates the family's `params` itself).

  Args:
    family, positions, params, ctx: the family, the positions [T] (or [T, k]), the
      parameters it declared (created by the model), the model's context.
    q: [B, Tq, H, D] queries at positions query_start .. query_start + Tq - 1 (may be
      traced); k, v: [B, T, H, D].
    key_mask: optional bool [B, T].
    logit_scale: optional float [B], a per-sequence factor (log-n scaling); the family's
      own factor (`Family.logit_scale`) multiplies it.
    scale_bias: whether logit_scale also multiplies the family's bias.
    chunk_rows: batch rows per chunk (`attention.attention`).
    query_input: the layer input at the query rows [B, Tq, M], for families that read it.
    return_weights: also return the attention weights [B, H, Tq, T] (computed beside the
      output from the same logits; the output is computed as without the option).

  Returns:
    [B, Tq, H, D] (and the weights with return_weights).
  """
  score, bias, normalize = attn_lib.dot_scores, None, None
  if family.acts == "attention":
    score = family.scorer(positions, params, ctx, q.shape, query_start)
    if family.bias is not None:
      bias = family.bias(positions, params, ctx, q.shape, query_start)  # [H, Tq, T] or None
    if family.normalize is not None:
      normalize = family.normalize(positions, params, ctx, q.shape, query_start)
    factor = logit_scale_of(family, ctx)
    if factor is not None:
      logit_scale = (jnp.full((q.shape[0],), factor, jnp.float32) if logit_scale is None
                     else logit_scale * factor)
  if not family.reads_input:
    query_input = None
  out = attn_lib.attention(q, k, v, score, key_mask, bias=bias, logit_scale=logit_scale,
                           scale_bias=scale_bias, chunk_rows=chunk_rows, weights_fn=normalize,
                           query_input=query_input)
  if not return_weights:
    return out
  logits = attn_lib.attention_logits(q, k, score, bias, logit_scale, scale_bias, query_input)
  return out, attn_lib.attention_weights(logits, key_mask, normalize)


def _sin_cos_term(positions, params, ctx: Context):
  del params
  per_axis = jnp.ndim(positions) == 2
  term = enc.sinusoid(positions, ctx.d_model, ctx.settings["max_timescale"], per_axis=per_axis)
  if ctx.settings["sin_cos_interleaved"]:
    term = enc.interleave_sin_cos(term, jnp.shape(positions)[-1] if per_axis else 1)
  return term


def _learned_params(ctx: Context) -> dict:
  init = jax.nn.initializers.truncated_normal(ctx.settings["learned_init_scale"])
  return {"position_table": ParamSpec((ctx.max_position, ctx.d_model), init)}


def _learned_term(positions, params, ctx: Context):
  del ctx
  return enc.learned_lookup(params["position_table"], positions)


def _rope_scorer(positions, params, ctx: Context, query_shape, query_start):
  del params
  timescale = ctx.settings["max_timescale"]
  per_axis = jnp.ndim(positions) == 2
  query_positions = query_rows(positions, query_start, query_shape[1])

  def score(q, k):
    return attn_lib.dot_scores(enc.apply_rope(q, query_positions, timescale, per_axis=per_axis),
                               enc.apply_rope(k, positions, timescale, per_axis=per_axis))

  return score


def _dot_scorer(positions, params, ctx: Context, query_shape, query_start):
  """Plain scaled dot products: the content part of a family whose positions are a bias."""
  del positions, params, ctx, query_shape, query_start
  return attn_lib.dot_scores


def _alibi_bias(positions, params, ctx: Context, query_shape, query_start):
  del params
  slopes = enc.alibi_slopes(query_shape[2])
  if ctx.behaviour.offset_tables:
    # Release item 5: the positions are an offset table |j - i| -> distance.
    bias = enc.alibi_bias_from_distances(enc.toeplitz(enc.signed_offsets(positions)), slopes)
  else:
    bias = enc.alibi_bias(positions, positions, slopes)
  return query_rows(bias, query_start, query_shape[1], axis=1)  # [H, Tq, T]


def _relative_params(ctx: Context) -> dict:
  normal = jax.nn.initializers.normal(0.02)
  rel_dim = ctx.num_heads * ctx.head_size  # The release encodes distances in d_model features.
  if ctx.behaviour.uncorrected_truncation:
    # Release item 6: hk.Linear's default, stddev 1/sqrt(fan_in) before truncation.
    kernel_init = jax.nn.initializers.truncated_normal(1.0 / math.sqrt(rel_dim))
  else:
    kernel_init = jax.nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
  return {
      "content_bias": ParamSpec((ctx.num_heads, ctx.head_size), normal),
      "relative_bias": ParamSpec((ctx.num_heads, ctx.head_size), normal),
      "relative_kernel": ParamSpec((rel_dim, ctx.num_heads * ctx.head_size), kernel_init),
  }


def _relative_scorer(positions, params, ctx: Context, query_shape, query_start):
  batch, num_queries, num_heads, head_size = query_shape
  length = positions.shape[0]
  timescale = ctx.settings["max_timescale"]
  content_bias, relative_bias = params["content_bias"], params["relative_bias"]
  rel_dim = params["relative_kernel"].shape[0]
  kernel = params["relative_kernel"].reshape(rel_dim, num_heads, head_size)
  pairwise = enc.use_pairwise(batch, length, num_heads, head_size, rel_dim)
  if ctx.behaviour.offset_tables:
    # Release item 5: positions are an offset table; the classic encoding uses
    # sinusoid(j - i) directly.
    if ctx.randomized and ctx.behaviour.clamped_relative_lookup:
      # Release item 1: clamped lookup, zero and rightward distances collapse.
      offset_positions = enc.release_relative_positions(positions, ctx.max_position)
    else:
      offset_positions = enc.signed_offsets(positions)
    if pairwise:
      table = enc.relative_key_table_toeplitz(offset_positions, kernel, timescale, num_queries,
                                              query_start)
      relative = lambda q: enc.relative_logits_from_table(q, table)
    else:
      relative = lambda q: enc.relative_logits_toeplitz(q, offset_positions, kernel, timescale,
                                                        query_start)
  elif pairwise:
    table = enc.relative_key_table(  # Once per batch and layer.
        positions, kernel, timescale, query_rows(positions, query_start, num_queries))
    relative = lambda q: enc.relative_logits_from_table(q, table)
  else:
    relative = lambda q: enc.relative_logits(
        q, positions, kernel, timescale, method="factorized",
        query_positions=query_rows(positions, query_start, num_queries))
  scale = 1.0 / math.sqrt(head_size)

  def score(q, k):
    content = jnp.einsum("bthd,bshd->bhts", (q + content_bias) * scale, k)
    return content + relative((q + relative_bias) * scale)

  return score


def causal_bias(positions, params, ctx: Context, query_shape, query_start):
  """The causal mask as a bias [H, Tq, T]: 0 where p_j <= p_i, the float32 minimum
  elsewhere (added to finite logits it stays far below them: the softmax gives 0)."""
  del params, ctx
  query_positions = query_rows(positions, query_start, query_shape[1])
  allowed = positions[None, :] <= query_positions[:, None]  # [Tq, T]
  bias = jnp.where(allowed, 0.0, jnp.finfo(jnp.float32).min).astype(jnp.float32)
  return jnp.broadcast_to(bias[None], (query_shape[2], *bias.shape))


def _shaw_max_distance(ctx: Context) -> int:
  return int(ctx.settings["shaw_max_distance"]) or ctx.max_position - 1


def _shaw_params(ctx: Context) -> dict:
  """One [R, D] table of distances shared by the heads: R = K + 1 rows (distances -K..0)
  when causal, 2K + 1 (-K..K) otherwise, K = shaw_max_distance (0: max_position - 1)."""
  distance = _shaw_max_distance(ctx)
  rows = distance + 1 if ctx.settings["shaw_causal"] else 2 * distance + 1
  init = jax.nn.initializers.normal(ctx.settings["shaw_init_scale"])
  return {"distance_table": ParamSpec((rows, ctx.head_size), init)}


def _shaw_scorer(positions, params, ctx: Context, query_shape, query_start):
  """Shaw et al. (2018), as Music Transformer's skew form computes it:
  logits[i, j] = (q_i . k_j + q_i . E[K + clip(p_j - p_i, -K, K or 0)]) / sqrt(D).

  A causal table has no rows for later keys: they read row K (distance 0) and are
  masked by the family's bias.
  """
  table = params["distance_table"]  # [R, D]
  causal = bool(ctx.settings["shaw_causal"])
  distance = table.shape[0] - 1 if causal else (table.shape[0] - 1) // 2
  query_positions = query_rows(positions, query_start, query_shape[1])
  offsets = positions[None, :] - query_positions[:, None]  # [Tq, T]
  index = jnp.clip(offsets, -distance, 0 if causal else distance) + distance
  scale = 1.0 / math.sqrt(query_shape[3])

  def score(q, k):
    content = jnp.einsum("bthd,bshd->bhts", q, k)
    per_row = jnp.einsum("bthd,rd->bhtr", q, table)  # [b, H, Tq, R]
    relative = jnp.take_along_axis(per_row, index[None, None], axis=-1)  # [b, H, Tq, T]
    return (content + relative) * scale

  return score


def _shaw_bias(positions, params, ctx: Context, query_shape, query_start):
  if not ctx.settings["shaw_causal"]:
    return None
  return causal_bias(positions, params, ctx, query_shape, query_start)


def _table_params(ctx: Context) -> dict:
  rows = int(ctx.settings["table_rows"]) or ctx.max_position
  init = jax.nn.initializers.normal(ctx.settings["table_init_scale"])  # Not truncated.
  return {"table": ParamSpec((rows, ctx.d_model), init)}


def _table_term(positions, params, ctx: Context):
  del ctx
  return enc.learned_lookup(params["table"], positions)


def _geometric_params(ctx: Context) -> dict:
  """NDR's DirectionSensitiveGeometricAttention parameters (docs/geometric.md).

  The directional projection is initialised like an hk.Linear (truncated normal of
  stddev 1/sqrt(d_model), zero bias), as every projection of this encoder; NDR keeps
  PyTorch's default (uniform +-1/sqrt(d_model), weight and bias).
  """
  constant = jax.nn.initializers.constant
  kernel_init = jax.nn.initializers.truncated_normal(1.0 / math.sqrt(ctx.d_model))
  return {
      "content_bias": ParamSpec((ctx.num_heads, ctx.head_size), jax.nn.initializers.zeros),
      "content_scale": ParamSpec((), constant(1.0 / math.sqrt(ctx.head_size))),
      "direction_kernel": ParamSpec((ctx.d_model, ctx.num_heads, 2), kernel_init),
      "direction_bias": ParamSpec((ctx.num_heads, 2), jax.nn.initializers.zeros),
      "direction_scale": ParamSpec((), constant(1.0)),
      "score_bias": ParamSpec((), jax.nn.initializers.zeros),
  }


def _geometric_scorer(positions, params, ctx: Context, query_shape, query_start):
  """s <q + c, k> + NDR's directional logits + s_bias: score_fn(q, k, query_input)."""
  del ctx
  query_positions = query_rows(positions, query_start, query_shape[1])

  def score(q, k, query_input):
    content = jnp.einsum("bthd,bshd->bhts", q + params["content_bias"], k)
    direction = geometric_lib.direction_logits(
        query_input, params["direction_kernel"], params["direction_bias"],
        params["direction_scale"], positions, query_positions)
    return content * params["content_scale"] + direction + params["score_bias"]

  return score


def _geometric_normalize(positions, params, ctx: Context, query_shape, query_start):
  del params
  return geometric_lib.weights_fn(positions, query_start, query_shape[1],
                                  normalize=bool(ctx.settings["geometric_normalize"]))


# --------------------------------------------------------------------------
# The registry.

FAMILIES: registry.Registry[Family] = registry.Registry("encoding family")


def register(family: Family) -> Family:
  """Adds a family (and its `randomized_` twin, if declared) to the registry."""
  return FAMILIES.register(family.name, family)


get_family = FAMILIES.get


def family_names() -> tuple[str, ...]:
  """The standalone families (encodings of their own), in registry order."""
  return tuple(f.name for f in FAMILIES if f.standalone)


def _encodings() -> dict[str, Encoding]:
  table = {}
  for family in FAMILIES:
    if not family.standalone:
      continue
    table[family.name] = Encoding(family.name, family, "arange")
    if family.randomized_twin:
      table["randomized_" + family.name] = Encoding(
          "randomized_" + family.name, family, "randomized")
  return table


def names() -> tuple[str, ...]:
  """Every encoding name: the families, then their randomized twins, in registry order."""
  table = _encodings()
  return tuple(sorted(table, key=lambda n: (n.startswith("randomized_"), list(table).index(n))))


def get(name: str) -> Encoding:
  """The encoding called `name`; an unknown name raises ValueError listing the valid ones."""
  try:
    return _encodings()[name]
  except KeyError:
    raise ValueError(
        f"unknown positional encoding {name!r}; valid names: {', '.join(names())}") from None


def families_accepting(floats: bool = False, per_axis: bool = False) -> tuple[str, ...]:
  """Names of the families that take float (or per-axis) positions."""
  return tuple(f.name for f in FAMILIES if f.standalone
               and (not floats or f.floats) and (not per_axis or f.per_axis))


_TIMESCALE = {"max_timescale": enc.DEFAULT_MAX_TIMESCALE}

register(Family("none", "none", randomized_twin=False, per_axis=True,
                description="no positional information"))
register(Family("sin_cos", "embedding", term=_sin_cos_term,
                settings={**_TIMESCALE, "sin_cos_interleaved": False},
                per_axis=True, description="sin/cos added to the embeddings (Vaswani et al.)"))
register(Family("learned", "embedding", term=_learned_term, params=_learned_params,
                settings={"learned_init_scale": 1.0}, floats=False,
                description="a learned table of max_position rows"))
register(Family("relative", "attention", scorer=_relative_scorer, params=_relative_params,
                settings=_TIMESCALE, release_offsets=True, release_per_layer=True,
                description="Transformer-XL relative logits (Dai et al.)"))
register(Family("rope", "attention", scorer=_rope_scorer, settings=_TIMESCALE,
                per_axis=True, release_per_layer=True,
                description="rotary embeddings (Su et al.)"))
register(Family("alibi", "attention", scorer=_dot_scorer, bias=_alibi_bias,
                release_offsets=True, release_per_layer=True,
                description="linear biases (Press et al.)"))
register(Family("geometric", "attention", scorer=_geometric_scorer,
                normalize=_geometric_normalize, reads_input=True, params=_geometric_params,
                settings={"geometric_normalize": True},
                description="geometric attention with directional encoding (Csordás et al., "
                            "NDR); docs/geometric.md"))

# Parts a model composes (Ito et al.'s: `randomized_pe.models.ito`), not encodings of
# their own: no randomized twins, not in `names()`.
register(Family("table", "embedding", term=_table_term, params=_table_params,
                settings={"table_rows": 0, "table_init_scale": 1.0}, floats=False,
                randomized_twin=False, standalone=False,
                description="a learned table of table_rows (0: max_position) rows, "
                            "N(0, table_init_scale^2), not truncated"))
register(Family("shaw", "attention", scorer=_shaw_scorer, bias=_shaw_bias, params=_shaw_params,
                settings={"shaw_max_distance": 0, "shaw_causal": False,
                          "shaw_init_scale": 1.0},
                floats=False, randomized_twin=False, standalone=False,
                description="Shaw et al. relative logits from a learned distance table, "
                            "optionally causal"))
register(Family("causal", "attention", scorer=_dot_scorer, bias=causal_bias,
                logit_scale=lambda ctx: ctx.settings["causal_logit_scale"],
                settings={"causal_logit_scale": 1.0}, randomized_twin=False, standalone=False,
                description="no positions, causal attention (a mask as a bias), logits "
                            "times causal_logit_scale"))
