"""Softmax attention over the batch in cache-sized chunks (pure JAX, no Haiku).

Shape glossary: B batch, T queries, S keys, H heads, D head size.

On a CPU the [B, H, T, S] logits of a training batch (21 MB at B=128, H=8,
T=S=72) do not fit in cache, and each of the dozen passes the forward and
backward make over them (logits, exp, sum, the two products, the softmax
gradient) goes to memory. `attention` runs the batch in chunks of rows whose
logits fit in cache, and recomputes a chunk's forward in the backward pass
(`jax.checkpoint`) instead of storing its [b, H, T, S] tensors. The result is
exactly the same function, and faster on a CPU (`python -m experiments.benchmark
--sections=attention`; figures in docs/benchmark.md, "Figures behind code choices").
Accelerators get the whole batch in one piece by default.

The logits come from a `score_fn(q, k) -> [b, H, T, S]` that is applied chunk by
chunk. It may close over arrays that do not depend on the batch (a relative
position table); they are shared by all chunks and their gradients are summed
over them. A position bias that does not depend on the content (ALiBi's) may be
passed apart from it (`bias`), so that log-n scaling can leave it unscaled.

log-n scaling (Su Jianlin, kexue.fm/archives/9444, docs/su.md): the logits of a
sequence of n keys are multiplied by log(n) / log(m) before the softmax, m a
reference length (the longest training sequence), so that attention over more
keys than in training is sharpened rather than spread out. `log_n_scale` gives
the per-sequence factor; `attention` applies any per-row factor (`logit_scale`).

Normalisation: softmax by default. A family may bring its own (`weights_fn`: logits and
key mask -> weights [b, H, T, S]; geometric attention's stick-breaking,
`randomized_pe.geometric`); `attention_weights` returns the explicit weights of either
for analyses. A score_fn may also read the layer input at the query rows
(`query_input`, split into chunks with the rows): NDR's directional encoding does.

Chunks at evaluation: the chunk size is a property of the program, not of the model
(whose code training and evaluation share), so a program that only evaluates traces the
model inside `forward_only_chunks()`. Chunks of rows whose logits fit CPU_CHUNK_ELEMENTS
are 1 or 2 rows at T = S = 200, and every chunk reads again what the scorer closes over:
the relative encoding's [T, S, H, D] table holds as many numbers as D rows of logits, so
with 2 rows it is read more than the logits themselves. Forward-only chunks have at
least FORWARD_ONLY_ROWS_PER_HEAD_DIM * D rows (the table then at most half of a chunk's
logits); without a backward pass the larger chunk costs no stored tensors. Other chunks
give the same function, rounded differently (the logits move in their last bits;
figures in docs/benchmark.md, "Evaluation (item 6)"). Training programs are traced
outside such a block and keep their chunks.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Callable, Iterator, Optional

import jax
import jax.numpy as jnp

# Elements of one chunk's [b, H, T, S] logits on a CPU: 2.8 MB, chosen by
# measurement on a 2-core CPU (docs/benchmark.md, "Figures behind code choices").
CPU_CHUNK_ELEMENTS = 700_000
# Forward-only programs (evaluation, `forward_only_chunks`) take chunks of at least this
# many rows per unit of head size D: 16 rows for the paper model (D = 8; 10 for a batch of
# 250 or 500, where 700k logits give 2 at T = S = 200). Measured on the paper model's
# evaluation at length 100 (2 x 250 rows): 10 rows per chunk were the fastest of 2, 10,
# 25, 50 and 125 (docs/benchmark.md, "Evaluation (item 6)").
FORWARD_ONLY_ROWS_PER_HEAD_DIM = 2

# How `default_chunk_rows` picks chunks on CPU while a program is traced: "training"
# (the default), "forward_only" (`forward_only_chunks`) or "whole_batch"
# (`whole_batch_chunks`).
_CHUNKS: contextvars.ContextVar[str] = contextvars.ContextVar(
    "randomized_pe_attention_chunks", default="training")


@contextlib.contextmanager
def _chunks(mode: str) -> Iterator[None]:
  token = _CHUNKS.set(mode)
  try:
    yield
  finally:
    _CHUNKS.reset(token)


def forward_only_chunks(on: bool = True) -> contextlib.AbstractContextManager:
  """Within the block, attention on CPU picks forward-only chunks (`default_chunk_rows`).

  For programs without a backward pass (evaluation). Chunk sizes are decided while a
  program is traced, so the block must enclose the tracing (the body of a jitted
  function), not the call of a compiled program. on=False restores training's chunks. An
  explicit `chunk_rows` (a model's `attention_chunk_rows`) is not affected. Inside
  `whole_batch_chunks` it changes nothing (costing wins).
  """
  if _CHUNKS.get() == "whole_batch":
    return contextlib.nullcontext()
  return _chunks("forward_only" if on else "training")


def whole_batch_chunks() -> contextlib.AbstractContextManager:
  """Within the block, attention takes the whole batch in one chunk on every backend.

  For costing a program rather than running it: XLA's cost analysis counts a loop's body
  once, so a program traced with chunks reports one chunk's attention, not all of them
  (the paper model's step at length 40: 15.6 GFLOP chunked, 19.8 GFLOP in one piece). The
  same function in one piece gives its arithmetic. As `forward_only_chunks`, the block
  must enclose the tracing, and an explicit `chunk_rows` is not affected; a
  `forward_only_chunks` block inside it (evaluation's programs) does not undo it.
  """
  return _chunks("whole_batch")



def _masked(logits: jax.Array, key_mask) -> jax.Array:
  """logits with masked keys at the dtype's lowest value (their weight underflows to 0)."""
  if key_mask is None:
    return logits
  low = jnp.asarray(jnp.finfo(logits.dtype).min, logits.dtype)
  return jnp.where(key_mask[:, None, None, :], logits, low)


def _batched(bias: jax.Array) -> jax.Array:
  """A bias [H, T, S] shared by the batch, or [b, H, T, S] per row, as [b or 1, H, T, S]."""
  return bias if bias.ndim == 4 else bias[None]

ScoreFn = Callable[..., jax.Array]  # (q, k) or, with query_input, (q, k, query_input).
WeightsFn = Callable[[jax.Array, Optional[jax.Array]], jax.Array]  # (logits, key_mask).


def dot_scores(q: jax.Array, k: jax.Array) -> jax.Array:
  """<q_t, k_s> / sqrt(D) for [b, T, H, D] and [b, S, H, D] -> [b, H, T, S].

  The scale is applied to the queries (a [b, T, H, D] pass) rather than to the
  logits (a [b, H, T, S] pass).
  """
  return jnp.einsum("bthd,bshd->bhts", q * (1.0 / math.sqrt(q.shape[-1])), k)


def log_n_scale(num_keys: jax.Array, reference: int) -> jax.Array:
  """log(n) / log(m) for n = num_keys (int [B]) and m = reference: float32 [B].

  Written as 1 + log(n / m) / log(m), which is exactly 1 when n = m (n / m is
  exactly 1.0 and log(1.0) exactly 0), whatever the rounding of the logarithms;
  the quotient of two logarithms need not be.

  n = 1 gives 0 (up to rounding): all logits of such a sequence become ~0, which is
  harmless because a softmax over one key is 1 whatever its logit. Sequences with no
  key at all (fully masked padding rows) are counted as n = 1 rather than giving
  log 0 = -inf and NaN outputs.

  Raises:
    ValueError: if reference < 2 (log 1 = 0 has no ratio).
  """
  if not isinstance(reference, int) or reference < 2:
    raise ValueError(f"the log-n reference length must be an int >= 2 (log 1 = 0), "
                     f"got {reference!r}")
  num_keys = jnp.maximum(jnp.asarray(num_keys), 1).astype(jnp.float32)
  return 1.0 + jnp.log(num_keys / reference) / math.log(reference)


def attention_logits(q: jax.Array, k: jax.Array, score_fn: ScoreFn = dot_scores,
                     bias: Optional[jax.Array] = None, logit_scale: Optional[jax.Array] = None,
                     scale_bias: bool = False,
                     query_input: Optional[jax.Array] = None) -> jax.Array:
  """The logits softmax (or a family's weights_fn) sees: logit_scale * score_fn(q, k) + bias.

  Args:
    q: [b, T, H, D] queries; k: [b, S, H, D] keys.
    score_fn: (q, k) -> [b, H, T, S] logits, scaled by 1 / sqrt(D) and biased as the
      encoding wants.
    bias: optional [H, T, S] (or [b, H, T, S], one per row) added after the scale
      (ALiBi's position bias), or before it with scale_bias.
    logit_scale: optional float [b]: row b's logits are multiplied by logit_scale[b]
      (log-n scaling). None leaves the logits as score_fn (+ bias) gives them: not
      even a multiplication by 1 is added.
    scale_bias: whether logit_scale also multiplies `bias`.
    query_input: optional [b, T, M], the layer input at the query rows, passed to
      score_fn as a third argument (for scorers that read it); None calls score_fn(q, k).

  Returns:
    [b, H, T, S].
  """
  logits = score_fn(q, k) if query_input is None else score_fn(q, k, query_input)
  if logit_scale is None:
    return logits if bias is None else logits + _batched(bias)
  scale = logit_scale[:, None, None, None]
  if bias is None:
    return logits * scale
  if scale_bias:
    return (logits + _batched(bias)) * scale
  return logits * scale + _batched(bias)


def default_chunk_rows(batch: int, heads: int, q_len: int, k_len: int,
                       backend: Optional[str] = None, head_size: Optional[int] = None,
                       forward_only: Optional[bool] = None) -> int:
  """Rows per chunk: the whole batch off CPU (and in `whole_batch_chunks`); on CPU rows
  whose logits fit CPU_CHUNK_ELEMENTS.

  Forward-only chunks (forward_only, default: inside `forward_only_chunks`) have at
  least FORWARD_ONLY_ROWS_PER_HEAD_DIM * head_size rows (no floor without head_size).
  Among the row counts in [ideal / 2, ideal] the one that pads the batch least is taken
  (ties: the larger), so that e.g. a batch of 500 runs in chunks of 10 rather than
  padding to 512.
  """
  backend = backend or jax.default_backend()
  if backend != "cpu" or _CHUNKS.get() == "whole_batch":
    return batch
  ideal = max(1, CPU_CHUNK_ELEMENTS // (heads * q_len * k_len))
  if forward_only is None:
    forward_only = _CHUNKS.get() == "forward_only"
  if forward_only and head_size:
    ideal = max(ideal, FORWARD_ONLY_ROWS_PER_HEAD_DIM * head_size)
  if ideal >= batch:
    return batch
  candidates = range(max(1, ideal // 2), ideal + 1)
  return min(candidates, key=lambda rows: (-(-batch // rows) * rows, -rows))


def softmax_attend(logits: jax.Array, v: jax.Array, key_mask=None) -> jax.Array:
  """softmax(logits) @ v, normalised after the product: [b, H, T, S], [b, S, H, D] -> [b, T, H, D].

  Dividing the [b, T, H, D] result instead of the [b, H, T, S] weights gives
  the same values (up to rounding) with one fewer pass over the largest tensor.
  key_mask: optional bool [b, S]; False keys get no weight.
  """
  logits = _masked(logits, key_mask)
  shift = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  unnormalised = jnp.exp(logits - shift)  # [b, H, T, S]
  total = jnp.sum(unnormalised, axis=-1)  # [b, H, T]
  out = jnp.einsum("bhts,bshd->bthd", unnormalised, v)
  return out / jnp.transpose(total, (0, 2, 1))[..., None]


def softmax_weights(logits: jax.Array, key_mask=None) -> jax.Array:
  """softmax over the keys, masked keys excluded: [b, H, T, S] -> [b, H, T, S].

  The weights `softmax_attend` applies (it normalises after the product instead).
  """
  return jax.nn.softmax(_masked(logits, key_mask), axis=-1)


def attention_weights(logits: jax.Array, key_mask=None,
                      weights_fn: Optional[WeightsFn] = None) -> jax.Array:
  """The explicit attention weights [b, H, T, S] of `attention_logits` output, for analyses.

  Args:
    logits: [b, H, T, S] (see `attention_logits`).
    key_mask: optional bool [b, S]; False keys get no weight.
    weights_fn: a family's normalisation (`randomized_pe.families.weights_fn`); None is
      softmax.
  """
  if weights_fn is None:
    return softmax_weights(logits, key_mask)
  return weights_fn(logits, key_mask)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, score_fn: ScoreFn = dot_scores,
              key_mask=None, *, bias: Optional[jax.Array] = None,
              logit_scale: Optional[jax.Array] = None, scale_bias: bool = False,
              chunk_rows: Optional[int] = None, weights_fn: Optional[WeightsFn] = None,
              query_input: Optional[jax.Array] = None) -> jax.Array:
  """softmax(attention_logits(q, k, ...)) @ v, computed `chunk_rows` batch rows at a time.

  Args:
    q: [B, T, H, D] queries.
    k, v: [B, S, H, D] keys and values.
    score_fn: (q, k) of a chunk -> logits [b, H, T, S], scaled and biased as
      the model wants (default: `dot_scores`).
    key_mask: optional bool [B, S]; False keys (padding) get no weight.
    bias, logit_scale, scale_bias: see `attention_logits` (logit_scale is [B], split
      into chunks with the rows; a bias [H, T, S] is shared by all rows, a bias
      [B, H, T, S], e.g. ALiBi's of positions [B, T], is split with them).
    chunk_rows: batch rows per chunk; None picks `default_chunk_rows`. A value
      >= B computes the whole batch at once.
    weights_fn: (logits [b, H, T, S], key_mask [b, S] or None) -> weights [b, H, T, S]
      replacing the softmax (a family's own normalisation); None: softmax, computed
      exactly as without the option. It may close over arrays that do not depend on
      the batch, like score_fn.
    query_input: optional [B, T, M], split into chunks with the rows and passed to
      score_fn (see `attention_logits`).

  Returns:
    [B, T, H, D], in the dtype of q, k and v (promoted), whatever the bias's or mask's.
  """
  q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
  if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape[:3] + k.shape[3:] or v.ndim != 4 or (
      k.shape[0], k.shape[2]) != (q.shape[0], q.shape[2]):
    raise ValueError(f"attention takes q [B, T, H, D] and k, v [B, S, H, D] (v may have "
                     f"another D); got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
  batch, q_len, heads, head_size = q.shape
  if key_mask is not None and (jnp.ndim(key_mask) != 2
                               or jnp.shape(key_mask)[0] not in (1, batch)
                               or jnp.shape(key_mask)[1] != k.shape[1]):
    raise ValueError(f"key_mask must be bool [{batch}, {k.shape[1]}] (or [1, {k.shape[1]}]), "
                     f"got {list(jnp.shape(key_mask))}")
  if bias is not None and jnp.shape(bias) not in ((heads, q_len, k.shape[1]),
                                                  (batch, heads, q_len, k.shape[1])):
    raise ValueError(f"bias must be [{heads}, {q_len}, {k.shape[1]}] or [{batch}, {heads}, "
                     f"{q_len}, {k.shape[1]}], got {list(jnp.shape(bias))}")
  out_dtype = jnp.result_type(q.dtype, k.dtype, v.dtype)
  if chunk_rows is None:
    chunk_rows = default_chunk_rows(batch, heads, q_len, k.shape[1], head_size=head_size)
  if chunk_rows < 1:
    raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")

  def one(rows):
    logits = attention_logits(rows["q"], rows["k"], score_fn, rows.get("bias", bias),
                              rows.get("logit_scale"), scale_bias, rows.get("query_input"))
    if weights_fn is None:
      return softmax_attend(logits, rows["v"], rows.get("key_mask"))
    weights = weights_fn(logits, rows.get("key_mask"))  # [b, H, T, S]
    return jnp.einsum("bhts,bshd->bthd", weights, rows["v"])

  # The arrays with one row per batch row, split into chunks together.
  inputs = {"q": q, "k": k, "v": v}
  if key_mask is not None:
    inputs["key_mask"] = key_mask
  if logit_scale is not None:
    inputs["logit_scale"] = logit_scale
  if query_input is not None:
    inputs["query_input"] = query_input
  if bias is not None and jnp.ndim(bias) == 4:
    inputs["bias"] = bias
  if chunk_rows >= batch:
    return one(inputs).astype(out_dtype)
  if key_mask is not None:  # Split with the rows.
    inputs["key_mask"] = jnp.broadcast_to(key_mask, (batch, k.shape[1]))

  num_chunks = -(-batch // chunk_rows)
  padded = num_chunks * chunk_rows

  def split(x):
    # Row b goes to chunk b % num_chunks: a batch split over devices stays split
    # along the rows of every chunk, and the loop runs over an unsplit axis.
    # Padding rows are rows of their own (ones, all keys visible), later dropped.
    if padded != batch:
      x = jnp.pad(x, [(0, padded - batch)] + [(0, 0)] * (x.ndim - 1), constant_values=1)
    return jnp.swapaxes(x.reshape(chunk_rows, num_chunks, *x.shape[1:]), 0, 1)

  body = jax.checkpoint(one, prevent_cse=False)  # Recompute, do not store, in the backward.
  out = jax.lax.map(body, {name: split(x) for name, x in inputs.items()})
  out = jnp.swapaxes(out, 0, 1).reshape(padded, q_len, heads, v.shape[-1])
  return out[:batch].astype(out_dtype)
