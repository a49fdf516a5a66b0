"""A CPU-sized run that shows length generalization in minutes (`make demo`).

  python -m experiments.train --config=configs/demo.py --workdir=runs/demo

Trains a 2-layer model on reverse_string lengths 1..10 and evaluates lengths
1..30, so the unseen lengths 11..30 test length generalization.
"""
from configs import default


def get_config(arg=None):
  config = default.get_config(arg)
  config.model.num_layers = 2
  config.model.max_position = 256
  config.training.steps = 6000
  config.training.batch_size = 64
  config.training.learning_rate = 1e-3
  config.training.max_length = 10
  config.training.log_every = 250
  config.training.checkpoint_every = 1000
  config.evaluation.max_length = 30
  config.evaluation.batch_size = 128
  config.evaluation.max_buckets = 6
  return config
