"""Speed benchmarks (measured here, never asserted in tests).

  python -m experiments.benchmark                  # every section
  python -m experiments.benchmark --sections=tasks # one section
  python -m experiments.benchmark --sections=buckets --output=buckets.json

Sections:
  tasks: milliseconds per batch of every task at batch 128 x length 40 and
         500 x 500 (median of repeats, after one warm-up call).
  train: the paper model on reverse_string, batch 128, lengths 1..40 (part `speed`):
         today's code beside a previous commit's (--baseline_commit=REV: a temporary
         `git worktree` of REV, removed afterwards) and the original release
         (--release_path=DIR of a checkout of google-deepmind/randomized_positional_encodings,
         run by --release_python=PY; its own modules imported from DIR by a driver that
         this benchmark writes to a temporary folder, experiments/benchmarking/driver.py;
         nothing of the release is in this project), each with and without huge-page
         malloc (--train_malloc=on,off), every one in its own process: compile seconds
         of one program per length (ahead of time; processes started one after another),
         then --steps steps each on the same uniformly drawn lengths, in rounds of
         --train_round that alternate between them. Ratios are to today's code with the
         same malloc (total time and median of the rounds' ratios); FLOPs per step from
         each length's cost analysis (of the step traced with attention in one piece:
         XLA counts a loop's body once, so a chunked program's own analysis counts one
         chunk) give GFLOP/s and the fraction of this CPU's float32
         matmul throughput measured at the start of the section. Part `limit`: FLOPs of
         the compiled step (XLA's cost analysis), steps/s and the achieved fraction for
         the paper model at fixed lengths (--limit_lengths=20,40) and the CPU protocol's
         model (configs/scales.py `apply_cpu`, lengths 1..12, batch 128; 1 and 3 models).
         --attention_free_bound adds a participant to `speed`: today's step with
         attention's core replaced by a pass-through, the bound on any attention kernel.
  eval:  the paper model's evaluation (randomized_relative, batch 500, its max_buckets
         and max_logits) of lengths 41..100 (--eval_lengths), today's code beside
         --baseline_commit, each in its own process, --eval_rounds alternating rounds
         (the first with a fresh evaluator: compile included), and whether the
         accuracies are identical.
  roofline: a projection (not a measurement) of the GPU-hours of the Table 1 protocol
         on V100, A100 and H100 (FP32 and TF32/FP16 peaks and memory bandwidth from the
         vendors' datasheets, GPUS in experiments/benchmarking/roofline.py) from the
         roofline of the paper model's programs:
         FLOPs and bytes accessed from XLA's cost analysis of the training step at
         --roofline_train_lengths and of one length's evaluation at
         --roofline_eval_lengths (other lengths: a quadratic fit), beside the paper's
         Table 2 (V100 hours per run). Not in the default sections.
  grid:  model-steps per second of a grid of --grid_models models (seeds x 3 learning
         rates, one program) in each grid.layout (vmap, loop) against one model, at
         training length --grid_length, in --grid_rounds alternating rounds of about
         --steps model steps each.
  sizes: the CPU protocol's training step (configs/scales.py, odds_first, batch 128)
         for models of --size_models (LAYERSxD_MODELxHEADS): XLA's FLOPs and model-steps/s,
         and each CPU scale's own 3-seed grid (`cpu`: 5 layers, vmap; `cpu_lite`: 2
         layers, loop), in --size_rounds alternating rounds; ratios to the first model
         (experiments/benchmarking/model_sizes.py). Not in the default sections.
  attention: one layer's attention (forward + backward) over the whole batch
         against cache-sized chunks (randomized_pe.attention), T = 20, 40, 80.
  buckets: training-length buckets (training.max_programs) and the persistent
         compilation cache, for the paper model on reverse_string with
         randomized_relative, lengths 1..40 (docs/benchmark.md). Parts
         (--bucket_parts): `compile`: per setting of --bucket_programs (0 = one
         program per length, and 1, 4, 8), the programs and seconds to compile
         every training program ahead of time, then steps/s over the training
         length distribution (the same steps for every setting, prefetched as
         training does, in alternating rounds) and its ratio to exact lengths;
         `cache`: a subprocess's compile phase (trainer and every training program)
         started twice with its own fresh cache folder, cold then warm; `demo`:
         the wall time of `python -m experiments.train --config=configs/demo.py`
         (or each of --demo_configs) in a fresh workdir, cold cache then warm, with
         the accuracies it reached.
         `--quick` runs it all on a tiny model to check that it works.
  ito:   Ito et al.'s Latin-square model (configs/latin_square.py:encoding=learn,
         sigma=0.2,scale=small; not in the default sections, --sections=ito): this
         CPU's float32 matmul throughput (jnp.dot of two 2048 x 2048 matrices, best of
         10) measured in the same run; then for one model and a grid of seeds in one
         program (--ito_seeds=1,3): the FLOPs of the compiled training step from XLA's
         cost analysis (`lower(...).compile().cost_analysis()`) beside an analytic count
         of its matrix products, steps/s of that program (--ito_steps model steps),
         the achieved GFLOP/s and its fraction of the matmul's, and the share of the
         step's op time by category (matmul, reduction, elementwise fusion, copy, ...)
         from a jax.profiler trace of a few steps (--ito_profile_steps; the CPU runtime
         records one event per executed HLO op, categorised from the optimized HLO).

This process never reads a persistent compilation cache (compile seconds mean
compiling); the `cache` and `demo` parts start subprocesses with their own folders
under --scratch.

Training times the training loop's own step, built by the same builder
(experiments.training.steps.build_trainer: a grid of one model, the batch split over devices
when there are several); `train` and `eval` give their subprocesses GLIBC_TUNABLES
explicitly. Like
`experiments.train`, the benchmark restarts itself with glibc's huge-page malloc
where that applies (experiments/training/runtime.py); it prints the GLIBC_TUNABLES it
ran with. RANDOMIZED_PE_MALLOC_TUNING=0 measures without it.

Prints Markdown tables; `--output=FILE.json` also writes the raw numbers. This module
holds the flags and `main`; the sections are in experiments/benchmarking/.
"""

from __future__ import annotations

import json
import os

from absl import app
from absl import flags

from experiments.benchmarking import buckets
from experiments.benchmarking import evaluation_speed
from experiments.benchmarking import ito_speed
from experiments.benchmarking import model_sizes
from experiments.benchmarking import model_speed
from experiments.benchmarking import roofline
from experiments.benchmarking import task_generation
from experiments.benchmarking import training_speed

_SECTIONS = flags.DEFINE_list("sections", ["tasks", "train", "eval", "grid", "attention", "buckets"],
                              "Which benchmarks to run.")
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed repeats per measurement (tasks).")
_OUTPUT = flags.DEFINE_string("output", None, "Optional JSON file for the raw numbers.")
_ENCODINGS = flags.DEFINE_list(
    "encodings", ["sin_cos", "relative", "randomized_sin_cos", "randomized_relative",
                  "randomized_rope", "randomized_alibi"], "Encodings timed by `train`.")
_STEPS = flags.DEFINE_integer("steps", 200, "Timed training steps per encoding (train).")
_MAX_TRAIN_LENGTH = flags.DEFINE_integer("max_train_length", 40, "Training lengths 1..N.")
_GRID_LENGTH = flags.DEFINE_integer("grid_length", 20, "Input length of the grid benchmark.")
_GRID_MODELS = flags.DEFINE_integer("grid_models", 30, "grid: models of the grid (a multiple "
                                    "of 3: seeds x 3 learning rates).")
_GRID_ROUNDS = flags.DEFINE_integer("grid_rounds", 3, "grid: alternating rounds.")
_SIZE_MODELS = flags.DEFINE_list(
    "size_models", ["5x64x8", "4x48x8", "3x48x8", "3x48x4", "2x64x8", "3x32x4"],
    "sizes: models, LAYERSxD_MODELxHEADS (the first is the ratios' reference).")
_SIZE_TASK = flags.DEFINE_string("size_task", "odds_first", "sizes: the task.")
_SIZE_STEPS = flags.DEFINE_integer("size_steps", 120, "sizes: grid steps timed a round.")
_SIZE_ROUNDS = flags.DEFINE_integer("size_rounds", 2, "sizes: alternating rounds.")
_BUCKET_PROGRAMS = flags.DEFINE_list(
    "bucket_programs", ["0", "1", "4", "8"],
    "training.max_programs settings timed by `buckets` (0: one program per length).")
_BUCKET_STEPS = flags.DEFINE_integer(
    "bucket_steps", 400, "Timed training steps per setting (buckets), in rounds of "
    "--bucket_round steps that alternate between the settings.")
_BUCKET_ROUND = flags.DEFINE_integer("bucket_round", 50, "Steps per setting and round (buckets).")
_BUCKET_PARTS = flags.DEFINE_list(
    "bucket_parts", ["compile", "cache", "demo"],
    "Parts of `buckets`: compile (programs, compile seconds and steps/s per setting), "
    "cache (cold vs warm second start, subprocesses), demo (the demo's wall time).")
_CACHE_PROGRAMS = flags.DEFINE_list(
    "cache_programs", ["0", "8"], "max_programs settings whose cold and warm starts "
    "`buckets` times (part cache).")
_DEMO_CONFIGS = flags.DEFINE_list(
    "demo_configs", ["configs/demo.py"], "Configs of the demo timed by `buckets` (part "
    "demo), each with its own fresh cache folder; e.g. the previous demo beside this one.")
_DEMO_ARGS = flags.DEFINE_list("demo_args", [], "Extra flags for the demo runs, e.g. "
                               "config.training.steps=500 (without the leading --).")
_SCRATCH = flags.DEFINE_string("scratch", None, "Folder for the subprocesses' caches, "
                               "workdirs and logs (default: a new temporary folder).")
_QUICK = flags.DEFINE_bool("quick", False, "A tiny model and few steps: checks that "
                           "`buckets` runs; its figures mean nothing.")
_ITO_SEEDS = flags.DEFINE_list("ito_seeds", ["1", "3"], "Grid sizes timed by `ito` "
                              "(seeds of configs/latin_square.py in one program).")
_ITO_STEPS = flags.DEFINE_integer("ito_steps", 30, "Timed model steps per grid size (ito): "
                                  "grid steps = this / models, at least 2.")
_ITO_PROFILE_STEPS = flags.DEFINE_integer("ito_profile_steps", 3, "Grid steps profiled "
                                          "for the op shares (ito; 0: no profile).")
_BASELINE_COMMIT = flags.DEFINE_string(
    "baseline_commit", None, "train: also time this commit's code (a temporary git "
    "worktree, removed afterwards) beside today's, in alternating rounds.")
_RELEASE_PATH = flags.DEFINE_string(
    "release_path", None, "train: also time the original release "
    "(google-deepmind/randomized_positional_encodings) checked out in this folder, "
    "imported from there by a driver run with --release_python.")
_RELEASE_PYTHON = flags.DEFINE_string(
    "release_python", None, "The interpreter for --release_path (default: this one); it "
    "needs the release's dependencies (jax, dm-haiku, optax, chex, numpy).")
_TRAIN_MALLOC = flags.DEFINE_list("train_malloc", ["on", "off"], "train: huge-page "
                                  "malloc settings timed (on, off), each a subprocess.")
_TRAIN_ROUND = flags.DEFINE_integer("train_round", 25, "train: steps per code version and "
                                    "round (the rounds alternate between them).")
_ATTENTION_FREE_BOUND = flags.DEFINE_bool(
    "attention_free_bound", False, "train, part speed: also time today's step with "
    "attention's core (logits, encoding, softmax, weighted sum) replaced by a pass-through "
    "(experiments/benchmarking/driver.py `attention_free`): not a model, the bound on what "
    "any attention kernel could make of the step.")
_TRAIN_PARTS = flags.DEFINE_list("train_parts", ["speed", "limit"], "Parts of train: "
                                 "speed (the comparison), limit (FLOPs and achieved fraction).")
_RELEASE_SEMANTICS = flags.DEFINE_bool(
    "release_semantics", True, "train: also time randomized_relative with "
    "model.compat=release (our code, the release's computation).")
_LIMIT_ENCODINGS = flags.DEFINE_list("limit_encodings", ["randomized_relative"],
                                     "train, part limit: encodings measured.")
_LIMIT_LENGTHS = flags.DEFINE_list("limit_lengths", ["20", "40"], "train, part limit: "
                                   "fixed training lengths of the paper model.")
_LIMIT_STEPS = flags.DEFINE_integer("limit_steps", 20, "train, part limit: timed model "
                                    "steps per program set.")
_EVAL_LENGTHS = flags.DEFINE_list("eval_lengths", ["41", "100"], "eval: the first and "
                                   "last length evaluated (batch 500).")
_EVAL_ENCODING = flags.DEFINE_string("eval_encoding", "randomized_relative", "eval: encoding.")
_EVAL_ROUNDS = flags.DEFINE_integer("eval_rounds", 2, "eval: evaluations per code version, "
                                    "alternating; the first compiles.")
_ROOFLINE_ENCODING = flags.DEFINE_string("roofline_encoding", "randomized_relative",
                                         "roofline: the encoding costed.")
_ROOFLINE_TRAIN_LENGTHS = flags.DEFINE_list(
    "roofline_train_lengths", ["1", "8", "16", "24", "32", "40"],
    "roofline: training lengths whose step is compiled and costed (others: fitted).")
_ROOFLINE_EVAL_LENGTHS = flags.DEFINE_list(
    "roofline_eval_lengths", ["41", "100", "200", "300", "400", "500"],
    "roofline: evaluation lengths compiled and costed (others: fitted).")
_LIMIT_PROFILE_STEPS = flags.DEFINE_integer(
    "limit_profile_steps", 0, "train, part limit: steps of each one-model program "
    "profiled for the share of op time by category (0: none; e.g. --limit_lengths=10,20,40 "
    "--limit_profile_steps=3 for issue 27's item 3).")
_CACHE_CHILD = flags.DEFINE_integer("cache_child", None, "Internal: compile the training "
                                    "programs of this max_programs and print the times.")


def main(argv):
  del argv
  from absl import logging  # pylint: disable=import-outside-toplevel
  logging.set_verbosity(logging.WARNING)
  if _CACHE_CHILD.value is not None:  # A subprocess of `buckets` (part cache).
    buckets.cache_child(_CACHE_CHILD.value, _MAX_TRAIN_LENGTH.value, _QUICK.value)
    return
  # Compile seconds here mean compiling: this process never reads a persistent cache
  # (the parts of `buckets` that measure the cache start subprocesses with their own).
  from experiments.training import compile_cache  # pylint: disable=import-outside-toplevel
  compile_cache.enable("off")
  sections = {
      "tasks": lambda: task_generation.bench_tasks(_REPEATS.value),
      "train": lambda: training_speed.bench_train(
          scratch=_SCRATCH.value, parts=_TRAIN_PARTS.value, encodings=_ENCODINGS.value,
          max_train_length=_MAX_TRAIN_LENGTH.value, steps=_STEPS.value,
          round_steps=_TRAIN_ROUND.value, malloc=_TRAIN_MALLOC.value,
          baseline_commit=_BASELINE_COMMIT.value, release_path=_RELEASE_PATH.value,
          release_python=_RELEASE_PYTHON.value, release_semantics=_RELEASE_SEMANTICS.value,
          attention_free_bound=_ATTENTION_FREE_BOUND.value,
          limit_encodings=_LIMIT_ENCODINGS.value, limit_lengths=_LIMIT_LENGTHS.value,
          limit_steps=_LIMIT_STEPS.value, limit_profile_steps=_LIMIT_PROFILE_STEPS.value),
      "grid": lambda: model_speed.bench_grid(_GRID_LENGTH.value, _STEPS.value,
                                             _GRID_MODELS.value, _GRID_ROUNDS.value),
      "attention": lambda: model_speed.bench_attention(_REPEATS.value),
      "sizes": lambda: model_sizes.bench_sizes(_SIZE_MODELS.value, _SIZE_TASK.value,
                                               _SIZE_STEPS.value, _SIZE_ROUNDS.value),
      "buckets": lambda: buckets.bench_buckets(
          scratch=_SCRATCH.value, parts=_BUCKET_PARTS.value,
          max_train_length=_MAX_TRAIN_LENGTH.value, quick=_QUICK.value,
          programs=_BUCKET_PROGRAMS.value, steps_per_setting=_BUCKET_STEPS.value,
          round_steps=_BUCKET_ROUND.value, cache_programs=_CACHE_PROGRAMS.value,
          demo_configs=_DEMO_CONFIGS.value, demo_args=_DEMO_ARGS.value),
      "ito": lambda: ito_speed.bench_ito(
          grid_sizes=_ITO_SEEDS.value, model_steps=_ITO_STEPS.value,
          profile_steps=_ITO_PROFILE_STEPS.value, scratch=_SCRATCH.value),
      "eval": lambda: evaluation_speed.bench_eval(
          lengths=_EVAL_LENGTHS.value, scratch=_SCRATCH.value,
          baseline_commit=_BASELINE_COMMIT.value, encoding=_EVAL_ENCODING.value,
          rounds=_EVAL_ROUNDS.value),
      "roofline": lambda: roofline.bench_roofline(
          _ROOFLINE_ENCODING.value, _ROOFLINE_TRAIN_LENGTHS.value,
          _ROOFLINE_EVAL_LENGTHS.value),
  }
  unknown = [s for s in _SECTIONS.value if s not in sections]
  if unknown:
    raise app.UsageError(f"unknown sections {unknown}; valid: {', '.join(sections)}")
  if "sizes" in _SECTIONS.value:
    try:
      for spec in _SIZE_MODELS.value:
        model_sizes.parse_model(spec)
    except ValueError as e:
      raise app.UsageError(f"--size_models: {e}") from None
  tunables = os.environ.get("GLIBC_TUNABLES", "")
  print(f"GLIBC_TUNABLES={tunables or '(unset)'} (see experiments/training/runtime.py)")
  results = {"glibc_tunables": tunables}
  for section in _SECTIONS.value:
    print(f"\n## {section}\n")
    results[section] = sections[section]()
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  from experiments.training import runtime  # pylint: disable=ungrouped-imports
  runtime.maybe_reexec()  # Huge-page malloc for XLA CPU; see experiments/training/runtime.py.
  app.run(main)
