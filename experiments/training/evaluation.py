"""Evaluation of the two kinds of data (`experiments.training.data.source`), with few programs.

Generated tasks: accuracy for every length of a range (`RangeEvaluator`). Lengths are
grouped into buckets; every sequence of a bucket is padded to the bucket's size, padded
keys are masked out of attention and padded outputs out of the accuracy, and positions
are drawn for the true length (a prefix of the same draw, see `randomized_pe.samplers`),
with the model's evaluation sampler. The result equals evaluating each length on its
own, with one program per bucket instead of one per length.

Range evaluation runs a length's batch in the fewest sub-batches whose attention logits
fit `max_logits`, of equal size (padding is at most one row per sub-batch), and traces
the model with attention chunks for forward-only programs
(`randomized_pe.attention.forward_only_chunks`), and runs the model's last layer on the
output rows alone (`num_outputs`, as training does); these were adopted in issue 27, item
6, to halve the time of lengths 41..100 at batch 500. Results are the same up to the last bits
of the logits (tolerance 1e-5; docs/benchmark.md, "Evaluation (item 6)"), so accuracies
are the same except where two logits tie, and except where the model keeps dropout at
evaluation (compat="release") and a length's batch is split: rows then fall into other
sub-batches and draw other dropout masks.
`legacy_batching=True` evaluates as before (every row, training's chunks, the largest
sub-batches), e.g. to reproduce an older eval.json bit for bit.
On a CPU with two or more cores two lengths run at a time, in threads (`default_workers`);
the accuracies do not depend on it.

Datasets: accuracy on named splits, overall and per group (`SplitEvaluator`), in chunks
of one shape.

`for_source` gives the evaluation of a run's kind of data, which the training loop
calls: `due(step)` and `periodic(...)` during training, `final(...)` at the end. The
evaluators talk to the model through the protocol of `randomized_pe.models`.

Shapes: C chunk of the batch, T padded sequence length, O padded output length,
M models of a grid, N examples of a split.
"""
from __future__ import annotations

from concurrent import futures
import dataclasses
import itertools
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np

from experiments.training import compile_cache
from experiments.training import data
from experiments.training import members as members_lib
from experiments.training import results
from randomized_pe import attention as attn_lib


def predict_padded(model, params, pos_key, dropout_key, tokens, seq_len, in_len,
                   out_len: int, chunk_index=None, *, intermediates: bool = False,
                   legacy_batching: bool = False):
  """Predicted output tokens of sequences padded to one shape: the forward pass of range
  evaluation (`RangeEvaluator`), which the analyses share (`experiments.analyze`).

  Args:
    model: a model (protocol of `randomized_pe.models`).
    params: its parameters (unstacked).
    pos_key: positions come from the model's evaluation sampler with this key, drawn for
      the true length `seq_len` and padded to the tokens' length (the first `seq_len`
      equal the unpadded draw).
    dropout_key: the key of dropout where the model keeps it at evaluation; with
      `chunk_index`, the chunk's index is folded into it.
    tokens: int [C, T], `seq_len` real tokens per row (may be traced), padded keys masked.
    in_len: the first output token (may be traced); out_len: O, the outputs read.
    intermediates: also return the model's intermediates (`apply(..., intermediates=True)`,
      e.g. the encoder's attention weights); the predictions are the same.
    legacy_batching: every row, with attention in the chunks of training programs (as
      before issue 27, item 6), instead of the output rows with evaluation's larger
      chunks (`attention.forward_only_chunks`).

  Returns:
    int [C, O] predicted outputs (positions past T read the last token; mask them);
    with intermediates, (those, the model's intermediates).
  """
  padded = tokens.shape[1]
  positions = model.sample_positions(pos_key, seq_len, padded_length=padded, evaluation=True)
  key_mask = jnp.broadcast_to(jnp.arange(padded)[None, :] < seq_len, tokens.shape)
  if chunk_index is not None:
    dropout_key = jax.random.fold_in(dropout_key, chunk_index)
  if intermediates or legacy_batching:  # Every row's logits.
    rows, start, extra = padded, 0, {"intermediates": True} if intermediates else {}
  else:  # The output rows only (the model's last layer computes those alone).
    rows = min(out_len, padded)
    # Output j is row in_len + j (the last row for those past it), of the rows from
    # `start`, which stays within the padded rows.
    start = jnp.clip(in_len, 0, padded - rows)
    extra = {"num_outputs": rows, "outputs_from": start}
  with attn_lib.forward_only_chunks(not legacy_batching):
    out = model.apply(params, dropout_key, tokens, positions, is_training=False,
                      key_mask=key_mask, **extra)
  logits, inner = out if intermediates else (out, None)
  index = jnp.minimum(in_len - start + jnp.arange(out_len), rows - 1)
  predictions = jnp.argmax(logits[:, index], axis=-1)  # [C, O]
  return (predictions, inner) if intermediates else predictions


def default_workers() -> int:
  """Lengths a range evaluation runs at a time: 2 on a CPU backend with 2 or more
  cores, whose programs leave one core partly idle (a program of the paper model keeps
  about 1.5 of 2 cores busy); 1 on accelerators, which run one program at a time."""
  if jax.default_backend() != "cpu":
    return 1
  return min(2, os.cpu_count() or 1)


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
    layout: how the models of stacked params run (`experiments.training.members`).
    cache_key: what determines model and task (`compile_cache.run_key`), to keep the
      programs' executables; None: not kept.
    legacy_batching: evaluate as before issue 27, item 6: sub-batches of the most rows
      that fit max_logits (the last one padded with masked rows) and attention in the
      chunks of training programs (module docstring).
    workers: lengths evaluated at a time, in threads (0: `default_workers()`). The
      same programs run on the same arrays, so the accuracies do not depend on it; on a
      2-core CPU two at a time keep both cores busy (docs/benchmark.md, "Evaluation").
  """

  model: object
  task: object
  max_logits: int = 2**27
  batch_sharding: object = None
  stacked: bool = False
  cache_key: object = None
  legacy_batching: bool = False
  layout: str = members_lib.DEFAULT
  workers: int = 0

  def __post_init__(self):
    self.traces = 0  # Programs traced so far (one per bucket shape; 0 when loaded).
    self._traces_lock = threading.Lock()
    if self.workers <= 0:
      self.workers = default_workers()
    chunk = self._chunk
    if self.stacked:
      chunk = members_lib.over_members(chunk, self.layout, in_axes=(0,) + (None,) * 7)
    name = f"range_chunk stacked={self.stacked}" + (" legacy" if self.legacy_batching else "")
    self._chunk_fn = compile_cache.Program(chunk, name, self.cache_key)

  def _chunk(self, params, key, chunk_index, tokens, targets, mask, in_len, seq_len):
    """Correct and counted output tokens of one chunk: tokens [C, T], targets/mask [C, O]."""
    with self._traces_lock:
      self.traces += 1
    pos_key, dropout_key = jax.random.split(key)
    predictions = predict_padded(self.model, params, pos_key, dropout_key, tokens, seq_len,
                                 in_len, targets.shape[1], chunk_index,
                                 legacy_batching=self.legacy_batching)  # [C, O]
    correct = (predictions == targets) & mask
    return jnp.sum(correct), jnp.sum(mask)

  def _plan(self, lengths, batch_size: int, max_buckets: int):
    """Per length: (padded T, padded O, chunk); programs are the distinct triples."""
    shapes = data.bucket_shapes(self.task, lengths, max_buckets)
    plan = {}
    for n, (padded, out_padded) in shapes.items():
      per_row = self.model.attention_logits_per_sequence(padded)
      plan[n] = (padded, out_padded, self.sub_batch_rows(batch_size, per_row))
    return plan, sorted({padded for padded, _ in shapes.values()})

  def sub_batch_rows(self, batch_size: int, per_row: int) -> int:
    """Rows of one sub-batch: at most max_logits // per_row (and a multiple of the devices
    with batch_sharding); the batch in as few sub-batches as that allows, of equal size
    (500 rows at most 419 a sub-batch: 2 x 250, not 2 x 419 with 338 rows of padding)."""
    most = int(max(1, min(batch_size, self.max_logits // per_row)))
    devices = 1 if self.batch_sharding is None else self.batch_sharding.mesh.size
    most = max(devices, most // devices * devices)
    if self.legacy_batching:
      return most
    even = -(-batch_size // -(-batch_size // most))  # ceil(B / ceil(B / most)) <= most.
    return -(-even // devices) * devices  # Still <= most, a multiple of the devices.

  def program_shapes(self, lengths, batch_size: int, max_buckets: int) -> list:
    """The distinct (T, O, chunk) shapes, one compiled program each, for these lengths."""
    plan, _ = self._plan([int(n) for n in lengths], batch_size, max_buckets)
    return sorted(set(plan.values()))

  def compile(self, params, shape):
    """Compiles (without running) the program of one (T, O, chunk) shape."""
    padded, out_pad, chunk = shape
    tokens = jnp.zeros((chunk, padded), jnp.int32)
    targets = jnp.zeros((chunk, out_pad), jnp.int32)
    return self._chunk_fn.compile(params, jax.random.PRNGKey(0), 0, tokens, targets,
                                  targets.astype(bool), 1, 1)

  def evaluate(self, params, lengths, batch_size: int, seed: int, max_buckets: int,
               progress: bool = False, before_each=None) -> dict:
    """Accuracy (masked, over the batch) for every length.

    The batch of length n comes from key fold_in(PRNGKey(seed), n); positions
    and dropout from fold_in(PRNGKey(seed + 1), n). `before_each()`, if given, is called
    before each length (the training loop's stop check; it may raise).

    Returns:
      {"lengths": [...], "accuracy": [...], "buckets": [...]}; with `stacked`,
      every accuracy is a list over models.
    """
    lengths = [int(n) for n in lengths]
    plan, buckets = self._plan(lengths, batch_size, max_buckets)
    roots = jax.random.PRNGKey(seed), jax.random.PRNGKey(seed + 1)  # Data; model.

    def one(n):
      return self._length_accuracy(params, n, plan[n], roots, batch_size)

    bar = None
    if progress:
      import tqdm  # pylint: disable=import-outside-toplevel
      bar = tqdm.tqdm(total=len(lengths), desc="evaluating", unit="length", leave=False)
    try:
      by_length = _map_lengths(one, lengths, self.workers, before_each,
                               None if bar is None else bar.update)
    finally:
      if bar is not None:
        bar.close()
    accuracy = [by_length[n] for n in lengths]
    return {"lengths": lengths, "accuracy": accuracy, "buckets": buckets}

  def _length_accuracy(self, params, n: int, shape, roots, batch_size: int):
    """The accuracy of length n (a list over models with `stacked`): its batch from
    fold_in(roots[0], n), positions and dropout from fold_in(roots[1], n)."""
    task = self.task
    padded, out_pad, chunk = shape
    batch = data.make_batch(task, jax.random.fold_in(roots[0], n), batch_size, n)
    out_len = batch["targets"].shape[1]
    in_len = batch["tokens"].shape[1] - out_len
    rows = -(-batch_size // chunk) * chunk  # Extra rows are fully masked.
    batch = data.pad_batch(task, batch, padded, out_pad, rows)
    tokens, targets, mask = batch["tokens"], batch["targets"], batch["mask"]
    key = jax.random.fold_in(roots[1], n)
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
    return (correct / np.maximum(counted, 1)).tolist()


def start_order(lengths, workers: int) -> list:
  """The order in which `workers` threads start the lengths: the two halves of the range
  interleaved (41, 71, 42, 72, ... for 41..100), so that the lengths running at the same
  time mostly belong to different buckets, and one thread compiles a bucket's program
  while the other runs; in order with one worker."""
  lengths = list(lengths)
  if workers <= 1:
    return lengths
  half = (len(lengths) + 1) // 2
  pairs = itertools.zip_longest(lengths[:half], lengths[half:])
  return [n for pair in pairs for n in pair if n is not None]


def _map_lengths(one, lengths, workers: int, before_each=None, done=None) -> dict:
  """{n: one(n)} for every length, `workers` lengths at a time in threads (1: one after
  another in this thread), started in `start_order`. `before_each()` runs in this thread
  before each length is started (it may raise: lengths not started are dropped, those
  running finish first); `done()` after each length finishes."""
  results_by_length = {}
  if workers <= 1 or len(lengths) <= 1:
    for n in lengths:
      if before_each is not None:
        before_each()
      results_by_length[n] = one(n)
      if done is not None:
        done()
    return results_by_length

  def collect(finished):
    for future in finished:
      results_by_length[running.pop(future)] = future.result()
      if done is not None:
        done()

  running = {}
  with futures.ThreadPoolExecutor(workers, thread_name_prefix="evaluation") as pool:
    try:
      for n in start_order(lengths, workers):
        if len(running) >= workers:
          collect(futures.wait(running, return_when=futures.FIRST_COMPLETED).done)
        if before_each is not None:
          before_each()
        running[pool.submit(one, n)] = n
      collect(futures.wait(running).done)
    except BaseException:
      for future in running:
        future.cancel()
      raise
  return results_by_length


def split_key(seed: int, dataset, split: str) -> jax.Array:
  """The key of a split's evaluation (`SplitEvaluator`): fold_in(PRNGKey(seed + 1), the
  split's index in the dataset)."""
  return jax.random.fold_in(jax.random.PRNGKey(seed + 1), list(dataset.splits).index(split))


def split_positions(model, key, length: int) -> jax.Array:
  """The positions every chunk of a split evaluated with `key` (`split_key`) gets: one draw
  of the model's evaluation sampler."""
  return model.sample_positions(jax.random.split(key)[0], length, evaluation=True)


def predict_classes(model, params, key, chunk_index, tokens, **apply_kwargs):
  """Predicted classes [C] of one chunk of a split's examples, tokens [C, T]: the forward
  pass of `SplitEvaluator`, which the analyses share (`experiments.ito_analysis`).

  Positions from the first half of `jax.random.split(key)` (`split_positions`), dropout
  (where the model keeps it at evaluation) from the second with the chunk's index folded
  in; the class is read at the last token. `apply_kwargs` go to the model's `apply`: with
  intermediates=True it returns (logits, intermediates), and so does this, (classes, the
  model's intermediates); the classes are the same.
  """
  pos_key, dropout_key = jax.random.split(key)
  positions = model.sample_positions(pos_key, tokens.shape[1], evaluation=True)
  out = model.apply(params, jax.random.fold_in(dropout_key, chunk_index), tokens,
                    positions, is_training=False, num_outputs=1, **apply_kwargs)  # [C, 1, K]
  if not apply_kwargs.get("intermediates"):
    return jnp.argmax(out[:, 0], axis=-1)
  logits, inner = out
  return jnp.argmax(logits[:, 0], axis=-1), inner


@dataclasses.dataclass
class SplitEvaluator:
  """Accuracy of a model on the splits of a dataset, overall and per group.

  Every split is read in chunks of `batch_size` examples, the last one padded with blank
  rows whose predictions are dropped, so every split runs the same compiled program. The
  model answers at the last token; positions come from its evaluation sampler, one draw
  per split from fold_in(PRNGKey(seed + 1), the split's index), and dropout (if the
  model keeps it at evaluation) from that key folded with the chunk's index.

  Attributes:
    model: the model (protocol of `randomized_pe.models`).
    dataset: an `experiments.training.data.Dataset`.
    batch_size: examples per chunk.
    batch_sharding: optional sharding of the batch axis over devices.
    stacked: params carry a leading models axis [M, ...]; accuracies are then lists of
      M values.
    cache_key: as RangeEvaluator's.
    layout: as RangeEvaluator's.
  """

  model: object
  dataset: data.Dataset
  batch_size: int = 128
  batch_sharding: object = None
  stacked: bool = False
  cache_key: object = None
  layout: str = members_lib.DEFAULT

  def __post_init__(self):
    self.traces = 0  # Programs traced so far (0 when loaded).
    chunk = self._chunk
    if self.stacked:
      chunk = members_lib.over_members(chunk, self.layout, in_axes=(0, None, None, None))
    self._chunk_fn = compile_cache.Program(chunk, f"split_chunk stacked={self.stacked}",
                                           self.cache_key)

  def _chunk(self, params, key, chunk_index, tokens):
    """Predicted classes [C] of one chunk of examples, tokens [C, T]."""
    self.traces += 1
    return predict_classes(self.model, params, key, chunk_index, tokens)

  def predictions(self, params, split: str, seed: int) -> np.ndarray:
    """Predicted classes of every example of `split`: int [N] (stacked: [M, N])."""
    examples = self.dataset.splits[split]
    count = len(examples.answers)
    chunk = self.batch_size
    if self.batch_sharding is not None:
      devices = self.batch_sharding.mesh.size
      chunk = max(devices, chunk // devices * devices)
    key = split_key(seed, self.dataset, split)
    outputs = []
    for c in range(-(-count // chunk)):
      rows = np.arange(c * chunk, min(count, (c + 1) * chunk))
      tokens = data.examples_batch(examples, rows, chunk)["tokens"]
      if self.batch_sharding is not None:
        tokens = jax.device_put(tokens, self.batch_sharding)
      outputs.append(self._chunk_fn(params, key, c, tokens))
    return np.concatenate([np.asarray(o) for o in outputs], axis=-1)[..., :count]

  def evaluate(self, params, splits, seed: int, before_each=None) -> dict:
    """{split: {"overall": a, group: a, ...}}, exact accuracies (the dataset's
    `accuracy`); with `stacked`, every a is a list over the models. `before_each()`, if
    given, is called before each split (it may raise)."""
    evaluated = {}
    for split in splits:
      if before_each is not None:
        before_each()
      examples = self.dataset.splits[split]
      correct = self.predictions(params, split, seed) == examples.answers  # [(M,) N]
      if not self.stacked:
        evaluated[split] = self.dataset.accuracy(correct, examples.groups)
        continue
      per_model = [self.dataset.accuracy(c, examples.groups) for c in correct]
      evaluated[split] = {k: [a[k] for a in per_model] for k in per_model[0]}
    return evaluated


# --------------------------------------------------------------------------
# The evaluation of each kind of data, as the training loop calls it.


class LengthEvaluation:
  """A generated task's evaluation: accuracy per length over evaluation.min_length..
  max_length after training (eval.json: `results.eval_record`), and every
  evaluation.every_steps steps during training (records of metrics.jsonl; 0: never),
  then with evaluation.periodic_batch_size sequences per length (0: batch_size).

  A periodic record holds the per-length accuracy, its mean over the range and the
  scores (training range, unseen lengths), each a list over the models of a grid (the
  one value of a single model); the loop adds the training seconds so far, so that
  accuracy can be drawn against training time (the paper's Figure 2).
  """

  def __init__(self, source, model, config, batch_sharding=None):
    self._config = config
    self._every = config.evaluation.get("every_steps", 0)
    self._evaluator = RangeEvaluator(model, source.task, max_logits=config.evaluation.max_logits,
                                     batch_sharding=batch_sharding, stacked=True,
                                     cache_key=compile_cache.run_key(config, source.task),
                                     layout=members_lib.of(config))

  def due(self, step: int) -> bool:
    return self._every > 0 and step % self._every == 0

  def _evaluate(self, params, batch_size, progress=False, before_each=None):
    e = self._config.evaluation
    return self._evaluator.evaluate(params, range(e.min_length, e.max_length + 1),
                                    batch_size, e.seed, e.max_buckets, progress=progress,
                                    before_each=before_each)

  def periodic(self, params, step: int, unwrap) -> dict:
    e, t = self._config.evaluation, self._config.training
    evaluated = self._evaluate(params, e.get("periodic_batch_size", 0) or e.batch_size)
    lengths = evaluated["lengths"]
    per_model = np.asarray(evaluated["accuracy"], np.float64).T  # [M, lengths]
    model_scores = [results.scores(lengths, list(a), t.min_length, t.max_length)
                    for a in per_model]
    return {"step": step, "evaluation": {
        "lengths": lengths,
        "accuracy": [unwrap(a) for a in evaluated["accuracy"]],
        "mean": unwrap(per_model.mean(axis=1).tolist()),
        **{name: unwrap([s[name] for s in model_scores]) for name in model_scores[0]}}}

  def final(self, params, members, diverged, step: int, progress: bool = False,
            before_each=None) -> dict:
    evaluated = self._evaluate(params, self._config.evaluation.batch_size, progress,
                               before_each)
    return results.eval_record(self._config, members, evaluated, diverged, step)


class SplitEvaluation:
  """A dataset's evaluation: accuracy overall and per group on evaluation.splits every
  evaluation.every_epochs epochs (records of metrics.jsonl; 0: never), and on
  evaluation.final_splits after training (eval.json: `results.split_record`).

  Defaults: every split but the training one, periodically; every split at the end.
  """

  def __init__(self, source, model, config, batch_sharding=None):
    e = config.evaluation
    dataset = source.task
    self._config, self._source, self._model = config, source, model
    self._evaluator = SplitEvaluator(model, dataset, e.batch_size, batch_sharding, stacked=True,
                                     cache_key=compile_cache.run_key(config, dataset),
                                     layout=members_lib.of(config))
    self._every = e.get("every_epochs", 0) * source.steps_per_epoch
    self._splits = tuple(e.get("splits", [s for s in dataset.splits
                                          if s != dataset.train_split]))
    self._final_splits = tuple(e.get("final_splits", tuple(dataset.splits)))

  def due(self, step: int) -> bool:
    """Whether to evaluate after `step` steps: every `every_epochs` whole epochs."""
    return self._every > 0 and step % self._every == 0

  def periodic(self, params, step: int, unwrap) -> dict:
    """The metrics record of an evaluation during training: {"step", "epoch",
    "evaluation": {split: {group: accuracy}}}; `unwrap` turns a list over the models
    into what the records hold (the one value of a single model)."""
    evaluated = self._evaluator.evaluate(params, self._splits, self._config.evaluation.seed)
    return {"step": step, "epoch": self._source.epoch(step),
            "evaluation": {split: {group: unwrap(values) for group, values in by_group.items()}
                           for split, by_group in evaluated.items()}}

  def final(self, params, members, diverged, step: int, progress: bool = False,
            before_each=None) -> dict:
    del progress  # A few seconds.
    evaluated = self._evaluator.evaluate(params, self._final_splits,
                                         self._config.evaluation.seed, before_each)
    return results.split_record(self._config, members, evaluated, diverged, step,
                                self._source.epoch(step), self._model.description)


def for_source(source, model, config, batch_sharding=None):
  """The evaluation of a run's kind of data (`experiments.training.data.source(config)`).

  batch_sharding: splits the evaluation batches over devices (a single model on
  several devices); None otherwise.
  """
  kinds = {data.GeneratedBatches: LengthEvaluation, data.EpochBatches: SplitEvaluation}
  return kinds[type(source)](source, model, config, batch_sharding)
