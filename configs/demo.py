"""A CPU-sized run that shows length generalization in about a minute (`make demo`).

  python -m experiments.train --config=configs/demo.py --workdir=runs/demo

Trains a 2-layer model on reverse_string lengths 1..10 and evaluates lengths
1..30, so the unseen lengths 11..30 test length generalization.

Sized for a cold start (nothing in the compilation cache) of at most about 60 s on a
slow 2-core CPU, where compiling dominates: each training or evaluation program of
even this small model takes several seconds to compile there, the init program as
long again, and a step ~15 ms. Measured with `python -m experiments.benchmark
--sections=buckets --bucket_parts=demo` and by hand (docs/benchmark.md), at load 1.5-2.5:

  the previous demo (batch 64, dropout 0.1, 6000 steps, one program per training
  length, 6 evaluation buckets: 23 programs): 231-247 s cold, 138 s warm,
  98.4% on lengths 1-10 and 78.3% on 11-30;
  this one (9 programs): 2,500 steps took 58.5-61 s cold, ~50 s warm (93.9% and 73.7%
  for seed 0); 2,200 steps, which leave room on a slower day, ~47 s warm, with 90.3% /
  70.1%, 91.9% / 68.9% and 93.5% / 70.8% for seeds 0, 1, 2 (chance is 50%). Under a
  concurrent sweep (load 4) the cold 2,200-step run took 92 s. Since batches stopped
  waiting for the device (data keys made in blocks: ~69 steps/s instead of ~58), the
  2,200 steps take 54.6-56.4 s cold and 39.8 s warm; 2,000 steps would save ~3 s but
  lost 2.4 points of unseen-length accuracy over seeds 0-2 (89.9% / 67.5% on average).

What each change buys, and what was tried instead:
  - training.max_programs = 1: every batch padded to the longest length (20 tokens);
    padded steps give the same loss and updates as unpadded ones. One compile instead
    of ten saves far more than the padding costs over 2,500 short steps (2 programs:
    ~20% cheaper steps, one more compile; no faster cold).
  - evaluation.max_buckets = 1: one evaluation program for lengths 1..30 (was 6).
  - batch 32 and dropout 0: ~65 steps/s instead of ~20-25 (batch 64, dropout 0.1);
    a step has a fixed cost of ~6 ms here, so batch 16 gained less than it lost.
  - 2,200 steps at learning rate 1e-3: about the most steps that fit. 2e-3 was worse over
    three seeds at 2,500 steps (88.9% / 70.0% on average against 92.3% / 71.7%), and d_model 32
    (twice the steps/s) levelled off near 92% / 71% even with 6,000 steps; a
    narrower feed-forward layer (widening_factor 2) was no faster.
  - checkpoint only at the end: the whole run takes about a minute.
"""
from configs import default


def get_config(arg=None):
  config = default.get_config(arg)
  config.model.num_layers = 2
  config.model.max_position = 256
  config.model.dropout_rate = 0.0
  config.training.steps = 2200
  config.training.batch_size = 32
  config.training.learning_rate = 1e-3
  config.training.max_length = 10
  config.training.max_programs = 1
  config.training.log_every = 250
  config.training.checkpoint_every = 2200
  config.evaluation.max_length = 30
  config.evaluation.batch_size = 128
  config.evaluation.max_buckets = 1
  return config
