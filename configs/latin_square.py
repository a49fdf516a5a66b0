"""Ito et al. (2024) on the Latin Square Task: one encoding, every seed in one program.

  python -m experiments.train --config=configs/latin_square.py:encoding=learn,sigma=0.2 \
      --workdir=runs/latin_square/learn-0.2
  python -m experiments.train \
      --config=configs/latin_square.py:encoding=2d_fixed,scale=small,seeds=2 \
      --workdir=runs/latin_square_small/2d_fixed

The argument is comma-separated key=value pairs (all optional):
  encoding   an encoding of `randomized_pe.models.ito.names()` (default 2d_fixed)
  sigma      σ of the `learn` encoding (default 1.0, the original's; the paper's headline
             encoding is learn with sigma=0.2)
  scale      full: the paper's protocol, 4,000 epochs and the original's 15 seeds;
             small: 200 epochs (12,800 steps, where the paper's σ ordering is already
             settled, SPEC-EXTENSIONS B7.3a) and 1 seed, for a CPU
  seeds      how many of the original's seeds, in its order (default: the scale's)
  epochs     training epochs (default: the scale's)
  optimizer  adam (default; the paper's main results), adamw (Tables 5-6: weight decay
             0.1 unless weight_decay= says otherwise) or sgd (Table 4: learning rate 1e-3
             unless lr= says otherwise)
  lr, weight_decay   override the optimizer's defaults
Any field can still be overridden with --config.X=..., e.g. --config.training.steps.
training.steps, log_every and checkpoint_every are counted for batch 128 (64 steps an
epoch): a run with another --config.training.batch_size must set them too.

The original's protocol (SPEC-EXTENSIONS B4): batch 128, shuffled epochs with the last
partial batch kept (8,100 puzzles: 63 batches of 128 and one of 36, 64 steps an
epoch), Adam at 1e-4 with PyTorch's betas and eps, no schedule, no clipping, cross-entropy
of the class read at the last cell. Every model of the grid reads the same epoch orders
(`data_seed`); the original's seed also set its order. Metrics: training loss and
accuracy averaged over each epoch (the original's "train accuracy": the mean of the
minibatch accuracies), test (900 held-out) and validation (108 human-designed) accuracy
overall and per condition every `evaluation.every_epochs` epochs, and at the end train,
test and validation in eval.json. Epoch k here is k complete passes; the original's
record "epoch k" came after k + 1 passes (its loop starts at epoch 0).
"""
import math

import ml_collections

from configs import default
from tasks.latin_square import data as lst

# The seeds of the original's 15 runs per configuration (its README; SPEC-EXTENSIONS B4).
SEEDS = (2235, 6312, 6068, 9742, 8880, 2197, 669, 6256, 3309, 2541, 8643, 7785, 195, 6914, 29)
TRAIN_PUZZLES = len(lst.CONDITIONS) * lst.GENERATED_ROWS_PER_CONDITION - lst.HELDOUT_ROWS
SCALES = {
    # epochs, seeds, evaluation and checkpoint cadence in epochs.
    "full": dict(epochs=4000, seeds=15, evaluate_every=200, checkpoint_every=50),
    "small": dict(epochs=200, seeds=1, evaluate_every=10, checkpoint_every=10),
}
OPTIMIZERS = {  # name -> (learning rate, weight decay) of the paper's runs with it.
    "adam": (1e-4, 0.0), "adamw": (1e-4, 0.1), "sgd": (1e-3, 0.0),
}
_KEYS = ("encoding", "sigma", "scale", "seeds", "epochs", "optimizer", "lr", "weight_decay")


def _parse(arg):
  settings = {}
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or key not in _KEYS:
      raise ValueError(f"bad config argument {item!r}: expected key=value with key one of "
                       f"{', '.join(_KEYS)}")
    settings[key] = value.strip()
  return settings


def get_config(arg=None):
  settings = _parse(arg)
  scale = settings.get("scale", "full")
  if scale not in SCALES:
    raise ValueError(f"unknown scale {scale!r}; valid choices: {', '.join(SCALES)}")
  plan = SCALES[scale]
  optimizer = settings.get("optimizer", "adam")
  if optimizer not in OPTIMIZERS:
    raise ValueError(f"unknown optimizer {optimizer!r}; valid choices: {', '.join(OPTIMIZERS)}")
  rate, decay = OPTIMIZERS[optimizer]
  epochs = int(settings.get("epochs", plan["epochs"]))
  num_seeds = int(settings.get("seeds", plan["seeds"]))
  if not 1 <= num_seeds <= len(SEEDS):
    raise ValueError(f"seeds={num_seeds}: the original has {len(SEEDS)} seeds")

  config = default.get_config()
  config.task = "latin_square"  # tasks.datasets.DATASETS: shuffled epochs of 8,100.
  config.seed = SEEDS[0]  # Unused with grid.seeds set, but keeps the default workdir name apt.
  config.data_seed = 0  # The epoch orders, shared by every model of the grid.

  # Ito's Transformer (randomized_pe/models/ito.py; docs/ito.md), the original's values.
  config.model = ml_collections.ConfigDict()
  config.model.name = "ito"
  config.model.pe = settings.get("encoding", "2d_fixed")
  config.model.pe_sigma = float(settings.get("sigma", 1.0))
  config.model.grid_size = 4
  config.model.num_layers = 4
  config.model.num_heads = 1
  config.model.d_model = 160
  config.model.mlp_size = 640
  config.model.fixed_pe_dropout = 0.1  # The original's Dropout(0.1) on h + PE (1d/2d).
  config.model.dropout_at_evaluation = False  # The original evaluated with it on.
  config.model.relative_causal = True
  config.model.c_nope_logit_scale = 100.0
  config.model.max_position = 16  # L of randomized_2d.
  config.model.max_timescale = 10_000.0
  config.model.compat = "paper"  # Unused (ito has no other); kept as the configs of results were.

  steps_per_epoch = math.ceil(TRAIN_PUZZLES / 128)
  t = config.training
  del t["min_length"], t["max_length"]  # A dataset has no lengths.
  t.batch_size = 128
  t.steps = epochs * steps_per_epoch
  t.learning_rate = float(settings.get("lr", rate))
  t.optimizer = optimizer
  t.weight_decay = float(settings.get("weight_decay", decay))
  t.grad_clip_norm = 0.0  # None.
  t.log_every = steps_per_epoch  # One record per epoch: the original's train accuracy.
  t.checkpoint_every = plan["checkpoint_every"] * steps_per_epoch

  e = config.evaluation
  del e["min_length"], e["max_length"]
  e.batch_size = 128  # Chunks of the splits: 108, 900 and 8,100 puzzles.
  e.every_epochs = plan["evaluate_every"]  # 0: only at the end.
  e.splits = ("test", "validation")  # Every every_epochs epochs (metrics.jsonl).
  e.final_splits = ("train", "test", "validation")  # At the end (eval.json).

  config.grid.seeds = SEEDS[:num_seeds]
  config.grid.learning_rates = ()
  return config
