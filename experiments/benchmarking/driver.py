"""A training-step timer that the benchmark's sections `train` and `eval`
(processes.TrainWorker) copy to a temporary folder and start once per code version and
malloc setting, as a script (`python driver.py SPEC`; importing it runs nothing). It
imports the code under test from its own folder (argument "root"): this project at
today's tree or at a temporary worktree of a previous commit ("kind": "ours"), or the
original release google-deepmind/randomized_positional_encodings ("kind": "release"),
and builds the training step of the same model (5 layers, d_model 64, 8 heads, dropout
0.1), batch and lengths. "stand_in": "attention_free" (ours only) replaces attention's
core by a pass-through (`attention_free`): not a model, a bound on what any attention
kernel could buy. Protocol (one JSON object per line on stdout, after a tag):
  READY {"params", "compile_s", "programs", "costed", "flops": {length: FLOPs},
      "bytes": {...}} after compiling one program per length (ahead of time) and running
      each once; the costs are XLA's cost analysis of each length's step, of a program
      traced with attention in one piece where the code has `whole_batch_chunks`
      ("costed": "one piece"; a chunked program's analysis counts one chunk), else of the
      timed programs ("as compiled");
  then per line of stdin {"lengths": [...], "seed": r}: makes those batches (not timed),
      runs the steps and prints DONE {"seconds": s};
  ERROR {"error": "..."} (one line) when the code cannot be imported or built.
Kind "eval" (ours): the paper model's evaluation (experiments.training.evaluation.RangeEvaluator,
batch 500, the config's max_buckets and max_logits) of lengths "lengths": READY after
building the model; then per line {"fresh": bool} evaluates them (fresh: a new evaluator,
compiling included) and prints DONE {"seconds", "traces", "accuracy"}.
"""
import json
import os
import sys
import tempfile
import time


def emit(tag, obj):
  print(tag + " " + json.dumps(obj), flush=True)


def cost(compiled):
  c = compiled.cost_analysis()
  c = c[0] if isinstance(c, (list, tuple)) else c
  return float(c.get("flops", 0.0)), float(c.get("bytes accessed", 0.0))


def _ours_module(name):
  """The module `name` of the code under test: experiments/training/NAME.py (today's
  layout), else experiments/NAME.py (commits before experiments/training/), else None."""
  import importlib
  for dotted in (f"experiments.training.{name}", f"experiments.{name}"):
    try:
      return importlib.import_module(dotted)
    except ImportError:  # Also experiments/training.py of old commits: not a package.
      continue
  return None


def attention_free():
  """Replaces `randomized_pe.families.attend` (logits, encoding, softmax, weighted sum, in
  every layer) by the values at the query rows plus the queries: the step keeps its
  projections, feed-forward blocks, layer norms, dropout, loss and update, and the
  gradients still reach the queries, keys and values. Its time bounds what any attention
  kernel could make of the step."""
  import jax
  from randomized_pe import families

  def attend(family, positions, params, ctx, q, k, v, key_mask=None, *, query_start=0,
             return_weights=False, **unused):
    del family, positions, params, ctx, k, key_mask, unused
    if return_weights:
      raise ValueError("the attention-free stand-in has no weights")
    return jax.lax.dynamic_slice_in_dim(v, query_start, q.shape[1], axis=1) + q

  families.attend = attend


def ours():
  root = os.path.abspath(SPEC["root"])
  sys.path.insert(0, root)
  os.chdir(root)
  if SPEC.get("stand_in") == "attention_free":
    attention_free()
  elif SPEC.get("stand_in"):
    raise ValueError(f"unknown stand_in {SPEC['stand_in']!r}; valid: attention_free")
  compile_cache = _ours_module("compile_cache")
  if compile_cache is not None:  # None: commits before the persistent cache (e.g. ecff2ab).
    compile_cache.enable("off")
  import jax
  import tasks
  from configs import default
  task = tasks.get("reverse_string")
  config = default.get_config()
  config.model.pe = SPEC["pe"]
  config.model.compat = SPEC["compat"]
  config.training.batch_size = BATCH
  config.training.max_length = max(LENGTHS)
  config.model.update(**SPEC.get("model", {}))  # Tests: a tiny model.
  data, steps = _ours_module("data"), _ours_module("steps")
  if data is None or steps is None:  # Commits before experiments/steps.py (e.g. ecff2ab).
    holder, seeds, place, step, data = _ours_before_steps_module(config, task)
  else:
    trainer = steps.build_trainer(config, task)
    holder = {"state": trainer.state}
    seeds, place, step = trainer.seeds, trainer.place, trainer.step
    trainer.state = None  # The loop owns (and donates) the state.
  params = sum(x.size for x in jax.tree_util.tree_leaves(holder["state"].params))

  def make(n, key):
    return place(data.make_batch(task, jax.random.PRNGKey(key), BATCH, n))

  def compile_one(n):
    return step.lower(holder["state"], seeds, make(n, n)).compile()

  def run(compiled, batches):
    state = holder["state"]
    for program, batch in zip(compiled, batches):
      state, _ = program(state, seeds, batch)
    holder["state"] = state
    jax.block_until_ready(state)

  return (params, make, compile_one, run, lambda: jax.block_until_ready(holder["state"]),
          _one_piece_costs(steps, config, task, make))


def _one_piece_costs(steps, config, task, make):
  """n -> (FLOPs, bytes) of the step at length n traced with attention in one piece
  (`randomized_pe.attention.whole_batch_chunks`), or None for code without it. XLA's cost
  analysis counts a loop's body once, so the timed programs' own costs count one chunk's
  attention; the one-piece program is the same function, costed whole (not run)."""
  from randomized_pe import attention  # pylint: disable=import-outside-toplevel
  if steps is None or not hasattr(attention, "whole_batch_chunks"):
    return None

  with attention.whole_batch_chunks():
    trainer = steps.build_trainer(config, task)

  def costs(n):
    with attention.whole_batch_chunks():  # Chunks are chosen while a program is traced.
      return cost(trainer.step.lower(trainer.state, trainer.seeds, make(n, n)).compile())

  return costs


def _ours_before_steps_module(config, task):
  """The training step as the benchmark of those commits built it (experiments/training.py)."""
  import jax
  import jax.numpy as jnp
  import randomized_pe as rpe
  from experiments import training
  model_config = training.model_config_from(config, task)
  model = rpe.make_encoder(model_config, task.output_size)
  members = training.grid_members(config)
  state = training.init_grid(model, config, members)
  seeds = jnp.array([m[0] for m in members], jnp.int32)
  state_sharding, seeds_sharding, batch_sharding = training.mesh_shardings(
      jax.devices(), len(members))
  if state_sharding is not None:
    state = jax.device_put(state, state_sharding)
    seeds = jax.device_put(seeds, seeds_sharding)
  place = (lambda b: jax.device_put(b, batch_sharding)) if batch_sharding else (lambda b: b)
  step = jax.jit(training.make_grid_step(model, model_config, training.make_optimizer(config)),
                 donate_argnums=(0,))
  return {"state": state}, seeds, place, step, training


def release():
  root = os.path.abspath(SPEC["root"])
  if not os.path.isfile(os.path.join(root, "experiments", "training.py")):
    raise FileNotFoundError(f"{root} is not a checkout of "
                            "google-deepmind/randomized_positional_encodings "
                            "(no experiments/training.py)")
  name = "randomized_positional_encodings"
  parent = os.path.dirname(root)
  if os.path.basename(root) != name:  # Its modules import themselves by that name.
    parent = tempfile.mkdtemp(prefix="release_parent_")
    os.symlink(root, os.path.join(parent, name))
  sys.path.insert(0, parent)
  import haiku as hk
  import jax
  import jax.numpy as jnp
  import optax
  from randomized_positional_encodings.experiments import training
  from randomized_positional_encodings.experiments import utils
  from randomized_positional_encodings.models import transformer
  from randomized_positional_encodings.tasks.dcf import reverse_string
  names = {"sin_cos": "SIN_COS", "relative": "RELATIVE", "rope": "ROTARY",
           "alibi": "ALIBI", "learned": "LEARNT"}
  pe = SPEC["pe"]
  noisy = pe.startswith("randomized_")
  base = pe[len("randomized_"):] if noisy else pe
  if base not in names:
    raise ValueError(f"the release has no encoding for {pe}")
  tiny = SPEC.get("model", {})  # Tests: a tiny model.
  kwargs = {"num_layers": tiny.get("num_layers", 5),
            "embedding_dim": tiny.get("d_model", 64), "dropout_prob": 0.1,
            "positional_encodings": ("NOISY_" if noisy else "") + names[base]}
  if noisy:
    kwargs["positional_encodings_params"] = {"noise_max_length": int(SPEC["max_position"])}
  task = reverse_string.ReverseString(vocab_size=2)
  model = transformer.make_transformer(output_size=task.output_size,
                                       transformer_module=transformer.TransformerEncoder,
                                       return_all_outputs=True, **kwargs)
  model = hk.transform(utils.make_model_with_empty_targets(
      model, task, 0, task.output_length(10) == 1))

  def loss_fn(output, target):  # As the release's experiments/example.py.
    return jnp.mean(jnp.sum(task.pointwise_loss_fn(output, target), axis=-1)), {}

  def accuracy_fn(output, target):
    mask = task.accuracy_mask(target)
    return jnp.sum(mask * task.accuracy_fn(output, target)) / jnp.sum(mask)

  # As the release's TrainingWorker builds it (learning rate: speed does not depend on it).
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-4))
  init_batch = task.sample_batch(jax.random.PRNGKey(1), length=10, batch_size=BATCH)
  params = model.init(jax.random.PRNGKey(0), init_batch["input"])
  holder = {"params": params, "opt": optimizer.init(params)}
  static = {"model_apply_fn": model.apply, "loss_fn": loss_fn, "accuracy_fn": accuracy_fn,
            "optimizer": optimizer, "is_autoregressive": False}

  def make(n, key):
    key = jax.random.PRNGKey(key)
    return (task.sample_batch(key, length=n, batch_size=BATCH), jax.random.fold_in(key, 1))

  def compile_one(n):
    batch, key = make(n, n)
    return training._update_parameters.lower(  # pylint: disable=protected-access
        params=holder["params"], rng_key=key, batch=batch, opt_state=holder["opt"],
        **static).compile()

  def run(compiled, batches):
    p, o = holder["params"], holder["opt"]
    for program, (batch, key) in zip(compiled, batches):
      p, o, _ = program(params=p, rng_key=key, batch=batch, opt_state=o)
    holder["params"], holder["opt"] = p, o
    jax.block_until_ready(p)

  count = sum(x.size for x in jax.tree_util.tree_leaves(params))
  # No chunks in the release's attention: its programs' costs are whole.
  return count, make, compile_one, run, lambda: jax.block_until_ready(holder["params"]), None


def evaluation_driver():
  root = os.path.abspath(SPEC["root"])
  sys.path.insert(0, root)
  os.chdir(root)
  try:
    compile_cache = _ours_module("compile_cache")
    if compile_cache is not None:  # None: commits before the persistent cache.
      compile_cache.enable("off")
    import tasks
    from configs import default
    evaluation, steps = _ours_module("evaluation"), _ours_module("steps")
    if evaluation is None or steps is None:
      raise ImportError("no experiments/training/evaluation.py or experiments/evaluation.py")
    task = tasks.get("reverse_string")
    config = default.get_config()
    config.model.pe = SPEC["pe"]
    config.model.update(**SPEC.get("model", {}))
    config.evaluation.update(**SPEC.get("evaluation", {}))
    model = steps.build_model(config, task)
    state = steps.init_state(model, steps.make_optimizer(config), 0)
    e = config.evaluation
  except Exception as error:  # pylint: disable=broad-except
    emit("ERROR", {"error": f"{type(error).__name__}: {error}".splitlines()[0][:300]})
    sys.exit(1)
  emit("READY", {"batch": e.batch_size, "max_buckets": e.max_buckets,
                 "max_logits": e.max_logits})
  evaluator = None
  for line in sys.stdin:
    if not line.strip():
      continue
    order = json.loads(line)
    if order.get("fresh") or evaluator is None:
      evaluator = evaluation.RangeEvaluator(model, task, max_logits=e.max_logits)
    traces = evaluator.traces
    start = time.perf_counter()
    result = evaluator.evaluate(state.params, LENGTHS, e.batch_size, e.seed, e.max_buckets)
    emit("DONE", {"seconds": time.perf_counter() - start,
                  "traces": evaluator.traces - traces, "accuracy": result["accuracy"]})


def main():
  if SPEC["kind"] == "eval":
    evaluation_driver()
    return
  try:
    params, make, compile_one, run, sync, one_piece = (
        ours if SPEC["kind"] == "ours" else release)()
    start = time.perf_counter()
    programs = {n: compile_one(n) for n in LENGTHS}
    compile_s = time.perf_counter() - start
    # FLOPs of the function: one-piece programs where attention runs in chunks (not timed).
    costs = {n: one_piece(n) if one_piece else cost(p) for n, p in programs.items()}
    # A program's first execution is slower on CPU: run each once before timing.
    run([programs[n] for n in LENGTHS], [make(n, 10**6 + n) for n in LENGTHS])
  except Exception as error:  # pylint: disable=broad-except
    emit("ERROR", {"error": f"{type(error).__name__}: {error}".splitlines()[0][:300]})
    sys.exit(1)
  emit("READY", {"params": int(params), "compile_s": compile_s, "programs": len(programs),
                 "costed": "one piece" if one_piece else "as compiled",
                 "flops": {n: c[0] for n, c in costs.items()},
                 "bytes": {n: c[1] for n, c in costs.items()}})
  for line in sys.stdin:
    if not line.strip():
      continue
    order = json.loads(line)
    lengths = [int(n) for n in order["lengths"]]
    batches = [make(n, order["seed"] * 100000 + i) for i, n in enumerate(lengths)]
    sync()
    start = time.perf_counter()
    run([programs[n] for n in lengths], batches)
    emit("DONE", {"seconds": time.perf_counter() - start})


if __name__ == "__main__":
  SPEC = json.loads(sys.argv[1])
  LENGTHS = [int(n) for n in SPEC["lengths"]]
  BATCH = int(SPEC.get("batch", 0))
  main()
