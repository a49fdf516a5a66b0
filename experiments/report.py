"""Tables and figures of a sweep beside the paper's numbers.

  python -m experiments.report --sweep_dir=runs/small [--out_dir=DIR]

Writes into OUT_DIR (default SWEEP_DIR/report):
  table1.md / table1.csv  max over seeds and learning rates of the unseen-length
                          accuracy (Table 1 of the paper), ours beside the paper's
  table4.md / table4.csv  mean and standard deviation over seeds at the best
                          learning rate (Table 4)
  headline.json           per task, best randomized minus best non-randomized
                          encoding, averaged over tasks (the paper: 12.0 points)
  figures/TASK.png        accuracy against length per encoding (best model), with
                          the training range shaded, like the paper's Figure 4
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


def write_report(sweep_dir: str, out_dir: str | None = None) -> dict:
  """Writes every report file; returns the tables and headline."""
  from experiments import io_utils  # pylint: disable=import-outside-toplevel

  if not os.path.isdir(sweep_dir):
    raise ValueError(f"no sweep folder at {sweep_dir}")
  results = load_sweep(sweep_dir)
  if not results:
    raise ValueError(f"no finished job (eval.json) under {sweep_dir}")
  paper = load_paper()
  out_dir = out_dir or os.path.join(sweep_dir, "report")
  os.makedirs(os.path.join(out_dir, "figures"), exist_ok=True)
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
  return {"tasks": tasks, "encodings": encodings, "table1": t1_md, "table4": t4_md,
          "headline": head, "out_dir": out_dir}


def main(argv):
  del argv  # cli.parse_flags refuses extra arguments.
  from experiments import cli  # pylint: disable=import-outside-toplevel

  try:
    report = write_report(_SWEEP_DIR.value, _OUT_DIR.value)
  except ValueError as e:
    cli.fail(cli.one_line(e))
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
  cli.run(main)
