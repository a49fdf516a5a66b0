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
  """Model inputs for one batch: tokens [B, T], targets [B, O], mask [B, O]."""
  sample = task.sample_batch(key, batch_size, length)
  empties = np.full(sample["output"].shape, empty_token(task), np.int32)
  return {"tokens": np.concatenate([sample["input"], empties], axis=1),
          "targets": sample["output"], "mask": sample["mask"]}


def pad_batch(task, batch: dict, tokens: int, outputs: int, rows: int) -> dict:
  """`batch` padded to [rows, tokens] tokens and [rows, outputs] targets.

  Padded tokens are empty tokens (the model masks them as keys); padded outputs and
  padded rows are masked out of the accuracy.
  """
  def pad(x, columns, value):
    out = np.full((rows, columns), value, x.dtype)
    out[:x.shape[0], :x.shape[1]] = x
    return out

  return {"tokens": pad(batch["tokens"], tokens, empty_token(task)),
          "targets": pad(batch["targets"], outputs, 0),
          "mask": pad(batch["mask"], outputs, False)}


def step_key(config, step: int) -> jax.Array:
  """The data key of training step `step`: a function of (data seed, step) only."""
  data_seed = config.seed if config.data_seed < 0 else config.data_seed
  return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(data_seed), _DATA), step)


def data_for_step(task, config, step: int) -> dict[str, np.ndarray]:
  """The training batch of `step`: one length uniform in [min_length, max_length]."""
  t = config.training
  key = step_key(config, step)
  length = int(tasks_lib.base.numpy_rng(key).integers(t.min_length, t.max_length + 1))
  return make_batch(task, jax.random.fold_in(key, 1), t.batch_size, length)


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
