"""Train and evaluate one (task, encoding) run.

  python -m experiments.train --task=reverse_string --pe=randomized_relative \
      [--config=configs/default.py] [--config.training.steps=...] [--workdir=DIR]

--task and --pe override the config. Running the same command again with the
same --workdir resumes from the last checkpoint. Bad input (unknown names,
impossible settings) exits with code 2 and a one-line message, before anything
compiles or any file is written.
"""
import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "configs", "default.py"),
    "ml_collections config file.")
_TASK = flags.DEFINE_string("task", None, "Task name (overrides config.task).")
_PE = flags.DEFINE_string("pe", None, "Positional encoding (overrides config.model.pe).")
_WORKDIR = flags.DEFINE_string("workdir", None,
                               "Output folder (default: runs/TASK-PE-seedSEED).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO.
  import jax  # pylint: disable=import-outside-toplevel

  from experiments import compile_cache  # pylint: disable=import-outside-toplevel
  from experiments import loop  # pylint: disable=import-outside-toplevel
  from experiments import results  # pylint: disable=import-outside-toplevel
  from experiments import validation  # pylint: disable=import-outside-toplevel

  config = _CONFIG.value
  if _TASK.value is not None:
    config.task = _TASK.value
  if _PE.value is not None:
    config.model.pe = _PE.value
  try:
    validation.validate(config, jax.device_count())
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  workdir = _WORKDIR.value or os.path.join(
      "runs", f"{config.task}-{config.model.pe}-seed{config.seed}")
  print(f"task {config.task}, model {config.model.name}, encoding {config.model.pe} "
        f"({config.model.compat} semantics), "
        f"{config.training.steps} steps on {jax.device_count()} {jax.default_backend()} "
        f"device(s); writing to {workdir}", flush=True)
  try:
    compile_cache.enable(config.compilation_cache)
  except OSError as e:
    print(f"error: cannot use the compilation cache: {e}", file=sys.stderr)
    sys.exit(2)
  try:
    result = loop.train_and_evaluate(config, workdir)
  except (ValueError, loop.NonFiniteLossError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2 if isinstance(e, ValueError) else 1)
  print(results.summary_table(result))
  print(f"per-length accuracies: {os.path.join(workdir, 'eval.json')}")
  print(compile_cache.summary())


if __name__ == "__main__":
  from experiments import runtime  # pylint: disable=ungrouped-imports
  runtime.maybe_reexec()  # Huge-page malloc for XLA CPU; see experiments/runtime.py.
  app.run(main)
