"""Tables and figures of a sweep beside the paper's numbers.

  python -m experiments.report --sweep_dir=runs/small [--out_dir=DIR] [--kind=auto]

Writes into OUT_DIR (default SWEEP_DIR/report):
  table1.md / table1.csv  max over seeds and learning rates of the unseen-length
                          accuracy (Table 1 of the paper), ours beside the paper's
  table4.md / table4.csv  mean and standard deviation over seeds at the best
                          learning rate (Table 4)
  headline.json           per task, best randomized minus best non-randomized
                          encoding, averaged over tasks (the paper: 12.0 points)
  figures/TASK.png        accuracy against length per encoding (best model), with
                          the training range shaded, like the paper's Figure 4
A sweep with variants (`sweep.variants`, e.g. configs/su.py) gets instead:
  variants.md / variants.csv  mean ± std over seeds of the unseen-length accuracy per
                          (task, variant), at the learning rate with the best mean
  figures/TASK.png        accuracy against length, a line per variant (mean over
                          seeds, the band ± one std), training range shaded
--kind=auto (default) picks the variants report when the jobs' config.json name
variants, else the paper's tables; --kind=paper or --kind=variants forces one.
A missing job (an unfinished sweep) is shown as a missing cell, never as zero.
The published numbers come from experiments/data/paper_results.json, a copy of
the tables of Ruoss et al., "Randomized Positional Encodings Boost Length
Generalization of Transformers", ACL 2023.
"""
from __future__ import annotations

import csv
import io
import json
import os
import sys

import numpy as np

from experiments import io_utils

PAPER_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                             "paper_results.json")
MISSING = "–"
KINDS = ("auto", "paper", "variants")


def load_paper() -> dict:
  with open(PAPER_RESULTS) as f:
    return json.load(f)


def load_sweep(sweep_dir: str) -> dict:
  """{(task, pe): eval result} for every job folder with an eval.json.

  Folders the sweep moved aside (ENCODING.replaced-TIME) are not results; a damaged
  eval.json is named on stderr and left out.
  """
  results = {}
  for task in sorted(os.listdir(sweep_dir)):
    task_dir = os.path.join(sweep_dir, task)
    if not os.path.isdir(task_dir):
      continue
    for pe in sorted(os.listdir(task_dir)):
      path = os.path.join(task_dir, pe, "eval.json")
      if ".replaced-" in pe or not os.path.exists(path):
        continue
      try:
        results[(task, pe)] = io_utils.read_json(path)
      except io_utils.CorruptFileError as e:
        print(f"warning: {e}; left out of the report", file=sys.stderr)
  return results


def _unseen_scores(result: dict) -> list[tuple[int, float, float]]:
  """(seed, learning rate, unseen accuracy in %) of every model of a job."""
  return [(m["seed"], m["learning_rate"], 100 * m["scores"]["unseen"])
          for m in result["models"] if m["scores"]["unseen"] is not None]


def table1_value(result: dict) -> float | None:
  scores = [s for _, _, s in _unseen_scores(result)]
  return max(scores) if scores else None


def table4_value(result: dict) -> tuple[float, float] | None:
  """Mean and std over seeds at the learning rate with the best mean."""
  by_rate = {}
  for _, rate, score in _unseen_scores(result):
    by_rate.setdefault(rate, []).append(score)
  if not by_rate:
    return None
  best = max(by_rate.values(), key=np.mean)
  return float(np.mean(best)), float(np.std(best))


def _ordered(values, reference):
  return [v for v in reference if v in values] + sorted(v for v in values if v not in reference)


def build_tables(results: dict, paper: dict):
  """Returns (tasks, encodings, table1 cells, table4 cells); a cell is (ours, paper)."""
  tasks = _ordered({t for t, _ in results}, list(paper["task_levels"]))
  encodings = _ordered({p for _, p in results}, paper["encodings"])
  t1, t4 = {}, {}
  for task in tasks:
    for pe in encodings:
      result = results.get((task, pe))
      t1[task, pe] = (table1_value(result) if result else None,
                      paper["table1_max_over_seeds_and_lrs"].get(task, {}).get(pe))
      ref = paper["table4_mean_std_over_seeds_best_lr"].get(task, {}).get(pe)
      t4[task, pe] = (table4_value(result) if result else None,
                      (ref["mean"], ref["std"]) if ref else None)
  return tasks, encodings, t1, t4


def headline(tasks, encodings, table1) -> dict:
  """Per task, best randomized minus best non-randomized encoding (ours and paper)."""
  out = {}
  for which in (0, 1):
    gains = {}
    for task in tasks:
      rand = [table1[task, p][which] for p in encodings if p.startswith("randomized_")]
      plain = [table1[task, p][which] for p in encodings if not p.startswith("randomized_")]
      rand = [v for v in rand if v is not None]
      plain = [v for v in plain if v is not None]
      if rand and plain:
        gains[task] = max(rand) - max(plain)
    out["ours" if which == 0 else "paper_same_cells"] = {
        "per_task": gains, "average_gain_points": float(np.mean(list(gains.values())))
        if gains else None, "tasks_counted": len(gains)}
  return out


def _fmt(value, paper_value, pair=False):
  if pair:
    ours = MISSING if value is None else f"{value[0]:.1f} ± {value[1]:.1f}"
    ref = MISSING if paper_value is None else f"{paper_value[0]:.1f} ± {paper_value[1]:.1f}"
  else:
    ours = MISSING if value is None else f"{value:.1f}"
    ref = MISSING if paper_value is None else f"{paper_value:.1f}"
  return f"{ours} ({ref})"


def markdown_table(tasks, encodings, cells, pair=False) -> str:
  lines = ["| task | " + " | ".join(encodings) + " |",
           "|---|" + "---:|" * len(encodings)]
  for task in tasks:
    lines.append(f"| {task} | " + " | ".join(_fmt(*cells[task, p], pair=pair)
                                           for p in encodings) + " |")
  return "\n".join(lines)


def csv_table(tasks, encodings, cells, pair=False) -> str:
  buffer = io.StringIO()
  writer = csv.writer(buffer)
  if pair:
    writer.writerow(["task", "encoding", "ours_mean", "ours_std", "paper_mean", "paper_std"])
  else:
    writer.writerow(["task", "encoding", "ours", "paper"])
  for task in tasks:
    for pe in encodings:
      ours, ref = cells[task, pe]
      if pair:
        ours, ref = ours or (None, None), ref or (None, None)
        row = [*ours, *ref]
      else:
        row = [ours, ref]
      writer.writerow([task, pe] + ["" if v is None else f"{v:.2f}" for v in row])
  return buffer.getvalue()


def plot_task(task: str, results: dict, encodings, path: str) -> None:
  """Accuracy against length of the best model per encoding, training range shaded."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, ax = plt.subplots(figsize=(7, 4))
  training_range = None
  for pe in encodings:
    result = results.get((task, pe))
    if not result or not result["models"]:
      continue
    best = max(result["models"], key=lambda m: m["scores"]["unseen"] or -1)
    ax.plot(result["lengths"], 100 * np.asarray(best["accuracy"]), label=pe,
            linestyle="-" if pe.startswith("randomized_") else "--")
    training_range = result["training_lengths"]
  if training_range:
    ax.axvspan(training_range[0], training_range[1], color="grey", alpha=0.15,
               label="training lengths")
  ax.set(xlabel="sequence length", ylabel="accuracy (%)", title=task, ylim=(0, 102))
  ax.legend(fontsize=7, loc="lower left")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# The variants report (a sweep with `sweep.variants`, e.g. configs/su.py).


def sweep_variants(sweep_dir: str, results: dict) -> list[str] | None:
  """The sweep's variant names in the config's order, from the jobs' config.json
  (`sweep.encodings` then `sweep.variants`); None if no job's config names variants."""
  from experiments import sweep  # pylint: disable=import-outside-toplevel
  from experiments import workdir as workdir_lib  # pylint: disable=import-outside-toplevel

  for task, name in results:
    try:
      stored = workdir_lib.stored_config(os.path.join(sweep_dir, task, name)) or {}
    except io_utils.CorruptFileError:
      continue
    sweep_config = stored.get("sweep") or {}
    if sweep_config.get("variants"):
      try:
        return [n for n, _ in sweep.variants(sweep_config)]
      except ValueError:
        continue
  return None


def _best_rate_models(result: dict) -> list[dict]:
  """The models (one per seed) at the learning rate whose mean unseen accuracy is best,
  as table4_value chooses it; models without an unseen score are left out."""
  by_rate = {}
  for m in result["models"]:
    if m["scores"]["unseen"] is not None:
      by_rate.setdefault(m["learning_rate"], []).append(m)
  if not by_rate:
    return []
  return max(by_rate.values(), key=lambda ms: np.mean([m["scores"]["unseen"] for m in ms]))


def variant_value(result: dict) -> tuple[float, float, int] | None:
  """(mean, std, number of seeds) of the unseen accuracy in %, over seeds at the best
  learning rate; std is NumPy's (ddof=0), as in Table 4."""
  models = _best_rate_models(result)
  if not models:
    return None
  scores = [100 * m["scores"]["unseen"] for m in models]
  return float(np.mean(scores)), float(np.std(scores)), len(scores)


def build_variant_table(results: dict, order: list[str] | None, paper: dict):
  """Returns (tasks, variants, cells); a cell is variant_value or None (missing)."""
  tasks = _ordered({t for t, _ in results}, list(paper["task_levels"]))
  names = _ordered({v for _, v in results}, order or [])
  cells = {(task, name): (variant_value(results[task, name]) if (task, name) in results
                          else None)
           for task in tasks for name in names}
  return tasks, names, cells


def variant_markdown(tasks, names, cells) -> str:
  lines = ["| task | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
  for task in tasks:
    row = [MISSING if cells[task, n] is None else f"{cells[task, n][0]:.1f} ± {cells[task, n][1]:.1f}"
           for n in names]
    lines.append(f"| {task} | " + " | ".join(row) + " |")
  return "\n".join(lines)


def variant_csv(tasks, names, cells) -> str:
  buffer = io.StringIO()
  writer = csv.writer(buffer)
  writer.writerow(["task", "variant", "mean", "std", "seeds"])
  for task in tasks:
    for name in names:
      cell = cells[task, name]
      writer.writerow([task, name] + (["", "", ""] if cell is None else
                                      [f"{cell[0]:.2f}", f"{cell[1]:.2f}", cell[2]]))
  return buffer.getvalue()


def plot_variants(task: str, results: dict, names, path: str) -> None:
  """Accuracy against length per variant: mean over seeds at the best learning rate,
  a band of ± one std, the training range shaded."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, ax = plt.subplots(figsize=(8, 4.5))
  training_range = None
  for i, name in enumerate(names):
    result = results.get((task, name))
    models = _best_rate_models(result) if result else []
    if not models:
      continue
    accuracy = 100 * np.asarray([m["accuracy"] for m in models], dtype=float)
    mean, std = accuracy.mean(axis=0), accuracy.std(axis=0)
    line, = ax.plot(result["lengths"], mean, label=f"{name} ({len(models)} seeds)",
                    linestyle=("-", "--", ":", "-.")[i // 10 % 4],
                    color=plt.get_cmap("tab10")(i % 10))
    ax.fill_between(result["lengths"], mean - std, mean + std, color=line.get_color(),
                    alpha=0.12, linewidth=0)
    training_range = result["training_lengths"]
  if training_range:
    ax.axvspan(training_range[0], training_range[1], color="grey", alpha=0.15,
               label="training lengths")
  ax.set(xlabel="sequence length", ylabel="accuracy (%)", title=task, ylim=(0, 102))
  ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def write_variant_report(sweep_dir: str, results: dict, order, out_dir: str) -> dict:
  tasks, names, cells = build_variant_table(results, order, load_paper())
  note = ("Mean ± std over seeds (at the learning rate with the best mean) of the accuracy "
          f"in % averaged over the unseen test lengths; {MISSING} marks a job not (yet) "
          "finished.")
  md = f"## Unseen-length accuracy per variant\n\n{note}\n\n" + variant_markdown(
      tasks, names, cells)
  io_utils.atomic_write_text(os.path.join(out_dir, "variants.md"), md + "\n")
  io_utils.atomic_write_text(os.path.join(out_dir, "variants.csv"),
                             variant_csv(tasks, names, cells))
  for task in tasks:
    plot_variants(task, results, names, os.path.join(out_dir, "figures", f"{task}.png"))
  return {"kind": "variants", "tasks": tasks, "variants": names, "cells": cells,
          "table": md, "out_dir": out_dir}


def write_report(sweep_dir: str, out_dir: str | None = None, kind: str = "auto") -> dict:
  """Writes every report file; returns the tables (and the paper kind's headline).

  kind: "paper" (Table 1, Table 4, headline), "variants" (write_variant_report) or
  "auto": "variants" when the jobs' config.json name `sweep.variants`.
  """
  if kind not in KINDS:
    raise ValueError(f"unknown report kind {kind!r}; valid choices: {', '.join(KINDS)}")
  if not os.path.isdir(sweep_dir):
    raise ValueError(f"no sweep folder at {sweep_dir}")
  results = load_sweep(sweep_dir)
  if not results:
    raise ValueError(f"no finished job (eval.json) under {sweep_dir}")
  out_dir = out_dir or os.path.join(sweep_dir, "report")
  order = sweep_variants(sweep_dir, results) if kind != "paper" else None
  os.makedirs(os.path.join(out_dir, "figures"), exist_ok=True)
  if kind == "variants" or (kind == "auto" and order is not None):
    return write_variant_report(sweep_dir, results, order, out_dir)
  paper = load_paper()
  tasks, encodings, t1, t4 = build_tables(results, paper)
  head = headline(tasks, encodings, t1)
  head["paper_published"] = paper["headline"]
  note = ("Cells: ours (paper). Accuracy in % averaged over the unseen test lengths; "
          f"{MISSING} marks a job not (yet) finished or a cell the paper lacks.")
  t1_md = f"## Table 1: max over seeds and learning rates\n\n{note}\n\n" + markdown_table(
      tasks, encodings, t1)
  t4_md = (f"## Table 4: mean ± std over seeds at the best learning rate\n\n{note}\n\n"
           + markdown_table(tasks, encodings, t4, pair=True))
  io_utils.atomic_write_text(os.path.join(out_dir, "table1.md"), t1_md + "\n")
  io_utils.atomic_write_text(os.path.join(out_dir, "table1.csv"), csv_table(tasks, encodings, t1))
  io_utils.atomic_write_text(os.path.join(out_dir, "table4.md"), t4_md + "\n")
  io_utils.atomic_write_text(os.path.join(out_dir, "table4.csv"),
                             csv_table(tasks, encodings, t4, pair=True))
  io_utils.write_json(os.path.join(out_dir, "headline.json"), head)
  for task in tasks:
    plot_task(task, results, encodings, os.path.join(out_dir, "figures", f"{task}.png"))
  return {"kind": "paper", "tasks": tasks, "encodings": encodings, "table1": t1_md,
          "table4": t4_md, "headline": head, "out_dir": out_dir}


def main(argv):
  del argv  # cli.parse_flags refuses extra arguments.
  from experiments import cli  # pylint: disable=import-outside-toplevel

  try:
    report = write_report(_SWEEP_DIR.value, _OUT_DIR.value, _KIND.value)
  except ValueError as e:
    cli.fail(cli.one_line(e))
  if report["kind"] == "variants":
    print(report["table"])
    print(f"\nwritten to {report['out_dir']}")
    return
  print(report["table1"])
  ours = report["headline"]["ours"]
  if ours["average_gain_points"] is not None:
    print(f"\nheadline: best randomized minus best classic encoding, averaged over "
          f"{ours['tasks_counted']} tasks: {ours['average_gain_points']:+.1f} points "
          f"(paper, same cells: {report['headline']['paper_same_cells']['average_gain_points']:+.1f}; "
          f"paper, all 15 tasks: +{report['headline']['paper_published']['average_gain_points']})")
  print(f"\nwritten to {report['out_dir']}")


if __name__ == "__main__":
  from absl import flags  # pylint: disable=ungrouped-imports

  from experiments import cli  # pylint: disable=ungrouped-imports

  _SWEEP_DIR = flags.DEFINE_string("sweep_dir", None, "Sweep folder.", required=True)
  _OUT_DIR = flags.DEFINE_string("out_dir", None, "Output folder (default SWEEP_DIR/report).")
  _KIND = flags.DEFINE_enum("kind", "auto", KINDS, "Which report: the paper's tables, the "
                            "variants table, or auto (variants if the sweep has them).")
  cli.run(main)
