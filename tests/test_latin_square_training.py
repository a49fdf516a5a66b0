"""Training on the Latin Square Task through the shared loop: shuffled epochs with the last
partial batch kept, seed grids, resume, optimizers, and evaluation per condition.

Models are tiny (one block, width 16) so that each compiled program costs seconds.
"""
import dataclasses
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import latin_square
from experiments.training import data
from experiments.training import evaluation
from experiments.training import loop
from experiments.training import steps
from experiments.training import trained_run
from tests import entry_points

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}


def tiny_config(arg="encoding=learn,sigma=0.2", **training):
  config = latin_square.get_config(arg + ",scale=small")
  config.model.update(num_layers=1, d_model=16, mlp_size=32)
  config.training.update(training)
  config.progress = False
  return config


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(tree)])


def _model_row(tree, m):
  return jax.tree_util.tree_map(lambda x: x[m], tree)


def _built(config):
  """(source, model) of a config."""
  source = data.source(config)
  model = steps.build_model(config, source.task)
  return source, model


def test_config_is_the_original_protocol():
  config = latin_square.get_config("encoding=learn,sigma=0.2")
  assert config.grid.seeds == latin_square.SEEDS and len(set(config.grid.seeds)) == 15
  assert (config.training.batch_size, config.training.learning_rate) == (128, 1e-4)
  assert (config.training.optimizer, config.training.grad_clip_norm) == ("adam", 0.0)
  assert config.training.steps == 4000 * 64
  assert latin_square.get_config("scale=small").training.steps == 12_800
  adamw = latin_square.get_config("optimizer=adamw")
  assert (adamw.training.optimizer, adamw.training.weight_decay) == ("adamw", 0.1)
  assert latin_square.get_config("optimizer=sgd").training.learning_rate == 1e-3
  with pytest.raises(ValueError, match="key one of encoding, sigma"):
    latin_square.get_config("sigmaa=0.2")


def test_epochs_read_every_puzzle_once_and_keep_the_last_partial_batch():
  config = tiny_config()
  source = data.source(config)
  train = source.task.splits["train"]
  assert isinstance(source, data.EpochBatches) and source.steps_per_epoch == 64
  orders = []
  for epoch in (0, 1, 2):
    rows = [source.rows(epoch * 64 + b) for b in range(64)]
    assert [len(r) for r in rows] == [128] * 63 + [36]  # 8,100 = 63 x 128 + 36.
    np.testing.assert_array_equal(np.sort(np.concatenate(rows)), np.arange(8100))
    orders.append(np.concatenate(rows))
    last = source.batch(epoch * 64 + 63)
    real = np.arange(128) < 36
    np.testing.assert_array_equal(last["row_mask"], real)
    np.testing.assert_array_equal(last["mask"][:, 0], real)
    np.testing.assert_array_equal(last["tokens"][:36], train.tokens[rows[-1]])
    np.testing.assert_array_equal(last["targets"][:36, 0], train.answers[rows[-1]])
    assert last["tokens"].shape == (128, 16) and not last["tokens"][36:].any()
  assert not np.array_equal(orders[0], orders[1])  # Shuffled anew every epoch...
  assert not np.array_equal(orders[0], np.arange(8100))
  fresh = data.source(tiny_config())  # ...from (data seed, epoch) alone: resumable.
  for step in (130, 63, 0):
    for key, value in fresh.batch(step).items():
      np.testing.assert_array_equal(value, source.batch(step)[key])


def test_one_grid_step_equals_each_seed_alone():
  # 2d_fixed keeps the original's dropout on h + PE: each model must draw its own.
  config = tiny_config("encoding=2d_fixed,seeds=3", batch_size=32)
  source, model = _built(config)
  members = steps.grid_members(config)
  assert [s for s, _ in members] == list(latin_square.SEEDS[:3])
  tokens = data.example_tokens(source.task)
  optimizer = steps.optimizer_for(model, config)
  state = steps.init_grid(model, config, members, tokens)
  seeds = jnp.array([s for s, _ in members], jnp.int32)
  batch = source.batch(5)
  grid_state, grid_metrics = jax.jit(steps.make_grid_step(model, optimizer))(state, seeds, batch)
  step = jax.jit(lambda state, batch, seed: steps.make_train_step(
      model, optimizer, seed)(state, batch))
  for m, (seed, rate) in enumerate(members):
    single = steps.init_state(model, steps.optimizer_for(model, config, rate), seed, tokens)
    np.testing.assert_array_equal(_flat(_model_row(state.params, m)), _flat(single.params))
    single, metrics = step(single, batch, seed)
    np.testing.assert_allclose(_flat(_model_row(grid_state.params, m)), _flat(single.params),
                               atol=1e-5, rtol=0)
    np.testing.assert_allclose(grid_metrics["loss"][m], metrics["loss"], atol=1e-5)
    np.testing.assert_allclose(grid_metrics["accuracy"][m], metrics["accuracy"], atol=1e-5)
  moved = np.abs(_flat(grid_state.params) - _flat(state.params)).max()
  assert moved > 5e-5  # The step did something (Adam moves each weight by about 1e-4).
  assert len(set(np.asarray(grid_metrics["loss"]).tolist())) == 3  # Three different models.


def test_padded_rows_do_not_change_the_update():
  # The last batch of an epoch: 36 puzzles padded to 128 rows, against the same 36
  # unpadded. 2d_fixed keeps its dropout on: the real rows must get the same masks.
  config = tiny_config("encoding=2d_fixed,optimizer=sgd", learning_rate=0.1)
  source, model = _built(config)
  rows = source.rows(63)
  padded = source.batch(63)
  unpadded = data.examples_batch(source.examples, rows, len(rows))
  assert padded["tokens"].shape[0] == 128 and unpadded["tokens"].shape[0] == 36
  optimizer = steps.optimizer_for(model, config)
  state = steps.init_state(model, optimizer, 29, data.example_tokens(source.task))
  step = jax.jit(steps.make_train_step(model, optimizer, 29))
  want, want_metrics = step(state, unpadded)
  got, got_metrics = step(state, padded)
  np.testing.assert_allclose(got_metrics["loss"], want_metrics["loss"], atol=1e-6, rtol=0)
  np.testing.assert_allclose(got_metrics["accuracy"], want_metrics["accuracy"], atol=1e-6)
  np.testing.assert_allclose(_flat(got.params), _flat(want.params), atol=1e-6, rtol=0)
  assert np.abs(_flat(want.params) - _flat(state.params)).max() > 1e-3  # It moved.
  # Counting the padded rows would change the loss: the comparison can fail.
  unmasked = dict(padded, row_mask=np.ones(128, bool), mask=np.ones((128, 1), bool))
  assert abs(float(step(state, unmasked)[1]["loss"]) - float(want_metrics["loss"])) > 1e-3


def test_optimizers_sgd_is_plain_and_adamw_decays():
  config = tiny_config("optimizer=sgd", learning_rate=0.5)
  params = {"w": jnp.array([1.0, -2.0])}
  grads = {"w": jnp.array([0.25, 0.5])}
  sgd = steps.make_optimizer(config)
  updates, _ = sgd.update(grads, sgd.init(params), params)
  np.testing.assert_allclose(updates["w"], [-0.125, -0.25], atol=1e-7)
  config = tiny_config("optimizer=adamw,weight_decay=0.1", learning_rate=0.5)
  adamw = steps.make_optimizer(config)
  updates, _ = adamw.update({"w": jnp.zeros(2)}, adamw.init(params), params)
  np.testing.assert_allclose(updates["w"], [-0.05, 0.1], atol=1e-7)  # -lr * wd * p.
  config.training.optimizer = "adam"
  with pytest.raises(ValueError, match="weight_decay=0.1 needs training.optimizer='adamw'"):
    steps.make_optimizer(config)
  config.training.optimizer = "rmsprop"
  with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'; valid choices: adam"):
    steps.make_optimizer(config)


def test_adamw_leaves_frozen_tables_unchanged():
  config = tiny_config("encoding=random,optimizer=adamw,weight_decay=0.1", learning_rate=1e-2)
  source, model = _built(config)
  tokens = data.example_tokens(source.task)
  batch = source.batch(0)

  def train(optimizer, count=2):
    state = steps.init_state(model, optimizer, 6914, tokens)
    step = jax.jit(steps.make_train_step(model, optimizer, 6914))
    start = state.params
    for _ in range(count):
      state, _ = step(state, batch)
    return start, state.params

  start, params = train(steps.optimizer_for(model, config))
  table = ("ito/block_0", "table")
  assert model.frozen_mask(start)[table[0]][table[1]]
  np.testing.assert_array_equal(params[table[0]][table[1]], start[table[0]][table[1]])
  for module, values in params.items():  # Everything else trains.
    for name, value in values.items():
      if (module, name) != table:
        assert np.abs(np.asarray(value) - np.asarray(start[module][name])).max() > 1e-4
  # The same AdamW without the model's frozen mask would shrink the tables.
  start, plain = train(steps.make_optimizer(config))
  decayed = np.asarray(plain[table[0]][table[1]]) / np.asarray(start[table[0]][table[1]])
  np.testing.assert_allclose(decayed, (1 - 1e-2 * 0.1) ** 2, rtol=1e-5)


def test_evaluation_per_condition_equals_a_brute_force_count():
  config = tiny_config("encoding=2d_fixed,seeds=3")  # The grid test's (a cached program).
  source, model = _built(config)
  dataset = source.task
  members = steps.grid_members(config)
  params = steps.init_grid(model, config, members, data.example_tokens(dataset)).params
  # Chunks of 40: validation is 40 + 40 + 28 (padded), test 22 x 40 + 20 (padded).
  evaluator = evaluation.SplitEvaluator(model, dataset, batch_size=40, stacked=True)
  got = evaluator.evaluate(params, ["validation", "test"], seed=0)
  assert evaluator.traces == 1  # One program for every chunk of every split.
  for split in ("validation", "test"):
    examples = dataset.splits[split]
    for m in range(len(members)):
      classes = np.argmax(model.classify(_model_row(params, m), None, examples.tokens), -1)
      right, seen = {}, {}
      for answer, predicted, group in zip(examples.answers, classes, examples.groups):
        name = ("binary", "ternary", "quaternary")[group]
        for key in ("overall", name):
          right[key] = right.get(key, 0) + int(answer == predicted)
          seen[key] = seen.get(key, 0) + 1
      assert set(got[split]) == set(seen)
      for key in seen:
        assert got[split][key][m] == pytest.approx(right[key] / seen[key], abs=1e-12)
    overall = got[split]["overall"]
    assert 0.05 < min(overall) and max(overall) < 0.95 and len(set(overall)) > 1


@pytest.fixture
def small_dataset():
  """The Latin squares cut to 21 training puzzles (3 steps an epoch at batch 8: 8, 8, 5),
  10 test and 12 validation puzzles, every condition in each."""
  full = data.DATASETS.get("latin_square")()

  def every(examples, stride, count):
    return data.Examples(*(x[::stride][:count] for x in examples))

  small = dataclasses.replace(full, name="small_latin_square", splits={
      "train": every(full.splits["train"], 400, 21), "test": every(full.splits["test"], 90, 10),
      "validation": every(full.splits["validation"], 9, 12)})
  data.DATASETS.register(small.name, lambda: small)
  yield small
  data.DATASETS.unregister(small.name)


def test_resume_equals_uninterrupted_run(tmp_path, small_dataset):
  # Epochs of 3 steps; log records at 3 and 6 (and 7, the end), evaluations after every
  # epoch (3 and 6), checkpoints at 2 and 4: the resume at step 4 is inside an epoch and
  # a log interval, and the next epoch's order must be read as the uninterrupted run does.
  def config(total):
    c = tiny_config("encoding=2d_fixed,seeds=2", steps=total, batch_size=8, log_every=3,
                    checkpoint_every=2)
    c.task = small_dataset.name
    c.evaluation.update(every_epochs=1, batch_size=8)
    return c

  straight = config(7)
  loop.train_and_evaluate(straight, str(tmp_path / "straight"))
  loop.train_and_evaluate(config(4), str(tmp_path / "resumed"))
  second = config(7)
  loop.train_and_evaluate(second, str(tmp_path / "resumed"))
  a = trained_run.restore_run(str(tmp_path / "straight")).state
  b = trained_run.restore_run(str(tmp_path / "resumed")).state
  assert a.step.tolist() == b.step.tolist() == [7, 7]
  np.testing.assert_array_equal(_flat(a.params), _flat(b.params))  # Bitwise on CPU.
  np.testing.assert_array_equal(_flat(a.opt_state), _flat(b.opt_state))
  ra = [json.loads(l) for l in open(tmp_path / "straight" / "metrics.jsonl")]
  rb = [json.loads(l) for l in open(tmp_path / "resumed" / "metrics.jsonl")]
  assert [(r["step"], "evaluation" in r) for r in ra] == [
      (3, False), (3, True), (6, False), (6, True), (7, False)]
  assert [r.get("epoch") for r in ra if "evaluation" in r] == [1.0, 2.0]
  assert set(ra[1]["evaluation"]) == {"test", "validation"}
  assert len(ra[1]["evaluation"]["validation"]["quaternary"]) == 2  # One value per model.
  assert len(ra) == len(rb)
  for x, y in zip(ra, rb):  # Record for record, all but the timing.
    for timing in ("steps_per_second", "train_seconds"):
      x.pop(timing, None), y.pop(timing, None)
    assert x == y
  ea = json.load(open(tmp_path / "straight" / "eval.json"))
  eb = json.load(open(tmp_path / "resumed" / "eval.json"))
  for timing in ("train_seconds", "train_cpu_seconds", *loop.EVALUATION_TIMES):
    assert ea.pop(timing) > 0 and eb.pop(timing) > 0
  assert ea == eb
  assert ea["splits"] == ["train", "test", "validation"] and ea["step"] == 7
  assert ea["epoch"] == pytest.approx(7 / 3)
  assert ea["over_models"]["validation"]["overall"]["count"] == 2


def test_entry_point_smoke(tmp_path):
  workdir = tmp_path / "run"
  cmd = [sys.executable, "-m", "experiments.train",
         "--config=configs/latin_square.py:encoding=learn,sigma=0.2,scale=small",
         f"--workdir={workdir}", "--config.model.num_layers=1", "--config.model.d_model=16",
         "--config.model.mlp_size=32", "--config.training.steps=2",
         "--config.training.log_every=1", "--config.training.checkpoint_every=2",
         "--config.evaluation.final_splits=('validation',)", "--config.progress=False"]
  out = entry_points.run_command(cmd, env=ENV, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "| validation |" in out.stdout
  records = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [1, 2]
  result = json.loads((workdir / "eval.json").read_text())
  assert result["task"] == "latin_square" and result["model"].endswith("learn, σ=0.2")
  assert set(result["accuracy"]["validation"]) == {"overall", "binary", "ternary", "quaternary"}
  bad = entry_points.run_command([*cmd[:3], "--config=configs/latin_square.py:encoding=alibi",
                                  f"--workdir={tmp_path / 'bad'}"], env=ENV, timeout=300)
  lines = [l for l in bad.stderr.splitlines() if l.strip()]
  assert bad.returncode == 2 and len(lines) == 1, bad.stderr
  assert "unknown Ito encoding 'alibi'" in lines[0] and not (tmp_path / "bad").exists()
