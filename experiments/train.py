"""Train and evaluate one (task, encoding) run.

  python -m experiments.train --task=reverse_string --pe=randomized_relative \
      [--config=configs/default.py] [--config.training.steps=...] [--workdir=DIR]

--task and --pe override the config. Running the same command again with the
same --workdir resumes from the last checkpoint. Exit codes: 0 done; 2 bad input
(unknown flag, config key or name, impossible setting, a workdir holding another
run), one line on stderr before anything compiles or any file is written; 1 the
run failed (operating-system error, damaged file, workdir in use, non-finite
loss, out of memory, a library's failure), one line; the libraries' messages and the
traceback go to WORKDIR/library.log, or to stderr with RANDOMIZED_PE_DEBUG=1; 130
Ctrl-C (or SIGTERM), after saving a checkpoint at the current step (before the first
step when it came while the model was built and compiled: nothing new to save; during
the final evaluation, between two lengths, without eval.json); a second one more than a
second later stops at once, without saving.
"""
import os
import sys

from absl import flags
from absl import logging

from experiments import cli

_CONFIG = cli.define_config(
    "config", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "configs", "default.py"),
    "ml_collections config file.")
_TASK = flags.DEFINE_string("task", None, "Task name (overrides config.task).")
_PE = flags.DEFINE_string("pe", None, "Positional encoding (overrides config.model.pe).")
_WORKDIR = flags.DEFINE_string("workdir", None,
                               "Output folder (default: runs/TASK-PE-seedSEED).")


def main(argv):
  del argv  # cli.parse_flags refuses extra arguments.
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO.
  import jax  # pylint: disable=import-outside-toplevel

  from experiments.storage import checkpoints  # pylint: disable=import-outside-toplevel
  from experiments.training import compile_cache  # pylint: disable=import-outside-toplevel
  from experiments.storage import io_utils  # pylint: disable=import-outside-toplevel
  from experiments.training import loop  # pylint: disable=import-outside-toplevel
  from experiments.training import results  # pylint: disable=import-outside-toplevel
  from experiments.training import stopping  # pylint: disable=import-outside-toplevel
  from experiments.training import validation  # pylint: disable=import-outside-toplevel
  from experiments.storage import workdir as workdir_lib  # pylint: disable=import-outside-toplevel

  config = _CONFIG.value
  # SIGINT and SIGTERM are stop requests from here on, acted on by the training loop
  # (experiments/training/stopping.py): a KeyboardInterrupt raised inside a library (a
  # lock's release in orbax, XLA's compilation, jax's gc callback) failed, crashed or
  # was swallowed.
  with stopping.graceful():
    try:
      if _TASK.value is not None:
        config.task = _TASK.value
      if _PE.value is not None:
        config.model.pe = _PE.value
      validated = validation.validate(config, jax.device_count())
      model = validated[1]
      validation.check_fits(config, validated)
      cli.check_shadowed(config, sys.argv)
      workdir = _WORKDIR.value or os.path.join(
          "runs", f"{config.task}-{model.label}-seed{config.seed}")
      cli.check_folder(workdir, "workdir")
    except (ValueError, TypeError) as e:
      cli.fail(cli.one_line(e))
    try:
      compile_cache.enable(config.compilation_cache)
    except OSError as e:
      cli.fail(f"cannot use the compilation cache: {cli.one_line(e)}")
    stop = config.training.get("stop_when_learned", 0)
    steps = (f"at most {config.training.steps} steps (stopping when learned: "
             f"{stop:g} on the training lengths)" if stop else f"{config.training.steps} steps")
    print(f"task {config.task}, {model.description}, {steps} on {jax.device_count()} "
          f"{jax.default_backend()} device(s); writing to {workdir}", flush=True)
    log_path = os.path.join(os.path.abspath(workdir), cli.LIBRARY_LOG)
    with cli.library_output_to(log_path) as library_log:

      def details() -> str:
        if library_log is not None and library_log.used:
          return f" (the libraries' messages: {log_path})"
        return "" if library_log is None else f" (set {cli.DEBUG_ENV}=1 for a traceback)"

      try:
        result = loop.train_and_evaluate(config, workdir, validated)
      except ValueError as e:
        cli.fail(cli.one_line(e))
      except stopping.Interrupted as e:
        print(f"interrupted: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
      except (workdir_lib.WorkdirBusy, loop.NonFiniteLossError,
              io_utils.CorruptFileError) as e:
        if library_log is None:  # Debug mode: the traceback too.
          cli.log_traceback(None, e)
        cli.fail(cli.one_line(e) + (details() if library_log is None or library_log.used
                                    else ""), cli.EXIT_FAILED)
      except (checkpoints.StorageError, OSError) as e:
        # A storage failure's details (the library's own error, chained to ours) go to the
        # log before the line is printed, so the line points to them whether or not the
        # library's threads have printed theirs by then (they may still be writing). Not
        # before the run's folder exists: the log would go to the terminal.
        if library_log is None or os.path.isdir(workdir):
          cli.log_traceback(library_log, e)
        cli.fail(cli.one_line(e) + details(), cli.EXIT_FAILED)
      except MemoryError as e:
        cli.log_traceback(library_log, e)
        cli.fail(f"out of memory{': ' + cli.one_line(e) if str(e) else ''}; lower "
                 "training.batch_size, evaluation.batch_size or the model's size"
                 + details(), cli.EXIT_FAILED)
      except Exception as e:  # pylint: disable=broad-except
        cli.log_traceback(library_log, e)
        if "RESOURCE_EXHAUSTED" in str(e):
          cli.fail(f"out of device memory: {cli.one_line(e)[:300]}; lower training.batch_size, "
                   "evaluation.batch_size or the model's size" + details(), cli.EXIT_FAILED)
        cli.fail(f"{type(e).__name__}: {cli.one_line(e)[:500]}" + details(), cli.EXIT_FAILED)
    print(results.summary_table(result))
    kind = "accuracies per split and group" if "splits" in result else "per-length accuracies"
    print(f"{kind}: {os.path.join(workdir, 'eval.json')}")
    print(compile_cache.summary())


if __name__ == "__main__":
  from experiments.training import runtime  # pylint: disable=ungrouped-imports
  runtime.maybe_reexec()  # Huge-page malloc for XLA CPU; see experiments/training/runtime.py.
  cli.run(main)
