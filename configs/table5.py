"""Reproduce Table 5 of Ruoss et al. (2023): geometric attention with directional encoding.

  python -m experiments.sweep --config=configs/table5.py --sweep_dir=runs/table5
  python -m experiments.sweep --config=configs/table5.py:scale=small --sweep_dir=runs/table5_small
  python -m experiments.report --sweep_dir=runs/table5_small

Table 5 (Appendix B.2) trains the encoder with NDR's geometric attention and directional
encoding (Csordás et al. 2022; no gating, no shared layers) on the 15 tasks and reports
the maximum and the mean ± std of the test score, next to the best of Table 1 / Table 4.
The paper gives one "Geometric" column; `geometric` is that model (positions 0..T-1),
`randomized_geometric` the same attention ordered by the distances between randomized
positions (not in the paper). docs/geometric.md says what is implemented and why.

Full scale: the protocol of configs/table1.py (15 tasks, 10 seeds x 3 learning rates,
2,000,000 steps, lengths 1..40, test lengths 41..500, L = 2048, compat="release"), so that
the results sit next to a Table 1 sweep like for like. Under compat="release" geometric
attention gets release items 3 and 4 like every attention encoding (dropout at
evaluation, no embedding dropout); items 1, 2 and 5 do not concern it (the release has
no geometric attention: one position draw per batch, shared by the layers).

Small scale (this 2-core CPU), sized like configs/su.py:scale=small: 6 tasks (with
modular_arithmetic, where the paper finds geometric attention best) x 3 encodings
(geometric, randomized_geometric and the paper's best, randomized_relative, as the
baseline trained alike) = 18 jobs, each a grid of 3 seeds x 1 learning rate (1e-3): a
2-layer model (d_model 32, 4 heads), 500 steps of batch 32 on lengths 1..8, test lengths
9..24, L = 128, one training program and two evaluation programs. Not yet timed; by the
su measurement (about 71 s a job, compilation included) some 20 minutes with --workers=1.
The report (`sweep.report = "table5"`) shows each encoding's max and mean ± std beside
the paper's Table 5 Geometric column and the best of its Tables 1 and 4.
"""
import ml_collections

from configs import scales
from configs import table1

ENCODINGS = ("geometric", "randomized_geometric")
SMALL_TASKS = ("modular_arithmetic", "even_pairs", "reverse_string", "missing_duplicate_string",
               "bucket_sort", "odds_first")
SMALL_BASELINES = ("randomized_relative",)
SCALES = scales.SCALES


def get_config(arg=None):
  scale = scales.parse(arg)
  config = table1.get_config("scale=full")  # The paper's protocol, compat="release".
  config.sweep = ml_collections.ConfigDict()
  config.sweep.tasks = tuple(table1.PAPER_TASKS)
  config.sweep.encodings = ENCODINGS
  config.sweep.report = "table5"
  if scale == "small":
    config.sweep.tasks = SMALL_TASKS
    config.sweep.encodings = ENCODINGS + SMALL_BASELINES
    scales.apply_small(config)
  elif scale in scales.CPU_SCALES:
    config.sweep.tasks = scales.CPU_TASKS
    scales.apply(config, scale)
  return config
