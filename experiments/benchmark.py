"""Speed benchmarks (measured here, never asserted in tests).

  python -m experiments.benchmark                  # every section
  python -m experiments.benchmark --sections=tasks # one section

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

_SECTIONS = flags.DEFINE_list("sections", ["tasks", "train", "grid", "attention"],
                              "Which benchmarks to run.")
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed repeats per measurement (tasks).")
_OUTPUT = flags.DEFINE_string("output", None, "Optional JSON file for the raw numbers.")
_ENCODINGS = flags.DEFINE_list(
    "encodings", ["sin_cos", "relative", "randomized_sin_cos", "randomized_relative",
                  "randomized_rope", "randomized_alibi"], "Encodings timed by `train`.")
_STEPS = flags.DEFINE_integer("steps", 200, "Timed training steps per encoding (train).")
_MAX_TRAIN_LENGTH = flags.DEFINE_integer("max_train_length", 40, "Training lengths 1..N.")
_GRID_LENGTH = flags.DEFINE_integer("grid_length", 20, "Input length of the grid benchmark.")


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


SECTIONS = {"tasks": bench_tasks, "train": bench_train, "grid": bench_grid,
            "attention": bench_attention}


def main(argv):
  del argv
  from absl import logging  # pylint: disable=import-outside-toplevel
  logging.set_verbosity(logging.WARNING)
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
