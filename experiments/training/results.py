"""A run's results: scores per model, the eval.json record, and a Markdown summary.

Two records, one per kind of data (`experiments.training.data.source`): a generated task's
accuracy per length (`eval_record`), a dataset's accuracy per split and group
(`split_record`), each completed by what the model records of itself (`with_model`).
`summary_table` renders either.
"""
from __future__ import annotations

import numpy as np


def scores(lengths, accuracy, train_min: int, train_max: int) -> dict:
  """Mean accuracy over the training range and over the unseen (longer) lengths."""
  acc = dict(zip(lengths, accuracy))
  seen = [a for n, a in acc.items() if train_min <= n <= train_max]
  unseen = [a for n, a in acc.items() if n > train_max]
  return {"train_range": float(np.mean(seen)) if seen else None,
          "unseen": float(np.mean(unseen)) if unseen else None}


def with_model(record: dict, model) -> dict:
  """`record` (`eval_record`'s or `split_record`'s) with the fields the model records of
  itself (its protocol's `record`, e.g. the encoder's "pe" and "compat"): eval.json."""
  return {**record, **model.record}


def eval_record(config, members, evaluated: dict, diverged, step: int) -> dict:
  """The eval.json record of a run (without the model's fields: `with_model`): per-length
  accuracy and scores of every grid model.

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
      "task": config.task, "step": step, "lengths": evaluated["lengths"],
      "buckets": evaluated["buckets"],
      "training_lengths": [t.min_length, t.max_length], "models": models,
  }
  if len(models) == 1:  # A single run keeps its numbers at the top level.
    record.update(accuracy=models[0]["accuracy"], scores=models[0]["scores"])
  return record


def _mean_sd(values) -> dict:
  """Mean and sample standard deviation (ddof 1, as the papers report; None for fewer
  than two values) of the finite values, and how many there were."""
  values = np.asarray([v for v in values if np.isfinite(v)], np.float64)
  return {"mean": float(values.mean()) if values.size else None,
          "sd": float(values.std(ddof=1)) if values.size > 1 else None,
          "count": int(values.size)}


def split_record(config, members, evaluated: dict, diverged, step: int, epoch: float,
                 description: str) -> dict:
  """The eval.json record of a dataset run (without the model's fields: `with_model`):
  accuracy per split, overall and per group, of every grid model, and with several
  models their mean and SD over the models that did not diverge.

  Args:
    config: the run's config.
    members: (seed, learning rate) per model.
    evaluated: `SplitEvaluator.evaluate`'s result with stacked (per-model) accuracies,
      {split: {group: [M]}}.
    diverged: bool per model.
    step: the step the models were evaluated at.
    epoch: the epochs that step completes.
    description: the model's one line (it names e.g. the σ of a learned encoding).
  """
  models = []
  for m, (seed, rate) in enumerate(members):
    models.append({
        "seed": seed, "learning_rate": rate, "diverged": bool(diverged[m]),
        "accuracy": {split: {group: values[m] for group, values in by_group.items()}
                     for split, by_group in evaluated.items()}})
  splits = list(evaluated)
  record = {"task": config.task, "model": description, "step": step,
            "epoch": epoch, "splits": splits,
            "groups": list(evaluated[splits[0]]) if splits else [], "models": models}
  if len(models) == 1:  # A single run keeps its numbers at the top level.
    record["accuracy"] = models[0]["accuracy"]
  else:
    kept = [m for m in models if not m["diverged"]]
    record["over_models"] = {
        split: {group: _mean_sd([m["accuracy"][split][group] for m in kept])
                for group in record["groups"]} for split in splits}
  return record


def _split_table(result: dict) -> str:
  """Markdown: accuracy per split (rows) and group (columns); mean ± SD over models."""
  groups = result["groups"]
  rows = ["| split | " + " | ".join(groups) + " |", "|---|" + "---:|" * len(groups)]
  for split in result["splits"]:
    if "accuracy" in result:
      cells = [f"{100 * result['accuracy'][split][g]:.1f}%" for g in groups]
    else:
      cells = []
      for g in groups:
        stats = result["over_models"][split][g]
        if stats["mean"] is None:
          cells.append("-")
        else:
          sd = "" if stats["sd"] is None else f" ± {100 * stats['sd']:.1f}"
          cells.append(f"{100 * stats['mean']:.1f}{sd}%")
    rows.append(f"| {split} | " + " | ".join(cells) + " |")
  if "over_models" in result:
    count = result["over_models"][result["splits"][0]][groups[0]]["count"]
    rows.append(f"\nMean ± SD (ddof 1) over {count} of {len(result['models'])} models "
                "(diverged ones left out).")
  return "\n".join(rows)


def summary_table(result: dict) -> str:
  """A short Markdown table: for a generated task, in-distribution vs unseen-length
  accuracy per model; for a dataset, accuracy per split and group."""
  if "splits" in result:
    return _split_table(result)
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
