"""Figure 2 of Ruoss et al. (2023): accuracy on unseen lengths against training time,
randomized relative trained on short sequences against classic relative trained on long
ones (the paper: missing_duplicate_string, lengths up to 40 against up to 500; test
accuracy averaged over lengths 41..500 for both; 168.4 against 22.1 steps/s on a V100,
above 90% 35.4 times sooner).

  python -m experiments.sweep --config=configs/figure2.py:scale=small --sweep_dir=runs/figure2_small
  python -m experiments.report --sweep_dir=runs/figure2_small   # figure2.md, figure2.png
  python -m experiments.sweep --config=configs/figure2.py --sweep_dir=runs/figure2   # full

Variants: randomized_relative_N40 and relative_N500 (small: N8 and N24). Both evaluate
the same lengths (evaluation.min_length = the short model's longest training length
+ 1) every `evaluation.every_steps` steps during training; each evaluation is a record
of metrics.jsonl with the training seconds so far (evaluation excluded, compiling
included). The report (`sweep.report = "figure2"`) draws the mean accuracy over those
lengths against training seconds, one curve per model (mean over seeds, band ± std),
and tabulates steps/s and the seconds each needs to reach given accuracies.

Full scale: the paper's protocol (configs/default.py, compat="release"), 10 seeds x 3
learning rates, evaluation every 10,000 steps on 100 sequences per length.
Small scale (configs/scales.py): lengths up to 8 against up to 24, test lengths 9..24,
1,500 steps, evaluation every 100 steps on 32 sequences per length, 3 seeds; at most 4
training programs each (the long model's steps then cost what its lengths cost, not
its longest length's).
"""
import ml_collections

from configs import default
from configs import scales
from configs import table1

SCALES = scales.SCALES


def variants(short, long):
  return (
      (f"randomized_relative_N{short}",
       {"model.pe": "randomized_relative", "training.max_length": short}),
      (f"relative_N{long}", {"model.pe": "relative", "training.max_length": long}),
  )


def get_config(arg=None):
  scale = scales.parse(arg)
  # The paper's protocol as configs/table1.py: compat="release", 10 seeds x 3 rates.
  config = table1.get_config()
  config.sweep = ml_collections.ConfigDict()
  config.sweep.tasks = ("missing_duplicate_string",)
  config.sweep.encodings = ()
  config.sweep.variants = variants(40, 500)
  config.sweep.report = "figure2"
  config.evaluation.update(min_length=41, every_steps=10_000, periodic_batch_size=100)
  if scale == "small":
    scales.apply_small(config)
    config.sweep.variants = variants(8, 24)
    config.training.update(steps=1500, max_programs=4, checkpoint_every=500)
    config.evaluation.update(min_length=9, every_steps=100, periodic_batch_size=32)
  elif scale in scales.CPU_SCALES:
    scales.apply(config, scale)
    config.sweep.variants = variants(scales.CPU_MAX_LENGTH, scales.CPU_TEST_LENGTH)
    config.evaluation.update(min_length=scales.CPU_MAX_LENGTH + 1, every_steps=500)
    # The figure follows each run to its last step, on unseen lengths only (cpu_lite
    # stops a run where learned, which reads the training lengths).
    config.training.stop_when_learned = 0.0
  return config
