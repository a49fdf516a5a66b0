"""FLOPs and throughput: this CPU's float32 matmul throughput (the peak the benchmark's
achieved fractions are of), and a config's training programs as the loop builds them
(step_figures): FLOPs per step from XLA's cost analysis of each step traced with
attention in one piece (`one_piece_costs`; a chunked program's analysis counts one
chunk), compile seconds of the programs as training builds them, steps/s, and the share
of op time by category from a jax.profiler trace (profile_shares)."""

import copy
import glob
import os
import re
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
from jax.profiler import ProfileData

from experiments.training import data
from experiments.training import steps
from randomized_pe import attention as attn_lib

MATMUL_SIZE = 2048


def matmul_throughput(size: int = MATMUL_SIZE, repeats: int = 10) -> dict:
  """This CPU's float32 jnp.dot of two size x size matrices: the best of `repeats`
  timed calls after a warm-up (2 size^3 FLOPs each)."""
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


def shape_key(batch) -> tuple:
  """The shapes of a batch's tokens and targets: one compiled program each."""
  return batch["tokens"].shape, batch["targets"].shape


def _hlo_categories(hlo_text: str) -> dict:
  """{instruction name: category} for the instructions of an optimized HLO module:
  "matmul" (a dot or convolution, or a fusion or custom call holding one),
  "reduction" (a fusion with a reduce), "elementwise/other fusion", "copy/transpose",
  "control" (while, call, conditional: their bodies' ops are counted instead), or the
  opcode."""
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


def _hlo_modules(hlo_text: str) -> dict:
  """{module name: its text} of one or several optimized HLO modules one after another
  (each begins with a line "HloModule NAME, ...")."""
  modules, name = {}, None
  for line in hlo_text.splitlines(keepends=True):
    header = re.match(r"^HloModule\s+([\w.\-]+)", line)
    if header:
      name = header.group(1)
      modules[name] = ""
    if name is not None:
      modules[name] += line
  return modules


def profile_shares(run_steps, hlo_text: str, scratch: str) -> dict:
  """The share of the time of the step's HLO ops by category, from a jax.profiler trace
  of `run_steps()`: the XLA CPU runtime records one event per executed op (stat
  `hlo_op`); events are summed per category (`_hlo_categories`); ops that ran in
  parallel on the two cores both count, so shares are of the summed op time. `hlo_text`:
  the step's program, or its programs one after another (a `steps.CompiledStep`'s); only
  the events of those modules count, each op categorised within its own module."""
  with jax.profiler.trace(scratch):
    run_steps()
  files = sorted(glob.glob(os.path.join(scratch, "**", "*.xplane.pb"), recursive=True),
                 key=os.path.getmtime)
  if not files:
    return {"error": "no trace written"}
  # Longest names first: a module's name may hold another's.
  modules = sorted(((name, _hlo_categories(text)) for name, text in
                    _hlo_modules(hlo_text).items()), key=lambda m: -len(m[0]))
  totals, unknown = {}, 0.0
  for plane in ProfileData.from_file(files[-1]).planes:
    for line in plane.lines:
      for event in line.events:
        stats = dict(event.stats)
        op = stats.get("hlo_op")
        module = str(stats.get("hlo_module", ""))
        categories = next((c for name, c in modules if name in module), None)
        if op is None or categories is None:
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


def cost_of(compiled) -> dict:
  """XLA's cost analysis of a compiled program as one dict."""
  cost = compiled.cost_analysis()
  return dict(cost[0] if isinstance(cost, (list, tuple)) else cost or {})


def one_piece_costs(config, task, batches: dict) -> dict:
  """{key: cost analysis} of a config's training step on each of `batches` ({key:
  batch}), traced with attention in one piece (`attention.whole_batch_chunks`): the
  function's arithmetic. XLA's cost analysis counts a loop's body once, so the programs
  training runs (attention in cache-sized chunks on CPU) report one chunk's attention
  (the paper model at length 40: 15.6 GFLOP a step against 19.8 in one piece). For the
  same reason a grid is costed in the `vmap` layout (`loop` runs its models in a loop,
  the same arithmetic). These programs are compiled for their costs only, never run."""
  if "grid" in config and config.grid.get("layout", "vmap") != "vmap":
    config = copy.deepcopy(config)
    config.grid.layout = "vmap"
  with attn_lib.whole_batch_chunks():
    trainer = steps.build_trainer(config, task, jax.devices()[:1])
    return {key: cost_of(trainer.step.lower(trainer.state, trainer.seeds, batch).compile())
            for key, batch in batches.items()}


def step_figures(config, timed_steps: int, profile_steps: int = 0,
                 scratch: str | None = None, batches: int = 8) -> dict:
  """The training programs of a config, as the loop builds them: XLA's cost analysis of
  each step (FLOPs per grid step; `one_piece_costs`), the compile seconds, and steps/s over
  `timed_steps` after two warm-up steps on the first `batches` batches of the run's data
  (cycled; one program per distinct shape among them, so a config of several lengths or
  buckets is timed over its own length mix; FLOPs per step are the mean over the timed
  steps), and (profile_steps > 0) the op shares of the first batch's program."""
  source = data.source(config)
  trainer = steps.build_trainer(config, source.task, jax.devices()[:1])
  state, seeds, step_fn = trainer.state, trainer.seeds, trainer.step
  trainer.state = None
  models = len(trainer.members)
  batches = [trainer.place(source.batch(s)) for s in range(batches)]
  keys = [shape_key(b) for b in batches]
  first = {}  # The first batch of each shape: one program each.
  for key, batch in zip(keys, batches):
    first.setdefault(key, batch)
  start = time.perf_counter()
  programs = {key: step_fn.lower(state, seeds, batch).compile() for key, batch in first.items()}
  compile_s = time.perf_counter() - start
  costs = one_piece_costs(config, source.task, first)
  for s in range(2):
    state, _ = programs[keys[s % len(batches)]](state, seeds, batches[s % len(batches)])
  jax.block_until_ready(state)
  start = time.perf_counter()
  for s in range(timed_steps):
    i = s % len(batches)
    state, _ = programs[keys[i]](state, seeds, batches[i])
  jax.block_until_ready(state)
  seconds = (time.perf_counter() - start) / max(timed_steps, 1)
  timed = [keys[s % len(batches)] for s in range(max(timed_steps, 1))]
  mean = lambda name: sum(float(costs[k].get(name, 0.0)) for k in timed) / len(timed)
  flops = mean("flops")
  result = {"models": models, "programs": len(programs), "flops_per_step": flops,
            "flops_per_model_step": flops / models,
            "transcendentals_per_step": mean("transcendentals"),
            "bytes_accessed_per_step": mean("bytes accessed"),
            "flops_per_program": {str(k[0]): float(c["flops"]) for k, c in costs.items()},
            "compile_s": compile_s, "timed_steps": timed_steps,
            "seconds_per_step": seconds, "steps_per_s": 1.0 / seconds,
            "model_steps_per_s": models / seconds,
            "gflops_achieved": flops / seconds / 1e9}
  if profile_steps > 0:
    holder = {"state": state}
    compiled = programs[keys[0]]

    def run_steps():
      current = holder["state"]
      for _ in range(profile_steps):
        current, _ = compiled(current, seeds, batches[0])
      jax.block_until_ready(current)
      holder["state"] = current

    folder = tempfile.mkdtemp(prefix="step_profile_", dir=scratch)
    result["profile"] = profile_shares(run_steps, compiled.as_text(), folder)
    result["profile"]["steps"] = profile_steps
  return result
