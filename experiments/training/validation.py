"""Checks of a run's config before any work: a one-line ValueError for any bad setting.

The rules of the run's own settings (seeds, training, evaluation, grid) are the table
`RULES` below; the model checks its settings itself (`randomized_pe.models`, e.g.
EncoderConfig), the kind of data its own (`experiments.training.data.source`: the lengths of a
generated task, a dataset's evaluation settings), and the optimizer its own. Each rule
is a predicate and the phrase the error uses, so a message reads "training.steps must
be >= 1, got 0".
"""
from __future__ import annotations

import ast
import math

import ml_collections

from experiments.training import data
from experiments.training import learned
from experiments.training import members
from experiments.training import memory
from experiments.training import steps

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
  """A tuple of distinct values each passing `rule` (a grid's members: a value given twice
  would train the same model twice)."""
  check, phrase = rule

  def tuple_check(v):
    return (isinstance(v, (tuple, list)) and all(check(x) for x in v)
            and len(set(v)) == len(v))

  tuple_check.element_check = check
  return tuple_check, f"a tuple of distinct values each {phrase}"


def seed_or_minus_one():
  return ((lambda v: int32()[0](v) and (v >= 0 or v == -1)),
          f"an integer in [0, {_INT32[1]}], or -1 (the same as seed)")


# setting -> (predicate, what the setting must be).
RULES = {
    "seed": int32(),
    "data_seed": seed_or_minus_one(),
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
    "grid.layout": ((lambda v: v in members.LAYOUTS), f"one of {', '.join(members.LAYOUTS)}"),
}


def _get(config, path: str):
  node = config
  for part in path.split("."):
    node = node[part]
  return node


def _elements(value):
  """The elements of a tuple setting as the command line gave it: a tuple flag whose text
  is not a Python literal (e.g. '(0.001,inf)') arrives as one string; it is split into
  its elements, each read as a number where it is one, so a message names the element."""
  if isinstance(value, (tuple, list)) and len(value) == 1 and isinstance(value[0], str):
    value = value[0]
  if not isinstance(value, str):
    return value
  text = value.strip()
  if text[:1] in "([" and text[-1:] in ")]":
    text = text[1:-1]
  out = []
  for part in (p.strip() for p in text.split(",") if p.strip()):
    try:
      out.append(ast.literal_eval(part))
    except (ValueError, SyntaxError):
      try:
        out.append(float(part))  # inf, nan: numbers, refused as not finite.
      except ValueError:
        out.append(part)
  return tuple(out)


def _numbers(value, path):
  """(path, number) of every number in a setting (tuple elements too)."""
  if isinstance(value, (tuple, list)):
    for x in value:
      yield from _numbers(x, path)
  elif _number(value):
    yield path, value


def _walk(node, prefix=""):
  for key, value in node.items():
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      yield from _walk(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def check_finite(config: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming the first setting (of any section: model, training, ...)
  holding an infinite or NaN number; the range of each is its own rule's."""
  for path, value in _walk(config):
    for _, x in _numbers(_elements(value), path):
      if not math.isfinite(x):
        element = "" if not isinstance(value, (tuple, list, str)) else f" (the element {x!r})"
        raise ValueError(f"{path} must be a finite number, got {_shown(value)}{element}")


def _shown(value):
  if isinstance(value, (tuple, list)) and len(value) == 1 and isinstance(value[0], str):
    return value[0]
  return repr(value)


def check_rules(config: ml_collections.ConfigDict, rules=None) -> None:
  """Raises ValueError for the first setting of `rules` (default RULES) that breaks its
  rule, or for any setting holding an infinite or NaN number."""
  check_finite(config)
  for path, (check, phrase) in (rules or RULES).items():
    try:
      value = _get(config, path)
    except KeyError:
      raise ValueError(f"the config has no setting {path}") from None
    # A tuple setting's elements (`each`); any other setting as it is.
    elements = _elements(value) if hasattr(check, "element_check") else value
    if not check(elements):
      bad = ""
      if isinstance(elements, (tuple, list)):
        element_check = getattr(check, "element_check", lambda x: True)
        wrong = [x for x in elements if not element_check(x)]
        repeated = [x for i, x in enumerate(elements) if x in elements[:i]]
        if wrong:
          bad = f" (the element {wrong[0]!r})"
        elif repeated:
          bad = f" ({repeated[0]!r} is given twice)"
      raise ValueError(f"{path} must be {phrase}, got {_shown(value)}{bad}")
    if elements is not value and isinstance(value, (tuple, list)):
      _set(config, path, tuple(elements))  # A tuple given as text: its elements.


def _set(config, path: str, value) -> None:
  parent, _, name = path.rpartition(".")
  (_get(config, parent) if parent else config)[name] = value


def validate(config: ml_collections.ConfigDict, device_count: int = 1):
  """Raises ValueError with a one-line message for any bad setting, before any work.

  Returns (source, model): the run's data (`experiments.training.data.source`) and its
  model (`experiments.training.steps.build_model`), built once here to check them, for
  the run to use (`experiments.training.loop.train_and_evaluate`) rather than build again.
  """
  check_rules(config)
  source = data.source(config)  # The task or dataset name.
  model = steps.build_model(config, source.task)  # Model settings, encoding and samplers.
  steps.make_optimizer(config)  # The optimizer and its settings.
  source.check(model, device_count)  # Lengths, or the dataset's settings.
  learned.check(config, isinstance(source, data.GeneratedBatches))  # Stopping when learned.
  return source, model


def check_fits(config: ml_collections.ConfigDict, validated=None) -> None:
  """ValueError (one line) if the run's largest programs cannot fit in the memory of the
  device that will run them (experiments/training/memory.py, from the model's cost hints).
  Not part of `validate`: listing a sweep's jobs on a laptop must not judge them against
  the laptop's memory; the process that runs a job checks it before anything is written.

  validated: (source, model) as `validate` returned them; None builds them (validating).
  """
  source, model = validate(config) if validated is None else validated
  memory.check(config, source, model, len(steps.grid_members(config)))
