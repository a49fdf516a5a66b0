"""The report's tables and figures: a sweep's results beside the paper's numbers (the
paper's tables, the variants report, the appendix's tables and figures, the CPU study),
and one run's curves. The command line and what it writes: experiments/report.py
(python -m experiments.report)."""
from __future__ import annotations

import csv
import io
import json
import os
import sys
import warnings

import numpy as np

from experiments import cli
from experiments.analysis import figures
from experiments.analysis import ito_tables
from experiments.analysis import motion
from experiments.analysis import order_blind
from experiments.analysis import stopping
from experiments.storage import io_utils
from experiments.storage import workdir as workdir_lib
from experiments.training import events
from experiments.training import jobs
from experiments.training import loop
from experiments.training import results as results_lib

PAPER_RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "paper_numbers",
                             "paper_results.json")
MISSING = "–"


def load_paper() -> dict:
  with open(PAPER_RESULTS) as f:
    return json.load(f)


def load_sweep(sweep_dir: str, moved_aside: bool = False) -> dict:
  """{(task, pe): eval result} for every job folder with an eval.json.

  Folders the sweep moved aside (ENCODING.replaced-TIME: an earlier run of the job, with
  other settings) are left out, or with moved_aside are the only ones read; hidden ones
  (a copy being assembled, `jobs.reuse`) are never results. A damaged eval.json is named
  on stderr and left out.
  """
  results = {}
  for task in sorted(os.listdir(sweep_dir)):
    task_dir = os.path.join(sweep_dir, task)
    if not os.path.isdir(task_dir):
      continue
    for pe in sorted(os.listdir(task_dir)):
      path = os.path.join(task_dir, pe, "eval.json")
      if ((".replaced-" in pe) != moved_aside or pe.startswith(".")
          or not os.path.exists(path)):
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


def unfinished_jobs(sweep_dir: str, results: dict) -> list[tuple[str, str]]:
  """(task, variant) of every job of the sweep without a result: the jobs its configs
  name (`sweep.tasks` x its variants, from any job's config.json) and the job folders
  holding a config.json, less those in `results`."""

  started = set(started_jobs(sweep_dir))
  expected = set(started)
  for stored in own_job_configs(sweep_dir, sorted(started | set(results))):
    try:
      sweep_config = stored.get("sweep") or {}
      names = [n for n, _ in jobs.variants(sweep_config)]
    except (ValueError, AttributeError, TypeError):
      continue
    expected |= {(t, n) for t in sweep_config.get("tasks") or () for n in names}
  return sorted(expected - set(results))


def started_jobs(sweep_dir: str) -> list[tuple[str, str]]:
  """(task, name) of every job folder holding a config.json, finished or not (folders
  moved aside, `.replaced-`, and hidden ones left out)."""
  started = []
  for task in sorted(os.listdir(sweep_dir)):
    task_dir = os.path.join(sweep_dir, task)
    if not os.path.isdir(task_dir):
      continue
    for name in sorted(os.listdir(task_dir)):
      if (".replaced-" not in name and not name.startswith(".")
          and os.path.exists(os.path.join(task_dir, name, "config.json"))):
        started.append((task, name))
  return started


def own_job_configs(sweep_dir: str, keys):
  """The config.json of each job (task, name) in `keys` that this sweep trained, in that
  order: what the report reads of the sweep's definition (its report kind, variants,
  tasks). A job copied from another sweep (`--reuse_from`: its folder holds
  jobs.REUSED_FROM) keeps the config.json of the sweep that trained it and is left out,
  as are jobs without a config.json or with a damaged one."""
  for task, name in keys:
    if os.path.exists(os.path.join(sweep_dir, task, name, jobs.REUSED_FROM)):
      continue
    try:
      stored = stored_job_config(sweep_dir, task, name)
    except io_utils.CorruptFileError:
      continue
    if stored:
      yield stored


def _unfinished_line(unfinished) -> str:
  if not unfinished:
    return ""
  shown = ", ".join(f"{t}/{n}" for t, n in unfinished[:10])
  more = f" and {len(unfinished) - 10} more" if len(unfinished) > 10 else ""
  return (f"unfinished: {len(unfinished)} job(s) without a result ({shown}{more}) are "
          f"missing cells ({MISSING}); run the sweep again to finish them")


def build_tables(results: dict, paper: dict, unfinished=()):
  """Returns (tasks, encodings, table1 cells, table4 cells); a cell is (ours, paper).
  Unfinished jobs ((task, encoding) pairs) get rows and columns of missing cells."""
  tasks = _ordered({t for t, _ in results} | {t for t, _ in unfinished},
                   list(paper["task_levels"]))
  encodings = _ordered({p for _, p in results} | {p for _, p in unfinished},
                       paper["encodings"])
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
    if not gains:
      out["ours" if which == 0 else "paper_same_cells"]["why_none"] = (
          "no task has both a randomized and a classic encoding with a result")
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
  plt, fig, (ax,) = figures.panels(7, 4)
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
    ax.legend(fontsize=7, loc="lower left")
  else:  # No job of this task has finished yet: say so rather than draw empty axes.
    ax.text(0.5, 0.5, "no finished job yet", transform=ax.transAxes, ha="center",
            va="center", color="grey")
  ax.set(xlabel="sequence length", ylabel="accuracy (%)", title=task, ylim=(0, 102))
  figures.save(plt, fig, path)


# The variants report (a sweep with `sweep.variants`, e.g. configs/su.py).


def sweep_variants(sweep_dir: str, results: dict) -> list[str] | None:
  """The sweep's variant names in the config's order, from the jobs' config.json
  (`sweep.encodings` then `sweep.variants`); None if no job's config names variants."""

  for stored in own_job_configs(sweep_dir, results):
    sweep_config = stored.get("sweep") or {}
    if sweep_config.get("variants"):
      try:
        return [n for n, _ in jobs.variants(sweep_config)]
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


def variant_value(result: dict) -> tuple[float, float, int, float | None] | None:
  """(mean, std, number of seeds, mean training-length accuracy) in %, over seeds at the
  best learning rate (the unseen accuracy's); std is NumPy's (ddof=0), as in Table 4."""
  models = _best_rate_models(result)
  if not models:
    return None
  scores = [100 * m["scores"]["unseen"] for m in models]
  return float(np.mean(scores)), float(np.std(scores)), len(scores), training_value(result)


# A model that has not learned its training lengths says nothing about unseen ones: every
# table shows the training-length accuracy beside the unseen one, marked below this.
TRAINED = 95.0
UNTRAINED_MARK = "†"


def training_value(result: dict) -> float | None:
  """Mean over seeds (at the best learning rate, as `_best_rate_models`) of the accuracy
  in % averaged over the training lengths; None without such scores."""
  scores = [100 * m["scores"]["train_range"] for m in _best_rate_models(result)
            if m["scores"].get("train_range") is not None]
  return float(np.mean(scores)) if scores else None


def training_text(train: float | None) -> str:
  """" (train 99.1)", marked when below TRAINED; "" when unknown."""
  if train is None:
    return ""
  return f" (train {train:.1f}{UNTRAINED_MARK if train < TRAINED else ''})"


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
    row = [MISSING if cells[task, n] is None else
           f"{cells[task, n][0]:.1f} ± {cells[task, n][1]:.1f}{training_text(cells[task, n][3])}"
           for n in names]
    lines.append(f"| {task} | " + " | ".join(row) + " |")
  return "\n".join(lines)


def variant_csv(tasks, names, cells) -> str:
  buffer = io.StringIO()
  writer = csv.writer(buffer)
  writer.writerow(["task", "variant", "mean", "std", "seeds", "training_mean"])
  for task in tasks:
    for name in names:
      cell = cells[task, name]
      writer.writerow([task, name] + (["", "", "", ""] if cell is None else
                                      [f"{cell[0]:.2f}", f"{cell[1]:.2f}", cell[2],
                                       "" if cell[3] is None else f"{cell[3]:.2f}"]))
  return buffer.getvalue()


def plot_variants(task: str, results: dict, names, path: str) -> None:
  """Accuracy against length per variant: mean over seeds at the best learning rate,
  a band of ± one std, the training range shaded."""
  plt, fig, (ax,) = figures.panels(8, 4.5)
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
  figures.save(plt, fig, path)


def variant_base(name: str, names) -> str | None:
  """The variant among `names` that `name` extends by one option: NAME without its last
  "+option" (rope+exp+logn -> rope+exp), else the classic encoding a randomized one
  randomizes (randomized_rope -> rope); None when `names` has no such variant."""
  head, plus, _ = name.rpartition("+")
  base = head if plus else name.removeprefix("randomized_")
  return base if base != name and base in names else None


def variant_effect_rows(tasks, names, cells) -> list[dict]:
  """Per variant that extends another (`variant_base`) and task: does the option lift the
  unseen-length accuracy by more than one std? `cells`: `build_variant_table`'s. Rows as
  `ordering_rows`' ("family": "BASE → VARIANT", "classic": the base's (mean, std),
  "randomized": the variant's), with its verdicts ("holds": above by more than the larger
  std)."""
  rows = []
  for name in names:
    base = variant_base(name, names)
    if base is None:
      continue
    for task in tasks:
      before, after = cells[task, base], cells[task, name]
      trained = (before and before[3], after and after[3])
      gain, verdict = ordering_verdict(before and before[:2], after and after[:2], trained)
      rows.append({"task": task, "family": f"{base} → {name}", "base": base,
                   "variant": name, "classic": before and before[:2],
                   "randomized": after and after[:2], "training": trained, "gain": gain,
                   "verdict": verdict})
  return rows


def variant_effect_markdown(rows) -> str:
  """`variant_effect_rows` as a grid and one line per option: on how many tasks it lifts."""
  lines = ["## What each option adds: every variant against the variant it extends", "",
           "Each column compares a variant with the one it extends by one option (log-n, "
           "evenly spaced test positions, a position sampler, randomized positions): "
           "unseen-length accuracy in %, mean over seeds, before → after. ✓: after above "
           "before by more than the larger of the two stds; ≈: within it; ✗: below by "
           f"more; {UNTRAINED_MARK}: a model below {TRAINED:.0f}% on its training lengths "
           "(no verdict).", "", ordering_grid_markdown(rows, header="{family}"), ""]
  for family in dict.fromkeys(r["family"] for r in rows):
    mine = [r for r in rows if r["family"] == family and r["verdict"] != "missing"]
    if not mine:
      continue
    lifts = sum(r["verdict"] == "holds" for r in mine)
    words = {"holds": "", "reversed": " (lowers)"}
    details = ", ".join(f"{r['task']} {r['gain']:+.1f}"
                        f"{words.get(r['verdict'], ' (' + r['verdict'] + ')')}"
                        for r in mine)
    lines.append(f"- {family}: lifts on {lifts} of {len(mine)} tasks ({details})")
  return "\n".join(lines)


def _training_records(workdir: str) -> list:
  """metrics.jsonl's training records (step, loss, accuracy); [] without a readable one."""
  try:
    records = io_utils.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  except (io_utils.CorruptFileError, OSError):
    return []
  return [(r["step"], r.get("loss"), r.get("accuracy")) for r in records
          if "evaluation" not in r and "loss" in r]


def same_models(sweep_dir: str, task: str, name: str, other: str, results: dict,
                records=None) -> bool:
  """Whether jobs `name` and `other` of `task` hold the same trained models: one was
  evaluated on the other's training (eval.json's shared_training), or their training
  records (loss and accuracy of every model at every log step) are identical, which a
  different training does not give. `records`: a dict caching `_training_records` per
  job folder."""
  for a, b in ((name, other), (other, name)):
    shared = results[task, a].get(loop.SHARED_TRAINING)
    if shared and os.path.basename(os.path.normpath(shared)) == b:
      return True
  records = {} if records is None else records

  def of(job):
    folder = os.path.join(sweep_dir, task, job)
    if folder not in records:
      records[folder] = _training_records(folder)
    return records[folder]
  return bool(of(name)) and of(name) == of(other)


# A paired verdict needs this many pairs of models that both learned their training
# lengths: one difference has no spread to weigh it against.
PAIRED_LEARNED = 2


def paired_effect_rows(sweep_dir: str, results: dict, tasks, names) -> list[dict]:
  """Every two jobs of a task that hold the same models (`same_models`: they differ in
  evaluation settings only, e.g. evenly spaced test positions), the earlier in `names`
  first: the unseen accuracy's difference seed by seed (later minus earlier, in %, at
  the learning rate each job's tables use, models of the same seed and rate paired), its
  mean and std, and the verdict of a paired comparison: "holds" when the mean exceeds the
  std of the differences, "reversed" when below minus it, else "within one std". A pair
  with a model below TRAINED on its training lengths ("learned": False) is left out of the
  mean, std and verdict; with fewer than PAIRED_LEARNED pairs left the verdict is "not
  learned" (mean and std then over every pair)."""
  rows, records = [], {}
  for task in tasks:
    done = [n for n in names if (task, n) in results]
    for i, after in enumerate(done):
      for before in done[:i]:
        if not same_models(sweep_dir, task, after, before, results, records):
          continue
        first = {(m["seed"], m["learning_rate"]): m
                 for m in _best_rate_models(results[task, before])}
        pairs = sorted(((m["seed"], m["learning_rate"]), first[m["seed"], m["learning_rate"]], m)
                       for m in _best_rate_models(results[task, after])
                       if (m["seed"], m["learning_rate"]) in first)
        if not pairs:
          continue
        diffs = [100 * (b["scores"]["unseen"] - a["scores"]["unseen"]) for _, a, b in pairs]
        learned = [min(a["scores"]["train_range"], b["scores"]["train_range"]) * 100
                   >= TRAINED for _, a, b in pairs]
        judged = all(learned) or sum(learned) >= PAIRED_LEARNED
        counted = [d for d, ok in zip(diffs, learned) if ok] if judged else diffs
        mean, std = float(np.mean(counted)), float(np.std(counted))
        verdict = ("not learned" if not judged else "holds" if mean > std else
                   "reversed" if mean < -std else "within one std")
        rows.append({"task": task, "family": f"{before} → {after}",
                     "seeds": [key[0] for key, _, _ in pairs], "differences": diffs,
                     "learned": learned, "mean": mean, "std": std, "verdict": verdict})
  return rows


def paired_effect_markdown(rows) -> str:
  lines = ["## The same models under two evaluations", "",
           "Jobs of a task that hold the same trained models (one was evaluated on the "
           "other's training, or their training records are identical to the last digit): "
           "they differ in an evaluation setting only, so its effect is read seed by seed. Differences of unseen-length accuracy in points, after minus "
           "before, per seed; ✓: their mean above their std; ≈: within it; ✗: below "
           f"minus it. A difference marked {UNTRAINED_MARK} is a seed with a model below "
           f"{TRAINED:.0f}% on its training lengths: it is left out of the mean ± std and "
           f"the verdict, which count the other seeds when at least {PAIRED_LEARNED} are "
           f"left, else the verdict is {UNTRAINED_MARK} (no verdict).", "",
           "| task | before → after | seeds | differences | mean ± std | verdict |",
           "|---|---|---|---|---:|:---:|"]
  for r in rows:
    learned = r["learned"]
    counted = ("" if all(learned) or r["verdict"] == "not learned" else
               f" (seeds {', '.join(str(s) for s, ok in zip(r['seeds'], learned) if ok)})")
    lines.append(f"| {r['task']} | {r['family']} | {', '.join(map(str, r['seeds']))} | "
                 + ", ".join(f"{d:+.1f}{'' if ok else UNTRAINED_MARK}"
                             for d, ok in zip(r["differences"], learned))
                 + f" | {r['mean']:+.1f} ± {r['std']:.1f}{counted} | "
                 f"{VERDICT_MARKS[r['verdict']]} |")
  return "\n".join(lines)


def write_variant_report(sweep_dir: str, results: dict, order, out_dir: str) -> dict:
  tasks, names, cells = build_variant_table(results, order, load_paper())
  effects = variant_effect_rows(tasks, names, cells)
  paired = paired_effect_rows(sweep_dir, results, tasks, names)
  note = ("Mean ± std over seeds (at the learning rate with the best mean) of the accuracy "
          "in % averaged over the unseen test lengths, and in brackets the mean accuracy on "
          f"the training lengths ({UNTRAINED_MARK}: below {TRAINED:.0f}%, the model did not "
          f"learn its task and its unseen score is no result); {MISSING} marks a job not "
          "(yet) finished.")
  md = f"## Unseen-length accuracy per variant\n\n{note}\n\n" + variant_markdown(
      tasks, names, cells)
  if effects:
    md += "\n\n" + variant_effect_markdown(effects)
  if paired:
    md += "\n\n" + paired_effect_markdown(paired)
  io_utils.atomic_write_text(os.path.join(out_dir, "variants.md"), md + "\n")
  io_utils.atomic_write_text(os.path.join(out_dir, "variants.csv"),
                             variant_csv(tasks, names, cells))
  for task in tasks:
    plot_variants(task, results, names, os.path.join(out_dir, figures.FOLDER, f"{task}.png"))
  return {"kind": "variants", "tasks": tasks, "variants": names, "cells": cells,
          "effects": effects, "paired": paired, "table": md, "out_dir": out_dir}


def stored_job_config(sweep_dir: str, task: str, name: str) -> dict | None:
  """A job's config.json (None without one; CorruptFileError if damaged)."""
  return workdir_lib.stored_config(os.path.join(sweep_dir, task, name))


def _pair_text(value, digits=1):
  return MISSING if value is None else f"{value[0]:.{digits}f} ± {value[1]:.{digits}f}"


def _write_both(out_dir: str, name: str, md: str, rows: list[list]) -> None:
  """OUT/NAME.md and OUT/NAME.csv (None cells empty, floats with two decimals)."""
  io_utils.atomic_write_text(os.path.join(out_dir, f"{name}.md"), md + "\n")
  buffer = io.StringIO()
  writer = csv.writer(buffer)
  for row in rows:
    writer.writerow(["" if v is None else f"{v:.2f}" if isinstance(v, float) else v
                     for v in row])
  io_utils.atomic_write_text(os.path.join(out_dir, f"{name}.csv"), buffer.getvalue())


# Table 2: running times.


def table2_cells(results: dict, tasks, encodings, paper: dict) -> dict:
  """(task, encoding) -> ((our hours, models in the job, our CPU hours or None, the CPU
  hours of its evaluations or None) or None, (paper mean, std) or None).

  Ours: the job's training seconds (eval.json's train_seconds: training wall time,
  compiling included, evaluation excluded) in hours, its process's CPU seconds over
  the same spans (train_cpu_seconds, in jobs run since they were recorded) in hours, and
  the CPU seconds of its evaluations, during training and final (evaluation_cpu_seconds,
  in jobs run since 30 Nov 2026) in hours. A job trains its grid of models in one
  program, so its time is for all of them; the paper's is for one model per GPU.
  """
  published = paper.get("table2_running_hours_mean_std", {}).get("hours", {})
  cells = {}
  for task in tasks:
    for pe in encodings:
      result = results.get((task, pe))
      ours = None
      if result and result.get("train_seconds") is not None:
        cpu, evaluation = (result.get(k) for k in ("train_cpu_seconds",
                                                    "evaluation_cpu_seconds"))
        ours = (result["train_seconds"] / 3600, len(result["models"]),
                None if cpu is None else cpu / 3600,
                None if evaluation is None else evaluation / 3600)
      ref = published.get(task, {}).get(pe)
      cells[task, pe] = (ours, tuple(ref) if ref else None)
  return cells


def table2_markdown(tasks, encodings, cells) -> str:
  lines = ["## Table 2: training time in hours",
           "",
           "Cells: ours, the whole job (its grid of models trained together in one "
           "program; models in brackets; then, where the job recorded it, the CPU hours "
           "of its process, all threads, which neither other work beside it nor a pause "
           "adds to, and those of its evaluations, during training and final) (paper: "
           f"mean ± std over runs of one model on a V100). {MISSING}: no job, or a job "
           "without its time (runs made before times were recorded). total: the sum of a "
           "column's job hours, and of the CPU hours of those of its jobs that recorded "
           "them. a job: a column's mean CPU hours of training per job (what the jobs "
           "of different encodings cost on one protocol, compiling included, evaluating "
           "not).",
           "",
           "| task | " + " | ".join(encodings) + " |", "|---|" + "---:|" * len(encodings)]
  for task in tasks:
    row = []
    for pe in encodings:
      ours, ref = cells[task, pe]
      ours_text = MISSING if ours is None else f"{ours[0]:.3g} [{ours[1]}]" + (
          "" if ours[2] is None else f", {ours[2]:.3g} CPU") + (
          "" if ours[3] is None else f" + {ours[3]:.3g} evaluating")
      row.append(f"{ours_text} ({_pair_text(ref, 2)})")
    lines.append(f"| {task} | " + " | ".join(row) + " |")
  # What a column of jobs cost: the sum of the jobs' hours that have a time.
  totals, means = [], []
  for pe in encodings:
    jobs = [cells[task, pe][0] for task in tasks if cells[task, pe][0] is not None]
    text = f"{sum(j[0] for j in jobs):.3g} ({len(jobs)} of {len(tasks)} jobs)" if jobs \
        else MISSING
    for index, what in ((2, "CPU"), (3, "CPU evaluating")):
      known = [j[index] for j in jobs if j[index] is not None]
      if known:
        text += f"; {sum(known):.3g} {what} ({len(known)} job{'s' * (len(known) > 1)})"
    totals.append(text)
    cpu = [j[2] for j in jobs if j[2] is not None]
    means.append(f"{sum(cpu) / len(cpu):.3g} CPU ({len(cpu)} job{'s' * (len(cpu) > 1)})"
                 if cpu else MISSING)
  lines.append("| total | " + " | ".join(totals) + " |")
  lines.append("| a job | " + " | ".join(means) + " |")
  return "\n".join(lines)


def table2_csv(tasks, encodings, cells) -> str:
  buffer = io.StringIO()
  writer = csv.writer(buffer)
  writer.writerow(["task", "encoding", "ours_hours", "ours_models", "paper_mean", "paper_std",
                   "ours_cpu_hours", "ours_evaluation_cpu_hours"])
  for task in tasks:
    for pe in encodings:
      ours, ref = cells[task, pe]
      ours, ref = ours or (None, None, None, None), ref or (None, None)
      writer.writerow([task, pe, "" if ours[0] is None else f"{ours[0]:.4f}",
                       "" if ours[1] is None else ours[1],
                       *["" if v is None else f"{v:.2f}" for v in ref],
                       *["" if v is None else f"{v:.4f}" for v in ours[2:]]])
  return buffer.getvalue()


# Every job, seed by seed: jobs.md / jobs.csv, written for every report whose models have
# scores (what the other tables average, and what each job cost).

JOBS_FILE = "jobs"


def _job_order(sweep_dir: str, results: dict) -> list[tuple[str, str]]:
  """The finished jobs in the sweep's order: tasks as the paper lists them, variants as
  the sweep's config does (`sweep.encodings`, then `sweep.variants`), others sorted."""
  order = []
  for stored in own_job_configs(sweep_dir, results):
    try:
      order = [n for n, _ in jobs.variants(stored.get("sweep") or {})]
      break
    except (ValueError, AttributeError, TypeError):
      continue
  tasks = _ordered({t for t, _ in results}, list(load_paper()["task_levels"]))
  names = _ordered({n for _, n in results}, order)
  return [(t, n) for t in tasks for n in names if (t, n) in results]


def _percent(model: dict, key: str) -> float | None:
  """A model's score `key` in %, None where it has none."""
  value = model["scores"].get(key)
  return None if value is None else 100 * value


def job_rows(sweep_dir: str, results: dict) -> list[dict]:
  """One row per (task, job, learning rate): the seeds in order, each seed's accuracy in %
  on the training lengths and on the unseen ones (None where a model has no such score),
  their mean ± std (NumPy's, ddof=0, as Table 4), whether this is the learning rate the
  tables use (`_best_rate_models`), and the job's steps and training hours, wall and CPU
  (eval.json's train_seconds, train_cpu_seconds; for the whole grid, on the job's first
  row), or for a job evaluated on another's training the name of that job ("shared",
  eval.json's shared_training; its hours are that job's). Jobs whose models have no
  scores (Ito's runs) are left out."""
  rows = []
  for task, name in _job_order(sweep_dir, results):
    result = results[task, name]
    models = result.get("models") or []
    if not models or any("scores" not in m for m in models):
      continue
    best = {id(m) for m in _best_rate_models(result)}
    by_rate = {}
    for m in models:
      by_rate.setdefault(m["learning_rate"], []).append(m)
    for i, (rate, group) in enumerate(sorted(by_rate.items())):
      group = sorted(group, key=lambda m: m["seed"])
      unseen = [_percent(m, "unseen") for m in group]
      known = [u for u in unseen if u is not None]
      seconds = [result.get(k) for k in ("train_seconds", "train_cpu_seconds")] if i == 0 \
          else [None, None]
      rows.append({
          "task": task, "job": name, "learning_rate": rate, "step": result.get("step"),
          "best": any(id(m) in best for m in group), "seeds": [m["seed"] for m in group],
          "train": [_percent(m, "train_range") for m in group], "unseen": unseen,
          "mean": float(np.mean(known)) if known else None,
          "std": float(np.std(known)) if known else None,
          "hours": None if seconds[0] is None else seconds[0] / 3600,
          "cpu_hours": None if seconds[1] is None else seconds[1] / 3600,
          "shared": os.path.basename(os.path.normpath(result[loop.SHARED_TRAINING]))
                    if loop.SHARED_TRAINING in result else None})
  return rows


def _scores_text(values, mark_untrained: bool = False) -> str:
  return ", ".join(MISSING if v is None else
                   f"{v:.1f}{UNTRAINED_MARK if mark_untrained and v < TRAINED else ''}"
                   for v in values)


def jobs_markdown(rows) -> str:
  lines = ["## Every job, seed by seed",
           "",
           "Accuracy in %, per seed (in the order of the seeds column), averaged over the "
           f"training lengths and over the unseen ones ({UNTRAINED_MARK}: a model below "
           f"{TRAINED:.0f}% on its training lengths); unseen mean ± std over those seeds; "
           "★: the learning rate whose mean unseen accuracy is best, the one the other "
           "tables use. Hours: the job's training (its whole grid, compiling included, "
           "evaluation excluded), wall and, where the job recorded it, CPU (its process, "
           "all threads); \"trained with JOB\": a job that differs from JOB only in "
           "evaluation settings, evaluated on JOB's training (the same models), whose "
           "hours are JOB's.",
           "",
           "| task | job | learning rate | steps | seeds | training lengths | unseen | "
           "unseen mean ± std | hours (CPU) |",
           "|---|---|---:|---:|---|---|---|---:|---:|"]
  for r in rows:
    hours = MISSING if r["hours"] is None else f"{r['hours']:.2f}" + (
        "" if r["cpu_hours"] is None else f" ({r['cpu_hours']:.2f})")
    if r["shared"] and r["hours"] is not None:
      hours = f"trained with {r['shared']}"
    mean = MISSING if r["mean"] is None else f"{r['mean']:.1f} ± {r['std']:.1f}"
    seeds = ", ".join(str(seed) for seed in r["seeds"])
    lines.append(
        f"| {r['task']} | {r['job']} | {r['learning_rate']:g}{' ★' if r['best'] else ''} | "
        f"{r['step']} | {seeds} | {_scores_text(r['train'], True)} | {_scores_text(r['unseen'])} | "
        f"{mean} | {hours} |")
  return "\n".join(lines)


def write_jobs_table(sweep_dir: str, results: dict, out_dir: str) -> list[dict]:
  """OUT/jobs.md and OUT/jobs.csv (one line per job and learning rate, one per seed in
  the csv); nothing when no job has scores."""
  rows = job_rows(sweep_dir, results)
  if not rows:
    return rows
  csv_rows = [["task", "job", "learning_rate", "best", "step", "seed", "train", "unseen",
               "job_hours", "job_cpu_hours", "trained_with"]]
  for r in rows:
    for i, seed in enumerate(r["seeds"]):
      csv_rows.append([r["task"], r["job"], f"{r['learning_rate']:g}", int(r["best"]),
                       r["step"], seed, r["train"][i], r["unseen"][i],
                       r["hours"] if i == 0 else None, r["cpu_hours"] if i == 0 else None,
                       r["shared"]])
  _write_both(out_dir, JOBS_FILE, jobs_markdown(rows), csv_rows)
  return rows


# Table 3: randomized sin/cos, sorted and unsorted (configs/table3.py).

TABLE3_VARIANTS = ("sorted", "unsorted")


def write_table3_report(results: dict, out_dir: str) -> dict:
  """Max over seeds and learning rates per (task, sorted/unsorted), ours (paper), and the
  mean over tasks of sorted minus unsorted (the paper: +15.7 points over its 15 tasks)."""
  paper = load_paper()
  published = {"sorted": {t: row.get("randomized_sin_cos") for t, row in
                          paper["table1_max_over_seeds_and_lrs"].items()},
               "unsorted": paper["table3_randomized_sin_cos_unsorted"]}
  tasks = _ordered({t for t, _ in results}, list(paper["task_levels"]))
  cells = {(task, v): (table1_value(results[task, v]) if (task, v) in results else None,
                       published[v].get(task))
           for task in tasks for v in TABLE3_VARIANTS}
  gains = {}
  for which in (0, 1):
    diffs = [cells[t, "sorted"][which] - cells[t, "unsorted"][which] for t in tasks
             if cells[t, "sorted"][0] is not None and cells[t, "unsorted"][0] is not None
             and cells[t, "sorted"][1] is not None and cells[t, "unsorted"][1] is not None]
    gains["ours" if which == 0 else "paper_same_tasks"] = (
        float(np.mean(diffs)) if diffs else None)
  note = ("Cells: ours (paper). Accuracy in % averaged over the unseen test lengths, "
          "maximised over seeds and learning rates as the paper's Table 3; the paper's "
          f"sorted column is its Table 1. {MISSING}: a job not (yet) finished.")
  md = (f"## Table 3: randomized sin/cos with and without sorting\n\n{note}\n\n"
        + markdown_table(tasks, TABLE3_VARIANTS, cells))
  if gains["ours"] is not None:
    md += (f"\n\nsorted minus unsorted, mean over these tasks: {gains['ours']:+.1f} points "
           f"(paper, same tasks: {gains['paper_same_tasks']:+.1f}; paper, 15 tasks: +15.7)")
  rows = sorting_rows(tasks, results)
  paper_rows = paper_sorting_rows(tasks, paper)
  sorting = sorting_markdown(rows) + "\n\n" + paper_sorting_markdown(paper_rows)
  text = md + "\n\n" + sorting
  _write_both(out_dir, "table3", md, [["task", "variant", "ours", "paper"]] + [
      [task, v, *cells[task, v]] for task in tasks for v in TABLE3_VARIANTS])
  with open(os.path.join(out_dir, "sorting.md"), "w") as f:
    f.write(sorting + "\n")
  plot_ordering(rows, os.path.join(out_dir, figures.FOLDER, "sorting.png"),
                names=("unsorted", "sorted"), title=SORTING_TITLE,
                tick="order-blind bound")
  for task in tasks:
    plot_variants(task, results, list(TABLE3_VARIANTS),
                  os.path.join(out_dir, figures.FOLDER, f"{task}.png"))
  return {"kind": "table3", "tasks": tasks, "cells": cells, "gains": gains, "table": md,
          "sorting": rows, "paper_sorting": paper_rows, "text": text}


# Sequences a length for the bound over the paper's 460 test lengths: its mean's standard
# error is below 0.05 points.
PAPER_BOUND_SAMPLES = 256


def paper_sorting_rows(tasks, paper: dict) -> list[dict]:
  """Per task with an order-blind bound: the paper's unsorted Table 3 cell beside the
  bound averaged over the paper's test lengths (its `setup`)."""
  low, high = paper["setup"]["test_lengths"]
  rows = []
  for task in tasks:
    bound = order_blind.order_blind_accuracy(task, range(low, high + 1), PAPER_BOUND_SAMPLES)
    if bound is not None:
      rows.append({"task": task, "lengths": (low, high),
                   "paper_unsorted": paper["table3_randomized_sin_cos_unsorted"].get(task),
                   "bound": float(np.mean(list(bound.values())))})
  return rows


def paper_sorting_markdown(rows) -> str:
  if not rows:
    return ""
  low, high = rows[0]["lengths"]
  lines = [f"## The paper's unsorted models and the order-blind bound at its test lengths "
           f"({low}..{high})", "",
           "| task | paper, unsorted (max over seeds and rates) | order-blind bound |",
           "|---|---:|---:|"]
  lines += [f"| {r['task']} | {_fmt_value(r['paper_unsorted'])} | {r['bound']:.1f} |"
            for r in rows]
  return "\n".join(lines)


def _fmt_value(value) -> str:
  return MISSING if value is None else f"{value:.1f}"


def sorting_rows(tasks, results: dict) -> list[dict]:
  """Per task, Table 3's two variants as `ordering_rows` gives a family's twins (unsorted
  in the classic's place, sorted in the randomized one's): unseen-length (mean, std) over
  seeds at the best learning rate, the training-length means, and `sorting_verdict`;
  "order_blind": the best accuracy a model blind to token order can reach on the
  unsorted job's training and unseen lengths (`order_blind.order_blind_accuracy`, scored
  as the job's accuracy by `results.scores`; None for a task without one). The paper's
  Table 3 gives maxima only: the figure's ticks ("paper") show the order-blind bound
  instead."""
  rows = []
  for task in tasks:
    value = {v: variant_value(results[task, v]) if (task, v) in results else None
             for v in TABLE3_VARIANTS}
    blind = None
    if (task, "unsorted") in results:
      result = results[task, "unsorted"]
      bound = order_blind.order_blind_accuracy(task, result["lengths"])
      if bound is not None:  # Scored as the job's accuracy is (results.scores).
        scored = results_lib.scores(list(bound), list(bound.values()),
                                    *result["training_lengths"])
        blind = (scored["train_range"], scored["unseen"])
    row = {"task": task, "family": "randomized_sin_cos",
           "classic": value["unsorted"] and value["unsorted"][:2],
           "randomized": value["sorted"] and value["sorted"][:2],
           "training": tuple(value[v] and value[v][3] for v in ("unsorted", "sorted")),
           "order_blind": blind,
           # The figure's tick on the unsorted bar: the order-blind bound (unseen lengths).
           "paper": ((blind[1], 0.0) if blind and blind[1] is not None else None, None)}
    gain, verdict = sorting_verdict(row["randomized"], row["classic"], row["training"][1],
                                    row["training"][0])
    row.update(gain=gain, verdict=verdict)
    rows.append(row)
  return rows


def sorting_verdict(sorted_value, unsorted_value, sorted_train,
                    unsorted_train) -> tuple[float | None, str]:
  """(gain, verdict) of one task of Table 3: the values are the unseen-length (mean, std)
  in % of the sorted and the unsorted model (None: missing), the trains their
  training-length means. The gain is sorted minus unsorted. Unlike `ordering_verdict`, an
  unsorted model that has not learned its training lengths still gets a verdict: that is
  the paper's point in its strongest form (positions in random order carry no order to
  learn from), shown as "holds, unsorted not learned". A sorted model below TRAINED gives
  "sorted not learned" (no verdict)."""
  if sorted_value is None or unsorted_value is None:
    return None, "missing"
  gain = sorted_value[0] - unsorted_value[0]
  if sorted_train is None or sorted_train < TRAINED:
    return gain, "sorted not learned"
  spread = max(sorted_value[1], unsorted_value[1])
  if gain > spread:
    unlearned = unsorted_train is None or unsorted_train < TRAINED
    return gain, "holds, unsorted not learned" if unlearned else "holds"
  if gain < -spread:
    return gain, "reversed"
  return gain, "within one std"


SORTING_TITLE = ("randomized sin/cos, positions unsorted and sorted: unseen-length accuracy, "
                 "mean ± std over seeds (in the bars: accuracy on the training lengths)")


def sorting_markdown(rows) -> str:
  def pair(value, train):
    return MISSING if value is None else f"{value[0]:.1f} ± {value[1]:.1f}{training_text(train)}"

  def bound(blind):
    if not blind or blind[1] is None:
      return MISSING
    return f"{blind[1]:.1f} (train {blind[0]:.1f})"

  lines = ["## Sorted against unsorted, mean ± std over seeds", "",
           "Unseen-length accuracy in %, mean ± std over seeds at the best learning rate "
           f"(train: on the training lengths, {UNTRAINED_MARK} below {TRAINED:.0f}%). "
           "\"holds\": sorted above unsorted by more than the larger std; \"holds, unsorted "
           "not learned\": and the unsorted model did not learn even its training lengths; "
           "\"sorted not learned\": no verdict. Order-blind bound: the best accuracy of a "
           "model that cannot tell which token comes first (it predicts the output's most "
           "frequent token everywhere), on the unsorted job's lengths "
           f"(experiments/analysis/order_blind.py; {MISSING}: order decides the output).", "",
           "| task | sorted | unsorted | sorted − unsorted | verdict | order-blind bound |",
           "|---|---:|---:|---:|---|---:|"]
  for r in rows:
    gain = MISSING if r["gain"] is None else f"{r['gain']:+.1f}"
    lines.append(f"| {r['task']} | {pair(r['randomized'], r['training'][1])} | "
                 f"{pair(r['classic'], r['training'][0])} | {gain} | {r['verdict']} | "
                 f"{bound(r.get('order_blind'))} |")
  holds = sum(r["verdict"].startswith("holds") for r in rows)
  lines += ["", f"sorting matters (holds) on {holds} of {len(rows)} tasks"]
  return "\n".join(lines)


# Figure 3: accuracy against the maximum position L (configs/figure3.py).


def write_figure3_report(sweep_dir: str, results: dict, out_dir: str) -> dict:
  """Unseen-length accuracy per (task, L): mean ± std over seeds at the best learning
  rate and the max over seeds and learning rates; L read from each job's config.json."""
  paper = load_paper()
  points = {}  # task -> [(L, variant value, max)]
  for (task, name), result in results.items():
    stored = stored_job_config(sweep_dir, task, name)
    if not stored:
      print(f"warning: {task}/{name} has no config.json (its L); left out", file=sys.stderr)
      continue
    points.setdefault(task, []).append(
        (stored["model"]["max_position"], variant_value(result), table1_value(result)))
  tasks = _ordered(set(points), list(paper["task_levels"]))
  values = sorted({p[0] for task in tasks for p in points[task]})
  by_cell = {(task, p[0]): p for task in tasks for p in points[task]}
  lines = ["## Figure 3: unseen-length accuracy against the maximum position L", "",
           "Cells: mean ± std over seeds at the best learning rate (max over seeds and "
           "learning rates) (train: mean accuracy on the training lengths, "
           f"{UNTRAINED_MARK} below {TRAINED:.0f}%). Accuracy in % averaged over the unseen "
           f"test lengths. {MISSING}: "
           "a job not (yet) finished. The paper gives no numbers, only its reading: "
           "largely unaffected by L unless L is much larger than the test lengths.", "",
           "| task | " + " | ".join(f"L = {v}" for v in values) + " |",
           "|---|" + "---:|" * len(values)]
  rows = [["task", "L", "mean", "std", "seeds", "max", "training_mean"]]
  for task in tasks:
    cells = []
    for v in values:
      cell = by_cell.get((task, v))
      if cell is None or cell[1] is None:
        cells.append(MISSING)
        rows.append([task, v, None, None, None, None])
        continue
      (mean, std, n, train), best = cell[1], cell[2]
      cells.append(f"{mean:.1f} ± {std:.1f} ({best:.1f}){training_text(train)}")
      rows.append([task, v, mean, std, n, best, train])
    lines.append(f"| {task} | " + " | ".join(cells) + " |")
  md = "\n".join(lines)
  _write_both(out_dir, "figure3", md, rows)
  plt, fig, axes = figures.panels(5, 3.8, max(1, len(tasks)))
  for ax, task in zip(axes, tasks):
    pts = sorted((p for p in points[task] if p[1] is not None), key=lambda p: p[0])
    if pts:
      xs = [p[0] for p in pts]
      ax.errorbar(xs, [p[1][0] for p in pts], yerr=[p[1][1] for p in pts], marker="o",
                  capsize=3, label="mean ± std over seeds")
      ax.plot(xs, [p[2] for p in pts], "x--", label="max over seeds and rates")
      ax.set_xscale("log", base=2)
      ax.set_xticks(xs, [str(x) for x in xs])
    ax.set(xlabel="maximum position L", ylabel="unseen-length accuracy (%)", title=task,
           ylim=(0, 102))
    ax.legend(fontsize=7, loc="lower left")
  figures.save(plt, fig, os.path.join(out_dir, "figure3.png"))
  return {"kind": "figure3", "tasks": tasks, "values": values, "table": md, "text": md}


# Figure 2: accuracy against training time (configs/figure2.py).

FIGURE2_THRESHOLDS = (60.0, 70.0, 80.0, 90.0)


def _per_model(value, count: int) -> list:
  """A metrics value as a list over the grid's models (a single model's is a scalar)."""
  return list(value) if isinstance(value, list) else [value] * count


def _job_records(sweep_dir: str, task: str, name: str) -> list | None:
  """The job's metrics.jsonl records ([] without the file; None, with a warning, if it
  is damaged)."""
  path = os.path.join(sweep_dir, task, name, "metrics.jsonl")
  try:
    return io_utils.read_jsonl(path) if os.path.exists(path) else []
  except io_utils.CorruptFileError as e:
    print(f"warning: {e}; left out of the report", file=sys.stderr)
    return None


def figure2_curve(sweep_dir: str, task: str, name: str, result: dict) -> dict | None:
  """The job's evaluations during training at the learning rate with the best final mean:
  {"seconds": [...], "mean": [...], "std": [...], "seeds": n, "steps_per_second": median
  over log intervals but the first (which compiles)}; None without such records."""
  records = _job_records(sweep_dir, task, name)
  evaluations = [r for r in records or [] if "evaluation" in r and "train_seconds" in r]
  if not evaluations:
    return None
  models = result["models"]
  accuracy = np.asarray([_per_model(r["evaluation"]["mean"], len(models))
                         for r in evaluations], np.float64) * 100  # [E, M]
  rates = sorted({m["learning_rate"] for m in models})
  best = max(rates, key=lambda rate: np.mean(
      [accuracy[-1, i] for i, m in enumerate(models) if m["learning_rate"] == rate]))
  columns = [i for i, m in enumerate(models) if m["learning_rate"] == best]
  logs = [r for r in records if "evaluation" not in r and "steps_per_second" in r]
  return {"seconds": [r["train_seconds"] for r in evaluations],
          "mean": accuracy[:, columns].mean(axis=1).tolist(),
          "std": accuracy[:, columns].std(axis=1).tolist(), "seeds": len(columns),
          "learning_rate": best,
          "steps_per_second": float(np.median([r["steps_per_second"] for r in logs[1:]]))
                              if len(logs) > 1 else None,
          "training_lengths": result.get("training_lengths")}


def first_reaching(curve: dict, threshold: float) -> float | None:
  """Training seconds of the first evaluation whose mean accuracy is >= threshold."""
  for seconds, mean in zip(curve["seconds"], curve["mean"]):
    if mean >= threshold:
      return seconds
  return None


def write_figure2_report(sweep_dir: str, results: dict, out_dir: str) -> dict:
  paper = load_paper()
  published = paper["efficiency_fig2"]
  curves = {}
  for (task, name), result in sorted(results.items()):
    curve = figure2_curve(sweep_dir, task, name, result)
    if curve is None:
      print(f"warning: {task}/{name} has no evaluations during training "
            "(evaluation.every_steps); left out", file=sys.stderr)
      continue
    curves[task, name] = curve
  lines = ["## Figure 2: accuracy on the test lengths against training time", "",
           "Mean accuracy (%) over the evaluated lengths, mean ± std over seeds at the best "
           "learning rate; seconds of training (compiling included, evaluation excluded). "
           f"{MISSING}: not reached. Paper ({published['task']}, {published['gpu']}): "
           f"randomized relative N=40 {published['randomized_relative_N40_steps_per_s']} "
           f"steps/s, relative N=500 {published['relative_N500_steps_per_s']} steps/s, "
           f"above 90% {published['speedup_to_90_percent']}x sooner.", "",
           "| task | model | training lengths | steps/s | final accuracy | "
           + " | ".join(f"s to {t:.0f}%" for t in FIGURE2_THRESHOLDS) + " |",
           "|---|---|---|---:|---:|" + "---:|" * len(FIGURE2_THRESHOLDS)]
  rows = [["task", "model", "steps_per_second", "final_mean", "final_std",
           *[f"seconds_to_{t:.0f}" for t in FIGURE2_THRESHOLDS]]]
  for (task, name), c in curves.items():
    reach = [first_reaching(c, t) for t in FIGURE2_THRESHOLDS]
    lengths = c["training_lengths"] and f"{c['training_lengths'][0]}..{c['training_lengths'][1]}"
    sps = MISSING if c["steps_per_second"] is None else f"{c['steps_per_second']:.1f}"
    lines.append(f"| {task} | {name} | {lengths} | {sps} | "
                 f"{c['mean'][-1]:.1f} ± {c['std'][-1]:.1f} | "
                 + " | ".join(MISSING if r is None else f"{r:.0f}" for r in reach) + " |")
    rows.append([task, name, c["steps_per_second"], c["mean"][-1], c["std"][-1], *reach])
  # Speed-ups: for each task with a randomized and a classic curve, the ratio of the
  # seconds each needs to reach each threshold both reach.
  speedups = {}
  for task in sorted({t for t, _ in curves}):
    names = [n for t, n in curves if t == task]
    rand = [n for n in names if n.startswith("randomized_")]
    plain = [n for n in names if not n.startswith("randomized_")]
    if len(rand) == 1 and len(plain) == 1:
      for t in FIGURE2_THRESHOLDS:
        a, b = first_reaching(curves[task, rand[0]], t), first_reaching(curves[task, plain[0]], t)
        if a and b:
          speedups.setdefault(task, {})[t] = b / a
  for task, by_threshold in speedups.items():
    lines.append("")
    lines.append(f"{task}: the randomized model reaches "
                 + ", ".join(f"{t:.0f}% {r:.1f}x sooner" for t, r in by_threshold.items())
                 + f" (paper: 90% {published['speedup_to_90_percent']}x sooner)")
  md = "\n".join(lines)
  _write_both(out_dir, "figure2", md, rows)
  tasks = sorted({t for t, _ in curves})
  plt, fig, axes = figures.panels(6, 4, max(1, len(tasks)))
  for ax, task in zip(axes, tasks):
    for (t, name), c in curves.items():
      if t != task:
        continue
      mean, std = np.asarray(c["mean"]), np.asarray(c["std"])
      line, = ax.plot(c["seconds"], mean, marker=".", label=f"{name} ({c['seeds']} seeds)")
      ax.fill_between(c["seconds"], mean - std, mean + std, color=line.get_color(),
                      alpha=0.15, linewidth=0)
    ax.set(xlabel="training time (s)", ylabel="accuracy on the test lengths (%)",
           title=task, ylim=(0, 102))
    ax.legend(fontsize=7, loc="lower right")
  figures.save(plt, fig, os.path.join(out_dir, "figure2.png"))
  return {"kind": "figure2", "curves": curves, "speedups": speedups, "table": md,
          "text": md}


# Table 5: geometric attention with directional encoding (configs/table5.py).


def write_table5_report(results: dict, out_dir: str) -> dict:
  """Per task and encoding of the sweep, the max over seeds and learning rates and the
  mean ± std over seeds at the best learning rate; beside them the paper's Table 5
  ("Geometric": its max and mean ± std) for `geometric`, and for every encoding the best
  of the paper's Table 1 (max) and Table 4 (mean ± std) over all its encodings."""
  paper = load_paper()
  published = paper["table5_geometric_attention"]
  tasks = _ordered({t for t, _ in results}, list(paper["task_levels"]))
  encodings = _ordered({p for _, p in results}, ["geometric", "randomized_geometric"])
  best_max = {t: max(row.values()) for t, row in paper["table1_max_over_seeds_and_lrs"].items()}
  best_mean = {t: max(((v["mean"], v["std"]) for v in row.values()), key=lambda x: x[0])
               for t, row in paper["table4_mean_std_over_seeds_best_lr"].items()}
  header = ["task"]
  for pe in encodings:
    header += [f"{pe} max", f"{pe} mean ± std"]
  header += ["paper Table 1 best max", "paper Table 4 best mean ± std"]
  lines = ["## Table 5: geometric attention with directional encoding", "",
           "Cells: ours (paper's Geometric column, for `geometric`). Accuracy in % averaged "
           "over the unseen test lengths: the max over seeds and learning rates, and the "
           f"mean ± std over seeds at the best learning rate. {MISSING}: a job not (yet) "
           "finished, or a cell the paper lacks.", "",
           "| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
  rows = [["task", "encoding", "max", "mean", "std", "paper_max", "paper_mean", "paper_std"]]
  for task in tasks:
    cells = []
    for pe in encodings:
      result = results.get((task, pe))
      top = table1_value(result) if result else None
      pair = table4_value(result) if result else None
      ref = published.get(task) if pe == "geometric" else None
      cells.append(_fmt(top, ref and ref["max"]))
      cells.append(_fmt(pair, ref and (ref["mean"], ref["std"]), pair=True))
      rows.append([task, pe, top, *(pair or (None, None)),
                   *((ref["max"], ref["mean"], ref["std"]) if ref else (None,) * 3)])
    cells.append(MISSING if task not in best_max else f"{best_max[task]:.1f}")
    cells.append(_pair_text(best_mean.get(task)))
    lines.append(f"| {task} | " + " | ".join(cells) + " |")
  md = "\n".join(lines)
  _write_both(out_dir, "table5", md, rows)
  for task in tasks:
    plot_task(task, results, encodings, os.path.join(out_dir, figures.FOLDER, f"{task}.png"))
  return {"kind": "table5", "tasks": tasks, "encodings": encodings, "table": md, "text": md}


def ordering_rows(tasks, encodings, table4, training, paper_table4=None) -> list[dict]:
  """Per task and family with both twins in the sweep: does the randomized encoding beat
  its classic twin on the unseen lengths by more than one std (the larger of the two
  seeds' stds)? `table4`: {(task, pe): ((mean, std) or None, paper)}; `training`:
  {(task, pe): mean training-length accuracy or None}. Verdicts: "holds", "within one
  std", "reversed" (classic above randomized by more than one std), "not learned" (a twin
  below TRAINED on its training lengths), "missing" (a job not finished)."""
  rows = []
  for task in tasks:
    for pe in encodings:
      twin = randomized_twin(pe, encodings)
      if twin is None:
        continue
      classic, randomized = table4[task, pe][0], table4[task, twin][0]
      trained = (training.get((task, pe)), training.get((task, twin)))
      row = {"task": task, "family": pe, "classic": classic, "randomized": randomized,
             "training": trained, "paper": (table4[task, pe][1], table4[task, twin][1])}
      gain, verdict = ordering_verdict(classic, randomized, trained)
      row.update(gain=gain, verdict=verdict)
      rows.append(row)
  return rows


def ordering_verdict(classic, randomized, trained) -> tuple[float | None, str]:
  """(gain, verdict) of one task and family: classic and randomized are the twins'
  unseen-length (mean, std) in % or None, trained their training-length means (None:
  unknown). The gain is the randomized twin's mean minus the classic's; the verdict is
  `ordering_rows`'."""
  if classic is None or randomized is None:
    return None, "missing"
  gain = randomized[0] - classic[0]
  spread = max(classic[1], randomized[1])
  if any(t is None or t < TRAINED for t in trained):
    return gain, "not learned"
  if gain > spread:
    return gain, "holds"
  if gain < -spread:
    return gain, "reversed"
  return gain, "within one std"


VERDICT_MARKS = {"holds": "✓", "within one std": "≈", "reversed": "✗",
                 "not learned": UNTRAINED_MARK}


def ordering_grid_markdown(rows, header: str = "{family} → randomized") -> str:
  """`ordering_rows` at a glance: one row per task, one column per family (titled
  `header`), each cell the classic and the randomized twin's unseen-length means and the
  verdict's mark."""
  families = list(dict.fromkeys(r["family"] for r in rows))
  by_cell = {(r["task"], r["family"]): r for r in rows}
  lines = ["| task | " + " | ".join(header.format(family=f) for f in families) + " |",
           "|---|" + "---|" * len(families)]
  for task in dict.fromkeys(r["task"] for r in rows):
    cells = []
    for family in families:
      r = by_cell.get((task, family))
      if r is None or r["verdict"] == "missing":
        cells.append(MISSING)
        continue
      cells.append(f"{r['classic'][0]:.1f} → {r['randomized'][0]:.1f} "
                   f"{VERDICT_MARKS[r['verdict']]}")
    lines.append(f"| {task} | " + " | ".join(cells) + " |")
  legend = ", ".join(f"{mark} {verdict}" for verdict, mark in VERDICT_MARKS.items())
  missing = f", {MISSING} not run yet" if any(MISSING in line for line in lines[2:]) else ""
  return "\n".join(lines + ["", f"Unseen-length accuracy in %, mean over seeds; {legend} "
                             f"(no verdict){missing}."])


def ordering_markdown(rows) -> str:
  def pair(value, train=None):
    text = MISSING if value is None else f"{value[0]:.1f} ± {value[1]:.1f}"
    return text + (training_text(train) if value is not None else "")

  lines = ["## The paper's ordering: randomized above its classic twin by more than one std",
           "", "Mean ± std over seeds of the unseen-length accuracy in % at the best "
           "learning rate (train: on the training lengths, "
           f"{UNTRAINED_MARK} below {TRAINED:.0f}%); the paper's Table 4 cells beside. "
           "\"holds\": the randomized mean exceeds the classic one by more than the larger "
           "std; \"not learned\": a twin below the training-length threshold, no verdict.",
           "", ordering_grid_markdown(rows), "", "In detail:",
           "", "| task | family | classic | randomized | gain | verdict | paper classic | "
           "paper randomized |", "|---|---|---:|---:|---:|---|---:|---:|"]
  for r in rows:
    gain = MISSING if r["gain"] is None else f"{r['gain']:+.1f}"
    lines.append(f"| {r['task']} | {r['family']} | {pair(r['classic'], r['training'][0])} | "
                 f"{pair(r['randomized'], r['training'][1])} | {gain} | {r['verdict']} | "
                 f"{pair(r['paper'][0])} | {pair(r['paper'][1])} |")
  families = sorted({r["family"] for r in rows})
  lines.append("")
  for family in families:
    mine = [r for r in rows if r["family"] == family]
    holds = sum(r["verdict"] == "holds" for r in mine)
    lines.append(f"{family}: holds on {holds} of {len(mine)} tasks "
                 f"({', '.join(r['task'] + ': ' + r['verdict'] for r in mine)})")
  return "\n".join(lines)


ORDERING_TITLE = ("{family} and its randomized twin: unseen-length accuracy, mean ± std over "
                  "seeds (in the bars: accuracy on the training lengths)")


def plot_ordering(rows, path: str, names=("{family}", "randomized_{family}"),
                  title: str = ORDERING_TITLE, tick: str = "paper (Table 4)") -> list[dict]:
  """`ordering_rows` as bars, one panel per family: per task the classic and the
  randomized twin's unseen-length mean with its std, the rows' "paper" cells (the
  paper's Table 4) as black ticks, the training-length accuracy inside each bar and the
  verdict above. `names`, `title` and `tick`: the two bars' legend labels, the panel's
  title ({family} is replaced) and the ticks' label, for other pairs in the same rows
  (`sorting_rows`). Returns what was drawn per task and family: {"task", "family",
  "classic", "randomized"} (the bars' heights as drawn, None for a missing job)."""
  families = sorted({r["family"] for r in rows})
  most = max(sum(r["family"] == f for r in rows) for f in families)
  plt, fig, axes = figures.panels(max(5.0, 1.1 * most + 2), 3.8, nrows=len(families))
  drawn = []
  for ax, family in zip(axes, families):
    mine = [r for r in rows if r["family"] == family]
    # The first bar of each side and the first tick carry the legend's labels.
    labelled, ticked = set(), False
    for i, r in enumerate(mine):
      heights = {}
      for side, offset, color, value, train, paper in (
          ("classic", -0.2, "tab:blue", r["classic"], r["training"][0], r["paper"][0]),
          ("randomized", 0.2, "tab:orange", r["randomized"], r["training"][1], r["paper"][1])):
        heights[side] = None
        if value is not None:
          label = names[0 if side == "classic" else 1].format(family=family)
          bars = ax.bar(i + offset, value[0], 0.38, yerr=value[1], color=color, capsize=3,
                        label=None if side in labelled else label)
          labelled.add(side)
          heights[side] = float(bars.patches[0].get_height())
          ax.text(i + offset, 2, MISSING if train is None else f"{train:.0f}", ha="center",
                  va="bottom", fontsize=6, color="white" if value[0] > 12 else "black")
        if paper is not None:
          ax.plot([i + offset - 0.17, i + offset + 0.17], [paper[0]] * 2, color="black",
                  linewidth=1.5, label=None if ticked else tick)
          ticked = True
      # Above the bars, their error bars and the ticks.
      top = max([v[0] + (v[1] or 0) for v in (r["classic"], r["randomized"]) if v is not None]
                + [p[0] for p in r["paper"] if p is not None] or [0])
      # A verdict with a qualifier ("holds, unsorted not learned") on two lines, so that
      # neighbouring tasks' verdicts do not run into each other.
      ax.text(i, min(top + 4, 103), r["verdict"].replace(", ", ",\n"), ha="center",
              va="bottom", fontsize=7)
      drawn.append({"task": r["task"], "family": family, **heights})
    ax.set_xticks(range(len(mine)), [r["task"] for r in mine], rotation=30, ha="right",
                  fontsize=7)
    ax.set(ylabel="unseen lengths (%)", ylim=(0, 125), title=title.format(family=family))
    ax.title.set_fontsize(8)
    ax.legend(fontsize=7, loc="upper left", ncol=3)
  figures.save(plt, fig, path)
  return drawn


def write_paper_report(sweep_dir: str, results: dict, out_dir: str, unfinished=()) -> dict:
  """Table 1, Table 4, the headline, Table 2 (hours) and a figure per task; unfinished
  jobs are missing cells, and the headline counts the tasks with results."""
  paper = load_paper()
  tasks, encodings, t1, t4 = build_tables(results, paper, unfinished)
  head = headline(tasks, encodings, t1)
  head["paper_published"] = paper["headline"]
  head["unfinished_jobs"] = [f"{t}/{n}" for t, n in unfinished]
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
  t2 = table2_cells(results, tasks, encodings, paper)
  t2_md = table2_markdown(tasks, encodings, t2)
  io_utils.atomic_write_text(os.path.join(out_dir, "table2.md"), t2_md + "\n")
  io_utils.atomic_write_text(os.path.join(out_dir, "table2.csv"),
                             table2_csv(tasks, encodings, t2))
  for task in tasks:
    plot_task(task, results, encodings, os.path.join(out_dir, figures.FOLDER, f"{task}.png"))
  training = {(task, pe): training_value(results[task, pe]) if (task, pe) in results else None
              for task in tasks for pe in encodings}
  train_md = "\n".join(
      ["## Accuracy on the training lengths: mean over seeds at the best learning rate", "",
       f"{UNTRAINED_MARK}: below {TRAINED:.0f}%, the unseen-length cells of that job are no "
       "result.", "", "| task | " + " | ".join(encodings) + " |",
       "|---|" + "---:|" * len(encodings)]
      + [f"| {task} | " + " | ".join(
          MISSING if training[task, pe] is None else
          f"{training[task, pe]:.1f}{UNTRAINED_MARK if training[task, pe] < TRAINED else ''}"
          for pe in encodings) + " |" for task in tasks])
  io_utils.atomic_write_text(os.path.join(out_dir, "training.md"), train_md + "\n")
  order = ordering_rows(tasks, encodings, t4, training)
  order_md = ordering_markdown(order)
  io_utils.atomic_write_text(os.path.join(out_dir, "ordering.md"), order_md + "\n")
  text = t1_md
  if order:
    plot_ordering(order, os.path.join(out_dir, figures.FOLDER, "ordering.png"))
    text += "\n\n" + order_md.split("\n\n")[-1]
  ours = head["ours"]
  if ours["average_gain_points"] is not None:
    text += (f"\n\nheadline: best randomized minus best classic encoding, averaged over "
             f"{ours['tasks_counted']} tasks: {ours['average_gain_points']:+.1f} points "
             f"(paper, same cells: {head['paper_same_cells']['average_gain_points']:+.1f}; "
             f"paper, all 15 tasks: +{paper['headline']['average_gain_points']})")
  else:
    text += f"\n\nheadline: not computed: {ours['why_none']}"
  return {"kind": "paper", "tasks": tasks, "encodings": encodings, "table1": t1_md,
          "table4": t4_md, "table2": t2_md, "headline": head, "training": training,
          "ordering": order, "text": text}


# The learning-speed study (configs/cpu_study.py, docs/cpu_protocol.md): variants named
# SETTING-ENCODING, every job evaluated during training.


def evaluations_during_training(sweep_dir: str, task: str, name: str,
                                result: dict) -> dict | None:
  """The job's evaluations during training, per seed at the best learning rate (the final
  evaluation's, `_best_rate_models`): {"steps", "seconds" (lists), "train", "unseen"
  (arrays [evaluations, seeds], accuracy in %)}; None without them."""
  records = _job_records(sweep_dir, task, name)
  evaluations = [r for r in records or [] if "evaluation" in r and "train_seconds" in r]
  if not evaluations:
    return None
  models = result["models"]
  best = _best_rate_models(result) or models
  columns = [i for i, m in enumerate(models) if any(m is b for b in best)]

  def series(key):
    values = np.asarray([_per_model(r["evaluation"][key], len(models)) for r in evaluations],
                        np.float64) * 100
    return values[:, columns]

  return {"steps": [r["step"] for r in evaluations],
          "seconds": [r["train_seconds"] for r in evaluations],
          "train": series("train_range"), "unseen": series("unseen")}


def learning_curve(sweep_dir: str, task: str, name: str, result: dict) -> dict | None:
  """The job's evaluations during training, over the seeds at the best learning rate:
  {"steps", "seconds", "train", "unseen"} (lists; accuracy means in %); None without them."""
  seen = evaluations_during_training(sweep_dir, task, name, result)
  if seen is None:
    return None
  return {**seen, "train": seen["train"].mean(axis=1).tolist(),
          "unseen": seen["unseen"].mean(axis=1).tolist()}


def randomized_twin(name: str, names) -> str | None:
  """The variant among `names` that is `name` with its encoding randomized: randomized_NAME
  (a sweep of encodings), or SETTING-randomized_ENC for SETTING-ENC (the study's
  variants); None if there is none or `name` is itself randomized."""
  prefix, _, encoding = name.rpartition("-")
  if encoding.startswith("randomized_") or name.startswith("randomized_"):
    return None
  for twin in (f"randomized_{name}", f"{prefix}-randomized_{encoding}" if prefix else None):
    if twin in names:
      return twin
  return None


def _twins_during_training(sweep_dir: str, results: dict, tasks, names):
  """(task, family, twin, [classic's, twin's] `evaluations_during_training`, the steps
  at which both were evaluated) for every twin pair of `names` (a variant and its
  `randomized_twin`) whose jobs both evaluated during training."""
  for task in tasks:
    for family in names:
      twin = randomized_twin(family, names)
      if twin is None:
        continue
      pair = [results.get((task, n)) for n in (family, twin)]
      seen = [None if r is None else evaluations_during_training(sweep_dir, task, n, r)
              for r, n in zip(pair, (family, twin))]
      if any(s is None for s in seen):
        continue
      yield task, family, twin, seen, sorted(set(seen[0]["steps"]) & set(seen[1]["steps"]))


def _verdict_over(seen, steps) -> tuple[float | None, str]:
  """`ordering_verdict` of two twins' evaluations during training, each seed's accuracy
  averaged over `steps` (one step: its evaluation)."""
  unseen, trained = [], []
  for s in seen:
    rows = [s["steps"].index(step) for step in steps]
    per_seed = s["unseen"][rows].mean(axis=0)
    unseen.append((float(per_seed.mean()), float(per_seed.std())))
    trained.append(float(s["train"][rows].mean()))
  return ordering_verdict(*unseen, trained)


def ordering_during_training(sweep_dir: str, results: dict, tasks, names) -> list[dict]:
  """`ordering_rows`' verdict at every step where both twins (a variant and its
  `randomized_twin`, both in `names`) were evaluated during training: [{"task", "family"
  (the classic variant's name), "twin", "step", "gain", "verdict"}], from the evaluations
  in metrics.jsonl (mean and std over the seeds at each job's best final learning rate).
  Those evaluations draw their own sequences (the protocol's periodic batch and buckets),
  so the last step's verdict may differ from the final evaluation's."""
  rows = []
  for task, family, twin, seen, steps in _twins_during_training(sweep_dir, results, tasks,
                                                                names):
    for step in steps:
      gain, verdict = _verdict_over(seen, [step])
      rows.append({"task": task, "family": family, "twin": twin, "step": step,
                   "gain": gain, "verdict": verdict})
  return rows


# How many of the last evaluations during training `ordering_late` averages.
LATE_EVALUATIONS = 3


def ordering_late(sweep_dir: str, results: dict, tasks, names,
                  count: int = LATE_EVALUATIONS) -> list[dict]:
  """`ordering_rows`' verdict on each seed's accuracies averaged over the last `count`
  steps at which both twins were evaluated during training (fewer if there are fewer):
  [{"task", "family", "twin", "steps", "gain", "verdict"}]. A learned model's
  unseen-length accuracy moves between evaluations (`motion_rows`), so one evaluation is
  a moment of it; the average over the last few is a reading less tied to that moment
  (for a model still improving, a little below its last value)."""
  rows = []
  for task, family, twin, seen, steps in _twins_during_training(sweep_dir, results, tasks,
                                                                names):
    if steps:
      gain, verdict = _verdict_over(seen, steps[-count:])
      rows.append({"task": task, "family": family, "twin": twin, "steps": steps[-count:],
                   "gain": gain, "verdict": verdict})
  return rows


def stopping_rows(sweep_dir: str, results: dict, tasks, names,
                  threshold: float = TRAINED / 100) -> list[dict]:
  """Each twin pair (a variant and its `randomized_twin`, both in `names`, both with
  evaluations during training) as `training.stop_when_learned = threshold` would have
  stopped each job (`stopping.stopped_at`): [{"task", "family", "twin", "jobs" (the
  classic's and the twin's `stopped_at`), "full_seconds" (their training seconds to the
  end), "gain", "verdict" (`ordering_verdict` of the seeds at the stopping steps)}]."""
  rows = []
  for task, family, twin, _, _ in _twins_during_training(sweep_dir, results, tasks, names):
    stopped = []
    for name in (family, twin):
      result = results[task, name]
      members = [(m.get("seed"), m.get("learning_rate")) for m in result["models"]]
      stopped.append(stopping.stopped_at(_job_records(sweep_dir, task, name) or [], members,
                                         threshold))
    if any(s is None for s in stopped):
      continue
    gain, verdict = ordering_verdict(
        *[(float(s["unseen"].mean()), float(s["unseen"].std())) for s in stopped],
        [float(s["train"].mean()) for s in stopped])
    rows.append({"task": task, "family": family, "twin": twin, "jobs": stopped,
                 "full_seconds": [results[task, n].get("train_seconds") for n in (family, twin)],
                 "gain": gain, "verdict": verdict})
  return rows


def stopping_markdown(rows) -> str:
  """One table per family: per task, where each twin would have stopped (step, training
  and unseen accuracy there), the verdict, and the training hours to those steps against
  the hours to the end; a last row with the sums and the count of verdicts that hold."""
  out = []
  for family in dict.fromkeys(r["family"] for r in rows):
    mine = [r for r in rows if r["family"] == family]
    twin = mine[0]["twin"]

    def cell(job):
      mark = "" if job["learned"] else f" ({UNTRAINED_MARK} not learned)"
      return (f"{job['step']}{mark} / {job['train'].mean():.1f} / "
              f"{job['unseen'].mean():.1f} ± {job['unseen'].std():.1f}")

    lines = [f"{family} → {twin}:", "",
             f"| task | {family}: step / train / unseen | {twin}: step / train / unseen | "
             "gain | verdict | hours to the stops / to the end |",
             "|---|---|---|---:|---|---:|"]
    stops = ends = 0.0
    for r in mine:
      stop = sum(j["seconds"] for j in r["jobs"]) / 3600
      end = (None if None in r["full_seconds"] else sum(r["full_seconds"]) / 3600)
      stops += stop
      ends += end or 0.0
      gain = MISSING if r["gain"] is None else f"{r['gain']:+.1f}"
      lines.append(f"| {r['task']} | {cell(r['jobs'][0])} | {cell(r['jobs'][1])} | {gain} | "
                   f"{VERDICT_MARKS.get(r['verdict'], '')} {r['verdict']} | "
                   f"{stop:.2f} / {MISSING if end is None else f'{end:.2f}'} |")
    held = sum(r["verdict"] == "holds" for r in mine)
    share = f" ({100 * stops / ends:.0f}%)" if ends else ""
    tasks = f"{len(mine)} task{'' if len(mine) == 1 else 's'}"
    lines.append(f"| all {tasks} | | | | holds on {held} | "
                 f"{stops:.2f} / {ends:.2f}{share} |")
    out.append("\n".join(lines))
  return "\n\n".join(out)


def ordering_during_training_markdown(rows, late=()) -> str:
  """One table per family: a row per task, a column per evaluated step, each cell the
  verdict's mark and the gain in points; with `late` (`ordering_late`'s rows), a last
  column of their verdicts over the last evaluations."""
  parts = []
  late = {(r["task"], r["family"]): r for r in late}
  count = max((len(r["steps"]) for r in late.values()), default=0)
  mark = lambda r: f"{VERDICT_MARKS[r['verdict']]} {r['gain']:+.1f}"  # pylint: disable=unnecessary-lambda-assignment
  for family in dict.fromkeys(r["family"] for r in rows):
    mine = [r for r in rows if r["family"] == family]
    steps = sorted({r["step"] for r in mine})
    cells = {(r["task"], r["step"]): mark(r) for r in mine}
    extra = [f"mean of the last {count}"] if late else []
    lines = [f"{family} → {mine[0]['twin']}:", "",
             "| task | " + " | ".join([str(s) for s in steps] + extra) + " |",
             "|---|" + "---:|" * (len(steps) + len(extra))]
    for task in dict.fromkeys(r["task"] for r in mine):
      row = [cells.get((task, s), "") for s in steps]
      if late:
        row.append(mark(late[task, family]) if (task, family) in late else "")
      lines.append(f"| {task} | " + " | ".join(row) + " |")
    parts.append("\n".join(lines))
  return "\n\n".join(parts)


def plot_ordering_during_training(rows, path: str) -> None:
  """The gain (randomized twin minus classic, unseen lengths) against steps: a panel per
  family, a line per task; filled markers where both twins had learned their training
  lengths, hollow where not."""
  families = list(dict.fromkeys(r["family"] for r in rows))
  plt, fig, axes = figures.panels(4, 3.2, len(families))
  tasks = list(dict.fromkeys(r["task"] for r in rows))
  handles = {}  # One legend entry per task, whichever panels it is in.
  for ax, family in zip(axes, families):
    for i, task in enumerate(tasks):
      mine = [r for r in rows if r["family"] == family and r["task"] == task]
      if not mine:
        continue
      color = plt.get_cmap("tab10")(i % 10)
      steps = [r["step"] for r in mine]
      gains = [r["gain"] for r in mine]
      handles.setdefault(task, ax.plot(steps, gains, "-", color=color, label=task)[0])
      for step, gain, r in zip(steps, gains, mine):
        learned = r["verdict"] != "not learned"
        ax.plot([step], [gain], "o", color=color, markersize=4,
                markerfacecolor=color if learned else "none")
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set(xlabel="step", ylabel="unseen-length gain (points)", title=family)
  axes[-1].legend([handles[t] for t in tasks if t in handles], [t for t in tasks if t in handles],
                  fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
  figures.save(plt, fig, path, fit_outside=True)


def motion_rows(sweep_dir: str, results: dict, tasks, names) -> list[dict]:
  """Per task, how far its learned models' unseen-length accuracy moved between
  consecutive evaluations during training and how much of it a job's seeds shared
  (`motion.decompose` over the transitions of the task's jobs in `names`, at the best
  learning rate, with every seed at >= TRAINED on its training lengths at both ends):
  [{"task", "jobs" (those with transitions), "transitions", "interval" (steps between
  the evaluations, "A" or "A-B"), "trend", "own", "shared", "final_std" (the final
  evaluation's std over seeds, as in variants.md and ordering.md, averaged over the
  task's finished jobs of two or more seeds whose models learned), "final_jobs"}]."""
  rows = []
  for task in tasks:
    changes, jobs, intervals, final = [], 0, set(), []
    for name in names:
      result = results.get((task, name))
      if result is None:
        continue
      value = variant_value(result)
      if value is not None and value[2] >= 2 and (value[3] or 0) >= TRAINED:
        final.append(value[1])
      seen = evaluations_during_training(sweep_dir, task, name, result)
      if seen is None:
        continue
      mine = motion.transitions(seen["train"], seen["unseen"], TRAINED)
      if mine:
        jobs += 1
        changes += mine
        intervals.update(np.diff(seen["steps"]).tolist())
    parts = motion.decompose(changes)
    if parts is None:
      continue
    rows.append({"task": task, "jobs": jobs, **parts,
                 "interval": "-".join(str(i) for i in sorted({min(intervals), max(intervals)})),
                 "final_std": float(np.mean(final)) if final else None,
                 "final_jobs": len(final)})
  return rows


def motion_markdown(rows) -> str:
  """The rows of `motion_rows` as a table, a row per task."""
  lines = ["| task | jobs | transitions | steps apart | trend | own | shared | "
           "final std over seeds (jobs) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    final = (MISSING if r["final_std"] is None
             else f"{r['final_std']:.1f} ({r['final_jobs']})")
    lines.append(f"| {r['task']} | {r['jobs']} | {r['transitions']} | {r['interval']} | "
                 f"{r['trend']:+.1f} | {r['own']:.1f} | {r['shared']:.1f} | {final} |")
  return "\n".join(lines)


def _first_step(curve: dict, key: str, threshold: float):
  for step, value in zip(curve["steps"], curve[key]):
    if value >= threshold:
      return step
  return None


def write_study_report(sweep_dir: str, results: dict, out_dir: str) -> dict:
  """study.md / study.csv: per (task, setting, encoding) the final accuracy on the
  training and unseen lengths (mean over seeds at the best learning rate), the first
  evaluated step at >= TRAINED on the training lengths, the best unseen accuracy seen
  during training, and the training seconds; figures/TASK.png: both accuracies against
  steps and against training seconds, a colour per variant. Runs the sweep moved aside
  (NAME.replaced-WHEN: the same job at settings it had before) are rows and curves of
  their own, after the jobs': how a change of protocol changed learning."""
  paper = load_paper()
  order = sweep_variants(sweep_dir, results) or []
  earlier = load_sweep(sweep_dir, moved_aside=True)
  tasks = _ordered({t for t, _ in results}, list(paper["task_levels"]))
  jobs_now = _ordered({v for _, v in results}, order)
  names = jobs_now + sorted({v for _, v in earlier})
  results = {**results, **earlier}
  lines = ["## Learning-speed study", "",
           "Accuracy in %: mean over seeds at the best learning rate, averaged over the "
           f"training lengths (train) and the unseen lengths; {UNTRAINED_MARK}: train below "
           f"{TRAINED:.0f}%; \"{TRAINED:.0f}% at\": the first evaluated step that reached it; "
           "\"best unseen\": the highest unseen accuracy of the evaluations during "
           f"training; seconds: training time to the last step. {MISSING}: not (yet) run.", "",
           "| task | variant | steps | train | unseen | "
           f"{TRAINED:.0f}% at | best unseen | seconds |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
  rows = [["task", "variant", "steps", "train", "unseen", "first_trained_step",
           "best_unseen", "seconds"]]
  curves = {}
  for task in tasks:
    for name in names:
      result = results.get((task, name))
      if result is None:
        continue
      value = variant_value(result)
      curve = learning_curve(sweep_dir, task, name, result)
      curves[task, name] = curve
      train = None if value is None else value[3]
      unseen = None if value is None else value[0]
      first = _first_step(curve, "train", TRAINED) if curve else None
      best = max(curve["unseen"]) if curve else None
      seconds = curve["seconds"][-1] if curve else None
      fmt = lambda v, d=1: MISSING if v is None else f"{v:.{d}f}"  # pylint: disable=unnecessary-lambda-assignment
      mark = UNTRAINED_MARK if train is not None and train < TRAINED else ""
      lines.append(f"| {task} | {name} | {result.get('step')} | {fmt(train)}{mark} | "
                   f"{fmt(unseen)} | {MISSING if first is None else first} | {fmt(best)} | "
                   f"{fmt(seconds, 0)} |")
      rows.append([task, name, result.get("step"), train, unseen, first, best, seconds])
  during = ordering_during_training(sweep_dir, results, tasks, names)
  late = ordering_late(sweep_dir, results, tasks, names)
  if during:
    lines += ["", "### The ordering during training", "",
              "Each classic encoding against its randomized twin at every step where both "
              "were evaluated during training: the unseen-length gain in points (randomized "
              "minus classic, means over the seeds) and the verdict of ordering.md "
              f"({', '.join(f'{m} {v}' for v, m in VERDICT_MARKS.items())}). These "
              "evaluations are the protocol's periodic ones (their own batch of sequences), "
              "not the final evaluation. The last column gives the verdict on each seed's "
              f"accuracies averaged over the last {LATE_EVALUATIONS} of those steps: a "
              "learned model's unseen accuracy moves between evaluations (below), and one "
              "evaluation is a moment of it.", "",
              ordering_during_training_markdown(during, late)]
    plot_ordering_during_training(during, os.path.join(out_dir, figures.FOLDER,
                                                       "ordering_during_training.png"))
  stops = stopping_rows(sweep_dir, results, tasks, jobs_now)
  if stops:
    lines += ["", "### Stopping when learned", "",
              f"What `training.stop_when_learned={TRAINED / 100:g}` would have given: each job "
              "stopped at the first evaluation during training at which its seeds averaged "
              f"{TRAINED:.0f}% on the training lengths, or trained all its steps if none did "
              f"({UNTRAINED_MARK}). The rule reads evaluations only, so such a run's models "
              "are these jobs' at that step (experiments/training/learned.py), and the "
              "table reads them from the evaluation during training there (accuracy in %, "
              "mean over the seeds; ± their std) and the training hours to it from the same "
              "records. A stopped run's final evaluation would draw more sequences per "
              "length (the protocol's evaluation.batch_size, not periodic_batch_size). "
              "Twins stop at different steps: each is compared where it had learned.", "",
              stopping_markdown(stops)]
  moved = motion_rows(sweep_dir, results, tasks, jobs_now)
  if moved:
    lines += ["", "### How far learned models move between evaluations", "",
              "A job's seeds train on the same batches, so their std at the final "
              "evaluation (the one the verdicts compare gains with) sees what differs "
              "between the seeds, not what the batches do to all of them. The evaluations "
              "during training (the same sequences each time) see both. Per task, over "
              "its jobs' consecutive evaluations at which every seed had learned its "
              f"training lengths (>= {TRAINED:.0f}%) at both ends, each seed's change of "
              "unseen-length accuracy in points: trend, the mean change; own, the std of "
              "the part of each seed's own; shared, the std of the part common to a job's "
              "seeds, about the trend (experiments/analysis/motion.py). If the deviations "
              "at successive evaluations were independent, a final evaluation would stray "
              "from its course by about own / √2 for each seed and shared / √2 for all "
              "the seeds of its job together, beside the final std over seeds "
              "(mean over the task's jobs whose models learned).", "",
              motion_markdown(moved)]
  md = "\n".join(lines)
  _write_both(out_dir, "study", md, rows)
  for task in tasks:
    plt, fig, (by_step, by_time) = figures.panels(6, 4, 2)
    present = [name for name in names if curves.get((task, name))]
    # A color per line of this figure (more than 10: tab20's), none shared.
    palette = plt.get_cmap("tab10" if len(present) <= 10 else "tab20")
    for i, name in enumerate(present):
      curve = curves[task, name]
      color = palette(i % palette.N)
      for ax, xs in ((by_step, curve["steps"]), (by_time, curve["seconds"])):
        ax.plot(xs, curve["train"], "-", color=color, label=f"{name} training lengths")
        ax.plot(xs, curve["unseen"], "--", color=color, label=f"{name} unseen lengths")
    by_step.set(xlabel="step", ylabel="accuracy (%)", title=task, ylim=(0, 102))
    by_time.set(xlabel="training seconds", ylabel="accuracy (%)", title=task, ylim=(0, 102))
    by_time.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figures.save(plt, fig, os.path.join(out_dir, figures.FOLDER, f"{task}.png"),
                 fit_outside=True)  # The legend stands beside the panels.
  return {"kind": "study", "tasks": tasks, "variants": names, "curves": curves,
          "ordering_during_training": during, "ordering_late": late, "stopping": stops,
          "motion": moved,
          "table": md, "text": md}


def _variants_report(sweep_dir: str, results: dict, out_dir: str) -> dict:
  report = write_variant_report(sweep_dir, results, sweep_variants(sweep_dir, results),
                                out_dir)
  return {**report, "text": report["table"]}


# Report kinds: name -> (sweep_dir, results, out_dir) -> {"kind", "text", ...}. A sweep
# config names its kind in `sweep.report`; the paper's and the variants report are the
# defaults (`_declared_kind`).
REPORTS = {
    "paper": write_paper_report,
    "variants": _variants_report,
    "table3": lambda sweep_dir, results, out_dir: write_table3_report(results, out_dir),
    "figure3": lambda sweep_dir, results, out_dir: write_figure3_report(
        sweep_dir, results, out_dir),
    "figure2": lambda sweep_dir, results, out_dir: write_figure2_report(
        sweep_dir, results, out_dir),
    "table5": lambda sweep_dir, results, out_dir: write_table5_report(results, out_dir),
    "study": write_study_report,
    "ito": lambda sweep_dir, results, out_dir: _ito_report(sweep_dir, results, out_dir),
}


def _ito_report(sweep_dir, results, out_dir):
  """Ito et al.'s Tables 1-6 for a folder of Latin-square runs (experiments/analysis/
  ito_tables.py)."""
  return ito_tables.report_kind(sweep_dir, results, out_dir)
KINDS = ("auto",) + tuple(REPORTS)


def _declared_kind(sweep_dir: str, results: dict) -> str:
  """The jobs' `sweep.report` (`own_job_configs`: not a copied job's; finished jobs first,
  then started ones); else "variants" if they name variants, else "paper"."""
  for stored in own_job_configs(sweep_dir, [*results, *started_jobs(sweep_dir)]):
    declared = (stored.get("sweep") or {}).get("report")
    if declared in REPORTS:
      return declared
  return "paper" if sweep_variants(sweep_dir, results) is None else "variants"


def write_report(sweep_dir: str, out_dir: str | None = None, kind: str = "auto") -> dict:
  """Writes every file of the report `kind` (REPORTS, or "auto": `_declared_kind`);
  returns its tables, its kind, the text to print and out_dir."""
  if kind not in KINDS:
    raise ValueError(f"unknown report kind {kind!r}; valid choices: {', '.join(KINDS)}")

  cli.check_folder(sweep_dir, "sweep_dir")
  if not os.path.isdir(sweep_dir):
    raise ValueError(f"no sweep folder at {sweep_dir}")
  results = load_sweep(sweep_dir)
  if not results:
    raise ValueError(f"no finished job (eval.json) under {sweep_dir}")
  out_dir = out_dir or os.path.join(sweep_dir, "report")
  if kind == "auto":
    kind = _declared_kind(sweep_dir, results)
  os.makedirs(os.path.join(out_dir, figures.FOLDER), exist_ok=True)
  unfinished = unfinished_jobs(sweep_dir, results)
  if kind == "paper":
    report = write_paper_report(sweep_dir, results, out_dir, unfinished)
  else:
    report = REPORTS[kind](sweep_dir, results, out_dir)
  if unfinished:
    report = {**report, "text": report["text"] + "\n\n" + _unfinished_line(unfinished)}
  job_table = write_jobs_table(sweep_dir, results, out_dir)
  return {**report, "unfinished": unfinished, "out_dir": out_dir, "jobs": job_table}


# Curves of one run: python -m experiments.report --run_dir=WORKDIR.

CURVES_FILE = "curves.png"
_SCORES = (("mean", "all lengths"), ("train_range", "training lengths"),
           ("unseen", "unseen lengths"))


def _run_members(run_dir: str, count: int) -> list[str]:
  """Names of the run's models (experiments.training.events.member_names), from its config.json."""
  try:
    stored = workdir_lib.stored_config(run_dir) or {}
  except io_utils.CorruptFileError:
    stored = {}
  grid = stored.get("grid") or {}
  seeds = list(grid.get("seeds") or [stored.get("seed", 0)])
  rates = list(grid.get("learning_rates")
               or [(stored.get("training") or {}).get("learning_rate", 0.0)])
  members = [(s, r) for s in seeds for r in rates]
  if len(members) != count:
    return [f"model {i}" for i in range(count)]
  return events.member_names(members) if count > 1 else [""]


def _as_array(values, count: int) -> np.ndarray:
  """Records' values as [records, models], None as NaN."""
  return np.asarray([[np.nan if v is None else v for v in _per_model(value, count)]
                     for value in values], np.float64).reshape(len(values), count)


def run_curves(run_dir: str) -> dict:
  """A run's metrics.jsonl as curves against the step: {"models": names, "train": {"step",
  "loss", "accuracy"}, "evaluation": {"step", "series": {label: [E, M]}}} (arrays are
  [records, models]). ValueError if the folder has no metrics records."""
  path = os.path.join(run_dir, "metrics.jsonl")
  records = io_utils.read_jsonl(path) if os.path.isfile(path) else []
  if not records:
    raise ValueError(f"no metrics records in {path}: --run_dir must be a training run's "
                     "workdir that has logged at least once (--sweep_dir is for a sweep)")
  logs = [r for r in records if "evaluation" not in r and "loss" in r]
  evaluations = [r for r in records if "evaluation" in r]
  first = (logs or evaluations)[0]
  sample = first.get("loss", None)
  if sample is None:  # Only evaluation records: count the models from one of their values.
    sample = next(iter(v for k, v in evaluations[0]["evaluation"].items() if k != "lengths"))
    sample = next(iter(sample.values())) if isinstance(sample, dict) else sample
  count = len(sample) if isinstance(sample, list) else 1
  series = {}
  if evaluations and "lengths" in evaluations[0]["evaluation"]:
    for key, label in _SCORES:
      values = _as_array([r["evaluation"].get(key) for r in evaluations], count)
      if not np.isnan(values).all():
        series[label] = values
  elif evaluations:  # A dataset: accuracy per split and group.
    labels = sorted({(split, group) for r in evaluations
                     for split, groups in r["evaluation"].items() for group in groups})
    for split, group in labels:
      series[f"{split}/{group}"] = _as_array(
          [r["evaluation"].get(split, {}).get(group) for r in evaluations], count)
  return {"models": _run_members(run_dir, count),
          "train": {"step": [r["step"] for r in logs],
                    "loss": _as_array([r.get("loss") for r in logs], count),
                    "accuracy": _as_array([r.get("accuracy") for r in logs], count)},
          "evaluation": {"step": [r["step"] for r in evaluations], "series": series}}


def _plot_lines(ax, steps, label: str, values: np.ndarray, names, color=None) -> None:
  """A line per model, or for a grid of more than 6 models the mean over the models
  with a band from the lowest to the highest (NaN, a diverged model, left out)."""
  if values.shape[1] == 1:
    ax.plot(steps, values[:, 0], marker="." if len(steps) < 30 else None, label=label,
            color=color)
  elif values.shape[1] <= 6:
    for i, name in enumerate(names):
      if color is None:  # A color per model, named in the legend.
        ax.plot(steps, values[:, i], lw=1, label=name)
      else:  # A color per series, its models in shades of it.
        ax.plot(steps, values[:, i], lw=1, label=label if i == 0 else None, color=color,
                alpha=0.35 + 0.65 * (i + 1) / values.shape[1])
  else:
    with warnings.catch_warnings():  # All-NaN steps (every model diverged) stay NaN.
      warnings.simplefilter("ignore", RuntimeWarning)
      mean = np.nanmean(values, axis=1)
      low, high = np.nanmin(values, axis=1), np.nanmax(values, axis=1)
    line, = ax.plot(steps, mean, label=f"{label} mean of {values.shape[1]} models (band: min-max)".strip(),
                    color=color)
    ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)


def write_curves(run_dir: str, out_dir: str | None = None) -> dict:
  """Draws a run's training loss and accuracy, and its evaluations during training,
  against the step into OUT_DIR/curves.png (default RUN_DIR); returns the path and a
  line to print."""

  cli.check_folder(run_dir, "run_dir")
  if not os.path.isdir(run_dir):
    raise ValueError(f"no run folder at {run_dir}")
  curves = run_curves(run_dir)
  train, evaluation, names = curves["train"], curves["evaluation"], curves["models"]
  panels = 3 if evaluation["series"] else 2
  plt, fig, axes = figures.panels(5, 3.6, panels)
  if train["step"]:
    _plot_lines(axes[0], train["step"], "", train["loss"], names)
    _plot_lines(axes[1], train["step"], "", train["accuracy"] * 100, names)
  finite = train["loss"][np.isfinite(train["loss"])]
  if finite.size and finite.min() > 0 and finite.max() > 20 * finite.min():
    axes[0].set_yscale("log")  # Orders of magnitude (a long run).
  axes[0].set(title="training loss", xlabel="step", ylabel="cross-entropy")
  axes[1].set(title="training accuracy (log intervals)", xlabel="step", ylabel="accuracy (%)")
  if panels == 3:
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, values) in enumerate(evaluation["series"].items()):
      _plot_lines(axes[2], evaluation["step"], label, values * 100, names,
                  colors[i % len(colors)])
    axes[2].set(title="evaluation during training" + (
        f" ({len(names)} models)" if len(names) > 1 else ""), xlabel="step",
                ylabel="accuracy (%)")
  for ax in axes:
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0] and any(ax.get_legend_handles_labels()[1]):
      ax.legend(fontsize=7)
  fig.suptitle(os.path.basename(os.path.abspath(run_dir)), fontsize=10)
  out_dir = out_dir or run_dir
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, CURVES_FILE)
  figures.save(plt, fig, path)
  steps = train["step"] or evaluation["step"]
  text = (f"{len(train['step'])} log records and {len(evaluation['step'])} evaluations "
          f"(steps {min(steps)}-{max(steps)}) of {len(names)} model(s): {path}")
  return {"path": path, "text": text}
