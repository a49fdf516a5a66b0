"""Section `buckets`: training-length buckets (training.max_programs) and the persistent
compilation cache, for the paper model on reverse_string with randomized_relative
(docs/benchmark.md): the programs, compile seconds and steps/s per max_programs setting
(part `compile`, in this process), a subprocess's compile phase started cold then warm
with its own cache folder (part `cache`: `python -m experiments.benchmark
--cache_child=N`, which runs cache_child), and the demo's wall time cold then warm (part
`demo`)."""

import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
import jax

from configs import default
from experiments.benchmarking import processes
from experiments.benchmarking import throughput
from experiments.benchmarking import timing
from experiments.training import compile_cache
from experiments.training import data
from experiments.training import steps
import tasks


def _bucket_config(max_programs: int, max_train_length: int, quick: bool):
  """The paper's config (configs/default.py) on reverse_string, randomized_relative,
  training lengths 1..max_train_length, with `training.max_programs = max_programs`;
  `quick`: a tiny model."""
  config = default.get_config()
  config.task = "reverse_string"
  config.model.pe = "randomized_relative"
  config.training.max_length = max_train_length
  config.training.max_programs = max_programs
  if quick:  # Checks the code path only.
    config.model.num_layers, config.model.d_model, config.model.num_heads = 1, 16, 2
    config.training.batch_size = 8
  return config


def _program_batches(task, config) -> dict:
  """One host batch per training program of `config`: {(tokens shape, targets shape): batch}.

  Exact lengths (max_programs 0): one per length; buckets: one per bucket shape
  (experiments.training.data.training_shapes), built as training builds them.
  """
  t = config.training
  shapes = data.training_shapes(task, config)
  batches = {}
  for n in range(t.min_length, t.max_length + 1):
    batch = data.make_batch(task, jax.random.PRNGKey(n), t.batch_size, n)
    if shapes is not None:
      batch = data.pad_batch(task, batch, *shapes[n], t.batch_size)
    batches.setdefault(throughput.shape_key(batch), batch)
  return batches


def _compile_programs(trainer, batches) -> tuple[dict, float]:
  """Lowers and compiles the step for every batch shape; (programs, seconds)."""
  start = time.perf_counter()
  compiled = {key: trainer.step.compile(trainer.state, trainer.seeds, trainer.place(batch))
              for key, batch in batches.items()}
  return compiled, time.perf_counter() - start


def _bucket_compile_and_speed(task, programs, steps_per_setting: int, round_steps: int,
                              max_train_length: int, quick: bool) -> dict:
  """Programs, compile seconds and steps/s per max_programs setting of `programs` (one
  process), `steps_per_setting` steps each in rounds of `round_steps`."""
  settings = [int(v) for v in programs]
  runs = {}
  print(f"compile (load {timing.load()}):\n")
  print("| max_programs | programs | token sizes | compile s | s per program |")
  print("|---:|---:|---|---:|---:|")
  for mp in settings:
    config = _bucket_config(mp, max_train_length, quick)
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
  total, chunk = steps_per_setting, max(1, min(round_steps, steps_per_setting))
  load_before = timing.load()
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
        state, _ = run["compiled"][throughput.shape_key(batch)](state, trainer.seeds, batch)
      jax.block_until_ready(state)
      elapsed = time.perf_counter() - start
      prefetch.close()
      run["state"] = state
      run["time"] += elapsed
      run["round_times"].append(elapsed)
  exact = runs.get(0)
  print(f"\nsteps/s over lengths 1..{max_train_length} ({total} steps per setting in "
        f"rounds of {chunk}; load {load_before} before, {timing.load()} after):\n")
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
  results["load_before_steps"], results["load_after_steps"] = load_before, timing.load()
  del runs, exact
  jax.clear_caches()
  gc.collect()
  return results


def cache_child(max_programs: int, max_train_length: int, quick: bool) -> None:
  """A process's compile phase for one setting, with the persistent cache of the
  environment (RANDOMIZED_PE_COMPILATION_CACHE): the trainer (its init program) and every
  training program. Prints one JSON line."""
  start = time.perf_counter()
  compile_cache.enable("")
  task = tasks.get("reverse_string")
  config = _bucket_config(max_programs, max_train_length, quick)
  compile_start = time.perf_counter()
  trainer = steps.build_trainer(config, task)
  batches = _program_batches(task, config)
  compiled, _ = _compile_programs(trainer, batches)
  end = time.perf_counter()
  print("CACHE_CHILD " + json.dumps({
      "compile_phase_s": end - compile_start, "imports_s": compile_start - start,
      "programs": len(compiled), **compile_cache.stats()}), flush=True)


def _child_flags(max_train_length: int, quick: bool) -> list:
  return [f"--max_train_length={max_train_length}"] + (["--quick"] if quick else [])


def _run(command, env, log_path, timeout=3600) -> tuple:
  """Runs `command` (stdout and stderr to log_path); (wall seconds, stdout text)."""
  start = time.perf_counter()
  with open(log_path, "w") as log:
    done = subprocess.run([sys.executable, *command], env=env, stdout=log,
                          stderr=subprocess.STDOUT, timeout=timeout, check=False,
                          cwd=processes.REPO)
  wall = time.perf_counter() - start
  with open(log_path) as log:
    text = log.read()
  if done.returncode != 0:
    raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}; see {log_path}:\n"
                       + text[-2000:])
  return wall, text


def _bucket_cache(scratch: str, cache_programs, max_train_length: int, quick: bool) -> dict:
  """Cold start vs warm start (the same config again) of each max_programs setting of
  `cache_programs`, each setting with its own fresh cache folder, in subprocesses."""
  results = {}
  print("\nthe same config started twice, its own fresh cache folder (subprocesses; the "
        "compile phase: trainer and every training program):\n")
  print("| max_programs | programs | cold compile s | warm compile s | warm / cold | "
        "warm: executables loaded / programs loaded / compiled | process wall cold / warm | "
        "load |")
  print("|---:|---:|---:|---:|---:|---|---|---|")
  for mp in (int(v) for v in cache_programs):
    folder = os.path.join(scratch, f"cache_programs{mp}")
    env = {**os.environ, compile_cache.ENV: folder}
    starts = []
    for name in ("cold", "warm"):
      wall, text = _run(["-m", "experiments.benchmark", f"--cache_child={mp}",
                         *_child_flags(max_train_length, quick)], env,
                        os.path.join(scratch, f"cache_programs{mp}_{name}.log"))
      line = [l for l in text.splitlines() if l.startswith("CACHE_CHILD ")][-1]
      starts.append({**json.loads(line[len("CACHE_CHILD "):]), "wall_s": wall})
    cold, warm = starts
    ratio = warm["compile_phase_s"] / cold["compile_phase_s"]
    results[str(mp)] = {"cold": cold, "warm": warm, "warm_vs_cold": ratio, "load": timing.load()}
    print(f"| {mp or 'exact'} | {cold['programs']} | {cold['compile_phase_s']:.1f} | "
          f"{warm['compile_phase_s']:.1f} | {ratio:.3f} | "
          f"{warm.get('executables_loaded', 0)} / {warm['loaded']} / {warm['compiled']} | "
          f"{cold['wall_s']:.0f} / {warm['wall_s']:.0f} | {timing.load()} |",
          flush=True)
  return results


def _demo_scores(workdir: str) -> dict:
  with open(os.path.join(workdir, "eval.json")) as f:
    record = json.load(f)
  return {"training_lengths": record["training_lengths"], **record["scores"],
          "step": record["step"]}


def _bucket_demo(scratch: str, demo_configs, demo_args, quick: bool) -> dict:
  """`python -m experiments.train --config=<demo>` in a fresh workdir with a fresh cache
  folder (cold), then again in another fresh workdir with that folder (warm), for each
  of `demo_configs`, with the extra flags `demo_args` (without the leading --)."""
  extra = [f"--{a}" for a in demo_args]
  if quick:
    extra += ["--config.training.steps=20", "--config.evaluation.max_length=12"]
  results = {}
  print(f"\n`python -m experiments.train --config=CONFIG {' '.join(extra)}` in a fresh "
        "workdir; wall seconds of the whole process, cold cache then warm:\n")
  print("| config | cache | wall s | training lengths | unseen lengths | programs | load |")
  print("|---|---|---:|---:|---:|---|---|")
  for i, config in enumerate(demo_configs):
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
                               "load": timing.load()}
      unseen = "-" if scores["unseen"] is None else f"{100 * scores['unseen']:.1f}%"
      print(f"| {config} | {name} | {wall:.1f} | {100 * scores['train_range']:.1f}% | "
            f"{unseen} | {cache_line} | {timing.load()} |", flush=True)
  return results


def bench_buckets(*, scratch: str | None, parts, max_train_length: int, quick: bool,
                  programs, steps_per_setting: int, round_steps: int, cache_programs,
                  demo_configs, demo_args) -> dict:
  """Training-length buckets, the persistent cache and the demo (experiments/benchmark.py's
  docstring; the arguments are its flags --scratch, --bucket_parts, --max_train_length,
  --quick, --bucket_programs, --bucket_steps, --bucket_round, --cache_programs,
  --demo_configs, --demo_args). `scratch`: None for a new temporary folder."""
  task = tasks.get("reverse_string")
  config = _bucket_config(0, max_train_length, quick)
  m, t = config.model, config.training
  print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}; reverse_string, "
        f"{m.pe}, {m.num_layers} layers, d_model {m.d_model}, batch {t.batch_size}, "
        f"training lengths {t.min_length}..{t.max_length}{' (--quick)' if quick else ''}"
        f"\n")
  scratch = scratch or tempfile.mkdtemp(prefix="randomized_pe_benchmark_")
  os.makedirs(scratch, exist_ok=True)
  results = {"device": jax.devices()[0].device_kind, "quick": quick,
             "scratch": scratch, "load_start": timing.load()}
  unknown = set(parts) - {"compile", "cache", "demo"}
  if unknown:
    raise app.UsageError(f"unknown --bucket_parts {sorted(unknown)}")
  if "compile" in parts:
    results["settings"] = _bucket_compile_and_speed(task, programs, steps_per_setting,
                                                    round_steps, max_train_length, quick)
  if "cache" in parts:
    results["cache"] = _bucket_cache(scratch, cache_programs, max_train_length, quick)
  if "demo" in parts:
    results["demo"] = _bucket_demo(scratch, demo_configs, demo_args, quick)
  results["load_end"] = timing.load()
  print(f"\nsubprocess logs, caches and workdirs: {scratch}")
  return results
