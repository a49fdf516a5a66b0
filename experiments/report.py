"""Tables and figures of a sweep beside the paper's numbers.

  python -m experiments.report --sweep_dir=runs/small [--out_dir=DIR] [--kind=auto]
  python -m experiments.report --run_dir=runs/demo    # one run's curves: curves.png

Writes into OUT_DIR (default SWEEP_DIR/report):
  table1.md / table1.csv  max over seeds and learning rates of the unseen-length
                          accuracy (Table 1 of the paper), ours beside the paper's
  table4.md / table4.csv  mean and standard deviation over seeds at the best
                          learning rate (Table 4)
  headline.json           per task, best randomized minus best non-randomized
                          encoding, averaged over tasks (the paper: 12.0 points)
  figures/TASK.png        accuracy against length per encoding (best model), with
                          the training range shaded, like the paper's Figure 4
  training.md             mean accuracy on the training lengths per cell (every table
                          also marks with † a model below 95% there: not a result)
  ordering.md             per task and family: randomized above its classic twin by
                          more than one std, within it, reversed, or not learned
A sweep with variants (`sweep.variants`, e.g. configs/su.py) gets instead:
  variants.md / variants.csv  mean ± std over seeds of the unseen-length accuracy per
                          (task, variant), at the learning rate with the best mean;
                          below it, each variant against the one it extends by one
                          option (rope -> rope+logn, rope -> randomized_rope, ...):
                          above by more than one std, within it, below, or not learned
  figures/TASK.png        accuracy against length, a line per variant (mean over
                          seeds, the band ± one std), training range shaded
The paper kind also writes
  table2.md / table2.csv  training hours per job from the runs' own records (eval.json's
                          train_seconds), beside the paper's Table 2
Experiments of the paper's appendix name their report in the sweep config
(`sweep.report`):
  table3     (configs/table3.py) table3.md: max over seeds and learning rates of sorted
             and unsorted randomized sin/cos, beside the paper's Table 3 and Table 1
  figure3    (configs/figure3.py) figure3.md, figure3.png: unseen-length accuracy
             against the maximum position L
  figure2    (configs/figure2.py) figure2.md, figure2.png: accuracy on the test lengths
             against training seconds, from the evaluations during training
  table5     (configs/table5.py) table5.md: geometric attention, max and mean ± std,
             beside the paper's Table 5 and the best of its Tables 1 and 4
  study      (configs/cpu_study.py) study.md: per (task, setting, encoding) the accuracy
             on the training and unseen lengths, when training reached 95%, seconds;
             figures/TASK.png: learning curves against steps and training seconds;
             runs moved aside (NAME.replaced-WHEN, an earlier protocol) beside them;
             where both twins of a family ran (NAME, randomized_NAME), ordering.md's
             verdict at every step evaluated during training and on each seed's
             accuracy averaged over the last 3 of them, a table per family and
             figures/ordering_during_training.png; per task, how far the learned
             models' unseen accuracy moved between evaluations, the part a job's seeds
             share and each seed's own (experiments/analysis/motion.py). Any sweep
             whose jobs evaluate during training has this view: --kind=study
  ito        (--kind=ito, a folder of Latin-square runs) Ito et al.'s Tables 1-6 beside
             ours, as python -m experiments.ito_report writes them
Every kind whose models have scores (all but ito) also writes
  jobs.md / jobs.csv      every job, seed by seed: each model's accuracy on the training
                          and unseen lengths, the unseen mean ± std, the learning rate
                          the tables use (★), and the job's training hours (wall, CPU)
--kind=auto (default) takes the jobs' `sweep.report`, else the variants report when
they name variants, else the paper's tables; --kind=KIND forces one.
A missing job (an unfinished sweep) is shown as a missing cell, never as zero.
--run_dir=WORKDIR draws one run's metrics.jsonl instead (a finished or a running run):
WORKDIR/curves.png, training loss and accuracy against the step and, when the run
evaluates during training (evaluation.every_steps / every_epochs), those evaluations;
a grid's models are a line each (more than 6: their mean and a min-max band).
The published numbers come from experiments/paper_numbers/paper_results.json, a copy of
the tables of Ruoss et al., "Randomized Positional Encodings Boost Length
Generalization of Transformers", ACL 2023.
"""
from absl import flags

from experiments.analysis import tables
from experiments.storage import io_utils

KINDS = tables.KINDS

FLAG_NAMES = ("sweep_dir", "run_dir", "out_dir", "kind")


def define_flags() -> None:
  """Defines the command line's flags, once: the entry point calls it, and so may code
  that runs `main` in its own process.

  Not on import, as experiments/analyze.py's `define_flags`: another entry point has a
  --kind of its own (analyze's), and the test suite imports both into one process.
  """
  if "kind" in flags.FLAGS and "run_dir" in flags.FLAGS:
    return
  flags.DEFINE_string("sweep_dir", None, "Sweep folder.")
  flags.DEFINE_string("run_dir", None, "A run's workdir: draws its curves (metrics.jsonl) "
                      "into curves.png instead of a sweep report.")
  flags.DEFINE_string("out_dir", None, "Output folder (default SWEEP_DIR/report; with "
                      "--run_dir, RUN_DIR).")
  flags.DEFINE_enum("kind", "auto", KINDS, "Which report: auto (the sweep config's "
                    "sweep.report, else variants if the sweep has them, else paper), or one "
                    "of the kinds by name.")


def main(argv):
  del argv  # cli.parse_flags refuses extra arguments.
  from experiments import cli  # pylint: disable=import-outside-toplevel

  sweep_dir, run_dir, out_dir, kind = (flags.FLAGS[name].value for name in FLAG_NAMES)
  if run_dir:
    try:
      curves = tables.write_curves(run_dir, out_dir)
    except (ValueError, io_utils.CorruptFileError) as e:
      cli.fail(cli.one_line(e))
    print(curves["text"])
    return
  if not sweep_dir:
    cli.fail("give --sweep_dir=SWEEP_DIR (a sweep's report) or --run_dir=WORKDIR "
             "(a run's curves)")
  try:
    report = tables.write_report(sweep_dir, out_dir, kind)
  except ValueError as e:
    cli.fail(cli.one_line(e))
  print(report["text"])
  print(f"\nwritten to {report['out_dir']}")


if __name__ == "__main__":
  from experiments import cli  # pylint: disable=ungrouped-imports

  define_flags()
  cli.run(main)
