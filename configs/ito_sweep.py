"""Ito et al. (2024) reproduced at 200 epochs on a CPU, one model per job (issue 26).

  python -m experiments.sweep --config=configs/ito_sweep.py --sweep_dir=results/ito
  python -m experiments.report --sweep_dir=results/ito      # the ito report (sweep.report)
  python -m experiments.ito_analysis --sweep_dir=results/ito

Every job is one model: configs/latin_square.py at scale=small (200 epochs, 12,800 steps
of batch 128, Adam 1e-4: the original's protocol) with ONE of the original's seeds
(`grid.seeds` a 1-tuple), in SWEEP_DIR/latin_square/ENCODING-sSEED, so that one job
fits in a 3-hour session on a 2-core CPU: about 36 minutes at the issue's 6 steps/s (an
idle 2-core Xeon), 2.3 hours at 0.655 s a step (a 2-core AMD EPYC loaded to 7-9, the
`ito` benchmark in docs/ito.md). Finished jobs' small files (config.json, metrics.jsonl, eval.json and
ito_analysis_inputs.npz; never checkpoints, which .gitignore excludes under results/)
can be committed, so that the sweep resumes from that folder on any machine: a job is
finished when its eval.json is for the configured steps (experiments.training.jobs.job_status).

The analyses need trained parameters (attention maps, position terms, noise), which a
committed folder lacks: `sweep.job_outputs` makes each job write
ito_analysis_inputs.npz (experiments.analysis.ito.write_job_inputs: the validation
puzzles' predictions, attention maps, position terms and noisy accuracies, about 0.5 MB)
from its checkpoints right after training. experiments.ito_analysis reads it where a
folder has no checkpoint, and merges the jobs of one encoding (disjoint seeds) into one
run, as experiments.ito_report does: mean ± SD over the jobs' seeds.

Jobs, in this order (experiments.sweep runs them in order), in two tiers. First the
issue's 15 models: learn σ = 0.2, 2.0 and 1.0, 2d_fixed and randomized_2d (issue 26
item 4, new: 2d_fixed's sin/cos at sorted random row and column positions from [0, 16),
drawn per axis as the randomized sampler draws a sequence's; evaluated with the same
sampler and evaluation.seed; docs/ito.md), the first seed of each, then the second seed
of each, then the third, so that a sweep cut short already has every encoding of the
tier; σ = 0.2 and 2.0 lead (the ends of the paper's σ curve, 95.4% against 38.9%: the
first two models already test the ordering). Then the tier the issue asks "if time
allows": nope and 1d_fixed, seed-major likewise. 7 encodings x 3 seeds = 21 jobs. (Until
2026-11-25 both tiers were one seed-major list; the job configs are the same, only the
order changed.)

The argument (optional) is `seeds=N`: the first N of the original's 15 seeds (default 3).
"""
from configs import latin_square

TIERS = (  # Per tier: (name, dotted overrides of configs/latin_square.py's config).
    (("learn-0.2", {"model.pe": "learn", "model.pe_sigma": 0.2}),
     ("learn-2.0", {"model.pe": "learn", "model.pe_sigma": 2.0}),
     ("learn-1.0", {"model.pe": "learn", "model.pe_sigma": 1.0}),
     ("2d_fixed", {"model.pe": "2d_fixed"}),
     ("randomized_2d", {"model.pe": "randomized_2d"})),
    (("nope", {"model.pe": "nope"}),
     ("1d_fixed", {"model.pe": "1d_fixed"})),
)
ENCODINGS = tuple(entry for tier in TIERS for entry in tier)
SEEDS = 3


def variants(num_seeds: int = SEEDS) -> tuple:
  """(name, overrides) per job, ENCODING-sSEED: tier by tier, seed-major in a tier."""
  return tuple((f"{name}-s{seed}", {**overrides, "seed": seed, "grid.seeds": (seed,)})
               for tier in TIERS for seed in latin_square.SEEDS[:num_seeds]
               for name, overrides in tier)


def get_config(arg=None):
  num_seeds = SEEDS
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    if key.strip() != "seeds" or not sep:
      raise ValueError(f"bad config argument {item!r}: expected seeds=N")
    num_seeds = int(value)
  if not 1 <= num_seeds <= len(latin_square.SEEDS):
    raise ValueError(f"seeds={num_seeds}: the original has {len(latin_square.SEEDS)} seeds")
  config = latin_square.get_config("scale=small,seeds=1")
  config.progress = False
  config.sweep = latin_square.ml_collections.ConfigDict()
  config.sweep.tasks = ("latin_square",)
  config.sweep.encodings = ()
  config.sweep.variants = variants(num_seeds)
  config.sweep.report = "ito"  # experiments.report dispatches to experiments.ito_report.
  config.sweep.job_outputs = ("ito_analysis_inputs",)  # For experiments.ito_analysis.
  return config
