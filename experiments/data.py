"""Batches: task samples as model inputs, padding, and generation in a background thread.

The input rule, written once: the model sees the task's input followed by one empty
token per output position (the empty token is one extra input symbol, after the
task's own), and predicts the outputs at those empty positions.

Shapes: B batch, I input length, O output length, T = I + O tokens.
"""
from __future__ import annotations

import queue
import threading

import jax
import numpy as np

import tasks as tasks_lib

_DATA = 0x646174  # Stream tag folded into the data seed.


def empty_token(task) -> int:
  """The id of the empty token: one past the task's own input symbols."""
  return task.input_size


def vocab_size(task) -> int:
  """Input ids the model embeds: the task's symbols plus the empty token."""
  return task.input_size + 1


def sequence_length(task, length: int) -> int:
  """Tokens the model sees for a sample of `length`: the input, then one empty token per output."""
  return task.input_length(length) + task.output_length(length)


def make_batch(task, key, batch_size: int, length: int) -> dict[str, np.ndarray]:
  """Model inputs for one batch.

  Returns:
    tokens [B, T], targets [B, O], mask [B, O] (the outputs that count for accuracy),
    and the true sizes per row, sequence_length [B] (T) and output_length [B] (O),
    which stay the same when the batch is padded (`pad_batch`).
  """
  sample = task.sample_batch(key, batch_size, length)
  empties = np.full(sample["output"].shape, empty_token(task), np.int32)
  tokens = np.concatenate([sample["input"], empties], axis=1)
  return {"tokens": tokens, "targets": sample["output"], "mask": sample["mask"],
          "sequence_length": np.full((batch_size,), tokens.shape[1], np.int32),
          "output_length": np.full((batch_size,), sample["output"].shape[1], np.int32)}


def pad_batch(task, batch: dict, tokens: int, outputs: int, rows: int) -> dict:
  """`batch` padded to [rows, tokens] tokens and [rows, outputs] targets.

  Padded tokens are empty tokens (the model masks them as keys); padded outputs and
  padded rows are masked out of the accuracy (and padded outputs out of the loss,
  through output_length).
  """
  def pad(x, columns, value):
    out = np.full((rows, columns), value, x.dtype)
    out[:x.shape[0], :x.shape[1]] = x
    return out

  def pad_rows(x):
    return np.concatenate([x, np.full((rows - x.shape[0],), x[0], x.dtype)])

  return {"tokens": pad(batch["tokens"], tokens, empty_token(task)),
          "targets": pad(batch["targets"], outputs, 0),
          "mask": pad(batch["mask"], outputs, False),
          "sequence_length": pad_rows(batch["sequence_length"]),
          "output_length": pad_rows(batch["output_length"])}


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


def bucket_shapes(task, lengths, max_buckets: int) -> dict[int, tuple[int, int]]:
  """length -> (padded tokens, padded outputs), with at most `max_buckets` token sizes.

  The bucket sizes minimise the padded cost (`plan_buckets`); a length goes to the
  smallest bucket that holds it, and a bucket's outputs are padded to its longest.
  """
  lengths = [int(n) for n in lengths]
  sizes = {n: sequence_length(task, n) for n in lengths}
  buckets = plan_buckets(list(sizes.values()), max_buckets)
  bucket_of = {n: min(b for b in buckets if b >= sizes[n]) for n in lengths}
  outputs = {b: max(task.output_length(n) for n in lengths if bucket_of[n] == b)
             for b in buckets}
  return {n: (bucket_of[n], outputs[bucket_of[n]]) for n in lengths}


def training_shapes(task, config):
  """`bucket_shapes` of the training lengths for `training.max_programs`; None for 0
  (every length its own shape, no padding)."""
  t = config.training
  if t.max_programs <= 0:
    return None
  return bucket_shapes(task, range(t.min_length, t.max_length + 1), t.max_programs)


def step_key(config, step: int) -> jax.Array:
  """The data key of training step `step`: a function of (data seed, step) only."""
  data_seed = config.seed if config.data_seed < 0 else config.data_seed
  return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(data_seed), _DATA), step)


def data_for_step(task, config, step: int, shapes=None) -> dict[str, np.ndarray]:
  """The training batch of `step`: one length uniform in [min_length, max_length].

  With `shapes` (`training_shapes`), padded to its length's bucket.
  """
  t = config.training
  key = step_key(config, step)
  length = int(tasks_lib.base.numpy_rng(key).integers(t.min_length, t.max_length + 1))
  batch = make_batch(task, jax.random.fold_in(key, 1), t.batch_size, length)
  if shapes is None:
    return batch
  tokens, outputs = shapes[length]
  return pad_batch(task, batch, tokens, outputs, t.batch_size)


class Prefetcher:
  """Generates the batches of steps [start, stop) in a background thread."""

  def __init__(self, make, start: int, stop: int, depth: int, place=lambda b: b):
    self._queue = queue.Queue(maxsize=max(1, depth))
    self._stop = threading.Event()

    def work():
      try:
        for step in range(start, stop):
          item = place(make(step))
          while not self._stop.is_set():
            try:
              self._queue.put(item, timeout=0.1)
              break
            except queue.Full:
              pass
          if self._stop.is_set():
            return
      except BaseException as e:  # Handed to the consumer.
        self._queue.put(e)

    self._thread = threading.Thread(target=work, daemon=True)
    self._thread.start()

  def next(self):
    item = self._queue.get()
    if isinstance(item, BaseException):
      raise item
    return item

  def close(self):
    self._stop.set()
