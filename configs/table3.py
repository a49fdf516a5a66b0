"""Table 3 of Ruoss et al. (2023): randomized sin/cos with and without sorting the
sampled positions (Appendix B.1, the paper's sanity check of the ordering).

  python -m experiments.sweep --config=configs/table3.py:scale=small --sweep_dir=runs/table3_small
  python -m experiments.report --sweep_dir=runs/table3_small   # table3.md, figures/TASK.png
  python -m experiments.sweep --config=configs/table3.py --sweep_dir=runs/table3   # full

Variants (one folder SWEEP_DIR/TASK/VARIANT each):
  sorted      randomized_sin_cos, the paper's method (its Table 1 column)
  unsorted    the same encoding fed `unsorted` positions: the sampled subset of
              [0, L) in random order, at training and (the training sampler's default)
              at evaluation
The report (`sweep.report = "table3"`) shows the max over seeds and learning rates of the
unseen-length accuracy, as the paper's Table 3 does, ours beside the paper's: the
unsorted column of Table 3 and the sorted one, which the paper takes from Table 1.

Full scale: the paper's protocol as configs/table1.py (15 tasks, compat="release",
10 seeds x 3 learning rates, 2,000,000 steps, lengths 1..40, test 41..500, L = 2048).
Small scale (configs/scales.py; minutes on a 2-core CPU): reverse_string, even_pairs and
missing_duplicate_string, 3 seeds x 1 learning rate, 1,000 steps.
"""
import ml_collections

from configs import scales
from configs import table1

SCALES = scales.SCALES
VARIANTS = (
    ("sorted", {"model.pe": "randomized_sin_cos"}),
    ("unsorted", {"model.pe": "randomized_sin_cos", "training.positions": "unsorted"}),
)
SMALL_TASKS = ("reverse_string", "even_pairs", "missing_duplicate_string")


def get_config(arg=None):
  scale = scales.parse(arg)
  # The paper's protocol as configs/table1.py: compat="release", 10 seeds x 3 rates.
  config = table1.get_config()
  config.sweep = ml_collections.ConfigDict()
  config.sweep.tasks = tuple(table1.PAPER_TASKS)
  config.sweep.encodings = ()
  config.sweep.variants = tuple((name, dict(overrides)) for name, overrides in VARIANTS)
  config.sweep.report = "table3"
  if scale == "small":
    scales.apply_small(config)
    config.sweep.tasks = SMALL_TASKS
    config.training.update(steps=1000, checkpoint_every=500)
  elif scale in scales.CPU_SCALES:
    config.sweep.tasks = scales.CPU_TASKS
    scales.apply(config, scale)
  return config
