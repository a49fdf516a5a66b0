"""Grid training, the sweep runner (local and Ray) and the report."""
import csv
import json
import os
import signal

import jax
import numpy as np
import pytest

import tasks
from configs import table1
from experiments.storage import checkpoints
from experiments.storage import io_utils
from experiments.storage import workdir as workdir_lib
from experiments.training import data
from experiments.training import evaluation
from experiments.analysis import tables as report
from experiments.training import steps
from experiments.training import jobs as sweep
from tests import sweep_helpers
from tests.test_training import tiny_config


def _tree_rows(tree, m):
  return jax.tree_util.tree_map(lambda x: x[m], tree)


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(tree)])


def test_grid_equals_single_model_training():
  config = tiny_config(steps=3)
  config.model.compat = "release"  # Per-layer positions and dropout: keys must differ per model.
  config.data_seed = 5
  config.grid.seeds = (3, 4)
  # Plain SGD: each model's update is its rate times its (clipped) gradient, so the updated
  # parameters compare the gradients themselves. Adam's first steps divide near-zero
  # gradients by their own size and so amplify float noise between the vmapped and single
  # programs (a 1e-9 difference can flip an update of size learning_rate).
  config.training.optimizer = "sgd"
  config.grid.learning_rates = (0.5, 1.0)
  task = tasks.get(config.task)
  model = steps.build_model(config, task)
  members = steps.grid_members(config)
  assert members == [(3, 0.5), (3, 1.0), (4, 0.5), (4, 1.0)]
  optimizer = steps.make_optimizer(config)
  grid_step = jax.jit(steps.make_grid_step(model, optimizer))
  state = steps.init_grid(model, config, members)
  seeds = np.array([s for s, _ in members], np.int32)
  # Lengths 1..3 padded to one shape (max_programs=1): one program per step function;
  # padded steps equal unpadded ones (tests/test_buckets.py).
  config.training.max_programs = 1
  shapes = data.training_shapes(task, config)
  batches = [data.data_for_step(task, config, s, shapes) for s in range(3)]
  assert len({b["tokens"].shape for b in batches}) == 1
  for batch in batches:
    state, grid_metrics = grid_step(state, seeds, batch)
  evaluator = evaluation.RangeEvaluator(model, task, stacked=True)
  grid_eval = evaluator.evaluate(state.params, range(1, 6), 8, 0, 2)
  # Each model alone: its own seed and learning rate, no vmap (one program, seed traced).
  step = jax.jit(lambda state, batch, seed: steps.make_train_step(
      model, optimizer, seed)(state, batch))
  init = jax.jit(lambda seed, rate: steps.init_state(
      model, steps.make_optimizer(config, rate), seed))  # One program, seed and rate traced.
  single_evaluator = evaluation.RangeEvaluator(model, task)
  for m, (seed, rate) in enumerate(members):
    single = init(seed, np.float32(rate))
    for batch in batches:
      single, metrics = step(single, batch, seed)
    np.testing.assert_allclose(_flat(_tree_rows(state.params, m)), _flat(single.params),
                               atol=1e-5)
    np.testing.assert_allclose(grid_metrics["loss"][m], metrics["loss"], atol=1e-5)
    alone = single_evaluator.evaluate(single.params, range(1, 6), 8, 0, 2)
    np.testing.assert_allclose([a[m] for a in grid_eval["accuracy"]], alone["accuracy"],
                               atol=1e-6)
  # Models really differ (own seeds, own learning rates).
  assert np.abs(_flat(_tree_rows(state.params, 0)) - _flat(_tree_rows(state.params, 1))).max() > 1e-4


def _tiny_sweep_config(steps=4):
  config = tiny_config(steps=steps, checkpoint_every=2, log_every=2)
  config.grid.seeds = (0, 1)
  config.sweep = table1.get_config("scale=small").sweep
  config.sweep.tasks = ("parity_check", "reverse_string")
  config.sweep.encodings = ("randomized_sin_cos",)
  config.evaluation.max_length = 4
  return config


def _completions(job):
  path = os.path.join(job.workdir, "completions.log")
  return open(path).read().count("done") if os.path.exists(path) else 0


def test_local_runner_resumes_stopped_job_and_skips_finished(tmp_path):
  config = _tiny_sweep_config()
  sweep_dir = str(tmp_path / "sweep")
  first = sweep.run_sweep(config, sweep_dir, job_fn=sweep_helpers.interrupted_job)
  assert first.failed == ["parity_check/randomized_sin_cos"] and first.done == 1
  jobs = sweep.make_jobs(config, sweep_dir)
  assert [sweep.is_finished(j) for j in jobs] == [False, True]
  # The stopped job left a checkpoint at half the steps; the re-run resumes it.
  assert checkpoints.Checkpoints(jobs[0].workdir).steps() == [2]
  second = sweep.run_sweep(config, sweep_dir, job_fn=sweep_helpers.interrupted_job)
  assert not second.failed and second.done == 2
  third = sweep.run_sweep(config, sweep_dir, job_fn=sweep_helpers.interrupted_job)
  assert third.done == 2 and not third.failed
  assert [_completions(j) for j in jobs] == [1, 1]  # No job ran twice to completion.
  records = [json.loads(l) for l in open(os.path.join(jobs[0].workdir, "metrics.jsonl"))]
  assert [r["step"] for r in records] == [2, 4]
  result = json.load(open(os.path.join(jobs[0].workdir, "eval.json")))
  assert [(m["seed"], m["learning_rate"]) for m in result["models"]] == [(0, 1e-3), (1, 1e-3)]


def test_local_workers_restart_a_killed_worker(tmp_path):
  config = _tiny_sweep_config()
  sweep_dir = str(tmp_path / "sweep")
  progress = sweep.run_sweep(config, sweep_dir, workers=2, job_fn=sweep_helpers.killed_job)
  assert not progress.failed and progress.done == 2
  jobs = sweep.make_jobs(config, sweep_dir)
  assert os.path.exists(jobs[0].workdir + ".stopped")  # Its first worker was killed.
  assert [_completions(j) for j in jobs] == [1, 1]
  assert all(sweep.is_finished(j) for j in jobs)


def test_ray_sweep_survives_a_killed_worker_and_drains(tmp_path):
  """One Ray cluster (its start is the cost) for two sweeps: a killed worker's job is
  retried to completion; a drain request (`kill -USR1` of the driver) lets the running
  job finish and cancels the two not started, leaving them to a later run."""
  ray = pytest.importorskip("ray", reason="ray not installed (pip install -e .[cluster])")
  config = _tiny_sweep_config()
  sweep_dir = str(tmp_path / "sweep")
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
           runtime_env={"env_vars": {"PYTHONPATH": sweep.ROOT, "JAX_PLATFORMS": "cpu",
                                     "SWEEP_DRIVER_PID": str(os.getpid())}})
  try:
    progress = sweep.run_sweep(config, sweep_dir, executor="ray", max_retries=2,
                               job_fn=sweep_helpers.killed_job)
    drain_config = _tiny_sweep_config()
    drain_config.sweep.tasks = ("reverse_string", "parity_check", "even_pairs")
    drain_dir = str(tmp_path / "drain")
    before = signal.getsignal(sweep.DRAIN_SIGNAL)
    drained = sweep.run_sweep(drain_config, drain_dir, executor="ray", max_retries=0,
                              job_fn=sweep_helpers.ray_draining_job)
    assert signal.getsignal(sweep.DRAIN_SIGNAL) is before
  finally:
    ray.shutdown()
  assert not progress.failed and progress.done == 2
  jobs = sweep.make_jobs(config, sweep_dir)
  assert all(sweep.is_finished(j) for j in jobs)
  assert os.path.exists(jobs[0].workdir + ".stopped")  # The worker really was killed once.
  assert [_completions(j) for j in jobs] == [1, 1]
  assert (drained.total, drained.done, drained.later, drained.failed) == (1, 1, 2, [])
  ran = [j for j in sweep.make_jobs(drain_config, drain_dir) if sweep.is_finished(j)]
  assert len(ran) == 1 and _completions(ran[0]) == 1
  left = [j for j in sweep.make_jobs(drain_config, drain_dir) if j not in ran]
  assert len(left) == 2 and not any(os.path.exists(j.workdir) for j in left)  # Not started.


class _FakeRay:
  """What `_ray_result` uses of Ray: `get` gives the task's result or raises."""

  class exceptions:  # pylint: disable=invalid-name
    TaskCancelledError = type("TaskCancelledError", (Exception,), {})

  def __init__(self, outcome):
    self.outcome = outcome

  def get(self, ref):
    del ref
    if isinstance(self.outcome, Exception):
      raise self.outcome
    return self.outcome


def test_a_ray_task_begun_after_the_drain_leaves_its_job_to_a_later_run(tmp_path):
  """Ray may hand a task to a worker and miss its cancel (ray#24359): the task then
  finds the driver's drain marker before its job starts, or before its training takes
  its folder's lock (refused, leaving no folder), and the driver counts it as
  not started, as one the cancel reached; a job that ran before the cancel counts."""
  marker = str(tmp_path / (sweep.DRAIN_MARKER_PREFIX + "1-2"))
  ran = []
  def job_fn(config, workdir, companions):
    del config, companions
    ran.append(workdir)
    return {"trained": workdir}
  def slow_start(config, workdir, companions):  # Drained while it prepared its start.
    io_utils.atomic_write_text(marker, "drained\n")
    with workdir_lib.locked(workdir):
      return job_fn(config, workdir, companions)
  before = signal.getsignal(sweep.DRAIN_SIGNAL)
  try:
    assert sweep._ray_task(job_fn, {}, "a", (), marker) == {"trained": "a"}
    refused = sweep._ray_task(slow_start, {}, str(tmp_path / "c"), (), marker)
    not_started = sweep._ray_task(job_fn, {}, "b", (), marker)
  finally:
    signal.signal(sweep.DRAIN_SIGNAL, before)
  assert ran == ["a"] and refused == not_started
  assert not os.path.exists(tmp_path / "c")  # The refused start left nothing behind.
  with workdir_lib.locked(str(tmp_path / "c")):  # The refusal ended with the task.
    pass

  jobs = sweep.make_jobs(_tiny_sweep_config(), str(tmp_path / "sweep"))
  cancelled = _FakeRay.exceptions.TaskCancelledError("cancelled")
  for outcome, counted in ((not_started, False), (cancelled, False), ({"trained": "a"}, True)):
    progress = sweep.Progress(len(jobs), 0, 1, len(jobs))
    assert sweep._ray_result(_FakeRay(outcome), None, jobs[0], progress, cancelled=True) is counted
    assert (progress.done, progress.failed) == ((1, []) if counted else (0, []))
  progress = sweep.Progress(len(jobs), 0, 1, len(jobs))  # Not drained: cannot happen.
  assert sweep._ray_result(_FakeRay(not_started), None, jobs[0], progress) is True
  assert (progress.done, progress.failed) == (0, [jobs[0].name])


def _fixture_eval(task, pe, unseen_by_model, lengths=(1, 2, 3, 4)):
  models = []
  for (seed, rate), unseen in unseen_by_model.items():
    accuracy = [1.0, 1.0] + [unseen, unseen]
    models.append({"seed": seed, "learning_rate": rate, "accuracy": accuracy,
                   "diverged": False, "scores": {"train_range": 1.0, "unseen": unseen}})
  return {"task": task, "pe": pe, "lengths": list(lengths), "training_lengths": [1, 2],
          "models": models, "step": 10}


def test_report_renders_tables_with_missing_cells(tmp_path):
  sweep_dir = tmp_path / "sweep"
  fixture = {
      ("even_pairs", "relative"): {(0, 1e-4): 0.6, (1, 1e-4): 0.7, (0, 3e-4): 0.9, (1, 3e-4): 0.5},
      ("even_pairs", "randomized_relative"): {(0, 1e-4): 1.0, (1, 1e-4): 0.98},
      ("reverse_string", "relative"): {(0, 1e-4): 0.55},
      # ("reverse_string", "randomized_relative") is missing: an unfinished job.
  }
  for (task, pe), models in fixture.items():
    os.makedirs(sweep_dir / task / pe)
    (sweep_dir / task / pe / "eval.json").write_text(json.dumps(_fixture_eval(task, pe, models)))
  out = report.write_report(str(sweep_dir))
  lines = out["table1"].splitlines()
  header = [c.strip() for c in lines[4].split("|")[1:-1]]
  assert header == ["task", "relative", "randomized_relative"]
  even = [c.strip() for c in lines[6].split("|")[1:-1]]
  assert even == ["even_pairs", "90.0 (96.4)", "100.0 (100.0)"]  # Max over seeds and rates.
  rev = [c.strip() for c in lines[7].split("|")[1:-1]]
  published = report.load_paper()["table1_max_over_seeds_and_lrs"]["reverse_string"]
  assert rev[2] == f"– ({published['randomized_relative']:.1f})"  # Missing, never zero.
  rows = list(csv.reader(open(os.path.join(out["out_dir"], "table1.csv"))))
  assert ["reverse_string", "randomized_relative", "",
          f"{published['randomized_relative']:.2f}"] in rows
  # Table 4: best learning rate by mean over seeds: 1e-4 (0.65) vs 3e-4 (0.70) -> 3e-4.
  t4 = [c.strip() for c in out["table4"].splitlines()[6].split("|")[1:-1]]
  assert t4[1].startswith("70.0 ± 20.0")
  head = out["headline"]["ours"]
  assert head["tasks_counted"] == 1  # reverse_string has no randomized result.
  assert head["per_task"]["even_pairs"] == pytest.approx(10.0)
  assert os.path.getsize(os.path.join(out["out_dir"], "figures", "even_pairs.png")) > 1000
  os.makedirs(tmp_path / "empty")
  with pytest.raises(ValueError, match="no finished job"):
    report.write_report(str(tmp_path / "empty"))
