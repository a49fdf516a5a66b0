"""The learning-speed study behind `scale=cpu` (issue 25, docs/cpu_protocol.md).

  python -m experiments.sweep --config=configs/cpu_study.py --sweep_dir=results/cpu_study
  python -m experiments.report --sweep_dir=results/cpu_study

Which settings let both `relative` and `randomized_relative` learn the paper's seven
tasks with the largest randomized gains (>= 95% on the training lengths) on a 2-core CPU,
and does the paper's gain on unseen lengths show there? One job per (task, setting,
encoding), one seed each; every job evaluates every `evaluation.every_steps` steps, so
metrics.jsonl holds the learning curve (training-length and unseen-length accuracy
against steps and training seconds).

Settings (variant names SETTING-ENCODING):
  A  the paper's model (5 layers, d_model 64, 8 heads, dropout 0.1), lengths 1..12, test
     13..48, L = 256, batch 128, constant learning rate 5e-4 (DESIGN.md §10: learns
     missing_duplicate_string's training lengths by step 1,500), 6,000 steps.
  B  as A with a longer training range: lengths 1..20, test 21..80, L = 512 (the same
     ratios N : M : L as A), on missing_duplicate_string and reverse_string only: does the
     range of training lengths, rather than the steps, hold back the gain A does not
     show on missing_duplicate_string?
  C  as A with a learning-rate schedule instead of the constant rate: warm-up over 200
     steps to 1e-3, then a cosine down to 0 at step 4,000 (`training.lr_schedule`), on
     duplicate_string with randomized relative only (the slowest learner of the Table 1
     core: 82-87% on its training lengths at step 4,000 and 98% at 12,000 with the
     constant rate): does a decaying rate shorten the protocol?
     Answer (26 Nov 2026): no; 89.1% on the training lengths at step 4,000, as A at the
     same step (docs/cpu_protocol.md).
  D  as A with half the batch (64) for the same 6,000 steps, i.e. half A's arithmetic, on
     the same model: does the slowest learner need the steps or the examples?
     Answer (26 Nov 2026): the examples; 98.1% on the training lengths and 72.8% unseen at
     step 6,000, as A (97.4% / 72.8%) with half its arithmetic.
  E  D's batch on odds_first's randomized relative model for 12,000 steps (A's
     arithmetic of 6,000 steps; the Table 1 core needed 12,000 steps of batch 128 there).
  F  D's batch on missing_duplicate_string's randomized relative model at B's lengths
     for 12,000 steps (the Table 1 core's model did not learn its training lengths in
     6,000 steps of batch 128: 84.4%).
     Answers (26 Nov 2026): E learns about as at batch 128 per step (83.3% at 6,000 steps
     against A's 84.7%; 95.7% at 12,000); F does not learn (84.5%, unseen at chance),
     where B did at batch 128: half the batch is not free for every task
     (docs/cpu_protocol.md).
  D12, E12  D and E with seeds 1 and 2 (one grid each): do the other seeds agree?
     Answers (26 Nov 2026): for duplicate_string yes (97.7%, 94.5%); odds_first 93.8% and
     94.3% at 12,000 steps, a little below batch 128's grid (97.1%).
  G, H  smaller models for the cost (issue 25's 4 CPU-hours for the relative pair: the
     paper's model stopped when learned took 9.4), on the two slowest learners, whose
     randomized relative jobs were 37% of that cost: odds_first and duplicate_string at
     their `scale=cpu` protocol (12,000 steps; duplicate_string at batch 64), randomized
     relative, stopped when learned (`training.stop_when_learned=0.95`). G: 3 layers,
     d_model 48, 8 heads; H: 2 layers, d_model 64, 8 heads. A training step of batch 128
     on odds_first costs 1.37 and 1.43 GFLOP against the paper model's 4.10, and runs
     2.8 and 3.8 times as fast (17.5 and 23.8 steps/s against 6.2, alone on an idle 2-core
     AMD EPYC Zen 3, 30 Nov 2026): do they learn in as few steps? H at most 20,000
     steps (first run to 12,000, where odds_first had not learned, then trained on: the
     rate is constant, so the two parts are one 20,000-step run).
  I  H at twice the learning rate (1e-3): does the smaller model take a larger rate?
     Answers (30 Nov 2026): G and H learn duplicate_string at steps 11,000 and 10,000
     (96.3% / 69.8% and 95.9% / 72.1% unseen; the paper's model: 5,000-6,000), and
     odds_first more slowly: G 89.4% at 12,000, H 95.3% / 67.3% only at 20,000 (the
     paper's model: 95.8% at 12,000); I no sooner (odds_first 94.2% at 20,000,
     duplicate_string learned at 14,000). scale=cpu_lite
     takes H's model (docs/cpu_protocol.md).
Each setting is its own sweep into the same folder (its tasks differ):
  python -m experiments.sweep --config=configs/cpu_study.py:B --sweep_dir=results/cpu_study
Finished jobs' small files are committed under results/cpu_study/, so the sweep resumes
from a fresh clone; checkpoints are never committed (.gitignore).
"""
import ml_collections

from configs import default
from configs import scales

TASKS = ("reverse_string", "missing_duplicate_string", "duplicate_string",
         "stack_manipulation", "odds_first", "cycle_navigation", "bucket_sort")
ENCODINGS = ("relative", "randomized_relative")

_A = {
        "model.max_position": 256,
        "training.steps": 6000, "training.batch_size": 128,
        "training.learning_rate": 5e-4, "training.max_length": 12,
        "training.max_programs": 2, "training.log_every": 250,
        "training.checkpoint_every": 1000,
        "evaluation.max_length": 48, "evaluation.batch_size": 128,
        "evaluation.max_buckets": 4, "evaluation.every_steps": 1000,
        "evaluation.periodic_batch_size": 64,
}
# G, H, I: on scale=cpu's protocol (CPU_PROTOCOL: 12,000 steps on these tasks), H and I
# trained on up to 20,000 unless learned before.
_SMALLER = {"training.stop_when_learned": 0.95}
_LONGER = {**_SMALLER, "training.steps": 20000}
# name -> (tasks, encodings in job order, dotted overrides shared by its encodings).
SETTINGS = {
    "A": (TASKS, ENCODINGS, _A),
    "B": (("missing_duplicate_string", "reverse_string"), ENCODINGS[::-1],
          {**_A, "model.max_position": 512, "training.max_length": 20,
           "evaluation.max_length": 80}),
    "C": (("duplicate_string",), ("randomized_relative",),
          {**_A, "training.steps": 4000, "training.learning_rate": 1e-3,
           "training.lr_schedule": "warmup_cosine", "training.lr_warmup_steps": 200,
           "training.lr_decay_steps": 4000}),
    "D": (("duplicate_string",), ("randomized_relative",),
          {**_A, "training.batch_size": 64}),
    "E": (("odds_first",), ("randomized_relative",),
          {**_A, "training.batch_size": 64, "training.steps": 12000}),
    "D12": (("duplicate_string",), ("randomized_relative",),
            {**_A, "training.batch_size": 64, "grid.seeds": (1, 2)}),
    "E12": (("odds_first",), ("randomized_relative",),
            {**_A, "training.batch_size": 64, "training.steps": 12000, "grid.seeds": (1, 2)}),
    "G": (("odds_first", "duplicate_string"), ("randomized_relative",),
          {**_SMALLER, "model.num_layers": 3, "model.d_model": 48}),
    "H": (("odds_first", "duplicate_string"), ("randomized_relative",),
          {**_LONGER, "model.num_layers": 2}),
    "I": (("odds_first", "duplicate_string"), ("randomized_relative",),
          {**_LONGER, "model.num_layers": 2, "grid.learning_rates": (1e-3,)}),
    "F": (("missing_duplicate_string",), ("randomized_relative",),
          {**_A, "model.max_position": 512, "training.max_length": 20,
           "evaluation.max_length": 80, "training.batch_size": 64, "training.steps": 12000}),
}


# Settings whose overrides are on scale=cpu's protocol, its per-task settings included,
# with seed 0, instead of on A.
CPU_PROTOCOL = ("G", "H", "I")


def get_config(arg=None):
  """The sweep of one setting (`configs/cpu_study.py:B`; default A)."""
  name = arg or "A"
  if name not in SETTINGS:
    raise ValueError(f"unknown setting {name!r}; valid choices: {', '.join(SETTINGS)}")
  tasks, encodings, overrides = SETTINGS[name]
  config = default.get_config()
  config.sweep = ml_collections.ConfigDict()
  config.sweep.tasks = tasks
  config.sweep.encodings = ()
  config.sweep.variants = tuple(
      (f"{name}-{pe}", {**overrides, "model.pe": pe}) for pe in encodings)
  if name in CPU_PROTOCOL:
    scales.apply_cpu(config, seeds=(0,))
  config.sweep.report = "study"
  config.progress = False
  return config
