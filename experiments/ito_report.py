"""Our Latin-square runs beside Ito et al. (2024)'s numbers: Markdown tables.

  python -m experiments.ito_report --sweep_dir=runs/latin_square [--epoch=200] \
      [--analysis=PATH] [--out_dir=DIR]
  python -m experiments.ito_report --workdirs=runs/ls/2d_fixed,runs/ls/learn-0.2

Renders Tables 1-6 of the paper and the shorter-training values of SPEC-EXTENSIONS
B7.3a (epochs 200, 400, 4000), our mean ± SD over seeds (ddof 1, the models whose loss
stayed finite; the number of seeds in brackets) next to theirs. A cell we do not have (no
run of that encoding and optimizer, or not trained to that epoch) or the paper does not
give is "–". The paper's numbers are experiments/paper_numbers/ito2024_results.json.

Where our numbers come from (a run is a workdir of experiments.train; runs are found as
experiments.ito_analysis finds them, and named by encoding and optimizer the same way):
  validation, held-out   the evaluation record of metrics.jsonl at that epoch (or
                         eval.json if it is at that epoch): overall accuracy per model
  training               the metrics record that closes that epoch: the mean of its
                         minibatch accuracies, the original's "train accuracy" (marked *
                         where only eval.json's end-of-run train accuracy is there)
  Table 3 and the other numbers   the analysis JSON of experiments.ito_analysis
                         (default SWEEP_DIR/ito_analysis/analysis.json), used in Table 3
                         only if it was computed at the tables' epoch
Tables 1-6 are at --epoch (default: the runs' common final epoch, e.g. 200 for
configs/ito_sweep.py; 4000, the paper's, when they differ); B7.3a has its own epochs,
and issue 26's targets at epoch 200 (the σ ordering, our means within two of the
authors' SDs) follow it. Runs of one label in several folders with disjoint seeds (one
sweep job per seed) are one run: mean ± SD over all their seeds.
Our epoch k is k full passes; the original's record "epoch k" came after k + 1.

Writes OUT_DIR/report.md (default SWEEP_DIR/ito_report) and prints it. Bad input is one
line on stderr and exit code 2 (experiments/cli.py).
"""
import os

from experiments.analysis import ito
from experiments.analysis import ito_tables


def main(argv):
  del argv  # cli.parse_flags refuses extra arguments.
  from experiments import cli  # pylint: disable=import-outside-toplevel

  try:
    workdirs = [w for w in (_WORKDIRS.value or "").split(",") if w.strip()]
    if _EPOCH.value is not None and not _EPOCH.value > 0:
      raise ValueError(f"--epoch must be > 0, got {_EPOCH.value}")
    if _ANALYSIS.value and not os.path.isfile(_ANALYSIS.value):
      raise ValueError(f"no analysis file at {_ANALYSIS.value}")
    runs = ito.find_runs(_SWEEP_DIR.value, workdirs)
    base = _SWEEP_DIR.value or os.path.dirname(os.path.abspath(workdirs[0]))
    analysis = _ANALYSIS.value or os.path.join(base, "ito_analysis", "analysis.json")
    out_dir = _OUT_DIR.value or os.path.join(base, "ito_report")
    epoch = ito_tables.final_epoch(runs) if _EPOCH.value is None else _EPOCH.value
    text = ito_tables.write_report(runs, out_dir, analysis, epoch)
  except ValueError as e:
    cli.fail(cli.one_line(e))
  except OSError as e:
    cli.fail(cli.one_line(e), cli.EXIT_FAILED)
  print(text)
  print(f"written to {os.path.join(out_dir, 'report.md')}")


if __name__ == "__main__":
  from absl import flags  # pylint: disable=ungrouped-imports

  from experiments import cli  # pylint: disable=ungrouped-imports

  _SWEEP_DIR = flags.DEFINE_string("sweep_dir", None, "Folder of Latin-square runs.")
  _WORKDIRS = flags.DEFINE_string("workdirs", None, "Comma-separated run folders "
                                  "(instead of --sweep_dir).")
  _ANALYSIS = flags.DEFINE_string("analysis", None, "analysis.json of experiments."
                                  "ito_analysis (default SWEEP_DIR/ito_analysis/analysis.json)")
  _EPOCH = flags.DEFINE_float("epoch", None, "The epoch of our values in Tables 1-6 "
                              "(default: the runs' common final epoch, else 4000).")
  _OUT_DIR = flags.DEFINE_string("out_dir", None, "Output folder (default "
                                 "SWEEP_DIR/ito_report).")
  cli.run(main)
