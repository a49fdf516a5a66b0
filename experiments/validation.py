"""Checks of a run's config before any work: a one-line ValueError for any bad setting.

The rules of the run's own settings (seeds, training, evaluation, grid) are the table
`RULES` below; the model checks its settings itself (`randomized_pe.models`, e.g.
EncoderConfig), the kind of data its own (`experiments.data.source`: the lengths of a
generated task, a dataset's evaluation settings), and the optimizer its own. Each rule
is a predicate and the phrase the error uses, so a message reads "training.steps must
be >= 1, got 0".
"""
from __future__ import annotations

import ml_collections

from experiments import data
from experiments import steps

_INT32 = (-2**31, 2**31 - 1)


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def at_least(low):
  return (lambda v: _number(v) and v >= low), f">= {low}"


def positive():
  return (lambda v: _number(v) and v > 0), "> 0"


def int32():
  return ((lambda v: _is_int(v) and _INT32[0] <= v <= _INT32[1]),
          f"an integer in [{_INT32[0]}, {_INT32[1]}]")


def each(rule):
  check, phrase = rule
  return ((lambda v: isinstance(v, (tuple, list)) and all(check(x) for x in v)),
          f"a tuple of values each {phrase}")


# setting -> (predicate, what the setting must be).
RULES = {
    "seed": int32(),
    "data_seed": int32(),  # -1: the same as seed.
    "training.steps": at_least(1),
    "training.batch_size": at_least(1),
    "training.learning_rate": positive(),
    "training.grad_clip_norm": at_least(0),  # 0: no clipping.
    "training.log_every": at_least(1),
    "training.checkpoint_every": at_least(1),
    # At least 1: with none kept a killed run would start again from step 0.
    "training.checkpoints_to_keep": at_least(1),
    "training.prefetch": at_least(0),
    "training.max_programs": at_least(0),  # 0: one program per training length.
    "evaluation.batch_size": at_least(1),
    "evaluation.seed": int32(),
    "evaluation.max_buckets": at_least(1),
    "evaluation.max_logits": at_least(1),
    "evaluation.every_steps": at_least(0),  # 0: only at the end.
    "evaluation.periodic_batch_size": at_least(0),  # 0: evaluation.batch_size.
    "grid.seeds": each(int32()),
    "grid.learning_rates": each(positive()),
}


def _get(config, path: str):
  node = config
  for part in path.split("."):
    node = node[part]
  return node


def check_rules(config: ml_collections.ConfigDict, rules=None) -> None:
  """Raises ValueError for the first setting of `rules` (default RULES) that breaks its
  rule."""
  for path, (check, phrase) in (rules or RULES).items():
    try:
      value = _get(config, path)
    except KeyError:
      raise ValueError(f"the config has no setting {path}") from None
    if not check(value):
      raise ValueError(f"{path} must be {phrase}, got {value!r}")


def validate(config: ml_collections.ConfigDict, device_count: int = 1) -> None:
  """Raises ValueError with a one-line message for any bad setting, before any work."""
  check_rules(config)
  source = data.source(config)  # The task or dataset name.
  model = steps.build_model(config, source.task)  # Model settings, encoding and samplers.
  steps.make_optimizer(config)  # The optimizer and its settings.
  source.check(model, device_count)  # Lengths, or the dataset's settings.
