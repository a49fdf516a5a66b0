"""Checks of a run's config before any work: a one-line ValueError for any bad setting."""
from __future__ import annotations

import ml_collections

import tasks as tasks_lib
from experiments import data
from experiments import steps


def validate(config: ml_collections.ConfigDict, device_count: int = 1) -> None:
  """Raises ValueError with a one-line message for any bad setting, before any work."""
  task = tasks_lib.get(config.task)
  model = steps.build_model(config, task)  # Model settings, encoding and samplers.
  t, e = config.training, config.evaluation
  for name, value in [("training.steps", t.steps), ("training.batch_size", t.batch_size),
                      ("training.log_every", t.log_every),
                      ("training.checkpoint_every", t.checkpoint_every),
                      ("evaluation.batch_size", e.batch_size),
                      ("evaluation.max_buckets", e.max_buckets)]:
    if value < 1:
      raise ValueError(f"{name} must be >= 1, got {value}")
  if t.max_programs < 0:
    raise ValueError(f"training.max_programs must be >= 0 (0: one per length), "
                     f"got {t.max_programs}")
  for prefix, lo, hi in [("training", t.min_length, t.max_length),
                         ("evaluation", e.min_length, e.max_length)]:
    if not 1 <= lo <= hi:
      raise ValueError(f"{prefix} lengths must satisfy 1 <= min_length <= max_length, "
                       f"got {lo}..{hi}")
  if t.batch_size % device_count:
    raise ValueError(f"training.batch_size={t.batch_size} must be divisible by the "
                     f"{device_count} devices")
  longest = max(data.sequence_length(task, n)
                for n in (*range(t.min_length, t.max_length + 1),
                          *range(e.min_length, e.max_length + 1)))
  model.check_sequence_length(longest, f"input plus output of {config.task}")
