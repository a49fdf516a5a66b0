"""The `scale=small` protocol shared by the experiment configs: sized for a 2-core CPU.

A 2-layer model (d_model 32, 4 heads), 500 steps of batch 32 on lengths 1..8, test
lengths 9..24, L = 128, one padded training program (max_programs=1) and two evaluation
programs: at this size compiling, not training, dominates a job, so few programs matter
more than short padded sequences. Measured on this 2-core CPU (configs/su.py): about 22 s
a job with a 3-seed grid on an idle machine, 71 s at load 5.

`apply(config)` sets these on a config of configs/default.py; the grid is the caller's.
"""
import ml_collections

SCALES = ("full", "small")
SEEDS = (0, 1, 2)
LEARNING_RATE = 1e-3


def scale(arg) -> str:
  """The scale a config argument asks for ("scale=small"; default "full"); a one-line
  ValueError naming the valid scales otherwise."""
  value = (arg or "scale=full").split("=")[-1]
  if value not in SCALES:
    raise ValueError(f"unknown scale {value!r}; valid choices: {', '.join(SCALES)}")
  return value


def apply(config: ml_collections.ConfigDict, seeds=SEEDS) -> ml_collections.ConfigDict:
  config.grid.seeds = tuple(seeds)
  config.grid.learning_rates = (LEARNING_RATE,)
  config.model.update(num_layers=2, num_heads=4, d_model=32, max_position=128)
  config.training.update(steps=500, batch_size=32, max_length=8, log_every=100,
                         checkpoint_every=250, max_programs=1)
  config.evaluation.update(max_length=24, batch_size=64, max_buckets=2)
  return config
