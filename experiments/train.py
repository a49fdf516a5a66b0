"""Train and evaluate one (task, encoding) run.

  python -m experiments.train --task=reverse_string --pe=randomized_relative \
      [--config=configs/default.py] [--config.training.steps=...] [--workdir=DIR]

--task and --pe override the config. Running the same command again with the
same --workdir resumes from the last checkpoint. Exit codes: 0 done; 2 bad input
(unknown flag, config key or name, impossible setting, a workdir holding another
run), one line on stderr before anything compiles or any file is written; 1 the
run failed (operating-system error, damaged file, workdir in use, non-finite
loss), one line; 130 Ctrl-C, after saving a checkpoint at the current step.
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

  from experiments import checkpoints  # pylint: disable=import-outside-toplevel
  from experiments import compile_cache  # pylint: disable=import-outside-toplevel
  from experiments import io_utils  # pylint: disable=import-outside-toplevel
  from experiments import loop  # pylint: disable=import-outside-toplevel
  from experiments import results  # pylint: disable=import-outside-toplevel
  from experiments import stopping  # pylint: disable=import-outside-toplevel
  from experiments import validation  # pylint: disable=import-outside-toplevel
  from experiments import workdir as workdir_lib  # pylint: disable=import-outside-toplevel

  config = _CONFIG.value
  try:
    if _TASK.value is not None:
      config.task = _TASK.value
    if _PE.value is not None:
      config.model.pe = _PE.value
    validation.validate(config, jax.device_count())
    cli.check_shadowed(config, sys.argv)
    workdir = _WORKDIR.value or os.path.join(
        "runs", f"{config.task}-{config.model.pe}-seed{config.seed}")
    cli.check_folder(workdir, "workdir")
  except (ValueError, TypeError) as e:
    cli.fail(cli.one_line(e))
  try:
    compile_cache.enable(config.compilation_cache)
  except OSError as e:
    cli.fail(f"cannot use the compilation cache: {cli.one_line(e)}")
  print(f"task {config.task}, model {config.model.name}, encoding {config.model.pe} "
        f"({config.model.compat} semantics), "
        f"{config.training.steps} steps on {jax.device_count()} {jax.default_backend()} "
        f"device(s); writing to {workdir}", flush=True)
  try:
    result = loop.train_and_evaluate(config, workdir)
  except ValueError as e:
    cli.fail(cli.one_line(e))
  except stopping.Interrupted as e:
    print(f"interrupted: {e}", file=sys.stderr, flush=True)
    sys.exit(e.exit_code)
  except (workdir_lib.WorkdirBusy, loop.NonFiniteLossError, io_utils.CorruptFileError,
          checkpoints.StorageError, OSError) as e:
    cli.fail(cli.one_line(e), cli.EXIT_FAILED)
  print(results.summary_table(result))
  kind = "accuracies per split and group" if "splits" in result else "per-length accuracies"
  print(f"{kind}: {os.path.join(workdir, 'eval.json')}")
  print(compile_cache.summary())


if __name__ == "__main__":
  from experiments import runtime  # pylint: disable=ungrouped-imports
  runtime.maybe_reexec()  # Huge-page malloc for XLA CPU; see experiments/runtime.py.
  cli.run(main)
