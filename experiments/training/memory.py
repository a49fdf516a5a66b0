"""The memory the largest training and evaluation programs of a run need, estimated from
their shapes before anything runs, against the memory available (issue 28).

A lower bound of the big buffers, so a run that cannot fit is refused up front (one
line with the estimate and the limit) instead of failing after training, without
refusing runs that fit:
  evaluation  the batch of the longest length made on the host (tokens, targets and
              masks: batch x T int32 each), and per model the attention logits of one
              sub-batch (evaluation.max_logits floats) and its feed-forward activations;
  training    per model and layer the attention probabilities kept for the backward
              pass (batch x heads x T x T floats for the encoder) and the activations
              (batch x T x the model's `block_width` floats).
The per-sequence figures are the model's own cost hints
(`activation_floats_per_sequence` of the model protocol, randomized_pe/models), so
that any model is counted, not only the encoder.
The limit is the environment's RANDOMIZED_PE_MEMORY_LIMIT (bytes; tests set a fake one),
else MemAvailable of /proc/meminfo, else no check.
"""
from __future__ import annotations

import os

import jax

from experiments.training import data

LIMIT_ENV = "RANDOMIZED_PE_MEMORY_LIMIT"
_FLOAT = 4


def available_bytes() -> int | None:
  """The memory a run may use: RANDOMIZED_PE_MEMORY_LIMIT; else on an accelerator its
  memory's limit (jax's memory_stats, None if it has none); else MemAvailable; else None."""
  if os.environ.get(LIMIT_ENV):
    return int(float(os.environ[LIMIT_ENV]))
  if jax.default_backend() != "cpu":
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  return None


def _gb(n: float) -> str:
  return f"{n / 2**30:.1f} GiB"


def estimate(config, task, model, num_models: int) -> dict[str, float]:
  """Bytes of the largest evaluation and training programs of a generated task's run,
  from the model's cost hints (`activation_floats_per_sequence`: a lower bound)."""

  e = config.evaluation
  t_eval = data.sequence_length(task, e.max_length)
  batch = max(e.batch_size, e.periodic_batch_size)
  chunk = max(1, min(batch, e.max_logits // max(1, model.attention_logits_per_sequence(t_eval))))
  evaluation = (3 * batch * t_eval * _FLOAT + num_models * chunk * _FLOAT
                * model.activation_floats_per_sequence(t_eval, training=False))
  t_train = data.sequence_length(task, config.training.max_length)
  training = (num_models * config.training.batch_size * _FLOAT
              * model.activation_floats_per_sequence(t_train, training=True))
  return {"evaluation": float(evaluation), "training": float(training)}


def check(config, source, model, num_models: int) -> None:
  """ValueError (one line, the estimate and the limit) if a program of the run cannot fit."""

  if not isinstance(source, data.GeneratedBatches):
    return  # A dataset's programs are sized by its own checks.
  limit = available_bytes()
  if limit is None:
    return
  needs = estimate(config, source.task, model, num_models)
  for name, hint in (("evaluation", "evaluation.batch_size or evaluation.max_logits"),
                     ("training", "training.batch_size, training.max_length or the model")):
    if needs[name] > limit:
      raise ValueError(
          f"the {name} would need at least {_gb(needs[name])} of memory, more than the "
          f"{_gb(limit)} available ({'$' + LIMIT_ENV if os.environ.get(LIMIT_ENV) else 'MemAvailable'}); "
          f"lower {hint}")
