"""Range evaluation: accuracy for every length of a range, with few compiled programs.

Lengths are grouped into buckets; every sequence of a bucket is padded to the
bucket's size, padded keys are masked out of attention and padded outputs out
of the accuracy, and positions are drawn for the true length (a prefix of the
same draw, see `positions.randomized_padded`). The result equals evaluating
each length on its own, with one program per bucket instead of one per length.

Shapes: C chunk of the batch, T padded sequence length, O padded output length.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from randomized_pe import positions as positions_lib

POSITION_MODES = ("sampled", "evenly_spaced")


def sequence_length(task, length: int) -> int:
  """Tokens the model sees for a sample of `length`: the input, then one empty token per output."""
  return task.input_length(length) + task.output_length(length)


def plan_buckets(sizes, max_buckets: int) -> list[int]:
  """Bucket sizes (sorted) covering `sizes`, minimising the total padded cost sum(T_pad^2).

  Exact dynamic programming over the sorted distinct sizes; a size goes to the
  smallest bucket that holds it.
  """
  values = np.array(sorted(set(int(s) for s in sizes)), dtype=np.float64)
  counts = np.array([sum(1 for s in sizes if s == v) for v in values], dtype=np.float64)
  n = len(values)
  k = max(1, min(max_buckets, n))
  prefix = np.concatenate([[0.0], np.cumsum(counts)])
  # best[j]: cost of covering values[:j] with the buckets so far; last choices in arg.
  best = np.full(n + 1, np.inf)
  best[0] = 0.0
  choices = []
  for _ in range(k):
    new = np.full(n + 1, np.inf)
    new[0] = 0.0
    arg = np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):
      # Last bucket covers values[i:j], padded to values[j-1].
      i = np.arange(j)
      cost = best[i] + (prefix[j] - prefix[i]) * values[j - 1] ** 2
      arg[j] = int(np.argmin(cost))
      new[j] = cost[arg[j]]
    best = new
    choices.append(arg)
  buckets, j = [], n
  for arg in reversed(choices):
    if j == 0:
      break
    buckets.append(int(values[j - 1]))
    j = arg[j]
  return sorted(set(buckets))


@dataclasses.dataclass
class RangeEvaluator:
  """Evaluates a model of `randomized_pe.make_encoder` over a range of lengths.

  Attributes:
    model: hk.Transformed of the encoder.
    model_config: its EncoderConfig.
    task: a task of `tasks`.
    positions: "sampled" (the encoding's sampler, as in training) or
      "evenly_spaced" (randomized encodings only; see positions.evenly_spaced).
    max_logits: sub-batch so that chunk * heads * T^2 stays below this.
    batch_sharding: optional sharding of the batch axis over devices.
    stacked: params carry a leading models axis [M, ...]; accuracies are then
      lists of M values (every model sees the same batches and positions).
  """

  model: object
  model_config: object
  task: object
  positions: str = "sampled"
  max_logits: int = 2**27
  batch_sharding: object = None
  stacked: bool = False

  def __post_init__(self):
    if self.positions not in POSITION_MODES:
      raise ValueError(f"unknown evaluation positions {self.positions!r}; "
                       f"valid choices: {', '.join(POSITION_MODES)}")
    self.traces = 0  # Programs compiled so far (one per bucket shape).
    chunk = self._chunk
    if self.stacked:
      chunk = jax.vmap(chunk, in_axes=(0,) + (None,) * 7)
    self._chunk_fn = jax.jit(chunk)

  def _sample_positions(self, key, seq_len, padded):
    cfg = self.model_config
    enc = cfg.encoding
    if self.positions == "evenly_spaced" and enc.randomized:
      return positions_lib.evenly_spaced_padded(key, seq_len, padded, cfg.max_position)
    return enc.sample_positions_padded(key, seq_len, padded, cfg.max_position,
                                       compat=cfg.compat, num_layers=cfg.num_layers)

  def _chunk(self, params, key, chunk_index, tokens, targets, mask, in_len, seq_len):
    """Correct and counted output tokens of one chunk: tokens [C, T], targets/mask [C, O]."""
    self.traces += 1
    padded, out_padded = tokens.shape[1], targets.shape[1]
    pos_key, dropout_key = jax.random.split(key)
    positions = self._sample_positions(pos_key, seq_len, padded)
    key_mask = jnp.broadcast_to(jnp.arange(padded)[None, :] < seq_len, tokens.shape)
    logits = self.model.apply(params, jax.random.fold_in(dropout_key, chunk_index), tokens,
                              positions, is_training=False, key_mask=key_mask)
    index = jnp.minimum(in_len + jnp.arange(out_padded), padded - 1)
    predictions = jnp.argmax(logits[:, index], axis=-1)  # [C, O]
    correct = (predictions == targets) & mask
    return jnp.sum(correct), jnp.sum(mask)

  def _plan(self, lengths, batch_size: int, max_buckets: int):
    """Per length: (padded T, padded O, chunk); programs are the distinct triples."""
    task = self.task
    sizes = {n: sequence_length(task, n) for n in lengths}
    buckets = plan_buckets(list(sizes.values()), max_buckets)
    bucket_of = {n: min(b for b in buckets if b >= sizes[n]) for n in lengths}
    out_padded = {b: max(task.output_length(n) for n in lengths if bucket_of[n] == b)
                  for b in buckets}
    plan = {}
    for n in lengths:
      padded = bucket_of[n]
      chunk = int(max(1, min(batch_size,
                             self.max_logits // (self.model_config.num_heads * padded**2))))
      if self.batch_sharding is not None:
        devices = self.batch_sharding.mesh.size
        chunk = max(devices, chunk // devices * devices)
      plan[n] = (padded, out_padded[padded], chunk)
    return plan, buckets

  def program_shapes(self, lengths, batch_size: int, max_buckets: int) -> list:
    """The distinct (T, O, chunk) shapes, one compiled program each, for these lengths."""
    plan, _ = self._plan([int(n) for n in lengths], batch_size, max_buckets)
    return sorted(set(plan.values()))

  def compile(self, params, shape):
    """Compiles (without running) the program of one (T, O, chunk) shape."""
    padded, out_pad, chunk = shape
    tokens = jnp.zeros((chunk, padded), jnp.int32)
    targets = jnp.zeros((chunk, out_pad), jnp.int32)
    return self._chunk_fn.lower(params, jax.random.PRNGKey(0), 0, tokens, targets,
                                targets.astype(bool), 1, 1).compile()

  def evaluate(self, params, lengths, batch_size: int, seed: int, max_buckets: int,
               progress: bool = False) -> dict:
    """Accuracy (masked, over the batch) for every length.

    The batch of length n comes from key fold_in(PRNGKey(seed), n); positions
    and dropout from fold_in(PRNGKey(seed + 1), n).

    Returns:
      {"lengths": [...], "accuracy": [...], "buckets": [...]}; with `stacked`,
      every accuracy is a list over models.
    """
    lengths = [int(n) for n in lengths]
    task = self.task
    plan, buckets = self._plan(lengths, batch_size, max_buckets)
    empty = task.input_size  # The empty token follows the task's symbols.
    data_root = jax.random.PRNGKey(seed)
    model_root = jax.random.PRNGKey(seed + 1)
    accuracy = []
    iterator = lengths
    if progress:
      import tqdm  # pylint: disable=import-outside-toplevel
      iterator = tqdm.tqdm(lengths, desc="evaluating", unit="length", leave=False)
    for n in iterator:
      padded, out_pad, chunk = plan[n]
      batch = task.sample_batch(jax.random.fold_in(data_root, n), batch_size, n)
      in_len, out_len = batch["input"].shape[1], batch["output"].shape[1]
      tokens = np.full((batch_size, padded), empty, np.int32)
      tokens[:, :in_len] = batch["input"]
      targets = np.zeros((batch_size, out_pad), np.int32)
      targets[:, :out_len] = batch["output"]
      mask = np.zeros((batch_size, out_pad), bool)
      mask[:, :out_len] = batch["mask"]
      rows = -(-batch_size // chunk) * chunk
      if rows > batch_size:  # Extra rows are fully masked.
        extra = rows - batch_size
        tokens = np.concatenate([tokens, np.full((extra, padded), empty, np.int32)])
        targets = np.concatenate([targets, np.zeros((extra, out_pad), np.int32)])
        mask = np.concatenate([mask, np.zeros((extra, out_pad), bool)])
      key = jax.random.fold_in(model_root, n)
      correct = counted = 0.0
      for c in range(rows // chunk):
        part = slice(c * chunk, (c + 1) * chunk)
        arrays = (tokens[part], targets[part], mask[part])
        if self.batch_sharding is not None:
          arrays = jax.device_put(arrays, self.batch_sharding)
        got, count = self._chunk_fn(params, key, c, *arrays, in_len,
                                    sequence_length(task, n))
        correct = correct + np.asarray(got, np.float64)
        counted = counted + np.asarray(count, np.float64)
      accuracy.append((correct / np.maximum(counted, 1)).tolist())
    return {"lengths": lengths, "accuracy": accuracy, "buckets": buckets}
