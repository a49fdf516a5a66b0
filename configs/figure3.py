"""Figure 3 of Ruoss et al. (2023): randomized relative encodings over a sweep of the
maximum position L (Appendix B.1).

  python -m experiments.sweep --config=configs/figure3.py:scale=small --sweep_dir=runs/figure3_small
  python -m experiments.report --sweep_dir=runs/figure3_small   # figure3.md, figure3.png
  python -m experiments.sweep --config=configs/figure3.py --sweep_dir=runs/figure3   # full

One variant per L (folder SWEEP_DIR/TASK/L<value>), all randomized_relative. The report
(`sweep.report = "figure3"`) draws the unseen-length accuracy against L per task (mean
± std over seeds at the best learning rate, and the max, as in the paper's figure) and
tabulates it. The paper gives no numbers for this figure, only its reading: accuracy
"largely unaffected" by L on reverse_string and missing_duplicate_string as long as L
exceeds the longest test sequence and is not much larger.

Full scale: the paper's protocol (configs/default.py: 5 layers, 2,000,000 steps, lengths
1..40, test 41..500, compat="release" as configs/table1.py), L in 1024, 2048, 4096, 8192,
10 seeds x 3 learning rates. Small scale (configs/scales.py): test sequences up to 49
tokens (missing_duplicate_string at length 24), L in 64, 128, 256, 512, 1024: from just
above the longest test sequence to 20 times it (the paper's L spans 1-8 times its
longest test sequence of about 1,000 tokens), 3 seeds, 1,000 steps.
"""
import ml_collections

from configs import default
from configs import scales
from configs import table1

SCALES = scales.SCALES
TASKS = ("reverse_string", "missing_duplicate_string")
FULL_L = (1024, 2048, 4096, 8192)
SMALL_L = (64, 128, 256, 512, 1024)
# cpu: from just above the longest test sequence (161 tokens: missing_duplicate_string at
# 80, its lengths of scales.CPU_TASK_OVERRIDES; reverse_string's is 96) to 13x (21x).
CPU_L = (192, 256, 512, 1024, 2048)


def variants(values):
  return tuple((f"L{value}", {"model.max_position": value}) for value in values)


def get_config(arg=None):
  scale = scales.parse(arg)
  # The paper's protocol as configs/table1.py: compat="release", 10 seeds x 3 rates.
  config = table1.get_config()
  config.model.pe = "randomized_relative"
  config.sweep = ml_collections.ConfigDict()
  config.sweep.tasks = TASKS
  config.sweep.encodings = ()
  config.sweep.variants = variants(FULL_L)
  config.sweep.report = "figure3"
  if scale == "small":
    scales.apply_small(config)
    config.sweep.variants = variants(SMALL_L)
    config.training.update(steps=1000, checkpoint_every=500)
  elif scale in scales.CPU_SCALES:
    scales.apply(config, scale)
    config.sweep.variants = variants(CPU_L)
  return config
