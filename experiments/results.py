"""A run's results: scores per model, the eval.json record, and a Markdown summary."""
from __future__ import annotations

import numpy as np


def scores(lengths, accuracy, train_min: int, train_max: int) -> dict:
  """Mean accuracy over the training range and over the unseen (longer) lengths."""
  acc = dict(zip(lengths, accuracy))
  seen = [a for n, a in acc.items() if train_min <= n <= train_max]
  unseen = [a for n, a in acc.items() if n > train_max]
  return {"train_range": float(np.mean(seen)) if seen else None,
          "unseen": float(np.mean(unseen)) if unseen else None}


def eval_record(config, members, evaluated: dict, diverged, step: int) -> dict:
  """The eval.json record of a run: per-length accuracy and scores of every grid model.

  Args:
    config: the run's config.
    members: (seed, learning rate) per model.
    evaluated: `RangeEvaluator.evaluate`'s result with stacked (per-model) accuracies.
    diverged: bool per model.
    step: the step the models were evaluated at.
  """
  t = config.training
  models = []
  for m, (seed, rate) in enumerate(members):
    accuracy = [a[m] for a in evaluated["accuracy"]]
    models.append({"seed": seed, "learning_rate": rate, "accuracy": accuracy,
                   "diverged": bool(diverged[m]),
                   "scores": scores(evaluated["lengths"], accuracy, t.min_length, t.max_length)})
  record = {
      "task": config.task, "pe": config.model.pe, "compat": config.model.compat,
      "step": step, "lengths": evaluated["lengths"], "buckets": evaluated["buckets"],
      "training_lengths": [t.min_length, t.max_length], "models": models,
  }
  if len(models) == 1:  # A single run keeps its numbers at the top level.
    record.update(accuracy=models[0]["accuracy"], scores=models[0]["scores"])
  return record


def summary_table(result: dict) -> str:
  """A short Markdown table of in-distribution vs unseen-length accuracy per model."""
  lo, hi = result["training_lengths"]
  unseen = [n for n in result["lengths"] if n > hi]
  columns = [f"{lo}-{hi} (training)"] + ([f"{unseen[0]}-{unseen[-1]} (unseen)"] if unseen else [])
  keys = ["train_range"] + (["unseen"] if unseen else [])
  models = result["models"]

  def cell(value):
    return "-" if value is None else f"{100 * value:.1f}%"

  if len(models) == 1:
    rows = ["| lengths | accuracy |", "|---|---:|"]
    rows += [f"| {c} | {cell(models[0]['scores'][k])} |" for c, k in zip(columns, keys)]
    return "\n".join(rows)
  rows = ["| seed | learning rate | " + " | ".join(columns) + " |",
          "|---:|---:|" + "---:|" * len(columns)]
  for m in models:
    flag = " (diverged)" if m["diverged"] else ""
    rows.append(f"| {m['seed']} | {m['learning_rate']:g}{flag} | "
                + " | ".join(cell(m["scores"][k]) for k in keys) + " |")
  return "\n".join(rows)
