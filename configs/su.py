"""Su Jianlin's position robustness measured on the benchmark tasks (issue 13, docs/su.md).

  python -m experiments.sweep --config=configs/su.py:scale=small --sweep_dir=runs/su_small
  python -m experiments.report --sweep_dir=runs/su_small   # variants.md, figures/TASK.png
  python -m experiments.sweep --config=configs/su.py --sweep_dir=runs/su   # full scale

Jobs: TASKS x VARIANTS (`sweep.variants`, one folder SWEEP_DIR/TASK/VARIANT each).
Variants, all of the RoPE family but the sin/cos baseline:
  rope, sin_cos               classic positions 0..T-1
  rope+logn                   classic with log-n attention scaling (m: longest training seq)
  randomized_rope             randomized positions, random test positions (the paper)
  randomized_rope+even        randomized, evenly spaced test positions floor(k L / T)
  randomized_rope+logn, randomized_rope+even+logn   the same two with log-n
                              (a +even job only evaluates otherwise, so the sweep
                              evaluates it on its twin's training when both run)
  rope+exp, rope+exp+logn     equal-mean exponential float positions, without / with log-n
  rope+beta, rope+beta+logn   equal-mean beta float positions, without / with log-n
Why RoPE for Su's variants: RoPE is Su's own encoding and the setting of his post; its
positions act only through the rotation inside Q K^T, so float positions need no table and
the log-n factor scales exactly the logits Su's formula (2) scales (for ALiBi and
Transformer-XL relative the factor's reach is a reading of ours, docs/su.md). RoPE is also
where the paper's randomized positions gain least on these tasks (Table 1), which leaves
room to see an effect. One family keeps the small scale within its time budget; sin/cos
stays as the second classic baseline the issue asks for. Add families by adding variants.
compat="paper" (configs/default.py): one position draw per batch shared by every layer,
as Su's samplers are defined (the release's per-layer draws have no float reading).

Full scale: the paper's protocol (configs/default.py: 5 layers, d_model 64, 2,000,000
steps, batch 128, lengths 1..40, test lengths 41..500, L = 2048), each job a grid of
10 seeds x 3 learning rates (1e-4, 3e-4, 5e-4), like configs/table1.py.

Small scale (this 2-core CPU): 6 tasks x 11 variants = 66 jobs, each a grid of 3 seeds
x 1 learning rate (1e-3): a 2-layer model (d_model 32, 4 heads), 500 steps of batch 32 on
lengths 1..8, test lengths 9..24, L = 128 (beta's M: the longest test sequence), one
training program (max_programs=1) and two evaluation programs, since compilation, not
training, dominates a job at this size.
Time estimate, measured on this 2-core CPU shared with other work (load average 4.9-5.8):
one job (duplicate_string, rope+exp+logn, among the longest sequences) took 71 s wall
(50 s CPU) with --workers=1, compilation included: 14.5 steps/s once compiled (3-seed grid,
batch 32), 500 steps in about 35 s, the rest compiling and evaluating. 66 jobs x 71 s =
about 78 minutes with --workers=1 under that load (even_pairs' shorter sequences are
faster); an idle machine should take less (66 x 50 s CPU = 55 CPU-minutes), --workers=2 is
not measured. The first measurement, with 3 training and 4 evaluation programs, took 187 s.
"""
import ml_collections

from configs import default
from configs import scales

SCALES = scales.SCALES
TASKS = ("reverse_string", "duplicate_string", "missing_duplicate_string", "even_pairs",
         "bucket_sort", "odds_first")
LOG_N = {"model.log_n_scaling": True}
EVEN = {"evaluation.positions": "evenly_spaced"}
EXP = {"model.pe": "rope", "training.positions": "equal_mean_exponential"}
BETA = {"model.pe": "rope", "training.positions": "equal_mean_beta"}
RANDOMIZED = {"model.pe": "randomized_rope"}
# (name, dotted overrides), in the order of the report's columns.
VARIANTS = (
    ("rope", {"model.pe": "rope"}),
    ("sin_cos", {"model.pe": "sin_cos"}),
    ("rope+logn", {"model.pe": "rope", **LOG_N}),
    ("randomized_rope", RANDOMIZED),
    ("randomized_rope+even", {**RANDOMIZED, **EVEN}),
    ("randomized_rope+logn", {**RANDOMIZED, **LOG_N}),
    ("randomized_rope+even+logn", {**RANDOMIZED, **EVEN, **LOG_N}),
    ("rope+exp", EXP),
    ("rope+exp+logn", {**EXP, **LOG_N}),
    ("rope+beta", BETA),
    ("rope+beta+logn", {**BETA, **LOG_N}),
)

def get_config(arg=None):
  scale = scales.parse(arg)
  config = default.get_config()
  config.grid.seeds = tuple(range(10))
  config.grid.learning_rates = (1e-4, 3e-4, 5e-4)
  config.sweep = ml_collections.ConfigDict()
  config.sweep.tasks = TASKS
  config.sweep.encodings = ()  # Plain encodings may be added: each is one more variant.
  config.sweep.variants = tuple((name, dict(overrides)) for name, overrides in VARIANTS)
  config.progress = False
  if scale == "small":
    scales.apply_small(config)
  elif scale in scales.CPU_SCALES:
    config.sweep.tasks = scales.CPU_TASKS
    scales.apply(config, scale)
    # Its 3-seed grids one model after another: 1.11-1.18x the model-steps/s of vmap at
    # this size on a 2-core CPU (docs/benchmark.md, "Grids"). Table 1's cpu jobs keep
    # vmap, the layout their committed results trained with (Table 3 reuses them).
    config.grid.layout = "loop"
  return config
