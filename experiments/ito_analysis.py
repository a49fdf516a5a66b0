"""The analyses of Ito et al. (2024) on trained Latin-square runs: figures and a JSON of numbers.

  python -m experiments.ito_analysis --sweep_dir=runs/latin_square [--out_dir=DIR]
  python -m experiments.ito_analysis --workdirs=runs/ls/2d_fixed,runs/ls/learn-0.2

A run is one workdir of `experiments.train` with `configs/latin_square.py` (or a job of
`experiments.sweep`): one encoding, every seed of its grid; folders of one label with
disjoint seeds (configs/ito_sweep.py: one job per seed) are one run, their models the
union (`merge_runs`). --sweep_dir finds the runs in a folder and one level below
(SWEEP_DIR/RUN or SWEEP_DIR/TASK/RUN), leaving out (with a note) the runs that have not
finished training, e.g. a sweep's stopped job; --workdirs analyses whatever it is given.
Each folder is read from the JOB_INPUTS file its sweep
job wrote after training (`write_job_inputs`, from its newest checkpoint with the default
noise settings) when that file matches the folder's newest checkpoint and the noise
settings (also a results folder committed without checkpoints), else evaluated at its
newest checkpoint, the parameters with their leading seed axis [S, ...] (--recompute:
always); folders with neither are skipped with a warning. Models
whose loss diverged are left out of every mean. All numbers are on the 108 validation puzzles (the puzzles people solved),
evaluated as `experiments.training.evaluation.SplitEvaluator` does (deterministic by default,
positions from the evaluation sampler with `evaluation.seed`).

What is measured (docs/ito.md, "Analyses"; SPEC-EXTENSIONS B6):
  attention similarity  each model's attention maps, [layers, 108 puzzles, 16, 16] (the
      original's `retrieve_model_weights` in lstnn/compare_rdms.py: every block, the 108
      validation puzzles, heads averaged), against every model of the reference run
      (--reference, default 2d_fixed; a model is not compared with itself): the cosine of
      the flattened maps, and the Jensen-Shannon divergence (base 2, in [0, 1]) between
      the attention distributions of each query row, averaged over rows, puzzles and
      layers. Per model: the mean over the reference models (--pairing=all) or the
      reference model of the same seed (--pairing=same_seed); then mean ± SD over seeds.
  Procrustes            each block's additive position term [16, M] against the 2d-fixed
      matrix: raw = ||P R - P_2d||_F with R = scipy.linalg.orthogonal_procrustes(P, P_2d)
      (the paper's reading, SciPy; grows with the norm of P), and standardised =
      scipy.spatial.procrustes(P_2d, P)'s disparity (both centred and scaled to norm 1,
      then rotated and scaled: a sum of squares in [0, 1]). Per model the mean over the
      blocks (per block values kept); encodings without an additive term have none.
  noise robustness      validation accuracy with N(0, SD^2) noise added to every token
      embedding (the output of the embedding layer, before block 0), a fresh draw per
      SD, draw and model (--noise_draws draws averaged); SD 0 is the clean accuracy.
  people                h = per-puzzle accuracy of the 40 people of human_behaviour.csv,
      m = per-puzzle accuracy of the run's models (mean over seeds of 0/1): cosine
      m.h / |m||h|, Spearman's rho (scipy.stats.spearmanr; undefined for a constant m),
      and their mean (the paper's composite).
  σ curve               for the learn-σ runs of each optimizer setting: validation
      accuracy, attention cosine and Procrustes distance against σ, and Spearman's rho
      over the σ levels of the mean attention cosine (the paper: 0.96) and of the mean
      Procrustes distances (the paper: -0.977) against the mean validation accuracy.

Writes OUT_DIR/analysis.json (default SWEEP_DIR/ito_analysis) and OUT_DIR/figures/*.png,
and prints a summary. Bad input (a missing folder, no run, an unknown encoding, a seed
given twice in one label, folders of one label with other settings) is one line on stderr
and exit code 2 (experiments/cli.py).
"""
import os
import sys

from experiments.analysis import ito


def main(argv):
  del argv  # cli.parse_flags refuses extra arguments.
  from absl import logging  # pylint: disable=import-outside-toplevel

  from experiments import cli  # pylint: disable=import-outside-toplevel

  logging.set_verbosity(logging.WARNING)  # Orbax logs every restore at INFO.
  try:
    workdirs = [w for w in (_WORKDIRS.value or "").split(",") if w.strip()]
    sds = ito.parse_floats(_NOISE_SDS.value, "--noise_sds")
    if _NOISE_DRAWS.value < 1:
      raise ValueError(f"--noise_draws must be >= 1, got {_NOISE_DRAWS.value}")
    unfinished = []
    runs = ito.find_runs(_SWEEP_DIR.value, workdirs, skipped=unfinished)
    if unfinished:
      print(f"skipping {len(unfinished)} unfinished run(s) (no eval.json for the configured "
            f"steps; analyse one with --workdirs): {', '.join(unfinished)}", file=sys.stderr)
    ito.check_encodings([_REFERENCE.value] + [e for e in (_ENCODINGS.value or "").split(",")
                                          if e.strip()])
    if _ENCODINGS.value:
      wanted = {e.strip() for e in _ENCODINGS.value.split(",") if e.strip()}
      runs = [r for r in runs if r.label in wanted or r.encoding in wanted
              or r.encoding_label in wanted or r.label == _REFERENCE.value]
      if not runs:
        raise ValueError(f"no run of {', '.join(sorted(wanted))}")
    for run in runs:
      ito.check_encodings([run.encoding])
    from experiments.training import compile_cache  # pylint: disable=import-outside-toplevel
    compile_cache.enable()  # The entry points' cache: a second analysis loads its programs.
    out_dir = _OUT_DIR.value or os.path.join(
        _SWEEP_DIR.value or os.path.dirname(os.path.abspath(workdirs[0])), "ito_analysis")
    result = ito.write_analysis(runs, out_dir, reference=_REFERENCE.value, noise_sds=sds,
                            noise_draws=_NOISE_DRAWS.value, noise_seed=_NOISE_SEED.value,
                            pairing=_PAIRING.value, recompute=_RECOMPUTE.value)
  except ValueError as e:
    cli.fail(cli.one_line(e))
  except OSError as e:
    cli.fail(cli.one_line(e), cli.EXIT_FAILED)
  print(ito.summary_markdown(result))
  print(f"\nwritten to {out_dir} (analysis.json, figures/)")


if __name__ == "__main__":
  from absl import flags  # pylint: disable=ungrouped-imports

  from experiments import cli  # pylint: disable=ungrouped-imports

  _SWEEP_DIR = flags.DEFINE_string("sweep_dir", None, "Folder of Latin-square runs.")
  _WORKDIRS = flags.DEFINE_string("workdirs", None, "Comma-separated run folders "
                                  "(instead of --sweep_dir).")
  _OUT_DIR = flags.DEFINE_string("out_dir", None, "Output folder (default "
                                 "SWEEP_DIR/ito_analysis, or beside the first workdir).")
  _REFERENCE = flags.DEFINE_string("reference", ito.REFERENCE, "The run attention maps are "
                                   "compared with (a label: 2d_fixed, learn-0.2, ...).")
  _ENCODINGS = flags.DEFINE_string("encodings", None, "Only these runs (labels or "
                                   "encodings, comma-separated), and the reference.")
  _NOISE_SDS = flags.DEFINE_string("noise_sds", ",".join(f"{s:g}" for s in ito.NOISE_SDS),
                                   "Standard deviations of the embedding noise.")
  _NOISE_DRAWS = flags.DEFINE_integer("noise_draws", 1, "Noise draws per SD, averaged.")
  _NOISE_SEED = flags.DEFINE_integer("noise_seed", 0, "Seed of the noise draws.")
  _PAIRING = flags.DEFINE_enum("pairing", "all", ito.PAIRINGS, "Compare a model with every "
                               "reference model (all) or the one of its seed (same_seed).")
  _RECOMPUTE = flags.DEFINE_boolean(
      "recompute", False, "Evaluate every model from its checkpoint, even where its job's "
      f"{ito.JOB_INPUTS} (written from that checkpoint with these noise settings) holds "
      "the same numbers.")
  cli.run(main)
