"""Batches: the two kinds of training data, padding, and generation in a background thread.

Two kinds of data, one interface each, chosen in one place (`source(config)`):
  generated tasks (`tasks`)   a fresh batch per step, of one length drawn per step
                              (`GeneratedBatches`); evaluated over a range of lengths
  fixed datasets              a training split read in shuffled epochs, the last partial
  (`tasks.datasets`)          batch kept (`EpochBatches`); evaluated on named splits
Both give the training step the same batch: tokens [B, T], targets [B, O], mask [B, O]
(outputs that count for accuracy), sequence_length [B] and output_length [B] (the true
sizes, which padding keeps), and on a dataset's batches row_mask [B] (the real rows;
padded ones count for nothing). A generated task's training batches have no padded rows
and no row_mask, so their program is the one it was before datasets existed. The model
answers at the last O of the T tokens.

The input rule of generated tasks, written once: the model sees the task's input
followed by one empty token per output position (the empty token is one extra input
symbol, after the task's own), and predicts the outputs at those empty positions. A
dataset's examples are read as they are (no empty token); its answer is at the last token.

Shapes: B batch, I input length, O output length, T = I + O tokens (a dataset: T tokens
per example, O = 1), N examples of a split.
"""
from __future__ import annotations

import functools
import queue
import threading

import jax
import numpy as np

import tasks as tasks_lib
from tasks import datasets as datasets_lib

_DATA = 0x646174  # Stream tag folded into the data seed.
_EPOCH = 0x65706F  # Stream tag of the epoch orders of a dataset.


def empty_token(task) -> int:
  """The id of the empty token: one past the task's own input symbols."""
  return task.input_size


def vocab_size(task) -> int:
  """Input ids the model embeds: a generated task's symbols plus the empty token; a
  dataset's own symbols (it has no empty token)."""
  if isinstance(task, Dataset):
    return task.vocab_size
  return task.input_size + 1


def example_tokens(task) -> np.ndarray:
  """int32 [1, T] tokens to initialise a model for `task` with.

  A dataset's length (a model may take no other, e.g. Ito's 16 cells); for a generated
  task two tokens, as always (the encoder's parameters do not depend on the length).
  """
  length = task.sequence_length if isinstance(task, Dataset) else 2
  return np.zeros((1, length), np.int32)


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


def data_seed(config) -> int:
  """The seed of the training data: `data_seed`, or `seed` when it is -1."""
  return config.seed if config.data_seed < 0 else config.data_seed


# Data keys are made in blocks of this many steps by one program: made one step at a time,
# their few eager JAX operations queue behind the training step running on the same
# device, so the batch prefetcher waited for every step to finish before it could make
# the next batch (docs/benchmark.md, "Batches no longer wait for the device").
_KEY_BLOCK = 1024


@jax.jit
def _fold_in_steps(base, steps):
  def keys(step):
    key = jax.random.fold_in(base, step)
    return jax.numpy.stack([key, jax.random.fold_in(key, 1)])
  return jax.vmap(keys)(steps)


@functools.lru_cache(maxsize=16)
def _step_key_block(seed: int, block: int) -> np.ndarray:
  """uint32 [_KEY_BLOCK, 2, 2]: for each step of the block, its raw data key and the key
  of its batch (`fold_in(key, 1)`), exactly as jax.random computes them one by one."""
  base = jax.random.fold_in(jax.random.PRNGKey(seed), _DATA)
  steps = np.arange(block * _KEY_BLOCK, (block + 1) * _KEY_BLOCK, dtype=np.uint32)
  return np.asarray(_fold_in_steps(base, steps))


def step_keys(config, step: int) -> tuple[np.ndarray, np.ndarray]:
  """The raw data key (uint32 [2]) of training step `step` and the key of its batch: a
  function of (data seed, step) only, equal to `fold_in(fold_in(PRNGKey(data seed),
  _DATA), step)` and its `fold_in(., 1)`."""
  if not 0 <= step < 2**32:
    raise ValueError(f"step must be in [0, 2**32), got {step}")
  block = _step_key_block(data_seed(config), step // _KEY_BLOCK)
  return block[step % _KEY_BLOCK, 0], block[step % _KEY_BLOCK, 1]


def data_for_step(task, config, step: int, shapes=None) -> dict[str, np.ndarray]:
  """The training batch of `step`: one length uniform in [min_length, max_length].

  With `shapes` (`training_shapes`), padded to its length's bucket.
  """
  t = config.training
  key, batch_key = step_keys(config, step)
  length = int(tasks_lib.base.numpy_rng(key).integers(t.min_length, t.max_length + 1))
  batch = make_batch(task, batch_key, t.batch_size, length)
  if shapes is None:
    return batch
  tokens, outputs = shapes[length]
  return pad_batch(task, batch, tokens, outputs, t.batch_size)


# --------------------------------------------------------------------------
# Fixed datasets: defined in tasks/datasets.py beside the generated tasks, as every name
# `config.task` accepts is; these names are theirs.

Examples = datasets_lib.Examples
Dataset = datasets_lib.Dataset
DATASETS = datasets_lib.DATASETS


# --------------------------------------------------------------------------
# The two kinds of training data; `source(config)` chooses.


class GeneratedBatches:
  """A generated task's batches: a fresh batch per step.

  Step s (0-based) draws one length uniform in [min_length, max_length] and a batch of
  that length from (data seed, s) alone (`data_for_step`), padded to its length's bucket
  with training.max_programs > 0. Evaluation: accuracy per length
  (`experiments.training.evaluation.RangeEvaluator`).
  """

  def __init__(self, task, config):
    self.task = task
    self.config = config

  @functools.cached_property
  def shapes(self):
    """`training_shapes` (None: one program per training length)."""
    return training_shapes(self.task, self.config)

  def batch(self, step: int) -> dict[str, np.ndarray]:
    """The training batch of step `step` (0-based)."""
    return data_for_step(self.task, self.config, step, self.shapes)

  def check(self, model, device_count: int) -> None:
    """One-line ValueError for lengths the run cannot use."""
    config, task = self.config, self.task
    t, e = config.training, config.evaluation
    for prefix, lo, hi in [("training", t.min_length, t.max_length),
                           ("evaluation", e.min_length, e.max_length)]:
      if not 1 <= lo <= hi:
        raise ValueError(f"{prefix} lengths must satisfy 1 <= min_length <= max_length, "
                         f"got {lo}..{hi}")
    if t.batch_size % device_count:
      raise ValueError(f"training.batch_size={t.batch_size} must be divisible by the "
                       f"{device_count} devices")
    longest = max(sequence_length(task, n)
                  for n in (*range(t.min_length, t.max_length + 1),
                            *range(e.min_length, e.max_length + 1)))
    model.check_sequence_length(longest, f"input plus output of {config.task}")


class EpochBatches:
  """A dataset's training split in shuffled epochs, the last partial batch kept.

  Step s (0-based) reads batch b = s % E of epoch s // E, with E = ceil(N / B) steps per
  epoch: the examples order[b B : (b + 1) B] of the epoch's order, a permutation of the N
  training examples drawn from (data seed, epoch) alone, so that a resumed run reads
  what an uninterrupted one reads. Every example is read once per epoch. The last batch
  of an epoch holds the N - (E - 1) B examples left over, padded to B rows that count
  for neither the loss nor the accuracy (row_mask False), so that every step has one
  shape and one compiled program. Every model of a grid reads the same order.
  Evaluation: accuracy per split, overall and per group
  (`experiments.training.evaluation.SplitEvaluator`), every `evaluation.every_epochs` epochs.
  """

  def __init__(self, dataset: Dataset, config):
    self.task = dataset
    self.config = config
    self.examples = dataset.splits[dataset.train_split]
    self.batch_size = int(config.training.batch_size)
    self.steps_per_epoch = -(-len(self.examples.answers) // self.batch_size)
    self._data_seed = data_seed(config)
    self._order = (None, None)  # (epoch, order): the prefetch thread reads epochs in turn.

  def order(self, epoch: int) -> np.ndarray:
    """int64 [N]: the permutation of the training examples that epoch `epoch` reads."""
    cached_epoch, order = self._order
    if cached_epoch != epoch:
      # Keys are made here, not in __init__: validation builds a source before the
      # entry point turns the compilation cache on, and nothing may compile before that.
      root = jax.random.fold_in(jax.random.PRNGKey(self._data_seed), _EPOCH)
      rng = tasks_lib.base.numpy_rng(jax.random.fold_in(root, epoch))
      order = rng.permutation(len(self.examples.answers))
      self._order = (epoch, order)
    return order

  def rows(self, step: int) -> np.ndarray:
    """int64 [<= B]: the training examples of step `step` (0-based), unpadded."""
    epoch, index = divmod(int(step), self.steps_per_epoch)
    return self.order(epoch)[index * self.batch_size:(index + 1) * self.batch_size]

  def epoch(self, steps_done: int) -> float:
    """Epochs completed after `steps_done` steps."""
    return steps_done / self.steps_per_epoch

  def batch(self, step: int) -> dict[str, np.ndarray]:
    """The training batch of step `step` (0-based), padded to B rows."""
    rows = self.rows(step)
    return examples_batch(self.examples, rows, self.batch_size)

  def check(self, model, device_count: int) -> None:
    """One-line ValueError for settings this dataset cannot use."""
    config, dataset = self.config, self.task
    if self.batch_size % device_count:
      raise ValueError(f"training.batch_size={self.batch_size} must be divisible by the "
                       f"{device_count} devices")
    model.check_sequence_length(dataset.sequence_length, f"the examples of {dataset.name}")
    e = config.evaluation
    every = e.get("every_epochs", 0)
    if not isinstance(every, int) or isinstance(every, bool) or every < 0:
      raise ValueError(f"evaluation.every_epochs must be an int >= 0 (0: only at the end), "
                       f"got {every!r}")
    for setting in ("splits", "final_splits"):
      for split in e.get(setting, ()):
        if split not in dataset.splits:
          raise ValueError(f"evaluation.{setting}: {dataset.name} has no split {split!r}; "
                           f"valid choices: {', '.join(dataset.splits)}")


def examples_batch(examples: Examples, rows: np.ndarray, batch_size: int) -> dict:
  """The batch of examples `rows` (at most batch_size of them), padded to batch_size rows.

  Padded rows are blank (all token 0) with row_mask and mask False.
  """
  count = len(rows)
  if count > batch_size:
    raise ValueError(f"{count} rows do not fit a batch of {batch_size}")
  length = examples.tokens.shape[1]
  tokens = np.zeros((batch_size, length), np.int32)
  tokens[:count] = examples.tokens[rows]
  targets = np.zeros((batch_size, 1), np.int32)
  targets[:count, 0] = examples.answers[rows]
  row_mask = np.arange(batch_size) < count
  return {"tokens": tokens, "targets": targets, "mask": row_mask[:, None].copy(),
          "row_mask": row_mask, "sequence_length": np.full((batch_size,), length, np.int32),
          "output_length": np.ones((batch_size,), np.int32)}


def task_names() -> tuple[str, ...]:
  """Every name `config.task` accepts: the registered tasks, then the datasets."""
  return (*tasks_lib.names(), *DATASETS.names())


def source(config):
  """The training data of a run, by `config.task`: the one place the kind is chosen.

  A name of `DATASETS` gives `EpochBatches`, a generated task of `tasks` gives
  `GeneratedBatches`. Both have `task` (what the model is built for: `build_model` and
  `vocab_size` take it), `batch(step)` and `check(model, device_count)`.

  Raises:
    ValueError: an unknown name (one line listing the valid ones).
  """
  name = config.task
  if name in DATASETS:
    return EpochBatches(DATASETS.get(name)(), config)
  if name in tasks_lib.TASKS:
    return GeneratedBatches(tasks_lib.get(name), config)
  raise ValueError(f"unknown task {name!r}; valid names: {', '.join(task_names())}")


class Prefetcher:
  """Generates the batches of steps [start, stop) in a background thread."""

  def __init__(self, make, start: int, stop: int, depth: int, place=lambda b: b):
    self._queue = queue.Queue(maxsize=max(1, depth))
    self._stop = threading.Event()

    def offer(item) -> bool:
      """Puts `item` when there is room; False once closed."""
      while not self._stop.is_set():
        try:
          self._queue.put(item, timeout=0.1)
          return True
        except queue.Full:
          pass
      return False

    def work():
      try:
        for step in range(start, stop):
          if not offer(place(make(step))):
            return
      except BaseException as e:  # Handed to the consumer.
        offer(e)

    self._thread = threading.Thread(target=work, daemon=True, name="batch prefetcher")
    self._thread.start()

  def next(self):
    item = self._queue.get()
    if isinstance(item, BaseException):
      raise item
    return item

  def close(self, timeout: float = 60.0):
    """Stops the thread and waits for it (up to `timeout` seconds): a daemon thread still
    inside jax (placing a batch) when the interpreter exits aborts the process."""
    self._stop.set()
    self._thread.join(timeout)
