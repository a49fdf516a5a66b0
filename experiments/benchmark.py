"""Speed benchmarks (measured here, never asserted in tests).

  python -m experiments.benchmark                  # every section
  python -m experiments.benchmark --sections=tasks # one section
  python -m experiments.benchmark --sections=buckets --output=buckets.json

Sections:
  tasks: milliseconds per batch of every task at batch 128 x length 40 and
         500 x 500 (median of repeats, after one warm-up call).
  train: the paper model on reverse_string, batch 128, lengths 1..40: compile
         seconds and programs for the 40 training lengths, then steady-state
         steps/s of the real loop (prefetched data, uniform lengths), per
         encoding; and for evaluation over 1..500 at batch 500: programs and
         compile seconds, plus the seconds to evaluate lengths 41..100.
  grid:  model-steps per second of a grid of 30 models (10 seeds x 3 learning
         rates, one program) against one model, at one training length.
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
(experiments.steps.build_trainer: a grid of one model, the batch split over devices
when there are several). Like
`experiments.train`, the benchmark restarts itself with glibc's huge-page malloc
where that applies (experiments/runtime.py); it prints the GLIBC_TUNABLES it
ran with. RANDOMIZED_PE_MALLOC_TUNING=0 measures without it.

Prints Markdown tables; `--output=FILE.json` also writes the raw numbers.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time

from absl import app
from absl import flags

_SECTIONS = flags.DEFINE_list("sections", ["tasks", "train", "grid", "attention", "buckets"],
                              "Which benchmarks to run.")
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed repeats per measurement (tasks).")
_OUTPUT = flags.DEFINE_string("output", None, "Optional JSON file for the raw numbers.")
_ENCODINGS = flags.DEFINE_list(
    "encodings", ["sin_cos", "relative", "randomized_sin_cos", "randomized_relative",
                  "randomized_rope", "randomized_alibi"], "Encodings timed by `train`.")
_STEPS = flags.DEFINE_integer("steps", 200, "Timed training steps per encoding (train).")
_MAX_TRAIN_LENGTH = flags.DEFINE_integer("max_train_length", 40, "Training lengths 1..N.")
_GRID_LENGTH = flags.DEFINE_integer("grid_length", 20, "Input length of the grid benchmark.")
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
_CACHE_CHILD = flags.DEFINE_integer("cache_child", None, "Internal: compile the training "
                                    "programs of this max_programs and print the times.")


# The release's numbers on the same 2-core CPU (measured when issue 3 was worked on),
# in ms per batch at 128 x 40 and 500 x 500.
RELEASE_TASK_MS = {
    "stack_manipulation": (24.5, 705), "modular_arithmetic_brackets": (8.8, 385),
    "solve_equation": (10.3, 379), "binary_addition": (3.8, 150),
    "binary_multiplication": (3.9, 154), "compute_sqrt": (3.0, 119),
}
TASK_SHAPES = ((128, 40), (500, 500))


def _median_ms(fn, repeats):
  fn(0)  # Warm-up.
  times = []
  for i in range(repeats):
    start = time.perf_counter()
    fn(i + 1)
    times.append((time.perf_counter() - start) * 1000)
  return statistics.median(times)


def bench_tasks(repeats: int) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  import tasks  # pylint: disable=import-outside-toplevel

  # Keys are made up front so that the timing is the task's generation alone.
  keys = [np.asarray(jax.random.PRNGKey(i)) for i in range(repeats + 1)]
  results = {}
  print("| task | ms at 128 x 40 | ms at 500 x 500 | release (128x40 / 500x500) |")
  print("|---|---:|---:|---|")
  for name in tasks.NAMES:
    task = tasks.get(name)
    row = []
    for batch_size, length in TASK_SHAPES:
      reps = repeats if batch_size * length <= 128 * 40 else max(3, repeats // 4)
      row.append(_median_ms(lambda i: task.sample_batch(keys[i], batch_size, length), reps))
    results[name] = row
    release = RELEASE_TASK_MS.get(name)
    release = f"{release[0]} / {release[1]}" if release else "< 1 / < 14"
    print(f"| {name} | {row[0]:.2f} | {row[1]:.1f} | {release} |", flush=True)
  worst = [max(r[0] for r in results.values()), max(r[1] for r in results.values())]
  print(f"\nslowest task: {worst[0]:.2f} ms at 128 x 40 (target <= 2), "
        f"{worst[1]:.1f} ms at 500 x 500 (target <= 50)")
  return results


RELEASE_STEPS_PER_SECOND = {"randomized_relative": 3.4, "randomized_sin_cos": 4.4}


def bench_train(repeats: int) -> dict:
  """Training and evaluation speed of the paper model (see the module docstring)."""
  del repeats
  import jax  # pylint: disable=import-outside-toplevel

  import tasks  # pylint: disable=import-outside-toplevel
  from configs import default  # pylint: disable=import-outside-toplevel
  from experiments import data  # pylint: disable=import-outside-toplevel
  from experiments import evaluation  # pylint: disable=import-outside-toplevel
  from experiments import steps  # pylint: disable=import-outside-toplevel

  task = tasks.get("reverse_string")
  lengths = range(1, _MAX_TRAIN_LENGTH.value + 1)
  results = {"device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
             "devices": jax.device_count(), "train": {}}
  print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}\n")
  runs = [(pe, "paper") for pe in _ENCODINGS.value]
  if "randomized_relative" in _ENCODINGS.value:
    runs.append(("randomized_relative", "release"))  # The release's own computation.
  print("| encoding | compat | params | compile s (programs) | steps/s | release steps/s |")
  print("|---|---|---:|---:|---:|---:|")
  for pe, compat in runs:
    config = default.get_config()
    config.model.pe = pe
    config.model.compat = compat
    config.training.max_length = _MAX_TRAIN_LENGTH.value
    # The training loop's own step: a grid of one model, batch split over devices.
    trainer = steps.build_trainer(config, task)
    state, seeds, place, step_fn = trainer.state, trainer.seeds, trainer.place, trainer.step
    trainer.state = None  # The loop below owns (and donates) the state.
    params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
    start = time.perf_counter()
    compiled = {}
    for n in lengths:  # Ahead-of-time: exactly one program per training length.
      batch = place(data.make_batch(task, jax.random.PRNGKey(n), config.training.batch_size, n))
      compiled[n] = step_fn.lower(state, seeds, batch).compile()
    compile_s = time.perf_counter() - start
    # A program's first execution is ~100 ms slower on CPU: run each once first.
    for n in lengths:
      batch = place(data.make_batch(task, jax.random.PRNGKey(n), config.training.batch_size, n))
      state, _ = compiled[n](state, seeds, batch)
    jax.block_until_ready(state)
    # Steady state: the real data stream (uniform lengths, prefetched in a thread).
    prefetch = data.Prefetcher(lambda s, c=config: data.data_for_step(task, c, s), 0,
                               _STEPS.value, depth=4, place=place)
    start = time.perf_counter()
    for _ in range(_STEPS.value):
      batch = prefetch.next()
      state, _ = compiled[batch["targets"].shape[1]](state, seeds, batch)
    jax.block_until_ready(state)
    steps_per_s = _STEPS.value / (time.perf_counter() - start)
    prefetch.close()
    release = RELEASE_STEPS_PER_SECOND.get(pe)
    ratio = f"{release} ({steps_per_s / release:.2f}x)" if release else "-"
    results["train"][f"{pe}/{compat}"] = {"params": params, "compile_s": compile_s,
                                          "programs": len(compiled), "steps_per_s": steps_per_s}
    print(f"| {pe} | {compat} | {params:,} | {compile_s:.0f} ({len(compiled)}) | "
          f"{steps_per_s:.2f} | {ratio} |", flush=True)
    # Free the programs: a CPU process cannot hold a few hundred of them at once.
    del compiled, step_fn, state, trainer
    jax.clear_caches()
    gc.collect()

  # Evaluation: programs for 1..500 at batch 500 (compiled ahead of time, not run),
  # then a timed evaluation of 41..100.
  config = default.get_config()
  config.model.pe = "randomized_relative"
  model = steps.build_model(config, task)
  state = steps.init_state(model, steps.make_optimizer(config), 0)
  e = config.evaluation
  evaluator = evaluation.RangeEvaluator(model, task, max_logits=e.max_logits)
  shapes = evaluator.program_shapes(range(e.min_length, e.max_length + 1), e.batch_size,
                                    e.max_buckets)
  start = time.perf_counter()
  for shape in shapes:
    evaluator.compile(state.params, shape)
  eval_compile_s = time.perf_counter() - start
  evaluator = evaluation.RangeEvaluator(model, task, max_logits=e.max_logits)
  start = time.perf_counter()
  evaluator.evaluate(state.params, range(41, 101), e.batch_size, e.seed, e.max_buckets)
  eval_s = time.perf_counter() - start
  results["eval"] = {"programs_1_500": len(shapes), "compile_s_1_500": eval_compile_s,
                     "seconds_41_100": eval_s, "programs_41_100": evaluator.traces}
  print(f"\nevaluation 1..500 at batch {e.batch_size}: {len(shapes)} programs "
        f"(release: one per length, 500), compiled in {eval_compile_s:.0f} s")
  print(f"evaluation of lengths 41..100 at batch {e.batch_size}: {eval_s:.1f} s "
        f"({evaluator.traces} programs, compile included)")
  return results


def bench_grid(repeats: int) -> dict:
  """Model-steps per second of a 10-seed x 3-rate grid against one model (one length)."""
  del repeats
  import jax  # pylint: disable=import-outside-toplevel

  import tasks  # pylint: disable=import-outside-toplevel
  from configs import default  # pylint: disable=import-outside-toplevel
  from experiments import data  # pylint: disable=import-outside-toplevel
  from experiments import steps  # pylint: disable=import-outside-toplevel

  task = tasks.get("reverse_string")
  length = _GRID_LENGTH.value
  results = {"device": jax.devices()[0].device_kind, "length": length}
  print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}; reverse_string, "
        f"batch 128, length {length} (sequence {2 * length}), randomized_relative\n")
  print("| models | steps/s | model-steps/s | vs one model |")
  print("|---:|---:|---:|---:|")
  base = None
  for seeds, rates in [((0,), (1e-4,)), (tuple(range(10)), (1e-4, 3e-4, 5e-4))]:
    config = default.get_config()
    config.model.pe = "randomized_relative"
    config.grid.seeds, config.grid.learning_rates = seeds, rates
    trainer = steps.build_trainer(config, task, jax.devices()[:1])
    state, member_seeds, step, members = (trainer.state, trainer.seeds, trainer.step,
                                          trainer.members)
    batch = data.make_batch(task, jax.random.PRNGKey(0), 128, length)
    state, _ = step(state, member_seeds, batch)  # Compile.
    jax.block_until_ready(state)
    timed = max(2, _STEPS.value // len(members))
    start = time.perf_counter()
    for _ in range(timed):
      state, _ = step(state, member_seeds, batch)
    jax.block_until_ready(state)
    rate = timed / (time.perf_counter() - start)
    model_rate = rate * len(members)
    base = base or model_rate
    results[len(members)] = {"steps_per_s": rate, "model_steps_per_s": model_rate}
    print(f"| {len(members)} | {rate:.3f} | {model_rate:.2f} | {model_rate / base:.2f}x |",
          flush=True)
  return results


def bench_attention(repeats: int) -> dict:
  """Attention forward + backward of one layer of the paper model: whole batch vs chunks."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from randomized_pe import attention  # pylint: disable=import-outside-toplevel
  from randomized_pe import encodings  # pylint: disable=import-outside-toplevel
  from randomized_pe import samplers  # pylint: disable=import-outside-toplevel

  batch, heads, head_size = 128, 8, 8
  results = {}
  print("batch 128, 8 heads of 8; ms per forward + backward (median); one device\n")
  print("| T | scores | whole batch | chunks (rows) | speed-up |")
  print("|---:|---|---:|---:|---:|")
  for length in (20, 40, 80):
    keys = jax.random.split(jax.random.PRNGKey(length), 5)
    q, k, v, cot = (jax.random.normal(keys[i], (batch, length, heads, head_size), jnp.float32)
                    for i in range(4))
    kernel = jax.random.normal(keys[4], (heads * head_size, heads, head_size)) * 0.1
    pos = samplers.randomized(jax.random.PRNGKey(0), length, 2048)

    def relative(kernel):
      table = encodings.relative_key_table(pos, kernel)
      return lambda cq, ck: attention.dot_scores(cq, ck) + encodings.relative_logits_from_table(
          cq * (1.0 / head_size**0.5), table)

    rows = attention.default_chunk_rows(batch, heads, length, length, backend="cpu")
    for name, scorer in (("dot", lambda kernel: attention.dot_scores), ("relative", relative)):
      times = []
      for chunk in ((batch, rows) if rows < batch else (batch,)):
        def loss(q, k, v, w, chunk=chunk, scorer=scorer):
          out = attention.attention(q, k, v, scorer(w), chunk_rows=chunk)
          return jnp.vdot(out, cot)
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
        times.append(_median_ms(lambda i, g=grad: jax.block_until_ready(g(q, k, v, kernel)),
                                repeats))
      results[f"{name}/{length}"] = {"whole_ms": times[0], "chunked_ms": times[-1], "rows": rows}
      if rows >= batch:  # The logits fit: the default runs the whole batch at once.
        print(f"| {length} | {name} | {times[0]:.1f} | one piece | - |", flush=True)
        continue
      print(f"| {length} | {name} | {times[0]:.1f} | {times[1]:.1f} ({rows}) | "
            f"{times[0] / times[1]:.2f}x |", flush=True)
  return results


# --- buckets: training-length buckets, the persistent compilation cache, the demo ---------


def _load() -> str:
  """The 1, 5 and 15 minute load averages (the machine is shared; read figures beside it)."""
  return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _bucket_config(max_programs: int):
  """The paper's config (configs/default.py) on reverse_string, randomized_relative,
  training lengths 1..--max_train_length, with `training.max_programs = max_programs`."""
  from configs import default  # pylint: disable=import-outside-toplevel
  config = default.get_config()
  config.task = "reverse_string"
  config.model.pe = "randomized_relative"
  config.training.max_length = _MAX_TRAIN_LENGTH.value
  config.training.max_programs = max_programs
  if _QUICK.value:  # Checks the code path only.
    config.model.num_layers, config.model.d_model, config.model.num_heads = 1, 16, 2
    config.training.batch_size = 8
  return config


def _program_batches(task, config) -> dict:
  """One host batch per training program of `config`: {(tokens shape, targets shape): batch}.

  Exact lengths (max_programs 0): one per length; buckets: one per bucket shape
  (experiments.data.training_shapes), built as training builds them.
  """
  from experiments import data  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  t = config.training
  shapes = data.training_shapes(task, config)
  batches = {}
  for n in range(t.min_length, t.max_length + 1):
    batch = data.make_batch(task, jax.random.PRNGKey(n), t.batch_size, n)
    if shapes is not None:
      batch = data.pad_batch(task, batch, *shapes[n], t.batch_size)
    batches.setdefault(_shape_key(batch), batch)
  return batches


def _shape_key(batch) -> tuple:
  return batch["tokens"].shape, batch["targets"].shape


def _compile_programs(trainer, batches) -> tuple[dict, float]:
  """Lowers and compiles the step for every batch shape; (programs, seconds)."""
  start = time.perf_counter()
  compiled = {key: trainer.step.compile(trainer.state, trainer.seeds, trainer.place(batch))
              for key, batch in batches.items()}
  return compiled, time.perf_counter() - start


def _bucket_compile_and_speed(task) -> dict:
  """Programs, compile seconds and steps/s per max_programs setting (one process)."""
  import jax  # pylint: disable=import-outside-toplevel

  from experiments import data  # pylint: disable=import-outside-toplevel
  from experiments import steps  # pylint: disable=import-outside-toplevel

  settings = [int(v) for v in _BUCKET_PROGRAMS.value]
  runs = {}
  print(f"compile (load {_load()}):\n")
  print("| max_programs | programs | token sizes | compile s | s per program |")
  print("|---:|---:|---|---:|---:|")
  for mp in settings:
    config = _bucket_config(mp)
    trainer = steps.build_trainer(config, task)
    batches = _program_batches(task, config)
    compiled, seconds = _compile_programs(trainer, batches)
    sizes = sorted(key[0][1] for key in batches)
    runs[mp] = {"config": config, "trainer": trainer, "compiled": compiled,
                "shapes": data.training_shapes(task, config), "batches": batches,
                "state": trainer.state, "time": 0.0, "round_times": []}
    trainer.state = None  # The timing loop owns (and donates) the state.
    size_text = (f"{sizes[0]}..{sizes[-1]} (every length)" if mp <= 0
                 else ", ".join(str(x) for x in sizes))
    print(f"| {mp or 'exact'} | {len(compiled)} | {size_text} | {seconds:.1f} | "
          f"{seconds / len(compiled):.2f} |", flush=True)
    runs[mp].update(programs=len(compiled), compile_s=seconds, token_sizes=sizes)
  # A program's first execution is slower on CPU: run each once before timing.
  for run in runs.values():
    for key, batch in run["batches"].items():
      run["state"], _ = run["compiled"][key](run["state"], run["trainer"].seeds,
                                              run["trainer"].place(batch))
    jax.block_until_ready(run["state"])
  # Steady state over the training length distribution: the same steps (so the same
  # lengths) for every setting, drawn and prefetched as the training loop draws them, in
  # rounds that alternate between the settings so that a change of the machine's load
  # falls on all of them alike.
  total, chunk = _BUCKET_STEPS.value, max(1, min(_BUCKET_ROUND.value, _BUCKET_STEPS.value))
  load_before = _load()
  for r, first in enumerate(range(0, total, chunk)):
    last = min(total, first + chunk)
    order = settings[r % len(settings):] + settings[:r % len(settings)]
    for mp in order:
      run = runs[mp]
      config, shapes, trainer = run["config"], run["shapes"], run["trainer"]
      prefetch = data.Prefetcher(
          lambda s, c=config, sh=shapes: data.data_for_step(task, c, s, sh), first, last,
          depth=config.training.prefetch, place=trainer.place)
      start = time.perf_counter()
      state = run["state"]
      for _ in range(first, last):
        batch = prefetch.next()
        state, _ = run["compiled"][_shape_key(batch)](state, trainer.seeds, batch)
      jax.block_until_ready(state)
      elapsed = time.perf_counter() - start
      prefetch.close()
      run["state"] = state
      run["time"] += elapsed
      run["round_times"].append(elapsed)
  exact = runs.get(0)
  print(f"\nsteps/s over lengths 1..{_MAX_TRAIN_LENGTH.value} ({total} steps per setting in "
        f"rounds of {chunk}; load {load_before} before, {_load()} after):\n")
  print("| max_programs | programs | compile s | steps/s | vs exact (total) | "
        "vs exact (median of rounds) |")
  print("|---:|---:|---:|---:|---:|---:|")
  results = {}
  for mp in settings:
    run = runs[mp]
    rate = total / run["time"]
    row = {"programs": run["programs"], "compile_s": run["compile_s"],
           "token_sizes": run["token_sizes"], "steps_per_s": rate,
           "round_seconds": run["round_times"]}
    ratio_text = median_text = "-"
    if exact is not None:
      row["vs_exact"] = exact["time"] / run["time"]
      row["vs_exact_median_round"] = statistics.median(
          e / b for e, b in zip(exact["round_times"], run["round_times"]))
      row["compile_vs_exact"] = run["compile_s"] / exact["compile_s"]
      ratio_text = f"{row['vs_exact']:.3f}"
      median_text = f"{row['vs_exact_median_round']:.3f}"
    results[str(mp)] = row
    print(f"| {mp or 'exact'} | {run['programs']} | {run['compile_s']:.1f} | {rate:.2f} | "
          f"{ratio_text} | {median_text} |", flush=True)
  results["steps"], results["round"] = total, chunk
  results["load_before_steps"], results["load_after_steps"] = load_before, _load()
  del runs, exact
  jax.clear_caches()
  gc.collect()
  return results


def _cache_child(max_programs: int) -> None:
  """A process's compile phase for one setting, with the persistent cache of the
  environment (RANDOMIZED_PE_COMPILATION_CACHE): the trainer (its init program) and every
  training program. Prints one JSON line."""
  start = time.perf_counter()
  from experiments import compile_cache  # pylint: disable=import-outside-toplevel
  compile_cache.enable("")
  import tasks  # pylint: disable=import-outside-toplevel
  from experiments import steps  # pylint: disable=import-outside-toplevel
  task = tasks.get("reverse_string")
  config = _bucket_config(max_programs)
  compile_start = time.perf_counter()
  trainer = steps.build_trainer(config, task)
  batches = _program_batches(task, config)
  compiled, _ = _compile_programs(trainer, batches)
  end = time.perf_counter()
  print("CACHE_CHILD " + json.dumps({
      "compile_phase_s": end - compile_start, "imports_s": compile_start - start,
      "programs": len(compiled), **compile_cache.stats()}), flush=True)


def _child_flags() -> list:
  return [f"--max_train_length={_MAX_TRAIN_LENGTH.value}"] + (["--quick"] if _QUICK.value
                                                              else [])


def _run(command, env, log_path, timeout=3600) -> tuple:
  """Runs `command` (stdout and stderr to log_path); (wall seconds, stdout text)."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  start = time.perf_counter()
  with open(log_path, "w") as log:
    done = subprocess.run([sys.executable, *command], env=env, stdout=log,
                          stderr=subprocess.STDOUT, timeout=timeout, check=False,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  wall = time.perf_counter() - start
  with open(log_path) as log:
    text = log.read()
  if done.returncode != 0:
    raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}; see {log_path}:\n"
                       + text[-2000:])
  return wall, text


def _bucket_cache(scratch: str) -> dict:
  """Cold start vs warm start (the same config again) of each --cache_programs setting,
  each setting with its own fresh cache folder, in subprocesses."""
  from experiments import compile_cache  # pylint: disable=import-outside-toplevel
  results = {}
  print("\nthe same config started twice, its own fresh cache folder (subprocesses; the "
        "compile phase: trainer and every training program):\n")
  print("| max_programs | programs | cold compile s | warm compile s | warm / cold | "
        "warm: executables loaded / programs loaded / compiled | process wall cold / warm | "
        "load |")
  print("|---:|---:|---:|---:|---:|---|---|---|")
  for mp in (int(v) for v in _CACHE_PROGRAMS.value):
    folder = os.path.join(scratch, f"cache_programs{mp}")
    env = {**os.environ, compile_cache.ENV: folder}
    starts = []
    for name in ("cold", "warm"):
      wall, text = _run(["-m", "experiments.benchmark", f"--cache_child={mp}",
                         *_child_flags()], env,
                        os.path.join(scratch, f"cache_programs{mp}_{name}.log"))
      line = [l for l in text.splitlines() if l.startswith("CACHE_CHILD ")][-1]
      starts.append({**json.loads(line[len("CACHE_CHILD "):]), "wall_s": wall})
    cold, warm = starts
    ratio = warm["compile_phase_s"] / cold["compile_phase_s"]
    results[str(mp)] = {"cold": cold, "warm": warm, "warm_vs_cold": ratio, "load": _load()}
    print(f"| {mp or 'exact'} | {cold['programs']} | {cold['compile_phase_s']:.1f} | "
          f"{warm['compile_phase_s']:.1f} | {ratio:.3f} | "
          f"{warm.get('executables_loaded', 0)} / {warm['loaded']} / {warm['compiled']} | "
          f"{cold['wall_s']:.0f} / {warm['wall_s']:.0f} | {_load()} |",
          flush=True)
  return results


def _demo_scores(workdir: str) -> dict:
  with open(os.path.join(workdir, "eval.json")) as f:
    record = json.load(f)
  return {"training_lengths": record["training_lengths"], **record["scores"],
          "step": record["step"]}


def _bucket_demo(scratch: str) -> dict:
  """`python -m experiments.train --config=<demo>` in a fresh workdir with a fresh cache
  folder (cold), then again in another fresh workdir with that folder (warm), for each
  of --demo_configs."""
  from experiments import compile_cache  # pylint: disable=import-outside-toplevel
  extra = [f"--{a}" for a in _DEMO_ARGS.value]
  if _QUICK.value:
    extra += ["--config.training.steps=20", "--config.evaluation.max_length=12"]
  results = {}
  print(f"\n`python -m experiments.train --config=CONFIG {' '.join(extra)}` in a fresh "
        "workdir; wall seconds of the whole process, cold cache then warm:\n")
  print("| config | cache | wall s | training lengths | unseen lengths | programs | load |")
  print("|---|---|---:|---:|---:|---|---|")
  for i, config in enumerate(_DEMO_CONFIGS.value):
    folder = os.path.join(scratch, f"cache_demo{i}")
    env = {**os.environ, compile_cache.ENV: folder}
    results[config] = {"args": extra}
    for name in ("cold", "warm"):
      workdir = os.path.join(scratch, f"demo{i}_{name}")
      wall, text = _run(["-m", "experiments.train", f"--config={config}",
                         f"--workdir={workdir}", *extra], env,
                        os.path.join(scratch, f"demo{i}_{name}.log"))
      scores = _demo_scores(workdir)
      cache_line = [l for l in text.splitlines() if l.startswith("compilation cache")]
      cache_line = cache_line[-1].split(": ", 1)[-1] if cache_line else "-"
      results[config][name] = {"wall_s": wall, **scores, "cache": cache_line,
                               "load": _load()}
      unseen = "-" if scores["unseen"] is None else f"{100 * scores['unseen']:.1f}%"
      print(f"| {config} | {name} | {wall:.1f} | {100 * scores['train_range']:.1f}% | "
            f"{unseen} | {cache_line} | {_load()} |", flush=True)
  return results


def bench_buckets(repeats: int) -> dict:
  """Training-length buckets, the persistent cache and the demo (module docstring)."""
  del repeats
  import tempfile  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel

  import tasks  # pylint: disable=import-outside-toplevel

  task = tasks.get("reverse_string")
  config = _bucket_config(0)
  m, t = config.model, config.training
  print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}; reverse_string, "
        f"{m.pe}, {m.num_layers} layers, d_model {m.d_model}, batch {t.batch_size}, "
        f"training lengths {t.min_length}..{t.max_length}{' (--quick)' if _QUICK.value else ''}"
        f"\n")
  scratch = _SCRATCH.value or tempfile.mkdtemp(prefix="randomized_pe_benchmark_")
  os.makedirs(scratch, exist_ok=True)
  results = {"device": jax.devices()[0].device_kind, "quick": _QUICK.value,
             "scratch": scratch, "load_start": _load()}
  unknown = set(_BUCKET_PARTS.value) - {"compile", "cache", "demo"}
  if unknown:
    raise app.UsageError(f"unknown --bucket_parts {sorted(unknown)}")
  if "compile" in _BUCKET_PARTS.value:
    results["settings"] = _bucket_compile_and_speed(task)
  if "cache" in _BUCKET_PARTS.value:
    results["cache"] = _bucket_cache(scratch)
  if "demo" in _BUCKET_PARTS.value:
    results["demo"] = _bucket_demo(scratch)
  results["load_end"] = _load()
  print(f"\nsubprocess logs, caches and workdirs: {scratch}")
  return results



# --------------------------------------------------------------------------
# ito: Ito et al.'s Latin-square model, FLOPs and achieved throughput (issue 26, item 1).

ITO_CONFIG = "encoding=learn,sigma=0.2,scale=small"
MATMUL_SIZE = 2048


def matmul_throughput(size: int = MATMUL_SIZE, repeats: int = 10) -> dict:
  """This CPU's float32 jnp.dot of two size x size matrices: the best of `repeats`
  timed calls after a warm-up (2 size^3 FLOPs each)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  keys = jax.random.split(jax.random.PRNGKey(0))
  a = jax.random.normal(keys[0], (size, size), jnp.float32)
  b = jax.random.normal(keys[1], (size, size), jnp.float32)
  dot = jax.jit(jnp.dot)
  dot(a, b).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    dot(a, b).block_until_ready()
    times.append(time.perf_counter() - start)
  flops = 2.0 * size ** 3
  return {"size": size, "repeats": repeats, "best_s": min(times),
          "median_s": statistics.median(times), "gflops_best": flops / min(times) / 1e9,
          "gflops_median": flops / statistics.median(times) / 1e9}


def ito_matmul_flops(config) -> float:
  """The analytic FLOPs of the matrix products of one training step of one model of
  Ito's Transformer (randomized_pe/models/ito.py), 2 m n k per product: forward per
  token the embedding (vocabulary 6 x d), per block the q, k, v and output projections
  (4 d^2), the scores and the weighted values (2 T d) and the MLP (2 d m), and the
  read-out on every cell (d x 4 classes); the backward pass twice the forward (the
  gradients of the inputs and of the weights), less the input gradient of the embedding.
  Elementwise work (GELU, LayerNorm, softmax, Adam) is not counted."""
  m = config.model
  d, mlp, layers = m.d_model, m.mlp_size, m.num_layers
  tokens = config.training.batch_size * 16
  cells = 16
  embed = 2 * 6 * d
  block = 2 * (4 * d * d + 2 * cells * d + 2 * d * mlp)
  readout = 2 * d * 4
  forward = tokens * (embed + layers * block + readout)
  return float(3 * forward - tokens * embed)


def _hlo_categories(hlo_text: str) -> dict:
  """{instruction name: category} for the instructions of an optimized HLO module:
  "matmul" (a dot or convolution, or a fusion or custom call holding one),
  "reduction" (a fusion with a reduce), "elementwise/other fusion", "copy/transpose",
  "control" (while, call, conditional: their bodies' ops are counted instead), or the
  opcode."""
  import re  # pylint: disable=import-outside-toplevel

  line_re = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*\S.*?\s([a-z][\w\-]*)\(")
  computations, current = {}, None
  instructions = {}
  for line in hlo_text.splitlines():
    header = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
    if header and "=" not in line.split("{")[0]:
      current = header.group(1)
      computations[current] = set()
      continue
    found = line_re.match(line)
    if not found or current is None:
      continue
    name, opcode = found.groups()
    computations[current].add(opcode)
    calls = re.findall(r"calls=%?([\w.\-]+)", line)
    target = re.search(r'custom_call_target="([^"]+)"', line)
    instructions[name] = (opcode, calls, target.group(1) if target else "")

  def inner(computation, seen=()):
    ops = set(computations.get(computation, ()))
    return ops

  out = {}
  for name, (opcode, calls, target) in instructions.items():
    ops = set()
    for c in calls:
      ops |= inner(c)
    if opcode in ("dot", "convolution") or ops & {"dot", "convolution"} or (
        opcode == "custom-call" and re.search("matmul|dot|gemm", target, re.I)):
      category = "matmul"
    elif opcode in ("while", "call", "conditional"):
      category = "control"
    elif opcode == "fusion":
      category = "reduction" if ops & {"reduce", "reduce-window"} else "elementwise/other fusion"
    elif opcode in ("copy", "transpose"):
      category = "copy/transpose"
    elif opcode in ("reduce", "reduce-window"):
      category = "reduction"
    else:
      category = opcode
    out[name] = category
  return out


def profile_shares(run_steps, hlo_text: str, scratch: str) -> dict:
  """The share of the time of the step's HLO ops by category, from a jax.profiler trace
  of `run_steps()`: the XLA CPU runtime records one event per executed op (stat
  `hlo_op`); events are summed per category (`_hlo_categories`); ops that ran in
  parallel on the two cores both count, so shares are of the summed op time."""
  import glob  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel
  from jax.profiler import ProfileData  # pylint: disable=import-outside-toplevel

  with jax.profiler.trace(scratch):
    run_steps()
  files = sorted(glob.glob(os.path.join(scratch, "**", "*.xplane.pb"), recursive=True),
                 key=os.path.getmtime)
  if not files:
    return {"error": "no trace written"}
  categories = _hlo_categories(hlo_text)
  totals, unknown = {}, 0.0
  for plane in ProfileData.from_file(files[-1]).planes:
    for line in plane.lines:
      for event in line.events:
        stats = dict(event.stats)
        op = stats.get("hlo_op")
        if op is None or "grid_step" not in str(stats.get("hlo_module", "")):
          continue
        category = categories.get(op)
        if category is None:
          unknown += event.duration_ns
          category = "(not in the HLO text)"
        if category == "control":
          continue  # Its body's ops have their own events.
        totals[category] = totals.get(category, 0.0) + event.duration_ns
  total = sum(totals.values())
  return {"total_op_ms": total / 1e6,
          "shares": {k: v / total for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}
                    if total else {}}


def ito_step_figures(config, timed_steps: int, profile_steps: int = 0,
                     scratch: str | None = None) -> dict:
  """One training program of an Ito config, as the loop builds it: XLA's cost analysis
  of the compiled step (FLOPs per grid step), the compile seconds, steps/s over
  `timed_steps` after two warm-up steps, and (profile_steps > 0) the op shares."""
  import tempfile  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel

  from experiments import data  # pylint: disable=import-outside-toplevel
  from experiments import steps  # pylint: disable=import-outside-toplevel

  source = data.source(config)
  trainer = steps.build_trainer(config, source.task, jax.devices()[:1])
  state, seeds, step_fn = trainer.state, trainer.seeds, trainer.step
  trainer.state = None
  models = len(trainer.members)
  batches = [trainer.place(source.batch(s)) for s in range(4)]
  start = time.perf_counter()
  compiled = step_fn.lower(state, seeds, batches[0]).compile()
  compile_s = time.perf_counter() - start
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  flops = float(cost["flops"])
  for s in range(2):
    state, _ = compiled(state, seeds, batches[s % 4])
  jax.block_until_ready(state)
  start = time.perf_counter()
  for s in range(timed_steps):
    state, _ = compiled(state, seeds, batches[s % 4])
  jax.block_until_ready(state)
  seconds = (time.perf_counter() - start) / max(timed_steps, 1)
  result = {"models": models, "flops_per_step": flops,
            "flops_per_model_step": flops / models,
            "analytic_matmul_flops_per_model_step": ito_matmul_flops(config),
            "transcendentals_per_step": float(cost.get("transcendentals", 0.0)),
            "bytes_accessed_per_step": float(cost.get("bytes accessed", 0.0)),
            "compile_s": compile_s, "timed_steps": timed_steps,
            "seconds_per_step": seconds, "steps_per_s": 1.0 / seconds,
            "model_steps_per_s": models / seconds,
            "gflops_achieved": flops / seconds / 1e9}
  if profile_steps > 0:
    holder = {"state": state}

    def run_steps():
      current = holder["state"]
      for s in range(profile_steps):
        current, _ = compiled(current, seeds, batches[s % 4])
      jax.block_until_ready(current)
      holder["state"] = current

    folder = tempfile.mkdtemp(prefix="ito_profile_", dir=scratch)
    result["profile"] = profile_shares(run_steps, compiled.as_text(), folder)
    result["profile"]["steps"] = profile_steps
  return result


def bench_ito(repeats: int) -> dict:
  """Ito's Latin-square model (configs/latin_square.py, learn σ 0.2, scale small): FLOPs
  per step from XLA's cost analysis, this CPU's float32 matmul throughput measured in the
  same run, steps/s, the achieved fraction, and the op shares of a profile, for one model
  and for a grid of seeds in one program."""
  del repeats
  import jax  # pylint: disable=import-outside-toplevel

  from configs import latin_square  # pylint: disable=import-outside-toplevel

  results = {"device": jax.devices()[0].device_kind, "load_start": _load(),
             "config": ITO_CONFIG, "matmul": matmul_throughput()}
  peak = results["matmul"]["gflops_best"]
  print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}; load average "
        f"{results['load_start']}")
  print(f"float32 jnp.dot {MATMUL_SIZE}x{MATMUL_SIZE}: best {peak:.1f} GFLOP/s, median "
        f"{results['matmul']['gflops_median']:.1f} GFLOP/s\n")
  print("| models | GFLOP per step (cost analysis) | per model | analytic matmuls per model "
        "| compile s | s per step | model steps/s | GFLOP/s | of the matmul's best |")
  print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for seeds in (int(s) for s in _ITO_SEEDS.value):
    config = latin_square.get_config(f"{ITO_CONFIG},seeds={seeds}")
    figures = ito_step_figures(config, max(2, _ITO_STEPS.value // seeds),
                               _ITO_PROFILE_STEPS.value, _SCRATCH.value)
    figures["fraction_of_matmul"] = figures["gflops_achieved"] / peak
    results[f"seeds_{seeds}"] = figures
    print(f"| {seeds} | {figures['flops_per_step'] / 1e9:.2f} | "
          f"{figures['flops_per_model_step'] / 1e9:.2f} | "
          f"{figures['analytic_matmul_flops_per_model_step'] / 1e9:.2f} | "
          f"{figures['compile_s']:.0f} | {figures['seconds_per_step']:.3f} | "
          f"{figures['model_steps_per_s']:.2f} | {figures['gflops_achieved']:.1f} | "
          f"{figures['fraction_of_matmul']:.0%} |", flush=True)
    jax.clear_caches()
    gc.collect()
  for seeds in (int(s) for s in _ITO_SEEDS.value):
    profile = results[f"seeds_{seeds}"].get("profile")
    if profile and profile.get("shares"):
      shares = ", ".join(f"{k} {v:.1%}" for k, v in profile["shares"].items())
      print(f"\nop time by category, {seeds} model(s), {profile['steps']} profiled steps "
            f"({profile['total_op_ms']:.0f} ms of op time): {shares}")
  results["load_end"] = _load()
  print(f"\nload average at the end: {results['load_end']}")
  return results


SECTIONS = {"tasks": bench_tasks, "train": bench_train, "grid": bench_grid,
            "attention": bench_attention, "buckets": bench_buckets,
            "ito": bench_ito}


def main(argv):
  del argv
  from absl import logging  # pylint: disable=import-outside-toplevel
  logging.set_verbosity(logging.WARNING)
  if _CACHE_CHILD.value is not None:  # A subprocess of `buckets` (part cache).
    _cache_child(_CACHE_CHILD.value)
    return
  # Compile seconds here mean compiling: this process never reads a persistent cache
  # (the parts of `buckets` that measure the cache start subprocesses with their own).
  from experiments import compile_cache  # pylint: disable=import-outside-toplevel
  compile_cache.enable("off")
  unknown = [s for s in _SECTIONS.value if s not in SECTIONS]
  if unknown:
    raise app.UsageError(f"unknown sections {unknown}; valid: {', '.join(SECTIONS)}")
  tunables = os.environ.get("GLIBC_TUNABLES", "")
  print(f"GLIBC_TUNABLES={tunables or '(unset)'} (see experiments/runtime.py)")
  results = {"glibc_tunables": tunables}
  for section in _SECTIONS.value:
    print(f"\n## {section}\n")
    results[section] = SECTIONS[section](_REPEATS.value)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  from experiments import runtime  # pylint: disable=ungrouped-imports
  runtime.maybe_reexec()  # Huge-page malloc for XLA CPU; see experiments/runtime.py.
  app.run(main)
