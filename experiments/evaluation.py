"""Range evaluation: accuracy for every length of a range, with few compiled programs.

Lengths are grouped into buckets; every sequence of a bucket is padded to the
bucket's size, padded keys are masked out of attention and padded outputs out
of the accuracy, and positions are drawn for the true length (a prefix of the
same draw, see `randomized_pe.samplers`), with the model's evaluation sampler.
The evaluator talks to the model through the protocol of `randomized_pe.models`. The result equals evaluating
each length on its own, with one program per bucket instead of one per length.

Shapes: C chunk of the batch, T padded sequence length, O padded output length.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from experiments import data


@dataclasses.dataclass
class RangeEvaluator:
  """Evaluates a model (protocol of `randomized_pe.models`) over a range of lengths.

  Attributes:
    model: the model; positions come from its evaluation sampler.
    task: a task of `tasks`.
    max_logits: sub-batch so that chunk * (attention logits per sequence) stays below this.
    batch_sharding: optional sharding of the batch axis over devices.
    stacked: params carry a leading models axis [M, ...]; accuracies are then
      lists of M values (every model sees the same batches and positions).
  """

  model: object
  task: object
  max_logits: int = 2**27
  batch_sharding: object = None
  stacked: bool = False

  def __post_init__(self):
    self.traces = 0  # Programs compiled so far (one per bucket shape).
    chunk = self._chunk
    if self.stacked:
      chunk = jax.vmap(chunk, in_axes=(0,) + (None,) * 7)
    self._chunk_fn = jax.jit(chunk)

  def _chunk(self, params, key, chunk_index, tokens, targets, mask, in_len, seq_len):
    """Correct and counted output tokens of one chunk: tokens [C, T], targets/mask [C, O]."""
    self.traces += 1
    padded, out_padded = tokens.shape[1], targets.shape[1]
    pos_key, dropout_key = jax.random.split(key)
    positions = self.model.sample_positions(pos_key, seq_len, padded_length=padded,
                                            evaluation=True)
    key_mask = jnp.broadcast_to(jnp.arange(padded)[None, :] < seq_len, tokens.shape)
    logits = self.model.apply(params, jax.random.fold_in(dropout_key, chunk_index), tokens,
                              positions, is_training=False, key_mask=key_mask)
    index = jnp.minimum(in_len + jnp.arange(out_padded), padded - 1)
    predictions = jnp.argmax(logits[:, index], axis=-1)  # [C, O]
    correct = (predictions == targets) & mask
    return jnp.sum(correct), jnp.sum(mask)

  def _plan(self, lengths, batch_size: int, max_buckets: int):
    """Per length: (padded T, padded O, chunk); programs are the distinct triples."""
    shapes = data.bucket_shapes(self.task, lengths, max_buckets)
    plan = {}
    for n, (padded, out_padded) in shapes.items():
      per_row = self.model.attention_logits_per_sequence(padded)
      chunk = int(max(1, min(batch_size, self.max_logits // per_row)))
      if self.batch_sharding is not None:
        devices = self.batch_sharding.mesh.size
        chunk = max(devices, chunk // devices * devices)
      plan[n] = (padded, out_padded, chunk)
    return plan, sorted({padded for padded, _ in shapes.values()})

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
    data_root = jax.random.PRNGKey(seed)
    model_root = jax.random.PRNGKey(seed + 1)
    accuracy = []
    iterator = lengths
    if progress:
      import tqdm  # pylint: disable=import-outside-toplevel
      iterator = tqdm.tqdm(lengths, desc="evaluating", unit="length", leave=False)
    for n in iterator:
      padded, out_pad, chunk = plan[n]
      batch = data.make_batch(task, jax.random.fold_in(data_root, n), batch_size, n)
      out_len = batch["targets"].shape[1]
      in_len = batch["tokens"].shape[1] - out_len
      rows = -(-batch_size // chunk) * chunk  # Extra rows are fully masked.
      batch = data.pad_batch(task, batch, padded, out_pad, rows)
      tokens, targets, mask = batch["tokens"], batch["targets"], batch["mask"]
      key = jax.random.fold_in(model_root, n)
      correct = counted = 0.0
      for c in range(rows // chunk):
        part = slice(c * chunk, (c + 1) * chunk)
        arrays = (tokens[part], targets[part], mask[part])
        if self.batch_sharding is not None:
          arrays = jax.device_put(arrays, self.batch_sharding)
        got, count = self._chunk_fn(params, key, c, *arrays, in_len,
                                    data.sequence_length(task, n))
        correct = correct + np.asarray(got, np.float64)
        counted = counted + np.asarray(count, np.float64)
      accuracy.append((correct / np.maximum(counted, 1)).tolist())
    return {"lengths": lengths, "accuracy": accuracy, "buckets": buckets}
