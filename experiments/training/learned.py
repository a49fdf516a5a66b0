"""When a run has learned its training lengths: the rule of `training.stop_when_learned`.

A run with `training.stop_when_learned = A` (0 < A <= 1; 0, the default, never stops
early) stops at the first evaluation during training (every `evaluation.every_steps`
steps) at which the models of some learning rate of its grid have learned their training
lengths: the mean over that rate's seeds of the accuracy on the training lengths (the
evaluation record's `train_range`) is at least A. Its final evaluation is then that of
the step it stopped at, its eval.json says so (`STOPPED`: that step), and
`training.steps` is the most it trains.

The rule reads evaluations only, and the learning rate's schedule stays that of
`training.steps`, so a run that stops at step S has the models the same run without the
rule has at step S: its records up to S are that run's. So the rule can be applied to the
records of runs trained to the end (`first_learned`), which is how the reports tell what
the stopping protocol would have given and cost (experiments/analysis/tables.py,
`stopping_rows`) without training anything again.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

SETTING = "training.stop_when_learned"
# The key of eval.json giving the step a run stopped at by the rule (absent otherwise).
STOPPED = "stopped_when_learned"


def threshold(config) -> float:
  """The run's `training.stop_when_learned` (0: off; configs stored before it existed)."""
  return float(config["training"].get("stop_when_learned", 0) or 0)


def check(config, generated: bool) -> None:
  """One-line ValueError for a rule the run cannot apply: a threshold outside [0, 1], or
  one > 0 without evaluations during training of a generated task's lengths, or with
  evaluations between training records (`generated`: the run's data is a generated
  task, whose evaluations score the training lengths)."""
  value = config["training"].get("stop_when_learned", 0)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
    raise ValueError(f"{SETTING} must be a number in [0, 1] (0: train all training.steps), "
                     f"got {value!r}")
  if not value:
    return
  every = config["evaluation"].get("every_steps", 0)
  if not generated:
    raise ValueError(f"{SETTING} reads the accuracy on the training lengths of a generated "
                     f"task; {config['task']!r} is a dataset: set it to 0")
  if not every:
    raise ValueError(f"{SETTING}={value} needs evaluations during training: set "
                     "evaluation.every_steps > 0")
  t, e = config["training"], config["evaluation"]
  if e["min_length"] > t["max_length"] or e["max_length"] < t["min_length"]:
    raise ValueError(f"{SETTING} reads the accuracy on the training lengths "
                     f"{t['min_length']}..{t['max_length']}, which the evaluation's "
                     f"{e['min_length']}..{e['max_length']} leaves out")
  log_every = t["log_every"]
  if every % log_every:
    raise ValueError(f"{SETTING}: evaluation.every_steps={every} must be a multiple of "
                     f"training.log_every={log_every} (a run stops where a training "
                     "record ends)")


def per_model(values, count: int) -> np.ndarray:
  """float64 [count]: a record's values, one per model of the grid (one number for a
  single model); ValueError if they are not one per model."""
  values = np.atleast_1d(np.asarray(values, np.float64))
  if len(values) != count:
    raise ValueError(f"{len(values)} accuracies for a grid of {count} models")
  return values


def by_rate(members: Sequence[tuple[int, float]]) -> dict:
  """{learning rate: the indices of its models}, rates in the grid's order."""
  rates: dict = {}
  for i, (_, rate) in enumerate(members):
    rates.setdefault(rate, []).append(i)
  return rates


def learned(train_range, members: Sequence[tuple[int, float]], value: float) -> bool:
  """Whether an evaluation's accuracies on the training lengths (`train_range`: one per
  model of the grid, or one number for a single model) meet the rule: the mean over the
  seeds of some learning rate >= `value` (> 0; 0 is never)."""
  if not value:
    return False
  accuracies = per_model(train_range, len(members))
  return max(float(accuracies[i].mean()) for i in by_rate(members).values()) >= value


def first_learned(records, members, value: float) -> Optional[int]:
  """The step of the first evaluation record (metrics.jsonl's) that meets the rule; None
  if none does."""
  for record in records:
    if "evaluation" in record and learned(record["evaluation"]["train_range"], members,
                                          value):
      return int(record["step"])
  return None
