"""Our Latin-square runs beside Ito et al. (2024)'s numbers: the Markdown tables (Tables
1-6, B7.3a, issue 26's targets). The command line and where each number comes from:
experiments/ito_report.py (python -m experiments.ito_report)."""
from __future__ import annotations

import json
import math
import os
from typing import Optional, Sequence

import numpy as np

from experiments.analysis import figures
from experiments.analysis import ito
from experiments.storage import io_utils
from tasks.latin_square import data as lst

PAPER_RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "paper_numbers",
                             "ito2024_results.json")
MISSING = "–"
TABLE_EPOCH = 4000
SHORT_EPOCHS = (200, 400, 4000)
_TOLERANCE = 1e-6


def load_paper(path: str = PAPER_RESULTS) -> dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _train_puzzles() -> int:
  return len(lst.CONDITIONS) * lst.GENERATED_ROWS_PER_CONDITION - lst.HELDOUT_ROWS


def _as_list(value) -> list:
  return list(value) if isinstance(value, (list, tuple)) else [value]


def _read(path: str, lines: bool):

  try:
    if lines:
      return io_utils.read_jsonl(path)
    return io_utils.read_json(path) if os.path.exists(path) else None
  except io_utils.CorruptFileError as e:
    raise ValueError(str(e)) from None


class RunRecords:
  """What a run's metrics.jsonl and eval.json hold, per epoch.

  Attributes:
    info: the run (`ito.RunInfo`).
    steps_per_epoch: training steps of one epoch.
    diverged: bool per model (eval.json's; all False without one).
  """

  def __init__(self, info: ito.RunInfo):
    self.info = info
    batch = int(info.config.get("training", {}).get("batch_size", 128))
    self.steps_per_epoch = -(-_train_puzzles() // batch)
    # A run merged from several folders (one job per seed): each folder's records; its
    # values are the folders' values side by side.
    self.parts = [RunRecords(p) for p in info.parts]
    if self.parts:
      self.records, self.final = [], None
      self.diverged = [d for p in self.parts for d in p.diverged]
      return
    self.records = _read(os.path.join(info.workdir, "metrics.jsonl"), lines=True)
    self.final = _read(os.path.join(info.workdir, "eval.json"), lines=False)
    models = (self.final or {}).get("models") or []
    self.diverged = [bool(m.get("diverged")) for m in models] or [False] * len(info.seeds)

  def _final_at(self, epoch: float) -> Optional[dict]:
    if self.final and abs(float(self.final.get("epoch", -1)) - epoch) < _TOLERANCE:
      return self.final
    return None

  def accuracy(self, split: str, epoch: float) -> tuple[Optional[list], bool]:
    """(overall accuracy per model on `split` at `epoch`, whether it is a fallback), or
    (None, False). "train" is the metrics record closing the epoch (fallback: eval.json's
    train split); "test" and "validation" the evaluation record (or eval.json)."""
    if split == "train":
      step = round(epoch * self.steps_per_epoch)
      for r in self.records:
        if r.get("step") == step and "evaluation" not in r and "accuracy" in r:
          return [float(a) for a in _as_list(r["accuracy"])], False
    else:
      for r in self.records:
        if (abs(float(r.get("epoch", -1)) - epoch) < _TOLERANCE
            and split in r.get("evaluation", {})):
          return [float(a) for a in _as_list(r["evaluation"][split]["overall"])], False
    final = self._final_at(epoch)
    if final and split in final.get("splits", []):
      values = [float(m["accuracy"][split]["overall"]) for m in final["models"]]
      return values, split == "train"
    return None, False

  def _values(self, split: str, epoch: float) -> tuple[list, list, bool]:
    """(values, diverged flags, any fallback) of the models that have a value."""
    if self.parts:
      values, diverged, fallback = [], [], False
      for part in self.parts:  # A folder without the value (still training) is left out.
        v, d, f = part._values(split, epoch)  # pylint: disable=protected-access
        values += v
        diverged += d
        fallback = fallback or f
      return values, diverged, fallback
    values, fallback = self.accuracy(split, epoch)
    if values is None:
      return [], [], False
    keep = self.diverged if len(self.diverged) == len(values) else [False] * len(values)
    return values, keep, fallback

  def kept(self, split: str, epoch: float) -> tuple[list, bool]:
    """(the values of the models that did not diverge, whether any is a fallback)."""
    values, diverged, fallback = self._values(split, epoch)
    return [v for v, bad in zip(values, diverged) if not bad and math.isfinite(v)], fallback

  def stats(self, split: str, epoch: float) -> Optional[dict]:
    """{"mean", "sd", "count", "fallback"} over the models that did not diverge."""
    chosen, fallback = self.kept(split, epoch)
    if not chosen:
      return None
    return {"mean": float(np.mean(chosen)),
            "sd": float(np.std(chosen, ddof=1)) if len(chosen) > 1 else None,
            "count": len(chosen), "fallback": fallback}


def ours(stats: Optional[dict]) -> str:
  """"0.954 ± 0.041 (3)": mean ± SD (number of seeds); "–" if missing."""
  if stats is None or stats.get("mean") is None:
    return MISSING
  sd = "" if stats.get("sd") is None else f" ± {stats['sd']:.3f}"
  mark = "*" if stats.get("fallback") else ""
  return f"{stats['mean']:.3f}{sd} ({stats['count']}){mark}"


def theirs(value) -> str:
  """[mean, SD] of the paper; "–" if missing."""
  if value is None:
    return MISSING
  mean, sd = (value + [None])[:2] if isinstance(value, list) else (value, None)
  if mean is None:
    return MISSING
  return f"{mean:.3f}" + ("" if sd is None else f" ± {sd:.3f}")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |",
           "|---|" + "---:|" * (len(header) - 1)]
  lines += ["| " + " | ".join(row) + " |" for row in rows]
  return "\n".join(lines)


def _rows(paper_rows: dict, ours_labels: Sequence[str]) -> list[str]:
  """The paper's rows in its order, then our runs it does not have."""
  extra = [l for l in ours_labels if l not in paper_rows]
  return list(paper_rows) + sorted(extra, key=ito.sort_key)


class Report:
  """The tables of one report."""

  def __init__(self, runs: Sequence[ito.RunInfo], paper: dict,
               analysis: Optional[dict] = None, epoch: float = TABLE_EPOCH):
    self.paper = paper
    self.analysis = analysis
    self.epoch = epoch
    # protocol -> encoding label -> RunRecords
    self.by_protocol: dict[str, dict[str, RunRecords]] = {}
    for info in runs:
      self.by_protocol.setdefault(info.protocol, {})[info.encoding_label] = RunRecords(info)

  def run(self, protocol: str, label: str) -> Optional[RunRecords]:
    return self.by_protocol.get(protocol, {}).get(label)

  def stats(self, protocol: str, label: str, split: str, epoch: float) -> Optional[dict]:
    run = self.run(protocol, label)
    return None if run is None else run.stats(split, epoch)

  def _labels(self, protocol: str, learn: Optional[bool]) -> list[str]:
    labels = self.by_protocol.get(protocol, {})
    return [l for l in labels if learn is None or l.startswith("learn-") == learn]

  def accuracy_table(self, key: str, learn: bool) -> str:
    table = self.paper[key]
    protocol = table["protocol"]
    # Tables 1 and 6 have learn-0.2 among the common PEs; our other learn-σ runs go to
    # Tables 2 and 5.
    labels = _rows(table["rows"], self._labels(protocol, learn))
    rows = []
    for label in labels:
      paper_row = table["rows"].get(label, {})
      rows.append([label,
                   ours(self.stats(protocol, label, "validation", self.epoch)),
                   theirs(paper_row.get("validation")),
                   ours(self.stats(protocol, label, "train", self.epoch)),
                   theirs(paper_row.get("training"))])
    return _table(["PE", "validation, ours", "validation, paper", "training, ours",
                   "training, paper"], rows)

  def _analysis_run(self, label: str) -> Optional[dict]:
    if not self.analysis:
      return None
    return self.analysis.get("runs", {}).get(label)

  def table3(self) -> str:
    table = self.paper["table3"]
    labels = _rows(table["rows"], self._labels(table["protocol"], True))
    rows, stale = [], []
    for label in labels:
      record = self._analysis_run(label)
      flat = averaged = None
      if record is not None and abs(float(record["epoch"]) - self.epoch) < _TOLERANCE:
        flat = record.get("attention_cosine")
        averaged = record.get("attention_cosine_puzzle_mean")
        trained = self.stats(table["protocol"], label, "validation", self.epoch)
        if "seeds" in record and trained and trained.get("count") != len(record["seeds"]):
          stale.append(f"{label} ({len(record['seeds'])} of {trained['count']} seeds)")
      rows.append([label, ours(flat), ours(averaged), theirs(table["rows"].get(label, {}).get(
          "attention_cosine"))])
    # The paper does not say which maps its cosine compares: ours gives both readings.
    text = _table(["PE", "attention cosine to 2d-fixed, ours (maps per puzzle)",
                   "ours (maps averaged over puzzles)", "paper"], rows)
    if stale:
      text += ("\n\nThe analysis predates finished runs: " + ", ".join(stale)
               + "; run `python -m experiments.ito_analysis` again, then this report.")
    return text

  def table4(self) -> str:
    table = self.paper["table4"]
    small = [l for l in set(self._labels("adam", True)) | set(self._labels("sgd", True))
             if float(l.split("-")[1]) <= 0.2]
    rows = []
    for label in _rows(table["rows"], small):
      paper_row = table["rows"].get(label, {})
      rows.append([label,
                   ours(self.stats("adam", label, "validation", self.epoch)),
                   theirs(paper_row.get("adam")),
                   ours(self.stats("sgd", label, "validation", self.epoch)),
                   theirs(paper_row.get("sgd"))])
    return _table(["σ", "Adam (lr 1e-4), ours", "Adam, paper", "SGD (lr 1e-3), ours",
                   "SGD, paper"], rows)

  def short_training(self) -> str:
    table = self.paper["short_training"]
    protocol = table["protocol"]
    labels = _rows(table["rows"], self._labels(protocol, None))
    rows = []
    for label in labels:
      paper_row = table["rows"].get(label, {})
      row = [label]
      for split, epoch, key in [("validation", 200, "validation_e200"),
                                ("validation", 400, "validation_e400"),
                                ("validation", 4000, "validation_e4000"),
                                ("test", 200, "heldout_e200"),
                                ("train", 200, "train_e200")]:
        row += [ours(self.stats(protocol, label, split, epoch)), theirs(paper_row.get(key))]
      rows.append(row)
    return _table(["PE", "val. e200, ours", "paper", "val. e400, ours", "paper",
                   "val. e4000, ours", "paper", "held-out e200, ours", "paper",
                   "train e200, ours", "paper"], rows)

  def targets_e200(self) -> str:
    """Issue 26's targets at epoch 200 (B7.3a, validation): the paper's σ ordering
    learn-0.2 > learn-1.0 > learn-2.0 of our means, and each of our means within two of
    the authors' SDs of theirs."""
    table = self.paper["short_training"]
    protocol = table["protocol"]
    rows, means = [], {}
    for label in ("2d_fixed", "learn-0.2", "learn-1.0", "learn-2.0"):
      paper = (table["rows"].get(label) or {}).get("validation_e200")
      stats = self.stats(protocol, label, "validation", 200)
      mean = None if stats is None else stats["mean"]
      means[label] = mean
      if mean is None or not paper or paper[1] in (None, 0):
        verdict = distance = MISSING
      else:
        gap = abs(mean - paper[0]) / paper[1]
        distance = f"{gap:.2f}"
        verdict = "yes" if gap <= 2 else "no"
      rows.append([label, ours(stats), theirs(paper), distance, verdict])
    order = ["learn-0.2", "learn-1.0", "learn-2.0"]
    if any(means[l] is None for l in order):
      ordering = f"{MISSING} (a learn-σ run at epoch 200 is missing)"
    else:
      held = means[order[0]] > means[order[1]] > means[order[2]]
      ordering = ("holds" if held else "does not hold") + " (" + " > ".join(
          f"{l} {means[l]:.3f}" for l in order) + ")"
    return (_table(["PE", "val. e200, ours", "paper", "distance in the paper's SDs",
                    "within 2 SDs"], rows)
            + f"\n\nThe paper's σ ordering learn-0.2 > learn-1.0 > learn-2.0 on validation "
            f"at epoch 200, of our means: {ordering}.")

  def validation_points(self) -> dict:
    """What the report's figure draws: for each encoding of the paper's shorter-training
    table (B7.3a, Adam) and our other runs of that optimizer setting that have a value at
    the report's epoch, {"ours": the validation accuracy of each model that did not
    diverge, "paper": the authors' [mean, SD] at that epoch, or None, "paper_models":
    each of the authors' models at that epoch (B7.3a's per-seed values), or None}."""
    table = self.paper["short_training"]
    protocol = table["protocol"]
    key = f"validation_e{self.epoch:g}"
    points = {}
    for label in _rows(table["rows"], self._labels(protocol, None)):
      run = self.run(protocol, label)
      ours_values = [] if run is None else run.kept("validation", self.epoch)[0]
      if ours_values:
        points[label] = {
            "ours": ours_values, "paper": (table["rows"].get(label) or {}).get(key),
            "paper_models": (table.get("per_seed", {}).get(label) or {}).get(key)}
    return points

  def write_figure(self, path: str) -> Optional[dict]:
    """Draws `validation_points` (a dot a model, and mean ± SD, ours and the authors')
    to `path`; returns the points, or None (nothing drawn) when no run has a value."""
    points = self.validation_points()
    if not points:
      return None
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    plt, fig, (ax,) = figures.panels(width=max(6.0, 1.1 * len(points) + 2), height=4.5)
    legend = set()

    def once(name):  # Each kind of mark in the legend once.
      seen = name in legend
      legend.add(name)
      return None if seen else name

    def draw(x, values, summary, color, marker, who):
      if values:
        spread = np.linspace(-0.08, 0.08, len(values)) if len(values) > 1 else np.zeros(1)
        ax.scatter(x + spread, values, s=14, color=color, alpha=0.6, marker=marker,
                   label=once(f"{who}, one model"))
      if summary is not None:
        ax.errorbar(x, summary[0], yerr=summary[1], fmt=marker, color=color, capsize=4,
                    markersize=7, label=once(f"{who}, mean ± SD"))

    ticks = []
    for x, (label, point) in enumerate(points.items()):
      values = point["ours"]
      draw(x - 0.15, values, (np.mean(values), np.std(values, ddof=1) if len(values) > 1
                              else 0.0), "C0", "o", "ours")
      paper, models = point["paper"], point["paper_models"]
      draw(x + 0.15, models, None if not paper or paper[0] is None
           else (paper[0], paper[1] or 0.0), "C1", "s", "the authors")
      ticks.append(f"{label}\n(ours {len(values)}" + (f", theirs {len(models)})" if models
                                                       else ")"))
    ax.set_xticks(range(len(points)), ticks, fontsize=8)
    ax.set_ylabel("validation accuracy (the 108 puzzles)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"Epoch {self.epoch:g}: ours beside the authors' (SPEC-EXTENSIONS B7.3a)",
                 fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(axis="y", alpha=0.3)
    figures.save(plt, fig, path)
    return points

  def other_numbers(self) -> str:
    text = self.paper["text"]
    analysis = self.analysis or {}
    curve = analysis.get("sigma_curves", {}).get("adam", {})

    def rho(key):
      value = curve.get(key)
      if not value:
        return MISSING
      return f"{value['rho']:.3f} ({value['levels']} σ levels)"

    def run_value(label, key, field="mean"):
      record = self._analysis_run(label)
      if record is None or record.get(key) is None:
        return MISSING
      value = record[key].get(field) if isinstance(record[key], dict) else record[key]
      if value is None:
        return MISSING
      return f"{value:.3f} (epoch {float(record['epoch']):g})"

    learn = self._analysis_run("learn-0.2")
    human = (learn or {}).get("human") or {}
    epoch = "" if learn is None else f" (epoch {float(learn['epoch']):g})"

    def human_value(key):
      return MISSING if human.get(key) is None else f"{human[key]:.3f}{epoch}"

    rows = [
        ["Spearman ρ, attention cosine vs validation accuracy over σ",
         rho("spearman_attention_cosine_vs_accuracy"),
         f"{text['attention_accuracy_spearman']['value']:g}"],
        ["Spearman ρ, Procrustes distance (raw) vs validation accuracy over σ",
         rho("spearman_procrustes_distance_vs_accuracy"),
         f"{text['procrustes_accuracy_spearman']['value']:g}"],
        ["Spearman ρ, Procrustes disparity (standardised) vs validation accuracy over σ",
         rho("spearman_procrustes_disparity_vs_accuracy"), MISSING],
        ["cosine of the 1d-fixed and 2d-fixed PE matrices",
         run_value("1d_fixed", "pe_cosine"), f"{text['pe_cosine_1d_2d']['value']:g}"],
        ["learn-0.2 vs people: Spearman ρ", human_value("spearman"),
         f"{text['human_learn_0.2']['spearman']:g}"],
        ["learn-0.2 vs people: cosine", human_value("cosine"),
         f"{text['human_learn_0.2']['cosine']:g}"],
        ["learn-0.2 vs people: composite", human_value("composite"), MISSING],
    ]
    return _table(["quantity", "ours", "paper"], rows)

  def markdown(self) -> str:
    epoch = f"{self.epoch:g}"
    note = (f"Cells: mean ± SD over seeds (ddof 1), the number of seeds in brackets; ours at "
            f"epoch {epoch}, the paper's at epoch 4000 over 15 seeds. {MISSING}: no run or "
            "no value. * training accuracy of eval.json (evaluated after training), not "
            "the epoch's minibatch mean.")
    parts = [f"# Ito et al. 2024 on the Latin Square Task: ours beside the paper's\n\n{note}"]
    sections = [
        ("Table 1: common PEs and learn-0.2 (Adam, lr 1e-4)", self.accuracy_table("table1", False)),
        ("Table 2: learn-σ (Adam, lr 1e-4)", self.accuracy_table("table2", True)),
        ("Table 3: attention-map cosine similarity to 2d-fixed (learn-σ, Adam)", self.table3()),
        ("Table 4: very small σ, Adam against SGD (validation)", self.table4()),
        ("Table 5: learn-σ with weight decay 0.1 (AdamW)", self.accuracy_table("table5", True)),
        ("Table 6: common PEs with weight decay 0.1 (AdamW)", self.accuracy_table("table6", False)),
        ("Shorter training (SPEC-EXTENSIONS B7.3a; Adam): epochs 200, 400, 4000",
         self.short_training()),
        ("Issue 26's targets at epoch 200 (B7.3a, validation)", self.targets_e200()),
        ("Other numbers of the paper", self.other_numbers()),
    ]
    for title, body in sections:
      parts.append(f"## {title}\n\n{body}")
    others = sorted(info.label for protocol, runs in self.by_protocol.items()
                    if protocol not in ito.PROTOCOLS for info in
                    (r.info for r in runs.values()))
    if others:
      parts.append("Runs with optimizer settings of no table: " + ", ".join(others) + ".")
    if self.analysis is None:
      parts.append("No analysis JSON (python -m experiments.ito_analysis): Table 3 and the "
                   "other numbers are missing.")
    parts.append(f"Source of the paper's numbers: {self.paper['source']}")
    return "\n\n".join(parts) + "\n"


def write_report(runs: Sequence[ito.RunInfo], out_dir: str,
                 analysis_path: Optional[str] = None, epoch: float = TABLE_EPOCH) -> str:
  """Renders the report, writes OUT_DIR/report.md and, when a run has a validation
  accuracy at `epoch`, its figure OUT_DIR/figures/validation_epochE.png (linked at the
  end of the Markdown); returns the Markdown."""

  analysis = None
  if analysis_path and os.path.exists(analysis_path):
    analysis = _read(analysis_path, lines=False)
  report = Report(runs, load_paper(), analysis, epoch)
  text = report.markdown()
  os.makedirs(out_dir, exist_ok=True)
  name = f"validation_epoch{epoch:g}.png"
  figure = os.path.join(out_dir, figures.FOLDER, name)
  if report.write_figure(figure) is not None:
    text += (f"\n![Validation accuracy at epoch {epoch:g}, ours beside the authors']"
             f"({figures.FOLDER}/{name})\n")
  elif os.path.exists(figure):  # From an earlier report of runs that are gone.
    os.remove(figure)
  io_utils.atomic_write_text(os.path.join(out_dir, "report.md"), text)
  return text


def final_epoch(runs: Sequence[ito.RunInfo]) -> float:
  """The epoch of the runs' eval.json when every finished folder has the same one (e.g.
  200 for a `scale=small` sweep), else TABLE_EPOCH (the paper's 4000)."""
  epochs = set()
  for run in runs:
    for part in run.folders:
      final = _read(os.path.join(part.workdir, "eval.json"), lines=False)
      if final and final.get("epoch") is not None:
        epochs.add(round(float(final["epoch"]), 6))
  return epochs.pop() if len(epochs) == 1 else TABLE_EPOCH


def report_kind(sweep_dir: str, results, out_dir: str) -> dict:
  """The interface of experiments.report's kinds (`REPORTS`: (sweep_dir, results,
  out_dir) -> {"kind", "text", ...}), so that it can dispatch a sweep here: this
  report of the runs in `sweep_dir` (runs of one label in several folders merged),
  Tables 1-6 at the runs' common final epoch (`final_epoch`: 200 for configs/ito_sweep.py,
  else 4000), the analysis JSON from SWEEP_DIR/ito_analysis/analysis.json if there is one."""
  del results  # eval.json records; this report reads each run's folder itself.
  runs = ito.find_runs(sweep_dir)
  text = write_report(runs, out_dir, os.path.join(sweep_dir, "ito_analysis", "analysis.json"),
                      final_epoch(runs))
  return {"kind": "ito", "text": text, "table": text}
