"""Reproduce Table 1 of Ruoss et al. (2023) with the release's semantics.

  python -m experiments.sweep --config=configs/table1.py --sweep_dir=runs/table1
  python -m experiments.sweep --config=configs/table1.py:scale=small --sweep_dir=runs/small

Full scale: 15 tasks x the 11 encodings of Table 1, each job a grid of
10 seeds x 3 learning rates trained together, 2,000,000 steps, lengths 1..40,
test lengths 41..500, L = 2048, compat="release".
Small scale (a CPU in minutes): 3 tasks x 4 encodings, 2 seeds x 1 learning
rate, a 2-layer model, 1,000 steps on lengths 1..10, test lengths 11..30.
CPU scale (configs/scales.py; about an hour a job of 3 seeds on a 2-core CPU): the seven
tasks of scales.CPU_TASKS x sin_cos, relative, rope and their randomized twins, the
paper's model at the protocol where it learns the training lengths.

  python -m experiments.sweep --config=configs/table1.py:scale=cpu --sweep_dir=results/table1_cpu
"""
import ml_collections

from configs import default
from configs import scales

PAPER_ENCODINGS = [
    "none", "sin_cos", "relative", "alibi", "rope", "learned",
    "randomized_sin_cos", "randomized_relative", "randomized_alibi", "randomized_rope",
    "randomized_learned",
]
PAPER_TASKS = [
    "even_pairs", "modular_arithmetic", "parity_check", "cycle_navigation",
    "stack_manipulation", "reverse_string", "modular_arithmetic_brackets", "solve_equation",
    "duplicate_string", "missing_duplicate_string", "odds_first", "binary_addition",
    "binary_multiplication", "compute_sqrt", "bucket_sort",
]
SCALES = scales.SCALES
# The Table 1 core of the cpu scale: three families and their randomized twins.
CPU_ENCODINGS = ("sin_cos", "relative", "rope",
                 "randomized_sin_cos", "randomized_relative", "randomized_rope")


def get_config(arg=None):
  scale = scales.parse(arg)
  config = default.get_config()
  config.model.compat = "release"
  config.grid.seeds = tuple(range(10))
  config.grid.learning_rates = (1e-4, 3e-4, 5e-4)
  config.sweep = ml_collections.ConfigDict()
  config.sweep.tasks = tuple(PAPER_TASKS)
  config.sweep.encodings = tuple(PAPER_ENCODINGS)
  config.progress = False
  if scale == "small":
    config.sweep.tasks = ("even_pairs", "reverse_string", "missing_duplicate_string")
    config.sweep.encodings = ("sin_cos", "relative", "randomized_sin_cos", "randomized_relative")
    config.grid.seeds = (0, 1)
    config.grid.learning_rates = (1e-3,)
    config.model.num_layers = 2
    config.model.max_position = 256
    config.training.update(steps=1000, batch_size=64, max_length=10, log_every=250,
                           checkpoint_every=500)
    config.evaluation.update(max_length=30, batch_size=64, max_buckets=6)
  elif scale in scales.CPU_SCALES:
    config.sweep.tasks = scales.CPU_TASKS
    config.sweep.encodings = CPU_ENCODINGS
    scales.apply(config, scale)
  return config
