"""Benchmark section `sizes`: what a training step costs at the CPU protocol for models of
other sizes than the paper's, and what a job's step costs at each CPU scale.

Part one: one model (`--size_models`, LAYERSxD_MODELxHEADS) at `scale=cpu`'s settings
(lengths 1..12 in 2 padded programs, batch 128) on `--size_task` with randomized relative
encodings: XLA's FLOPs of the step and its steps/s. Part two: each CPU scale's own grid of
3 seeds (`scale=cpu`: the paper's model, `grid.layout=vmap`; `cpu_lite`: 2 layers, `loop`)
on the same task and batch: model-steps/s, so the ratio is the cost of a job's step. Every
setting is timed `--size_rounds` times in alternating order (each round compiles afresh,
`throughput.step_figures`); the table gives the best and the median round and each one's
ratio to the first setting. Ratios are of one run: compare them, never the seconds of
another day or machine.
"""
from __future__ import annotations

import statistics

import jax

from configs import default
from configs import scales
from experiments.benchmarking import throughput
from experiments.benchmarking import timing


def parse_model(spec: str) -> tuple[int, int, int]:
  """(layers, d_model, heads) of "LAYERSxD_MODELxHEADS"; a one-line ValueError otherwise."""
  parts = spec.lower().split("x")
  if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise ValueError(f"model size {spec!r}: expected LAYERSxD_MODELxHEADS, e.g. 5x64x8")
  layers, d_model, heads = map(int, parts)
  if d_model % heads:
    raise ValueError(f"model size {spec!r}: d_model {d_model} is not a multiple of "
                     f"{heads} heads")
  return layers, d_model, heads


def settings(models, task: str) -> list[tuple[str, object]]:
  """(name, config) of every setting: one model of each size, then each CPU scale's grid."""
  out = []
  for spec in models:
    layers, d_model, heads = parse_model(spec)
    config = scales.apply_cpu(default.get_config(), seeds=(0,))
    config.task, config.model.pe = task, "randomized_relative"
    config.model.update(num_layers=layers, d_model=d_model, num_heads=heads)
    out.append((f"{layers} x {d_model}, {heads} heads", config))
  for scale in scales.CPU_SCALES:
    config = scales.apply(default.get_config(), scale)
    config.task, config.model.pe = task, "randomized_relative"
    config.training.batch_size = 128  # The task's own batch may differ (duplicate_string).
    m = config.model
    out.append((f"scale={scale}: {len(config.grid.seeds)} seeds of {m.num_layers} x "
                f"{m.d_model}, {config.grid.layout}", config))
  return out


def bench_sizes(models, task: str = "odds_first", steps: int = 120, rounds: int = 2) -> dict:
  chosen = settings(models, task)  # Bad sizes fail here, before anything is compiled.
  print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}; "
        f"{timing.cpu_name()}; {task}, randomized_relative, batch 128, lengths 1..12 in 2 "
        f"programs; {steps} grid steps a round, {rounds} rounds; load {timing.load()}\n")
  runs = {name: [] for name, _ in chosen}
  for r in range(max(rounds, 1)):
    order = chosen[r % len(chosen):] + chosen[:r % len(chosen)]
    for name, config in order:
      runs[name].append(throughput.step_figures(config, steps))
      jax.clear_caches()
  rows = []
  for name, _ in chosen:
    rates = [f["model_steps_per_s"] for f in runs[name]]
    first = runs[name][0]
    rows.append({"setting": name, "models": first["models"],
                 "gflop_per_model_step": first["flops_per_model_step"] / 1e9,
                 "compile_s": min(f["compile_s"] for f in runs[name]),
                 "model_steps_per_s_best": max(rates),
                 "model_steps_per_s_median": statistics.median(rates)})
  base = rows[0]
  print("| setting | GFLOP a model step | compile s | model-steps/s, best / median "
        "| vs the first |\n|---|---:|---:|---:|---:|")
  for row in rows:
    best = row["model_steps_per_s_best"] / base["model_steps_per_s_best"]
    median = row["model_steps_per_s_median"] / base["model_steps_per_s_median"]
    row.update(ratio_best=best, ratio_median=median)
    print(f"| {row['setting']} | {row['gflop_per_model_step']:.2f} | {row['compile_s']:.1f} "
          f"| {row['model_steps_per_s_best']:.2f} / {row['model_steps_per_s_median']:.2f} "
          f"| {best:.2f}x / {median:.2f}x |")
  return {"task": task, "steps": steps, "rounds": rounds, "cpu": timing.cpu_name(),
          "rows": rows}
