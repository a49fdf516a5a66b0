"""The paper's settings (Ruoss et al. 2023, Appendix A).

  python -m experiments.train --task=reverse_string --pe=randomized_relative \
      --config=configs/default.py --workdir=runs/reverse_rr

Override any field on the command line, e.g. `--config.training.steps=10000`.
"""
import ml_collections


def get_config(arg=None):
  del arg
  config = ml_collections.ConfigDict()
  config.task = "reverse_string"
  config.seed = 0  # Parameters, positions and dropout.
  config.data_seed = -1  # Training batches; -1: same as seed.

  config.model = ml_collections.ConfigDict()
  config.model.name = "encoder"  # randomized_pe.models.names().
  # An encoding of randomized_pe.families.names(): a family (classic positions 0..T-1)
  # or randomized_<family> (sorted random positions from [0, max_position)).
  config.model.pe = "randomized_relative"
  config.model.num_layers = 5
  config.model.num_heads = 8
  config.model.d_model = 64
  config.model.widening_factor = 4
  config.model.dropout_rate = 0.1
  config.model.emb_init_scale = 0.02
  config.model.max_position = 2048  # L.
  config.model.max_timescale = 10_000.0
  config.model.learned_init_scale = 1.0
  config.model.compat = "paper"  # Or "release" (docs/release.md).
  # log-n attention scaling (Su Jianlin; docs/su.md): every attention logit times
  # log(n) / log(m), n the sequence's true number of tokens, m the reference length
  # (0: the longest training sequence in tokens, input plus output).
  config.model.log_n_scaling = False
  config.model.log_n_reference = 0
  config.model.log_n_scale_bias = False  # Also scale ALiBi's bias (Su scales Q K^T only).
  # Sampler equal_mean_beta (docs/su.md): spans M * u, u ~ Beta with mean T / M and
  # concentration a + b; M = 0: the longest evaluation sequence in tokens.
  config.model.beta_max_length = 0
  config.model.beta_concentration = 1.0

  config.training = ml_collections.ConfigDict()
  config.training.steps = 2_000_000
  config.training.batch_size = 128
  config.training.learning_rate = 1e-4
  # experiments.training.steps.OPTIMIZERS: "adam" (the paper), "adamw" (with weight_decay), "sgd".
  config.training.optimizer = "adam"
  config.training.weight_decay = 0.0
  config.training.grad_clip_norm = 1.0
  # experiments.training.steps.SCHEDULES: "constant" (the paper's), "warmup_cosine" (linear
  # warm-up over lr_warmup_steps, then a cosine down to 0 at lr_decay_steps).
  config.training.lr_schedule = "constant"
  config.training.lr_warmup_steps = 0
  config.training.lr_decay_steps = 0
  config.training.min_length = 1  # Each step draws one length uniformly from
  config.training.max_length = 40  # [min_length, max_length] for the whole batch.
  config.training.log_every = 1000
  # Stop at the first evaluation during training (evaluation.every_steps) at which the
  # seeds of some learning rate average at least this accuracy on the training lengths
  # (0 < A <= 1), and evaluate there; 0: train all `steps`. The models it stops with are
  # those of the run without it at that step (experiments/training/learned.py).
  config.training.stop_when_learned = 0.0
  config.training.checkpoint_every = 10_000
  config.training.checkpoints_to_keep = 2
  config.training.prefetch = 4  # Batches generated ahead by a background thread.
  # Training programs: 0 compiles one per training length (the paper's exact shapes);
  # N > 0 pads each batch to one of at most N bucket sizes (the same loss and updates,
  # fewer compilations; experiments/training/data.py). 0 here because of the figures of
  # `python -m experiments.benchmark --sections=buckets` (this model, lengths 1..40, a
  # 2-core CPU; docs/benchmark.md): 8 programs compile in 16-22% of the exact time but
  # step 8-13.5% slower, 4 programs in 8-11% and 20-21% slower; over the paper's 2M steps
  # (about 12 days at 1.9 steps/s) the slower steps cost far more than the 7-25 minutes of
  # compiling saved. Short CPU runs gain (configs/scales.py, configs/demo.py).
  config.training.max_programs = 0
  # The position sampler of training (randomized_pe.samplers.names(), e.g. "unsorted"
  # for the paper's Table 3); "": the encoding's own (arange, or randomized for
  # randomized_<family>).
  config.training.positions = ""

  config.evaluation = ml_collections.ConfigDict()
  config.evaluation.min_length = 1
  config.evaluation.max_length = 500
  config.evaluation.batch_size = 500  # One batch per length.
  config.evaluation.seed = 1234
  # The position sampler of evaluation, e.g. "evenly_spaced"; "": the training
  # sampler's evaluation default (for the built-in samplers: the training sampler).
  config.evaluation.positions = ""
  config.evaluation.max_buckets = 16  # Programs compiled for the length range.
  # Evaluation during training every this many steps (0: only at the end), each a
  # record of metrics.jsonl with the training seconds so far (the paper's Figure 2),
  # with this many sequences per length (0: batch_size).
  config.evaluation.every_steps = 0
  config.evaluation.periodic_batch_size = 0
  # Sub-batches keep attention logits (chunk x heads x T x T floats) under this size.
  config.evaluation.max_logits = 2**27

  # A grid of models trained together in one program (seeds x learning rates),
  # all on the same batches; empty lists mean the single seed / learning rate.
  config.grid = ml_collections.ConfigDict()
  # Tuples, so that the command line can set them: --config.grid.seeds='(0,1,2)'.
  config.grid.seeds = ()
  config.grid.learning_rates = ()
  # How the models run in the program: "vmap" (side by side, as batch axes) or "loop" (one
  # after another, each with one model's shapes: faster per model on a CPU);
  # experiments/training/members.py. Part of a run's identity (floats differ by ~1e-6).
  config.grid.layout = "vmap"

  config.progress = True  # tqdm bar.
  # Folder of JAX's persistent compilation cache, or "off"; "": the environment's
  # RANDOMIZED_PE_COMPILATION_CACHE, else ~/.cache/randomized_pe/jax
  # (experiments/training/compile_cache.py). Changes speed, never results.
  config.compilation_cache = ""
  return config
