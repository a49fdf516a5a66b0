"""Runs and sweeps that cannot be corrupted: parse-time errors, locks, identity, damaged
checkpoints and files, file modes, Ctrl-C, storage errors (issue 11)."""
import copy
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from experiments.storage import checkpoints
from experiments.storage import io_utils
from experiments.training import loop
from experiments.analysis import tables as report
from experiments.training import jobs as sweep
from experiments.training import trained_run
from experiments.storage import workdir as workdir_lib
from tests import entry_points
from tests import sweep_helpers
from tests.test_training import ENV, ROOT, tiny_config

TINY_FLAGS = [
    "--config.model.num_layers=1", "--config.model.d_model=16", "--config.model.num_heads=2",
    "--config.model.widening_factor=2", "--config.model.max_position=64",
    "--config.training.batch_size=8", "--config.training.learning_rate=1e-3",
    "--config.training.max_length=3", "--config.training.prefetch=2",
    "--config.training.max_programs=1",  # As tests.test_training.tiny_config: one program.
    "--config.evaluation.max_length=6", "--config.evaluation.batch_size=8",
    "--config.evaluation.max_buckets=1", "--config.progress=False",
]


def _one_error_line(stderr: str) -> str:
  lines = [l for l in stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-3000:]
  return lines[0]


@pytest.mark.parametrize("module,args,message", [
    ("train", ["--config.training.stepz=5"],
     "unknown setting --config.training.stepz (did you mean --config.training.steps?)"),
    ("train", ["--config.training.steps=abc"], "--config.training.steps=abc"),
    ("train", ["--config.training.steps=2.5"], "--config.training.steps=2.5"),
    ("train", ["--bogus=1"], "Unknown command line flag 'bogus'"),
    ("train", ["--config=configs/missing.py"], "config file configs/missing.py does not exist"),
    ("train", ["--config=tests/data/broken_config.py"], "broken_config.py, line 3"),
    ("train", ["--config=tests/data/no_get_config.py"], "has no get_config() function"),
    ("train", ["--config=configs/table1.py:scale=huge"],
     "unknown scale 'huge'; valid choices: full, small"),
    ("train", ["--config.grid.seeds=(0,1.5)"],
     "grid.seeds must be a tuple of distinct values each an"),
    ("train", ["--config.training.checkpoints_to_keep=0"],
     "training.checkpoints_to_keep must be >= 1, got 0"),
    ("train", ["--config.seed=3000000000"], "seed must be an integer in"),
    ("train", ["--config.training.learning_rate=-1"], "training.learning_rate must be > 0"),
    ("train", ["stray"], "unexpected arguments: stray"),
    ("sweep", ["--config=configs/table1.py:scale=small", "--workers=-1"],
     "--workers must be >= 1, got -1"),
    ("sweep", ["--config=configs/table1.py:scale=small", "--report_every=-1"],
     "--report_every must be >= 0, got -1.0"),
    ("sweep", ["--config=configs/table1.py:scale=small", "--config.training.stepz=5"],
     "did you mean --config.training.steps?"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, module, args, message):
  target = tmp_path / "out"
  where = f"--workdir={target}" if module == "train" else f"--sweep_dir={target}"
  out = entry_points.run(f"experiments.{module}", [where, *args], env=ENV, timeout=120)
  assert out.returncode == 2, out.stderr[-3000:]
  assert message in _one_error_line(out.stderr)
  assert not target.exists()


def test_rejected_settings_write_nothing_and_the_corrected_run_is_accepted(tmp_path):
  run = str(tmp_path / "run")
  bad = tiny_config(steps=2)
  bad.training.checkpoints_to_keep = 0
  with pytest.raises(ValueError, match="checkpoints_to_keep must be >= 1"):
    loop.train_and_evaluate(bad, run)
  assert not os.path.exists(run)
  result = loop.train_and_evaluate(tiny_config(steps=2), run)
  assert result["step"] == 2


def _identity_steps_and_missing_config_are_refused_without_writing(run):
  """run: a finished run of tiny_config(steps=4) (trained by the truncated-checkpoint test
  below, which shares it)."""
  before = {f: os.path.getmtime(os.path.join(run, f)) for f in ("config.json", "eval.json")}
  with pytest.raises(ValueError, match=r"holds another run \(training.learning_rate: "
                     r"0.001 -> 0.0005\)"):
    loop.train_and_evaluate(tiny_config(steps=4, learning_rate=5e-4), run)
  with pytest.raises(ValueError, match=r"checkpoint at step 4, beyond training.steps=2"):
    loop.train_and_evaluate(tiny_config(steps=2), run)
  after = {f: os.path.getmtime(os.path.join(run, f)) for f in ("config.json", "eval.json")}
  assert after == before
  # Without config.json the checkpoints' run is unknown: another encoding is refused.
  os.remove(os.path.join(run, "config.json"))
  other = tiny_config(steps=6)
  other.model.pe = "randomized_rope"
  with pytest.raises(ValueError, match="has checkpoints but no config.json"):
    loop.train_and_evaluate(other, run)


def test_settings_that_cannot_change_results_are_not_identity():
  config = tiny_config(steps=4, max_programs=0).to_dict()  # max_programs at its default.
  other = copy.deepcopy(config)
  other["training"].update(steps=9, prefetch=1, log_every=1, checkpoint_every=1)
  other["progress"] = True
  other["evaluation"]["max_length"] = 9
  assert workdir_lib.identity(config) == workdir_lib.identity(other)
  other["model"]["num_layers"] = 2
  assert workdir_lib.identity_differences(config, other) == ["model.num_layers: 1 -> 2"]
  # A setting added after a run was stored is no difference while it has its default.
  older = copy.deepcopy(config)
  del older["model"]["dropout_rate"], older["training"]["max_programs"]
  assert workdir_lib.identity_differences(older, config) == []
  config["training"]["max_programs"] = 3
  assert workdir_lib.identity_differences(older, config) == [
      "training.max_programs: (absent) -> 3"]
  # So for evaluation settings: a finished sweep job stays finished after an upgrade.
  del older["evaluation"]["every_steps"], older["evaluation"]["periodic_batch_size"]
  assert workdir_lib.evaluation_differences(older, config) == []
  config["evaluation"]["every_steps"] = 100
  assert workdir_lib.evaluation_differences(older, config) == [
      "evaluation.every_steps: (absent) -> 100"]


def test_a_second_process_on_a_locked_workdir_is_refused(tmp_path):
  run = tmp_path / "run"
  with workdir_lib.locked(str(run)):
    out = entry_points.run("experiments.train", [f"--workdir={run}",
                                                 "--config.training.steps=2", *TINY_FLAGS],
                           env=ENV, timeout=300)
    assert out.returncode == 1, out.stderr[-3000:]
    line = _one_error_line(out.stderr)
    assert f"is in use by process {os.getpid()}" in line
    assert os.listdir(run) == [workdir_lib.LOCK_FILE]
  assert workdir_lib.holder_if_locked(str(run)) is None  # Released with its holder.


def test_the_lock_stamp_changes_each_time_a_run_takes_the_lock(tmp_path):
  """What a Ray sweep driver watches to see a job start (a stale lock file of an
  earlier run included), without taking the lock itself."""
  run = str(tmp_path / "run")
  assert workdir_lib.lock_stamp(run) is None
  with workdir_lib.locked(run):
    first = workdir_lib.lock_stamp(run)
    assert first is not None and workdir_lib.lock_stamp(run) == first
  assert workdir_lib.lock_stamp(run) == first  # Releasing writes nothing.
  time.sleep(0.05)  # Past the file system's timestamp tick.
  with workdir_lib.locked(run):
    assert workdir_lib.lock_stamp(run) not in (None, first)


def test_a_truncated_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, capfd):
  run = str(tmp_path / "run")
  old_umask = os.umask(0o022)
  try:
    loop.train_and_evaluate(tiny_config(steps=4, checkpoint_every=2), run)  # Steps 2 and 4.
    # The same run, copied, for the identity test (one training for both).
    shutil.copytree(run, str(tmp_path / "identity"))
    _identity_steps_and_missing_config_are_refused_without_writing(str(tmp_path / "identity"))
    data_files = [p for p in glob.glob(os.path.join(run, "checkpoints", "4", "**"),
                                       recursive=True)
                  if os.path.isfile(p) and os.path.getsize(p) > 1000]
    # Every file cut to half, as a copy or a disk that failed mid-write leaves them. (Only
    # the biggest file made this test flaky: it is sometimes an OCDBT data file that a
    # restore does not read, and the state restored from the rest was bit-identical.)
    for path in data_files:
      with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    capfd.readouterr()
    result = loop.train_and_evaluate(tiny_config(steps=6, checkpoint_every=2), run)
    err = capfd.readouterr().err
    assert "the checkpoint of step 4 cannot be read" in err and "trying step 2" in err
    assert result["step"] == 6
    assert len(os.listdir(os.path.join(run, "damaged_checkpoints"))) == 1
    assert checkpoints.Checkpoints(run).steps() == [4, 6]  # Step 4 saved again.
    # Result files have ordinary permissions (0666 less the umask), not 0600.
    for name in ("config.json", "metrics.jsonl", "eval.json"):
      assert os.stat(os.path.join(run, name)).st_mode & 0o777 == 0o644, name
  finally:
    os.umask(old_umask)


def test_an_os_error_while_saving_is_one_line_and_keeps_the_last_checkpoint(
    tmp_path, monkeypatch):
  run = str(tmp_path / "run")
  original = io_utils.write_json

  def disk_full_at_step_4(path, data):
    if path.endswith(checkpoints.CARRY_FILE) and "4" in data:
      raise OSError(28, "No space left on device")
    return original(path, data)

  monkeypatch.setattr(io_utils, "write_json", disk_full_at_step_4)
  config = tiny_config(steps=6, checkpoint_every=2)
  with pytest.raises(checkpoints.StorageError) as info:
    loop.train_and_evaluate(config, run)
  assert "\n" not in str(info.value) and "No space left on device" in str(info.value)
  assert "step 4" in str(info.value)
  assert trained_run.restore_run(run).state.step.tolist() == [2]


def test_an_atomic_write_that_fails_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path, monkeypatch):
  path = str(tmp_path / "result.bin")
  io_utils.atomic_write_bytes(path, b"old")
  io_utils.atomic_write_text(path + ".txt", "caf\u00e9\n")
  assert open(path + ".txt", encoding="utf-8").read() == "caf\u00e9\n"

  def failing_replace(src, dst):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(os, "replace", failing_replace)
  for durable in (True, False):
    with pytest.raises(OSError, match="No space left"):
      io_utils.atomic_write_bytes(path, b"new", durable=durable)
  assert open(path, "rb").read() == b"old"
  assert sorted(os.listdir(tmp_path)) == ["result.bin", "result.bin.txt"]


def test_corrupt_files_are_named(tmp_path):
  path = tmp_path / "eval.json"
  path.write_text('{"step": 4, "accuracy": [0.5')
  with pytest.raises(io_utils.CorruptFileError, match=str(path)):
    io_utils.read_json(str(path))


def _sweep_config(steps=2):
  config = tiny_config(steps=steps)
  config.sweep = {"tasks": ("reverse_string",), "encodings": ("randomized_relative",)}
  return config


def test_a_sweep_reruns_changed_jobs_and_skips_corrupt_results(tmp_path, capfd):
  sweep_dir = str(tmp_path / "sweep")
  config = _sweep_config()
  config.sweep.tasks = ("reverse_string", "parity_check")
  sweep.run_sweep(config, sweep_dir, job_fn=sweep_helpers.counting_job)
  jobs = sweep.make_jobs(config, sweep_dir)
  assert [sweep.is_finished(j) for j in jobs] == [True, True]

  def completions(job):
    return len(open(os.path.join(job.workdir, "completions.log")).read().split())

  # A corrupt eval.json: named, evaluated again; the other job is skipped.
  with open(os.path.join(jobs[0].workdir, "eval.json"), "w") as f:
    f.write('{"step": 2, "acc')
  capfd.readouterr()
  progress = sweep.run_sweep(config, sweep_dir, job_fn=sweep_helpers.counting_job)
  out = capfd.readouterr().out
  assert f"{jobs[0].workdir}/eval.json is damaged" in out and not progress.failed
  assert [completions(j) for j in jobs] == [2, 1]

  # Another evaluation range: the same models evaluated again, not retrained.
  config.evaluation.max_length = 7
  progress = sweep.run_sweep(config, sweep_dir, job_fn=sweep_helpers.counting_job)
  assert "evaluation settings changed (evaluation.max_length: 6 -> 7)" in capfd.readouterr().out
  jobs = sweep.make_jobs(config, sweep_dir)
  for job in jobs:
    result = json.load(open(os.path.join(job.workdir, "eval.json")))
    assert result["lengths"] == list(range(1, 8)) and result["step"] == 2
    steps_logged = [json.loads(l)["step"] for l in open(os.path.join(job.workdir,
                                                                       "metrics.jsonl"))]
    assert steps_logged == [2]

  # Another model: never mistaken for finished; refused with the difference named, then
  # with rerun_changed moved aside and trained again.
  config.training.learning_rate = 5e-4
  progress = sweep.run_sweep(config, sweep_dir, job_fn=sweep_helpers.counting_job)
  out = capfd.readouterr().out
  assert "training.learning_rate: 0.001 -> 0.0005" in out and "--rerun_changed" in out
  assert len(progress.failed) == 2
  progress = sweep.run_sweep(config, sweep_dir, job_fn=sweep_helpers.counting_job,
                             rerun_changed=True)
  jobs = sweep.make_jobs(config, sweep_dir)
  assert not progress.failed and all(sweep.is_finished(j) for j in jobs)
  assert len(glob.glob(os.path.join(sweep_dir, "*", "*.replaced-*"))) == 2
  # The report names a corrupt result and carries on.
  with open(os.path.join(jobs[1].workdir, "eval.json"), "w") as f:
    f.write("{")
  results = report.load_sweep(sweep_dir)
  assert list(results) == [("reverse_string", "randomized_relative")]
  assert "parity_check/randomized_relative/eval.json is damaged" in capfd.readouterr().err


def _wait_for(predicate, timeout, what):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return
    time.sleep(0.2)
  raise AssertionError(f"timed out waiting for {what}")


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  try:  # A zombie is dead.
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] != "Z"
  except FileNotFoundError:
    return False


def test_sigint_saves_the_current_step_and_exits_130(tmp_path):
  run = tmp_path / "run"
  process = subprocess.Popen(
      [sys.executable, "-m", "experiments.train", f"--workdir={run}",
       "--config.training.steps=100000", "--config.training.log_every=1",
       "--config.training.checkpoint_every=100000", *TINY_FLAGS],
      cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    metrics = run / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and len(metrics.read_text().split("\n")) > 3, 300,
              "training steps")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
  finally:
    process.kill()
  assert process.returncode == 130, err[-3000:]
  assert "Traceback" not in err
  saved = checkpoints.Checkpoints(str(run)).steps()
  assert len(saved) == 1 and 3 <= saved[0] < 100000
  assert f"saved a checkpoint of step {saved[0]}" in err


def test_a_killed_sweep_driver_leaves_no_live_worker(tmp_path):
  sweep_dir = tmp_path / "sweep"
  script = f"""
import sys; sys.path.insert(0, {ROOT!r})
from experiments.training import jobs as sweep
from tests import sweep_helpers
from tests.test_reliability import _sweep_config
sweep.run_sweep(_sweep_config(), {str(sweep_dir)!r}, workers=2,
                job_fn=sweep_helpers.waiting_job)
"""
  driver = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  pid_file = sweep_dir / "reverse_string" / "randomized_relative" / "worker.pid"
  try:
    _wait_for(pid_file.exists, 120, "the worker to start")
    worker = int(pid_file.read_text())
    assert _alive(worker)
    driver.kill()
    driver.wait(timeout=30)
    _wait_for(lambda: not _alive(worker), 30, "the worker to stop with its driver")
  finally:
    driver.kill()
  assert workdir_lib.holder_if_locked(str(pid_file.parent)) is None
  assert (pid_file.parent / "stopped").read_text() == str(signal.SIGTERM)
