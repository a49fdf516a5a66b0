"""Results that live in the repository (issue 25, item 4): a sweep folder whose finished
jobs keep only their small files (config.json, eval.json, metrics.jsonl; no checkpoints,
as a fresh clone of results/ has them) is read by the sweep as finished and by the
report, and a job whose settings differ from its files is not skipped."""
import csv
import glob
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

from configs import table1
from experiments.analysis import tables as report
from experiments.storage import results_git
from experiments.training import jobs as sweep
from tests import entry_points
from tests import sweep_helpers
from tests.test_training import ENV
from tests.test_training import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results")
# results/<folder> -> the sweep config that made it, its config arguments and the
# command line's overrides (the folder the README's commands name).
COMMITTED = {"cpu_study": ("configs.cpu_study", ("A", "B", "C", "D", "E", "F", "D12", "E12",
                                                 "G", "H", "I")),
             "table1_cpu": ("configs.table1", ("scale=cpu",)),
             "table1_cpu_lite": ("configs.table1", ("scale=cpu_lite",)),
             "su_cpu": ("configs.su", ("scale=cpu",)),
             "su_cpu_lite": ("configs.su", ("scale=cpu_lite",)),
             "table3_cpu": ("configs.table3", ("scale=cpu",)),
             "table3_cpu_lite": ("configs.table3", ("scale=cpu_lite",)),
             # The relative pair of the Table 1 core, each job stopped where it had learned
             # (docs/cpu_protocol.md): the same config with one override.
             "table1_cpu_stopped": ("configs.table1", ("scale=cpu",),
                                    {"training.stop_when_learned": 0.95})}
SMALL_FILES = {"config.json", "eval.json", "metrics.jsonl"}


def _config():
  config = tiny_config(steps=4, checkpoint_every=2, log_every=2)
  config.grid.seeds = (0, 1)
  config.sweep = table1.get_config("scale=small").sweep
  config.sweep.tasks = ("reverse_string",)
  config.sweep.encodings = ("relative", "randomized_relative")
  config.evaluation.max_length = 4
  return config


def _as_committed(sweep_dir):
  """What git keeps of a sweep folder (.gitignore): the small files only."""
  for job_dir in glob.glob(os.path.join(sweep_dir, "*", "*")):
    for name in os.listdir(job_dir):
      path = os.path.join(job_dir, name)
      if name not in SMALL_FILES:
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def _must_not_run(config_dict, workdir, companions):
  raise AssertionError(f"re-ran a finished job in {workdir}")


def test_small_files_are_a_finished_sweep_and_a_report(tmp_path):
  # One sweep for two tests (each trains two jobs): this one, then on a copy of the same
  # committed folder _a_job_whose_settings_differ_from_its_files_is_not_skipped.
  config = _config()
  sweep_dir = str(tmp_path / "results" / "exp")
  assert not sweep.run_sweep(config, sweep_dir).failed
  _as_committed(sweep_dir)
  shutil.copytree(sweep_dir, str(tmp_path / "exp"))
  assert sorted(os.listdir(os.path.join(sweep_dir, "reverse_string", "relative"))) == sorted(
      SMALL_FILES)
  again = sweep.run_sweep(config, sweep_dir, job_fn=_must_not_run)
  assert (again.done, again.failed) == (2, [])
  out = report.write_report(sweep_dir, str(tmp_path / "report"))
  assert out["kind"] == "paper" and out["encodings"] == ["relative", "randomized_relative"]
  assert [r["verdict"] for r in out["ordering"]] != ["missing"]
  assert os.path.getsize(tmp_path / "report" / "figures" / "ordering.png") > 0
  assert set(out["training"]) == {("reverse_string", "relative"),
                                  ("reverse_string", "randomized_relative")}
  assert all(v is not None for v in out["training"].values())
  _the_jobs_table_is_every_seed_of_every_job(sweep_dir, tmp_path / "report", out["jobs"])
  _a_job_whose_settings_differ_from_its_files_is_not_skipped(str(tmp_path / "exp"))
  _a_finished_job_of_another_folder_with_the_same_settings_is_copied(str(tmp_path / "exp"),
                                                                     tmp_path / "other")
  _only_and_max_jobs_choose_a_sessions_share(str(tmp_path / "exp"))


def test_a_drain_signal_lets_the_running_job_finish_and_starts_no_other(tmp_path):
  """`kill -USR1` of a sweep run in one process: the job running finishes, the others are
  left to a later run (not failed), and the signal's previous handler is back."""
  config = _config()
  config.sweep.encodings = ("relative", "randomized_relative", "rope")
  trained = []

  def job(config_dict, workdir, companions):
    del config_dict, companions
    trained.append(os.path.basename(workdir))
    os.kill(os.getpid(), sweep.DRAIN_SIGNAL)

  before = signal.getsignal(sweep.DRAIN_SIGNAL)
  progress = sweep.run_sweep(config, str(tmp_path / "exp"), job_fn=job)
  assert trained == ["relative"]
  assert (progress.total, progress.done, progress.later, progress.failed) == (1, 1, 2, [])
  assert signal.getsignal(sweep.DRAIN_SIGNAL) is before


def test_a_drain_signal_lets_the_running_workers_finish_and_starts_no_other(tmp_path):
  """With two workers: both running jobs finish (their workers ignore the signal, which
  a signal to the process group also sends them), the third is not started."""
  config = _config()
  config.sweep.tasks = ("reverse_string", "parity_check", "even_pairs")
  config.sweep.encodings = ("randomized_relative",)
  sweep_dir = str(tmp_path / "exp")
  progress = sweep.run_sweep(config, sweep_dir, workers=2, max_retries=0,
                             job_fn=sweep_helpers.draining_job)
  assert (progress.total, progress.done, progress.later, progress.failed) == (2, 2, 1, [])
  jobs = sweep.make_jobs(config, sweep_dir)
  assert [sweep.is_finished(j) for j in jobs[:2]] == [True, True]
  assert not os.path.exists(jobs[2].workdir)
  assert [j.name for j in jobs] == ["reverse_string/randomized_relative",
                                    "parity_check/randomized_relative",
                                    "even_pairs/randomized_relative"]


def test_the_eta_counts_trainings_not_the_jobs_that_share_one(monkeypatch, capsys):
  """A job evaluated on another's training costs no training: the ETA is the mean wall
  time of the finished trainings over those not started and what remains of the running
  ones, spread over the workers but never below the longest remainder."""
  clock = [0.0]
  monkeypatch.setattr(sweep, "time", types.SimpleNamespace(time=lambda: clock[0]))
  job = lambda variant, companions=(): sweep.Job("reverse_string", variant,
                                                 f"/x/{variant}", {}, variant, companions)
  first = job("randomized_rope", (job("randomized_rope+even"),))
  second, third = job("rope"), job("sin_cos")
  progress = sweep.Progress(4, 0, 2, 3)
  progress.start(first)
  progress.start(second)
  assert progress.eta_seconds() is None
  clock[0] = 100.0
  progress.finish(first)  # Two jobs, one training of 100 s.
  assert progress.done == 2
  # The second is due now (0 s left), the third not started (100 s): one worker's work.
  assert progress.eta_seconds() == pytest.approx(100.0)
  assert capsys.readouterr().out.splitlines()[-1] == (
      "[sweep] 2/4 done, 1 running, 1 left, ETA 1.7 min")
  progress.start(third)
  clock[0] = 130.0
  assert progress.eta_seconds() == pytest.approx(70.0)
  progress.finish(second)
  assert progress.eta_seconds() == pytest.approx(115 - 30)  # Mean of 100 and 130, 30 s in.


def test_a_running_training_slower_than_the_mean_is_timed_by_its_own_pace(
    monkeypatch, capsys, tmp_path):
  """Past the mean of the finished trainings, a running one is not reported as due: its
  remainder is its own pace (steps recorded since it started) over the steps it has left.
  Each start says what runs."""
  clock = [0.0]
  monkeypatch.setattr(sweep, "time", types.SimpleNamespace(time=lambda: clock[0]))
  def job(variant, companions=()):
    return sweep.Job("reverse_string", variant, str(tmp_path / variant),
                     {"training": {"steps": 1000}}, variant, companions)
  def record(variant, *steps):
    os.makedirs(tmp_path / variant, exist_ok=True)
    with open(tmp_path / variant / "metrics.jsonl", "w") as f:
      f.writelines(json.dumps({"step": s, "loss": 0.1}) + "\n" for s in steps)
  fast, slow = job("rope", (job("rope+even"),)), job("sin_cos")
  record("sin_cos", 100)  # Resumed at step 100.
  progress = sweep.Progress(3, 0, 2, 2)
  progress.start(fast)
  progress.start(slow)
  assert capsys.readouterr().out.splitlines() == [
      "[sweep] started reverse_string/rope (with reverse_string/rope+even): "
      "0/3 done, 2 running, 1 left",
      "[sweep] started reverse_string/sin_cos: 0/3 done, 3 running, 0 left"]
  clock[0] = 100.0
  progress.finish(fast)
  clock[0] = 300.0  # 200 s past the mean; 300 steps in 300 s, 600 left.
  record("sin_cos", 100, 250, 400)
  assert progress.eta_seconds() == pytest.approx(600.0)
  record("sin_cos", 100)  # No step since it started: the mean's remainder, 0.
  assert progress.eta_seconds() == pytest.approx(0.0)
  (tmp_path / "sin_cos" / "metrics.jsonl").write_text("{damaged\n")
  assert progress.eta_seconds() == pytest.approx(0.0)


def test_before_any_training_finished_the_eta_is_read_from_the_running_ones_paces(
    monkeypatch, tmp_path):
  """No training finished yet: each running training's remainder is its own pace over
  its steps left, and a training not started costs the mean of the running ones' whole
  trainings at their paces; without a recorded step there is no ETA."""
  clock = [0.0]
  monkeypatch.setattr(sweep, "time", types.SimpleNamespace(time=lambda: clock[0]))
  def job(variant):
    return sweep.Job("reverse_string", variant, str(tmp_path / variant),
                     {"training": {"steps": 1000}}, variant)
  def record(variant, *steps):
    os.makedirs(tmp_path / variant, exist_ok=True)
    with open(tmp_path / variant / "metrics.jsonl", "w") as f:
      f.writelines(json.dumps({"step": s, "loss": 0.1}) + "\n" for s in steps)
  record("sin_cos", 100)  # Resumed at step 100.
  progress = sweep.Progress(3, 0, 2, 3)
  progress.start(job("rope"))
  progress.start(job("sin_cos"))
  assert progress.eta_seconds() is None  # No step recorded since either started.
  clock[0] = 100.0
  record("rope", 100, 250)      # 0.4 s a step: 300 s left, 400 s in all.
  record("sin_cos", 100, 300)   # 0.5 s a step: 350 s left, 500 s in all.
  # The third training costs the mean whole training, 450 s: (300 + 350 + 450) / 2.
  assert progress.eta_seconds() == pytest.approx(550.0)
  record("sin_cos", 100)  # Only rope's pace: sin_cos is given what 400 s leaves of it.
  assert progress.eta_seconds() == pytest.approx((300 + 300 + 400) / 2)


def test_the_pace_is_the_last_interval_once_two_are_logged_since_the_start(
    monkeypatch, tmp_path):
  """The first interval logged since a start holds the compilation: from the second on,
  the pace is the last interval's steps per second, which follows the machine's load."""
  clock = [0.0]
  monkeypatch.setattr(sweep, "time", types.SimpleNamespace(time=lambda: clock[0]))
  workdir = tmp_path / "rope"
  os.makedirs(workdir)
  def record(*rates):  # Records every 100 steps from step 100 (resumed there).
    with open(workdir / "metrics.jsonl", "w") as f:
      f.writelines(json.dumps({"step": 100 * (i + 1), "loss": 0.1, "steps_per_second": r})
                   + "\n" for i, r in enumerate((5.0, *rates)))
  record()
  progress = sweep.Progress(2, 0, 1, 2)
  progress.start(sweep.Job("reverse_string", "rope", str(workdir),
                           {"training": {"steps": 1000}}, "rope"))
  clock[0] = 200.0
  record(0.5)  # One interval since the start, compiling: its steps over its time.
  assert progress.eta_seconds() == pytest.approx(2.0 * 800 + 2.0 * 1000)
  record(0.5, 4.0)  # 4 steps/s: 700 left, and the next training at that pace.
  assert progress.eta_seconds() == pytest.approx(700 / 4 + 1000 / 4)
  record(0.5, 4.0, 2.0)  # Slower now (other work started): the last interval counts.
  assert progress.eta_seconds() == pytest.approx(600 / 2 + 1000 / 2)


def test_the_heartbeat_prints_the_count_the_eta_and_each_running_step(
    monkeypatch, capsys, tmp_path):
  """Between starts and ends, the heartbeat prints a line every interval with the steps
  each running training has recorded, and none once its block ends or with interval 0."""
  clock = [100.0]
  monkeypatch.setattr(sweep, "time", types.SimpleNamespace(time=lambda: clock[0]))
  running = sweep.Job("reverse_string", "rope", str(tmp_path / "rope"),
                      {"training": {"steps": 1000}}, "rope")
  progress = sweep.Progress(2, 0, 1, 2)
  with progress.heartbeat(0.01):
    threading.Event().wait(0.1)
  assert capsys.readouterr().out == ""  # Nothing running: nothing to report.
  clock[0] = 0.0
  progress.start(running)
  clock[0] = 100.0  # 250 steps in 100 s: 300 s left, 400 s for the next.
  os.makedirs(tmp_path / "rope")
  (tmp_path / "rope" / "metrics.jsonl").write_text(
      "".join(json.dumps({"step": s, "loss": 0.1}) + "\n" for s in (100, 250)))
  capsys.readouterr()
  with progress.heartbeat(0.01):
    lines, waited = [], 0
    while len(lines) < 2 and waited < 500:
      threading.Event().wait(0.01)
      waited += 1
      lines += [l for l in capsys.readouterr().out.splitlines() if "at step" in l]
  assert lines[:2] == ["[sweep] 0/2 done, 1 running, 1 left, ETA 11.7 min; "
                       "reverse_string/rope at step 250 of 1000"] * 2
  threading.Event().wait(0.1)
  assert "at step" not in capsys.readouterr().out
  with progress.heartbeat(0):
    threading.Event().wait(0.1)
  assert capsys.readouterr().out == ""


def test_the_ordering_figure_draws_every_cell_of_the_ordering_rows(tmp_path):
  table4 = {("a", "relative"): ((60.0, 2.0), (55.0, 1.0)),
            ("a", "randomized_relative"): ((70.5, 1.5), (75.0, 2.0)),
            ("b", "relative"): ((50.0, 1.0), None),
            ("b", "randomized_relative"): (None, (80.0, 3.0)),
            ("a", "sin_cos"): ((40.0, 9.0), None),
            ("a", "randomized_sin_cos"): ((45.0, 1.0), None),
            ("b", "sin_cos"): ((30.0, 1.0), None),
            ("b", "randomized_sin_cos"): ((20.0, 1.0), None)}
  training = {key: 99.0 for key in table4}
  training["b", "randomized_sin_cos"] = 60.0
  encodings = ["relative", "randomized_relative", "sin_cos", "randomized_sin_cos"]
  rows = report.ordering_rows(["a", "b"], encodings, table4, training)
  assert [(r["task"], r["family"], r["verdict"]) for r in rows] == [
      ("a", "relative", "holds"), ("a", "sin_cos", "within one std"),
      ("b", "relative", "missing"), ("b", "sin_cos", "not learned")]
  grid = report.ordering_grid_markdown(rows).splitlines()
  assert grid[:4] == ["| task | relative → randomized | sin_cos → randomized |",
                      "|---|---|---|",
                      "| a | 60.0 → 70.5 ✓ | 40.0 → 45.0 ≈ |",
                      "| b | – | 30.0 → 20.0 † |"]
  assert grid[-1].endswith("(no verdict), – not run yet.")
  complete = report.ordering_grid_markdown([r for r in rows if r["task"] == "a"])
  assert complete.splitlines()[-1].endswith("(no verdict).")  # No cell missing.
  assert report.ordering_grid_markdown(rows) in report.ordering_markdown(rows)
  path = tmp_path / "ordering.png"
  drawn = report.plot_ordering(rows, str(path))
  assert path.stat().st_size > 0
  by_cell = {(d["task"], d["family"]): (d["classic"], d["randomized"]) for d in drawn}
  assert by_cell == {("a", "relative"): (60.0, 70.5), ("a", "sin_cos"): (40.0, 45.0),
                     ("b", "relative"): (50.0, None), ("b", "sin_cos"): (30.0, 20.0)}


def _the_jobs_table_is_every_seed_of_every_job(sweep_dir, report_dir, rows):
  """jobs.csv: a line per model with its accuracy on the training lengths and beyond,
  recomputed here from eval.json's accuracy per length; jobs.md: a line per job with the
  unseen mean ± std over its seeds and the job's hours."""
  expected = []
  for encoding in ("relative", "randomized_relative"):
    with open(os.path.join(sweep_dir, "reverse_string", encoding, "eval.json")) as f:
      record = json.load(f)
    low, high = record["training_lengths"]
    for model in sorted(record["models"], key=lambda m: m["seed"]):
      by_length = dict(zip(record["lengths"], model["accuracy"]))
      expected.append(
          (encoding, model["seed"], record["train_seconds"] / 3600,
           100 * np.mean([a for n, a in by_length.items() if low <= n <= high]),
           100 * np.mean([a for n, a in by_length.items() if n > high])))
  with open(report_dir / "jobs.csv") as f:
    table = list(csv.DictReader(f))
  assert [(r["job"], int(r["seed"])) for r in table] == [e[:2] for e in expected]
  for line, (_, seed, hours, train, unseen) in zip(table, expected):
    assert float(line["train"]) == pytest.approx(train, abs=0.006)
    assert float(line["unseen"]) == pytest.approx(unseen, abs=0.006)
    assert line["job_hours"] == ("" if seed else f"{hours:.2f}")  # On a job's first line.
  assert [(r["job"], r["best"]) for r in rows] == [("relative", True),
                                                  ("randomized_relative", True)]
  text = (report_dir / "jobs.md").read_text()
  for row, encoding in zip(rows, ("relative", "randomized_relative")):
    unseen = [e[4] for e in expected if e[0] == encoding]
    assert row["mean"] == pytest.approx(np.mean(unseen)) and row["std"] == pytest.approx(
        np.std(unseen))
    assert f"| reverse_string | {encoding} | " in text
    assert f"| {np.mean(unseen):.1f} ± {np.std(unseen):.1f} | " in text


def _a_job_whose_settings_differ_from_its_files_is_not_skipped(sweep_dir):
  """A finished sweep of _config(), as committed: a job of other settings is not skipped."""
  changed = _config()
  changed.training.learning_rate = 3e-3  # Identity: the model differs.
  changed.grid.learning_rates = ()
  for job in sweep.make_jobs(changed, sweep_dir):
    finished, why = sweep.job_status(job)
    assert not finished and "training.learning_rate" in why, why
  # More steps than the files hold: not finished (resumed, or trained again).
  longer = _config()
  longer.training.steps = 6
  for job in sweep.make_jobs(longer, sweep_dir):
    finished, why = sweep.job_status(job)
    assert not finished and "step 4" in why, why
  calls = []
  sweep.run_sweep(longer, sweep_dir, job_fn=lambda c, w, _: calls.append(w))
  assert len(calls) == 2


def _a_finished_job_of_another_folder_with_the_same_settings_is_copied(source, other):
  """`reuse_from`: a job that has not started, whose settings equal those of a finished
  job of another folder (under another variant name, as Table 3's "sorted" is Table 1's
  randomized_sin_cos), is copied, not trained; jobs of other settings, jobs already
  started and folders that do not exist are not."""
  config = _config()
  config.sweep.encodings = ()
  config.sweep.variants = (
      ("sorted", {"model.pe": "randomized_relative"}),
      ("unsorted", {"model.pe": "randomized_relative", "training.positions": "unsorted"}))
  sweep_dir = str(other / "exp")
  assert [(j.name, a) for j, a, _ in sweep.plan(config, sweep_dir, reuse_from=[source])] == [
      ("reverse_string/sorted", "reuse"), ("reverse_string/unsorted", "start")]
  assert not other.exists()  # The plan writes nothing.
  with pytest.raises(ValueError, match=r"^--reuse_from: '.*nowhere' is not a folder"):
    sweep.run_sweep(config, sweep_dir, reuse_from=[str(other / "nowhere")])
  assert not other.exists()
  # What a copy interrupted while being assembled leaves: a hidden folder, which the
  # next copy replaces and no report reads.
  leftover = os.path.join(sweep_dir, "reverse_string", ".sorted.reusing")
  shutil.copytree(os.path.join(source, "reverse_string", "randomized_relative"), leftover)
  assert list(report.load_sweep(sweep_dir)) == []
  trained, committed = [], []
  committer = results_git.Committer
  try:  # The copy is committed as a finished job is (--commit_results).
    results_git.Committer = lambda: (lambda *job: committed.append(job))
    progress = sweep.run_sweep(config, sweep_dir, reuse_from=[source], commit_results=True,
                               job_fn=lambda c, w, _: trained.append(w))
  finally:
    results_git.Committer = committer
  copy = os.path.join(sweep_dir, "reverse_string", "sorted")
  original = os.path.join(source, "reverse_string", "randomized_relative")
  assert trained == [os.path.join(sweep_dir, "reverse_string", "unsorted")]
  assert committed[0] == (copy, "reverse_string/sorted", [])
  assert progress.done == 2 and not progress.failed
  assert sorted(os.listdir(copy)) == sorted(SMALL_FILES | {sweep.REUSED_FROM})
  assert not os.path.exists(leftover)
  for name in SMALL_FILES:
    with open(os.path.join(copy, name), "rb") as a, open(os.path.join(original, name), "rb") as b:
      assert a.read() == b.read(), name
  note = json.load(open(os.path.join(copy, sweep.REUSED_FROM)))
  assert os.path.realpath(os.path.join(copy, note["source"])) == os.path.realpath(original)
  assert sorted(note["files"]) == sorted(SMALL_FILES)
  assert [a for _, a, _ in sweep.plan(config, sweep_dir, reuse_from=[source])][0] == "skip"
  # Other steps than the source's: no reuse; nor into a folder a run has started in.
  longer = config.copy_and_resolve_references()
  longer.training.steps = 6
  assert [a for _, a, _ in sweep.plan(longer, str(other / "b"), reuse_from=[source])] == [
      "start", "start"]
  started = other / "c" / "reverse_string" / "sorted"
  started.mkdir(parents=True)
  (started / "metrics.jsonl").write_text("")
  assert [a for _, a, _ in sweep.plan(config, str(other / "c"), reuse_from=[source])] == [
      "start", "start"]


def test_the_plan_says_what_a_run_would_do_and_writes_nothing(tmp_path):
  config = _config()
  sweep_dir = str(tmp_path / "exp")
  assert [(j.name, a) for j, a, _ in sweep.plan(config, sweep_dir)] == [
      ("reverse_string/relative", "start"), ("reverse_string/randomized_relative", "start")]
  assert not os.path.exists(sweep_dir)  # Nothing written.
  stopped = _config()
  stopped.training.steps = 2  # Checkpoints at step 2 (checkpoint_every 2), eval.json too.
  sweep.run_sweep(stopped, sweep_dir)
  planned = sweep.plan(config, sweep_dir)
  assert [a for _, a, _ in planned] == ["resume", "resume"]
  assert all(d == "from its checkpoint at step 2 of 4" for _, _, d in planned), planned
  sweep.run_sweep(config, sweep_dir)
  _as_committed(sweep_dir)
  assert [a for _, a, _ in sweep.plan(config, sweep_dir)] == ["skip", "skip"]
  changed = _config()
  changed.training.learning_rate = 3e-3
  changed.grid.learning_rates = ()
  refused = sweep.plan(changed, sweep_dir)
  assert [a for _, a, _ in refused] == ["refuse", "refuse"]
  assert "training.learning_rate" in refused[0][2] and "--rerun_changed" in refused[0][2]
  assert [a for _, a, _ in sweep.plan(changed, sweep_dir, rerun_changed=True)] == [
      "start again"] * 2
  # A stopped run of other settings (no eval.json) is refused too, not shown as resumable.
  os.remove(os.path.join(sweep_dir, "reverse_string", "relative", "eval.json"))
  assert [a for _, a, _ in sweep.plan(changed, sweep_dir)] == ["refuse", "refuse"]
  longer = _config()
  longer.training.steps = 6  # No checkpoints left (committed files): from step 0.
  assert [(a, d) for _, a, d in sweep.plan(longer, sweep_dir)][1] == (
      "start", "eval.json is for step 4, the config says 6")


def _small_files(folder, text):
  os.makedirs(folder)
  for name in SMALL_FILES:
    with open(os.path.join(folder, name), "w") as f:
      f.write(text)


def test_a_held_git_lock_is_waited_for_and_a_failed_commit_caught_up(tmp_path, monkeypatch,
                                                                      capsys):
  repo = tmp_path / "repo"
  repo.mkdir()
  _git(repo, "init", "-q")
  for key, value in (("GIT_AUTHOR_NAME", "t"), ("GIT_AUTHOR_EMAIL", "t@t"),
                     ("GIT_COMMITTER_NAME", "t"), ("GIT_COMMITTER_EMAIL", "t@t")):
    monkeypatch.setenv(key, value)
  _git(repo, "commit", "-q", "--allow-empty", "-m", "start")
  lock = repo / ".git" / "index.lock"
  monkeypatch.setattr(results_git, "LOCK_WAIT", 0.1)
  # Someone's git command holds the lock for a moment: the commit waits for it.
  _small_files(repo / "sweep" / "task" / "a", "a\n")
  lock.write_text("")
  threading.Timer(0.5, lock.unlink).start()
  assert results_git.commit_job(str(repo / "sweep" / "task" / "a"), "task/a")
  assert not lock.exists() and "results: sweep/task/a finished" in _git(repo, "log", "-1")
  # A lock that stays: one warning, and the next finished job's call commits both.
  monkeypatch.setattr(results_git, "LOCK_TRIES", 2)
  committer = results_git.Committer()
  _small_files(repo / "sweep" / "task" / "b", "b\n")
  lock.write_text("")
  committer(str(repo / "sweep" / "task" / "b"), "task/b")
  assert "could not commit the results of task/b" in capsys.readouterr().out
  assert len(committer.pending) == 1
  lock.unlink()
  _small_files(repo / "sweep" / "task" / "c", "c\n")
  committer(str(repo / "sweep" / "task" / "c"), "task/c")
  assert committer.pending == []
  log = _git(repo, "log", "--format=%s")
  assert "results: sweep/task/b finished" in log and "results: sweep/task/c finished" in log
  assert _git(repo, "status", "--porcelain") == ""
  assert results_git.commit_job(str(repo / "sweep" / "task" / "c"), "task/c") == ""  # Nothing new.


def test_sweep_command_line_dry_run_lists_jobs_and_writes_nothing(tmp_path):
  sweep_dir = tmp_path / "exp"
  args = [sys.executable, "-m", "experiments.sweep", "--config=configs/table1.py:scale=small",
          "--config.sweep.tasks=('reverse_string',)",
          "--config.sweep.encodings=('relative','randomized_rope')",
          f"--sweep_dir={sweep_dir}", "--dry_run"]
  out = entry_points.run_command(args, env=ENV, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.splitlines() == [
      "start       reverse_string/relative: nothing trained yet",
      "start       reverse_string/randomized_rope: nothing trained yet",
      "[sweep] dry run, nothing trained or written: 2 jobs, 2 start"]
  assert not sweep_dir.exists()
  bad = entry_points.run_command(args[:-2] + [f"--sweep_dir={sweep_dir}", "--dry_run",
                                              "--config.sweep.encodings=('rotary',)"],
                                 env=ENV, timeout=300)
  assert bad.returncode == 2 and "rotary" in bad.stderr and "Traceback" not in bad.stderr
  assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
  assert not sweep_dir.exists()


@pytest.mark.parametrize("folder", sorted(COMMITTED))
def test_committed_results_match_the_config_that_made_them(folder):
  """Every job folder committed under results/FOLDER is a finished job of its config
  today: editing the config without re-running its jobs fails here, not silently."""
  sweep_dir = os.path.join(RESULTS, folder)
  module, args, *overrides = COMMITTED[folder]

  def config(arg):
    made = importlib.import_module(module).get_config(arg)
    for key, value in (overrides[0] if overrides else {}).items():
      section, name = key.split(".")
      made[section][name] = value
    return made

  jobs = {job.name: job for arg in args for job in sweep.make_jobs(config(arg), sweep_dir)}
  # Folders moved aside (JOB.replaced-WHEN, by --rerun_changed or by hand, kept as the
  # record of an earlier protocol) are not results: the report skips them too.
  committed = [os.path.relpath(os.path.dirname(p), sweep_dir)
               for p in glob.glob(os.path.join(sweep_dir, "*", "*", "eval.json"))
               if ".replaced-" not in p]
  if not committed:
    pytest.skip(f"no finished job committed under results/{folder} yet")
  for name in committed:
    assert name in jobs, f"results/{folder}/{name} is no job of {module}"
    finished, why = sweep.job_status(jobs[name])
    assert finished, f"results/{folder}/{name}: {why}"


def _git(repo, *args):
  return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                        capture_output=True, text=True, check=True).stdout


def test_commit_results_commits_each_finished_jobs_small_files_only(tmp_path, monkeypatch):
  repo = tmp_path / "repo"
  repo.mkdir()
  _git(repo, "init", "-q")
  _git(repo, "commit", "-q", "--allow-empty", "-m", "start")
  (repo / "staged_by_someone_else.txt").write_text("not theirs to commit\n")
  _git(repo, "add", "staged_by_someone_else.txt")
  for key, value in (("GIT_AUTHOR_NAME", "t"), ("GIT_AUTHOR_EMAIL", "t@t"),
                     ("GIT_COMMITTER_NAME", "t"), ("GIT_COMMITTER_EMAIL", "t@t")):
    monkeypatch.setenv(key, value)
  sweep_dir = str(repo / "results" / "exp")
  progress = sweep.run_sweep(_config(), sweep_dir, commit_results=True)
  assert progress.done == 2 and not progress.failed
  log = _git(repo, "log", "--format=%s", "--name-only").splitlines()
  committed = sorted(line for line in log if line.startswith("results/"))
  assert committed == sorted(f"results/exp/reverse_string/{pe}/{name}"
                             for pe in ("relative", "randomized_relative")
                             for name in SMALL_FILES)
  assert sum(line.startswith("results: results/exp/reverse_string/") for line in log) == 2
  # Someone else's staged file stays staged, uncommitted; checkpoints exist but stay out.
  assert _git(repo, "status", "--porcelain", "staged_by_someone_else.txt").startswith("A ")
  assert glob.glob(os.path.join(sweep_dir, "*", "*", "checkpoints"))
  # A fresh clone has the finished sweep.
  clone = tmp_path / "clone"
  _git(tmp_path, "clone", "-q", str(repo), str(clone))
  again = sweep.run_sweep(_config(), str(clone / "results" / "exp"), job_fn=_must_not_run)
  assert (again.done, again.failed) == (2, [])


def _only_and_max_jobs_choose_a_sessions_share(sweep_dir):
  """--only keeps the jobs whose TASK/VARIANT matches a pattern, --max_jobs trains the
  first N unfinished ones and leaves the rest (finished jobs do not count); a pattern
  that matches nothing is refused before anything runs, naming tasks and variants."""
  config = _config()
  config.sweep.encodings = ("relative", "randomized_relative", "rope", "sin_cos", "alibi")
  names = lambda planned: [(j.name.split("/")[1], a) for j, a, _ in planned]
  planned = sweep.plan(config, sweep_dir, max_jobs=2)
  assert names(planned) == [
      ("relative", "skip"), ("randomized_relative", "skip"), ("rope", "start"),
      ("sin_cos", "start"), ("alibi", "later")]
  hours = []
  for name in ("relative", "randomized_relative"):
    with open(os.path.join(sweep_dir, "reverse_string", name, "eval.json")) as f:
      hours.append(json.load(f)["train_seconds"] / 3600)
  low, high = f"{min(hours):.2f}", f"{max(hours):.2f}"
  took = (f"its task's 2 finished jobs took {low}" + ("" if low == high else f"-{high}")
          + " h of training")
  assert [detail.endswith(took) for _, _, detail in planned] == [False, False, True, True, False]
  assert planned[4][2] == f"beyond --max_jobs=2 (then: start, nothing trained yet; {took})"
  assert names(sweep.plan(config, sweep_dir, only=["*/r*", "*/alibi"])) == [
      ("relative", "skip"), ("randomized_relative", "skip"), ("rope", "start"),
      ("alibi", "start")]
  trained = []
  progress = sweep.run_sweep(config, sweep_dir, only=["reverse_string/[rs]*"], max_jobs=1,
                             job_fn=lambda c, w, _: trained.append(os.path.basename(w)))
  assert trained == ["rope"]
  assert (progress.total, progress.done, progress.later) == (3, 3, 1)
  trained.clear()
  sweep.run_sweep(config, sweep_dir, job_fn=lambda c, w, _: trained.append(os.path.basename(w)))
  assert trained == ["rope", "sin_cos", "alibi"]  # The fake wrote nothing: none finished.
  for bad, message in [({"only": ["*/nope", "*/rope"]},
                        r"^--only: '\*/nope' matches no job; jobs are TASK/VARIANT with TASK "
                        r"one of reverse_string and VARIANT one of relative, "
                        r"randomized_relative, rope, sin_cos, alibi"),
                       ({"max_jobs": 0}, r"^--max_jobs must be >= 1")]:
    with pytest.raises(ValueError, match=message):
      sweep.plan(config, sweep_dir, **bad)
    with pytest.raises(ValueError, match=message):
      sweep.run_sweep(config, sweep_dir, **bad, job_fn=_must_not_run)
