"""Run a sweep of (task, variant) jobs, each a grid of seeds x learning rates.

  python -m experiments.sweep --config=configs/table1.py:scale=small --sweep_dir=runs/small
  python -m experiments.sweep --config=configs/table1.py --sweep_dir=/shared/table1 \
      --executor=ray --ray_address=auto --gpus_per_job=1

Jobs are tasks x variants: `sweep.encodings` (the variant ENC sets model.pe=ENC) and
`sweep.variants`, (name, {dotted setting: value}) pairs such as
("rope+logn", {"model.pe": "rope", "model.log_n_scaling": True}) (configs/su.py).
Each job writes into SWEEP_DIR/TASK/VARIANT/ (the files of experiments.train,
eval.json last and atomically; then the files `sweep.job_outputs` names, JOB_OUTPUTS of
experiments/training/jobs.py, made from the job's checkpoints, e.g. the inputs of
experiments.ito_analysis). --only=PATTERNS keeps the jobs whose TASK/VARIANT
matches a shell pattern; --max_jobs=N trains at most N unfinished jobs and stops (a
session's share of a sweep of many hours); `kill -USR1` of the driver (either executor)
lets the running jobs finish and starts no other, leaving them to a later run.
Re-running the command skips finished jobs and resumes unfinished ones from their
checkpoints, so a sweep survives a dead worker or a killed driver; --dry_run prints
what a run would do with each job and changes nothing. While jobs train, a line every
--report_every minutes gives the count, the ETA and each running job's step. --reuse_from=FOLDER copies a
finished job of another sweep folder whose settings equal those of a job that has not
started (the copy's reused_from.json names its source) instead of training it again.
Jobs that differ only in evaluation settings (Su's +even variants) share one training: a
job is evaluated on the training of the first earlier job of the run with its other
settings (`share_training` in experiments/training/jobs.py; its eval.json names that job
in `shared_training`).
Executors:
  local (default): jobs in sequence, or --workers=N processes at once; a worker
      that dies is restarted on its job (up to --max_retries times).
  ray: one Ray task per job on an existing cluster (--ray_address) or a local
      one; Ray retries a task whose worker died. Needs `pip install -e .[cluster]`;
      on a multi-machine cluster SWEEP_DIR must be on a shared filesystem.
"""
import collections
import os
import sys

from experiments.training import jobs


def main(argv):
  del argv  # cli.parse_flags refuses extra arguments.
  from absl import logging  # pylint: disable=import-outside-toplevel

  from experiments import cli  # pylint: disable=import-outside-toplevel
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  if "sweep" not in config:
    cli.fail("the config has no `sweep` section (tasks and encodings); "
             "use e.g. --config=configs/table1.py")
  try:
    cli.check_shadowed(config, sys.argv)
    if _DRY_RUN.value:
      planned = jobs.plan(config, _SWEEP_DIR.value, rerun_changed=_RERUN_CHANGED.value,
                          reuse_from=_REUSE_FROM.value, only=_ONLY.value,
                          max_jobs=_MAX_JOBS.value)
      for job, action, detail in planned:
        print(f"{action:<11} {job.name}: {detail}")
      counts = collections.Counter(action for _, action, _ in planned)
      print(f"[sweep] dry run, nothing trained or written: {len(planned)} jobs, "
            + ", ".join(f"{n} {a}" for a, n in counts.items()))
      return
    progress = jobs.run_sweep(config, _SWEEP_DIR.value, _EXECUTOR.value, _WORKERS.value,
                         _RAY_ADDRESS.value, _GPUS.value, _RETRIES.value,
                         rerun_changed=_RERUN_CHANGED.value,
                         commit_results=_COMMIT_RESULTS.value,
                         reuse_from=_REUSE_FROM.value, only=_ONLY.value,
                         max_jobs=_MAX_JOBS.value,
                         report_every=_REPORT_EVERY.value)
  except ValueError as e:
    cli.fail(cli.one_line(e))
  except jobs.SweepInterrupted:
    print("[sweep] interrupted; re-run the same command to resume", file=sys.stderr,
          flush=True)
    sys.exit(cli.EXIT_INTERRUPTED)
  if progress.failed:
    print(f"[sweep] {len(progress.failed)} jobs failed: {', '.join(progress.failed)}; "
          "re-run the command to retry them", file=sys.stderr)
    sys.exit(cli.EXIT_FAILED)
  if progress.later:
    print(f"[sweep] {progress.done} of {progress.total + progress.later} jobs finished, "
          f"{progress.later} left to a later run (--max_jobs or {jobs.DRAIN_SIGNAL.name}); "
          "the same command runs them")
    return
  print(f"[sweep] all {progress.total} jobs finished; report: "
        f"python -m experiments.report --sweep_dir={_SWEEP_DIR.value}")


if __name__ == "__main__":
  from experiments.training import runtime  # pylint: disable=ungrouped-imports
  runtime.maybe_reexec()  # Huge-page malloc for XLA CPU; see experiments/training/runtime.py.
  from absl import flags  # pylint: disable=ungrouped-imports

  from experiments import cli  # pylint: disable=ungrouped-imports

  _CONFIG = cli.define_config("config", os.path.join(jobs.ROOT, "configs", "table1.py"),
                              "Sweep config (with a `sweep` section).")
  _SWEEP_DIR = flags.DEFINE_string("sweep_dir", None, "Folder of the sweep's jobs.",
                                   required=True)
  _EXECUTOR = flags.DEFINE_enum("executor", "local", jobs.EXECUTORS, "Where jobs run.")
  _WORKERS = flags.DEFINE_integer("workers", 1, "Local worker processes (>= 1).")
  _RAY_ADDRESS = flags.DEFINE_string("ray_address", None,
                                     "Ray cluster address (default: start a local Ray).")
  _GPUS = flags.DEFINE_float("gpus_per_job", 0.0, "GPUs requested per Ray job.")
  _RETRIES = flags.DEFINE_integer("max_retries", 3, "Retries of a job whose worker died.")
  _RERUN_CHANGED = flags.DEFINE_boolean(
      "rerun_changed", False, "Move aside the folders of jobs whose settings changed "
      "(to FOLDER.replaced-TIME) and run those jobs again.")
  _DRY_RUN = flags.DEFINE_boolean(
      "dry_run", False, "Print what the sweep would do with each job (skip a finished one, "
      "write a missing job output, resume one from its checkpoints, start one, evaluate "
      "one on another's training, refuse a folder of other settings) and exit without training or writing anything.")
  _COMMIT_RESULTS = flags.DEFINE_boolean(
      "commit_results", False, "Commit each finished job's small files (config.json, "
      "eval.json, metrics.jsonl, its job outputs; never checkpoints) to the git repository "
      "holding SWEEP_DIR as the job finishes (experiments/storage/results_git.py).")
  _REUSE_FROM = flags.DEFINE_list(
      "reuse_from", [], "Sweep folders (comma-separated) whose finished jobs are copied "
      "instead of trained again when a job of this sweep has the same settings and has "
      "not started (e.g. Table 3's sorted jobs from Table 1's randomized_sin_cos ones); "
      "the copy's reused_from.json names its source.")
  _ONLY = flags.DEFINE_list(
      "only", [], "Shell patterns over the jobs' names TASK/VARIANT (comma-separated, e.g. "
      "'stack_manipulation/*,*/rope+exp'): run (or --dry_run) only the jobs they match.")
  _MAX_JOBS = flags.DEFINE_integer(
      "max_jobs", None, "Train at most this many unfinished jobs (the first in the sweep's "
      "order; a job evaluated on another's training counts with it), then stop: the share "
      "of a long sweep that fits a session; the same command runs the next ones.")
  _REPORT_EVERY = flags.DEFINE_float(
      "report_every", jobs.REPORT_EVERY, "Minutes between progress lines while jobs "
      "train (count, ETA, each running job's step); 0: only when a job starts or ends.")
  cli.run(main)
