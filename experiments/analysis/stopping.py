"""What stopping when learned would have given, read from runs trained to the end.

A run with `training.stop_when_learned = A` stops at the first evaluation during training
at which the seeds of a learning rate average A on the training lengths, and its models
are those of the same run without the rule at that step (experiments/training/learned.py;
tests/test_stop_when_learned.py). So the records of a run trained to the end hold what
the stopped run would have found at that step (its evaluation during training) and what
its training would have cost (the training seconds to that step). `stopped_at` reads
them; experiments/analysis/tables.py (`stopping_rows`) compares twins with it.
"""
from __future__ import annotations

from experiments.training import learned


def stopped_at(records, members, threshold: float) -> dict | None:
  """The run `records` (metrics.jsonl's) came from, as `training.stop_when_learned =
  threshold` would have stopped it: {"step" (its last evaluation's if the rule never
  held: it trains all its steps), "learned" (whether the rule held), "seconds" (training
  seconds to that step), "train", "unseen" (accuracy in % at that evaluation, one per seed
  of the learning rate whose seeds average the most on the training lengths there)};
  None without evaluations during training. `members`: the grid's (seed, learning rate)
  in the order of the records' values."""
  evaluations = [r for r in records if "evaluation" in r and "train_seconds" in r]
  if not evaluations:
    return None
  step = learned.first_learned(evaluations, members, threshold)
  record = (evaluations[-1] if step is None
            else next(r for r in evaluations if r["step"] == step))
  train = learned.per_model(record["evaluation"]["train_range"], len(members)) * 100
  unseen = learned.per_model(record["evaluation"]["unseen"], len(members)) * 100
  columns = learned.by_rate(members)
  best = max(columns, key=lambda rate: train[columns[rate]].mean())  # First of equals.
  return {"step": int(record["step"]), "learned": step is not None,
          "seconds": float(record["train_seconds"]), "learning_rate": best,
          "train": train[columns[best]], "unseen": unseen[columns[best]]}
