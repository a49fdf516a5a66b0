"""Training entry point, resume, bucketed evaluation, multi-device and error paths."""
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import randomized_pe as rpe
import tasks
from configs import default
from experiments.training import data
from experiments.training import evaluation
from experiments.training import loop
from experiments.training import steps
from experiments.training import trained_run
from tests import entry_points

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}


def tiny_config(**training):
  config = default.get_config()
  config.task = "reverse_string"
  config.model.pe = "randomized_relative"
  config.model.update(num_layers=1, num_heads=2, d_model=16, widening_factor=2,
                      max_position=64)
  # max_programs=1: lengths 1..max_length padded to one shape, so each test compiles one
  # training program instead of one per length (padded = unpadded: tests/test_buckets.py).
  # Tests of the exact-lengths path ask for max_programs=0. checkpoint_every=4: one save,
  # at the end (an orbax save is about 0.16 s of CPU); tests of resuming ask for more.
  config.training.update(steps=4, batch_size=8, learning_rate=1e-3, max_length=3,
                         log_every=2, checkpoint_every=4, prefetch=2, max_programs=1)
  config.training.update(training)
  # One evaluation program for lengths 1..6 (padded = per-length: test_bucketed_evaluation_
  # equals_per_length); the tests of buckets ask for more.
  config.evaluation.update(max_length=6, batch_size=8, max_buckets=1)
  config.progress = False
  return config


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(tree)])


def test_entry_point_smoke(tmp_path):
  workdir = tmp_path / "run"
  cmd = [sys.executable, "-m", "experiments.train", "--config=configs/demo.py",
         "--task=parity_check", "--pe=randomized_rope", f"--workdir={workdir}",
         "--config.model.num_layers=1", "--config.model.d_model=16", "--config.model.num_heads=2",
         "--config.training.steps=4", "--config.training.batch_size=8",
         "--config.training.max_length=3", "--config.training.log_every=2",
         "--config.training.checkpoint_every=2", "--config.evaluation.max_length=6",
         "--config.evaluation.batch_size=8", "--config.evaluation.max_buckets=1",
         "--config.progress=False"]
  out = entry_points.run_command(cmd, env=ENV, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "(training)" in out.stdout and "(unseen)" in out.stdout
  config = json.loads((workdir / "config.json").read_text())
  assert config["task"] == "parity_check" and config["model"]["pe"] == "randomized_rope"
  records = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [2, 4]
  for r in records:
    assert np.isfinite(r["loss"]) and 0 <= r["accuracy"] <= 1 and r["steps_per_second"] > 0
  result = json.loads((workdir / "eval.json").read_text())
  assert result["lengths"] == list(range(1, 7)) and result["step"] == 4
  assert all(0 <= a <= 1 for a in result["accuracy"])
  assert result["scores"]["unseen"] == pytest.approx(np.mean(result["accuracy"][3:]))
  assert result["scores"]["train_range"] == pytest.approx(np.mean(result["accuracy"][:3]))
  assert sorted(f for f in os.listdir(workdir / "checkpoints") if f.isdigit()) == ["2", "4"]
  assert not [f for f in os.listdir(workdir) if f.startswith(".tmp")]


def test_resume_equals_uninterrupted_run(tmp_path, monkeypatch):
  # Checkpoints at 2, 4, 6; log records at 3 and 6: the resume at step 4 is inside a log
  # interval, whose record must still average steps 4-6 as the uninterrupted run's does.
  # Evaluation during training at 3 and 6 (Figure 2's records), with the same programs
  # and batches as the final one.
  # With a learning-rate schedule, whose update count is part of the optimizer state, so
  # the resumed run must continue the schedule where it stopped (the constant default is
  # every other run of the suite).
  def config(steps):
    c = tiny_config(steps=steps, log_every=3, lr_schedule="warmup_cosine",
                    lr_warmup_steps=2, lr_decay_steps=8)
    c.evaluation.every_steps = 3
    return c

  straight = config(6)
  # The straight run's evaluations each take `pause` seconds more, so that the
  # clock's split between training and evaluating is checked with a margin (compared
  # with the evaluations' own few milliseconds, a checkpoint saved under load can take
  # longer); results do not depend on it.
  pause = 1.0
  evaluate = evaluation.LengthEvaluation._evaluate

  def slow_evaluate(self, *args, **kwargs):
    time.sleep(pause)
    return evaluate(self, *args, **kwargs)

  with monkeypatch.context() as patched:
    patched.setattr(evaluation.LengthEvaluation, "_evaluate", slow_evaluate)
    final = loop.train_and_evaluate(straight, str(tmp_path / "straight"))
  first = config(4)  # Stops after the checkpoint of step 4.
  loop.train_and_evaluate(first, str(tmp_path / "resumed"))
  second = config(6)
  resumed_final = loop.train_and_evaluate(second, str(tmp_path / "resumed"))
  a = trained_run.restore_run(str(tmp_path / "straight")).state
  b = trained_run.restore_run(str(tmp_path / "resumed")).state
  assert a.step.tolist() == b.step.tolist() == [6]  # Stacked: one model.
  np.testing.assert_array_equal(_flat(a.params), _flat(b.params))  # Bitwise on CPU.
  np.testing.assert_array_equal(_flat(a.opt_state), _flat(b.opt_state))
  ra = [json.loads(l) for l in open(tmp_path / "straight" / "metrics.jsonl")]
  rb = [json.loads(l) for l in open(tmp_path / "resumed" / "metrics.jsonl")]
  assert [(r["step"], "evaluation" in r) for r in ra] == [
      (3, False), (3, True), (6, False), (6, True)]
  assert [(r["step"], "evaluation" in r) for r in rb] == [(r["step"], "evaluation" in r) for r in ra]
  seconds = [r["train_seconds"] for r in ra if "evaluation" in r] + [final["train_seconds"]]
  assert 0 < seconds[0] < seconds[1] <= seconds[2]
  assert 0 < resumed_final["train_seconds"]
  # CPU seconds over the same spans, carried through the checkpoint like the wall clock.
  for result in (final, resumed_final):
    assert 0 < result["train_cpu_seconds"] < 4 * result["train_seconds"]
  # What the evaluations cost (two during training, the final one), carried alike.
  for result in (final, resumed_final):
    assert 0 < result["evaluation_cpu_seconds"] < 4 * result["evaluation_seconds"]
  # Three evaluations (steps 3 and 6, the final one) count as evaluating; after the
  # record of step 6 only its checkpoint counts as training, not the final evaluation.
  assert final["evaluation_seconds"] >= 3 * pause
  assert 0 <= final["train_seconds"] - seconds[1] < pause
  for x, y in zip(ra, rb):  # Record for record, all but the timing.
    for timing in ("steps_per_second", "train_seconds"):
      x.pop(timing, None), y.pop(timing, None)
    assert x == y
  # The evaluation during training at the last step is the final evaluation.
  last = ra[-1]["evaluation"]
  assert last["lengths"] == final["lengths"] and last["accuracy"] == final["accuracy"]
  assert last["unseen"] == final["scores"]["unseen"]
  assert last["mean"] == pytest.approx(np.mean(final["accuracy"]), abs=1e-12)


def _per_length_reference(model, task, params, lengths, batch_size, seed):
  """Each length on its own: no padding, no masks, positions drawn for that length.

  Jitted (one program per length) because op-by-op execution compiles every operation
  for every length, which made this reference the slowest part of the suite.
  """
  apply = jax.jit(lambda p, k, t, pos: model.apply(p, k, t, pos, is_training=False))
  accuracy = []
  for n in lengths:
    batch = data.make_batch(task, jax.random.fold_in(jax.random.PRNGKey(seed), n),
                            batch_size, n)
    key = jax.random.fold_in(jax.random.PRNGKey(seed + 1), n)
    pos_key, dropout_key = jax.random.split(key)
    positions = model.sample_positions(pos_key, batch["tokens"].shape[1], evaluation=True)
    logits = apply(params, jax.random.fold_in(dropout_key, 0), batch["tokens"], positions)
    out = logits[:, -batch["targets"].shape[1]:]
    correct = (np.argmax(out, -1) == batch["targets"]) & batch["mask"]
    accuracy.append(correct.sum() / batch["mask"].sum())
  return np.array(accuracy)


@pytest.mark.parametrize("task_name,pe,compat", [
    ("binary_addition", "randomized_relative", "paper"),
    ("reverse_string", "randomized_rope", "release"),
    ("modular_arithmetic", "randomized_learned", "paper"),
])
def test_bucketed_evaluation_equals_per_length(task_name, pe, compat):
  task = tasks.get(task_name)
  config = rpe.EncoderConfig(vocab_size=task.input_size + 1, pe=pe, compat=compat,
                             num_layers=2, num_heads=2, d_model=16, widening_factor=2,
                             max_position=64, dropout_rate=0.0)
  model = rpe.EncoderModel(config, task.output_size)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 3), jnp.int32))
  lengths = range(1, 9)
  evaluator = evaluation.RangeEvaluator(model, task)
  got = evaluator.evaluate(params, lengths, batch_size=16, seed=7, max_buckets=3)
  assert len(got["buckets"]) <= 3 and evaluator.traces <= len(got["buckets"])
  want = _per_length_reference(model, task, params, lengths, 16, 7)
  np.testing.assert_allclose(got["accuracy"], want, atol=1e-6)
  assert 0.05 < np.mean(want) < 0.95  # Untrained: the comparison is not trivial.


def test_evaluation_compiles_at_most_one_program_per_bucket():
  task = tasks.get("reverse_string")
  config = rpe.EncoderConfig(vocab_size=3, pe="randomized_alibi", num_layers=1, num_heads=2,
                             d_model=16, widening_factor=2, max_position=256)
  model = rpe.EncoderModel(config, 2)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 3), jnp.int32))
  evaluator = evaluation.RangeEvaluator(model, task, max_logits=2**16)
  result = evaluator.evaluate(params, range(1, 65), batch_size=4, seed=0, max_buckets=6)
  assert len(result["buckets"]) == 6 and result["buckets"][-1] == 128
  assert evaluator.traces <= 6


def test_plan_buckets_is_optimal_on_a_small_case():
  sizes = [2, 3, 4, 10, 11, 12]
  assert data.plan_buckets(sizes, 2) == [4, 12]
  assert data.plan_buckets(sizes, 10) == sizes
  assert data.plan_buckets(sizes, 1) == [12]


def count_step_traces(monkeypatch) -> list:
  """The batch shapes the training step's gradients are traced with (one entry per
  compiled program; the update is one program for every shape)."""
  traces = []
  original = steps.make_gradient_step

  def counting(*args, **kwargs):
    step = original(*args, **kwargs)

    def wrapped(state, keys, batch):
      traces.append(batch["tokens"].shape)
      return step(state, keys, batch)
    return wrapped

  monkeypatch.setattr(steps, "make_gradient_step", counting)
  return traces


def test_training_compiles_one_program_per_length(tmp_path, monkeypatch):
  traces = count_step_traces(monkeypatch)
  config = tiny_config(steps=16, max_length=4, log_every=16, checkpoint_every=16,
                       max_programs=0)
  config.evaluation.max_length = 2
  loop.train_and_evaluate(config, str(tmp_path / "run"))
  lengths_seen = {data.data_for_step(tasks.get("reverse_string"), config, s)["tokens"].shape
                  for s in range(1, 17)}
  assert len(traces) == len(lengths_seen) and 2 <= len(lengths_seen) <= 4


def test_nonfinite_update_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
  original = steps.make_optimizer

  def poisoned(config, learning_rate=None):  # Updates become NaN from the third step on.
    return optax.chain(original(config, learning_rate),
                       optax.scale_by_schedule(lambda count: jnp.where(count >= 2, jnp.nan, 1.0)))

  monkeypatch.setattr(steps, "make_optimizer", poisoned)
  config = tiny_config(steps=6, log_every=1, checkpoint_every=2)
  with pytest.raises(loop.NonFiniteLossError, match=r"step 3.*checkpoint \(step 2\)"):
    loop.train_and_evaluate(config, str(tmp_path / "run"))
  state = trained_run.restore_run(str(tmp_path / "run")).state
  assert state.step.tolist() == [2] and np.all(np.isfinite(_flat(state.params)))


def test_two_devices_give_the_same_loss_as_one(tmp_path):
  script = f"""
import sys; sys.path.insert(0, {ROOT!r})
import jax
assert jax.device_count() == 2, jax.devices()
from tests.test_training import tiny_config
from experiments.training import loop
config = tiny_config(steps=3, log_every=1, checkpoint_every=3)
loop.train_and_evaluate(config, {str(tmp_path / 'two')!r})
config.grid.seeds = (0, 1)  # Two models: the models axis is split over the devices.
loop.train_and_evaluate(config, {str(tmp_path / 'two_grid')!r})
from experiments.training import steps
split = steps.mesh_shardings(jax.devices(), 2, "vmap")
assert not split[0].is_fully_replicated and split[2].is_fully_replicated, split
# The loop layout runs one model at a time: the devices share its batch instead.
looped = steps.mesh_shardings(jax.devices(), 2, "loop")
assert looped[0].is_fully_replicated and not looped[2].is_fully_replicated, looped
"""
  env = {**ENV, "XLA_FLAGS": " ".join(
      [ENV.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=2"]).strip()}
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  loop.train_and_evaluate(tiny_config(steps=3, log_every=1, checkpoint_every=3),
                              str(tmp_path / "one"))
  two = [json.loads(l)["loss"] for l in open(tmp_path / "two" / "metrics.jsonl")]
  one = [json.loads(l)["loss"] for l in open(tmp_path / "one" / "metrics.jsonl")]
  assert len(one) == len(two) == 3
  np.testing.assert_allclose(two, one, atol=1e-5)
  e_two = json.load(open(tmp_path / "two" / "eval.json"))["accuracy"]
  e_one = json.load(open(tmp_path / "one" / "eval.json"))["accuracy"]
  np.testing.assert_allclose(e_two, e_one, atol=1e-6)
  # The two-model grid split over two devices: model 0 equals the single run.
  grid = [json.loads(l)["loss"] for l in open(tmp_path / "two_grid" / "metrics.jsonl")]
  np.testing.assert_allclose([g[0] for g in grid], one, atol=1e-5)
  assert all(abs(g[0] - g[1]) > 1e-6 for g in grid)


@pytest.mark.parametrize("args,message", [
    (["--task=sorting"], "unknown task 'sorting'; valid names: even_pairs"),
    (["--pe=rotary"], "unknown positional encoding 'rotary'; valid names: none, sin_cos"),
    (["--config.model.max_position=100"], "max_position=100 is smaller than the longest"),
    (["--config.evaluation.positions=grid"],
     "unknown position sampler 'grid'; valid choices: arange, randomized, unsorted"),
    (["--config.training.positions=unsorted", "--config.model.compat=release"],
     "sampler 'unsorted' cannot give"),
])
def test_bad_input_exits_2_with_one_line_and_no_files(tmp_path, args, message):
  workdir = tmp_path / "run"
  out = entry_points.run("experiments.train", [f"--workdir={workdir}", *args], env=ENV,
                         timeout=120)
  assert out.returncode == 2
  lines = [l for l in out.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], out.stderr
  assert not workdir.exists()



def test_step_keys_equal_the_keys_jax_random_makes_one_step_at_a_time():
  # The data keys come in blocks from one program (so making a batch needs no device
  # work); they must be the keys the per-step formula gives, or every run's data changes.
  for seed, data_seed in ((0, -1), (3, 7)):
    config = tiny_config()
    config.seed, config.data_seed = seed, data_seed
    root = jax.random.fold_in(jax.random.PRNGKey(data.data_seed(config)), 0x646174)
    for step in (0, 1, 5, 1023, 1024, 1025, 2_000_000, 2**32 - 1):
      key, batch_key = data.step_keys(config, step)
      want = jax.random.fold_in(root, step)
      assert key.dtype == np.uint32 and key.shape == (2,)
      np.testing.assert_array_equal(key, np.asarray(want))
      np.testing.assert_array_equal(batch_key, np.asarray(jax.random.fold_in(want, 1)))
  with pytest.raises(ValueError, match="step must be in"):
    data.step_keys(config, -1)


def test_training_clock_counts_wall_and_cpu_seconds_without_evaluation(monkeypatch):
  now = {"wall": 100.0, "cpu": 10.0}
  monkeypatch.setattr(loop.time, "perf_counter", lambda: now["wall"])
  monkeypatch.setattr(loop.time, "process_time", lambda: now["cpu"])

  def advance(wall, cpu):
    now["wall"] += wall
    now["cpu"] += cpu

  clock = loop.TrainingClock.from_carry({})  # A new run.
  advance(5.0, 8.0)
  with clock.excluded():  # Evaluation during training: counted apart.
    advance(3.0, 6.0)
  advance(2.0, 1.0)
  assert clock.carry() == {"train_seconds": 7.0, "train_cpu_seconds": 9.0,
                           "evaluation_seconds": 3.0, "evaluation_cpu_seconds": 6.0}
  resumed = loop.TrainingClock.from_carry({"count": 2, **clock.carry()})
  advance(1.0, 0.5)
  with resumed.evaluating():  # The final evaluation: evaluation, and training stopped.
    advance(4.0, 2.0)
  assert resumed.evaluation_seconds() == {"evaluation_seconds": 7.0,
                                          "evaluation_cpu_seconds": 8.0}
  assert (resumed.seconds(), resumed.cpu_seconds()) == (12.0, 11.5)  # Still running.
  # A checkpoint saved before CPU seconds were kept: its run's CPU time is unknown, and
  # so is what its evaluations cost.
  older = loop.TrainingClock.from_carry({"train_seconds": 7.0})
  advance(1.0, 1.0)
  with older.excluded():
    advance(1.0, 1.0)
  assert older.cpu_seconds() is None and older.carry() == {"train_seconds": 8.0}
  assert older.evaluation_seconds() is None
  # One saved before the evaluations' seconds were kept.
  between = loop.TrainingClock.from_carry({"train_seconds": 7.0, "train_cpu_seconds": 5.0})
  assert between.carry() == {"train_seconds": 7.0, "train_cpu_seconds": 5.0}
