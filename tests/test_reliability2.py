"""Runs that cannot be corrupted, continued (issue 28): numeric settings, settings the
grid shadows, progress lines, reports of unfinished sweeps, a checkpoint's identity,
library failures, memory estimates and signals."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from experiments.training import loop
from experiments.training import validation
from tests import entry_points
from tests.test_reliability import TINY_FLAGS, _one_error_line
from tests.test_training import ENV, ROOT, tiny_config


def _run(module, args, timeout=300, env=None):
  return entry_points.run(f"experiments.{module}", args, env=env or ENV, timeout=timeout)


@pytest.mark.parametrize("module,args,message", [
    # 1: infinite numbers, duplicate grid members, undocumented sentinels, list elements.
    ("train", ["--config.training.learning_rate=inf"],
     "training.learning_rate must be a finite number, got inf"),
    ("train", ["--config.model.dropout_rate=inf"], "model.dropout_rate must be a finite number"),
    ("train", ["--config.grid.learning_rates=(0.001,inf)"],
     "grid.learning_rates must be a finite number, got (0.001,inf) (the element inf)"),
    ("train", ["--config.grid.learning_rates=(0.001,abc)"], "(the element 'abc')"),
    ("train", ["--config.grid.seeds=(0,0)"], "(0 is given twice)"),
    ("train", ["--config.grid.learning_rates=(0.001,0.001)"], "(0.001 is given twice)"),
    ("train", ["--config.data_seed=-2"],
     "data_seed must be an integer in [0, 2147483647], or -1 (the same as seed), got -2"),
    # 7: a program that cannot fit in memory, refused before training.
    ("train", ["--config.evaluation.batch_size=2000000000"],
     "the evaluation would need at least"),
    # 2: a setting the grid replaces.
    ("train", ["--config.grid.learning_rates=(0.001,0.002)",
               "--config.training.learning_rate=0.01"],
     "--config.training.learning_rate has no effect: grid.learning_rates=(0.001, 0.002)"),
    ("train", ["--config.grid.seeds=(1,2)", "--config.data_seed=0", "--config.seed=5"],
     "--config.seed has no effect: grid.seeds=(1, 2)"),
    ("sweep", ["--config=configs/table1.py:scale=small", "--config.training.learning_rate=0.01"],
     "--config.training.learning_rate has no effect: grid.learning_rates="),
    ("sweep", ["--config=configs/table1.py:scale=small", "--only=reverse_string/*,nope/*"],
     "--only: 'nope/*' matches no job; jobs are TASK/VARIANT with TASK one of "),
])
def test_bad_numbers_and_shadowed_settings_are_one_line_and_write_nothing(
    tmp_path, module, args, message):
  target = tmp_path / "out"
  where = f"--workdir={target}" if module == "train" else f"--sweep_dir={target}"
  out = _run(module, [where, *TINY_FLAGS, *args] if module == "train" else [where, *args],
             timeout=120)
  assert out.returncode == 2, out.stderr[-3000:]
  assert message in _one_error_line(out.stderr)
  assert not target.exists()


def test_an_infinite_learning_rate_writes_nothing_and_the_corrected_run_works(tmp_path):
  run = str(tmp_path / "run")
  bad = tiny_config(steps=2, learning_rate=float("inf"))
  with pytest.raises(ValueError, match="training.learning_rate must be a finite number"):
    loop.train_and_evaluate(bad, run)
  assert not os.path.exists(run)
  assert loop.train_and_evaluate(tiny_config(steps=2), run)["step"] == 2


def test_a_tuple_given_as_text_is_judged_and_stored_by_its_elements():
  config = tiny_config()
  config.grid.learning_rates = ("(0.001, 0.002)",)
  validation.check_rules(config)
  assert tuple(config.grid.learning_rates) == (0.001, 0.002)
  config.grid.seeds = (0, 1, 0)
  with pytest.raises(ValueError, match=r"grid.seeds must be a tuple of distinct values .*"
                     r"\(0 is given twice\)"):
    validation.check_rules(config)


@pytest.mark.parametrize("module", ["train", "sweep", "report"])
def test_a_file_given_as_the_folder_is_the_same_one_line_error(tmp_path, module):
  path = tmp_path / "a_file"
  path.write_text("not a folder")
  flag = "workdir" if module == "train" else "sweep_dir"
  args = [f"--{flag}={path}"]
  if module == "train":
    args += TINY_FLAGS
  if module == "sweep":
    args += ["--config=configs/table1.py:scale=small"]
  out = _run(module, args, timeout=120)
  assert out.returncode == 2, out.stderr[-3000:]
  assert _one_error_line(out.stderr) == (
      f"error: --{flag}={path} is a file, not a folder; use another --{flag}")
  assert path.read_text() == "not a folder"


def test_progress_to_a_non_terminal_is_one_plain_line_per_interval(tmp_path):
  out = _run("train", [f"--workdir={tmp_path / 'run'}", *TINY_FLAGS, "--config.progress=True",
                       "--config.training.steps=6", "--config.training.log_every=2"])
  assert out.returncode == 0, out.stderr[-3000:]
  assert "\r" not in out.stderr + out.stdout
  lines = [l for l in out.stderr.splitlines() if "randomized_relative: step" in l]
  assert [l.split(": step ")[1].split(" ")[0] for l in lines] == ["2/6", "4/6", "6/6"], lines
  assert "loss" in lines[0] and "steps/s" in lines[0]


def test_progress_counts_computed_steps_and_few_steps_run_ahead(tmp_path, monkeypatch):
  from experiments.training import steps  # pylint: disable=import-outside-toplevel
  dispatched, seen = [0], []
  build = steps.build_trainer

  def counting_trainer(*args, **kwargs):
    trainer = build(*args, **kwargs)
    step = trainer.step

    def counted(*a):
      dispatched[0] += 1
      return step(*a)

    trainer.step = counted
    return trainer

  def computed(self, step):
    seen.append((step, dispatched[0]))
    self.done = max(self.done, step)

  monkeypatch.setattr(steps, "build_trainer", counting_trainer)
  monkeypatch.setattr(loop.Progress, "computed", computed)
  loop.train_and_evaluate(tiny_config(steps=12, log_every=12, checkpoint_every=12),
                          str(tmp_path / "run"))
  counted = [s for s, _ in seen]
  assert counted == sorted(counted) and counted[-1] == 12
  # The progress is told of a step only once it is computed, and the host never runs
  # more than MAX_STEPS_AHEAD steps ahead of the last step known computed.
  assert all(0 <= d - s <= loop.MAX_STEPS_AHEAD for s, d in seen), seen
  assert len(set(counted)) >= 12 - loop.MAX_STEPS_AHEAD


SECOND_SIGNAL = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from experiments.training import stopping
with stopping.graceful():
  os.kill(os.getpid(), signal.SIGINT)
  time.sleep(0.3)
  print("requested", stopping.requested(), flush=True)
  os.kill(os.getpid(), signal.SIGINT)  # Within the grace period: the same Ctrl-C.
  time.sleep(1.5)
  print("still running", flush=True)
  os.kill(os.getpid(), signal.SIGINT)
  time.sleep(20)
  print("not stopped", flush=True)
"""


def test_a_second_signal_ends_the_process_at_once_with_one_line(tmp_path):
  out = subprocess.run([sys.executable, "-c", SECOND_SIGNAL.format(root=ROOT)], cwd=ROOT,
                       env=ENV, capture_output=True, text=True, timeout=60)
  assert out.returncode == 130, (out.returncode, out.stderr[-3000:])
  assert out.stdout.split("\n")[:2] == ["requested 2", "still running"]
  assert "not stopped" not in out.stdout
  assert "interrupted again: stopped at once" in _one_error_line(out.stderr)


def test_two_interrupts_while_compiling_do_not_crash(tmp_path):
  run = tmp_path / "run"
  process = subprocess.Popen(
      [sys.executable, "-m", "experiments.train", f"--workdir={run}", *TINY_FLAGS,
       "--config.training.steps=100000", "--config.compilation_cache=off"],
      cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    process.stdout.readline()  # "task ...": building and compiling starts.
    process.send_signal(signal.SIGINT)
    time.sleep(1.5)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=600)
  finally:
    process.kill()
  assert process.returncode == 130, (process.returncode, err[-3000:])
  assert "Traceback" not in err and "Segmentation" not in err


def _ignoring_sigint():
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # As `cmd &` in a script starts a job.


def test_a_run_started_with_sigint_ignored_still_stops_on_sigint(tmp_path):
  # A background job of a non-interactive shell starts with SIGINT ignored (also this
  # suite's subprocesses when the suite itself runs so); before the training loop
  # installed its handler, such a SIGINT was lost and the run trained to the end.
  process = subprocess.Popen(
      [sys.executable, "-m", "experiments.train", f"--workdir={tmp_path / 'run'}",
       *TINY_FLAGS, "--config.training.steps=100000", "--config.compilation_cache=off"],
      cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      preexec_fn=_ignoring_sigint)
  try:
    process.stdout.readline()  # "task ...": building and compiling starts.
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
  finally:
    process.kill()
  assert process.returncode == 130, (process.returncode, err[-3000:])
  assert "Traceback" not in err and "interrupted" in err
  assert not (tmp_path / "run" / "eval.json").exists()


def test_a_report_of_an_unfinished_sweep_shows_missing_cells_and_names_the_jobs(tmp_path):
  from experiments.storage import io_utils  # pylint: disable=import-outside-toplevel
  from experiments.analysis import tables as report  # pylint: disable=import-outside-toplevel
  from experiments.training import jobs as sweep  # pylint: disable=import-outside-toplevel

  def job(config_dict, workdir, companions):
    if config_dict["task"] == "parity_check":
      raise RuntimeError("never started")
    if config_dict["model"]["pe"] == "relative":  # Started, stopped before its result.
      os.makedirs(workdir)
      io_utils.write_json(os.path.join(workdir, "config.json"), config_dict)
      raise RuntimeError("stopped")
    return sweep.run_job(config_dict, workdir, companions)

  config = tiny_config(steps=2)
  config.sweep = {"tasks": ("reverse_string", "parity_check"),
                  "encodings": ("relative", "randomized_relative")}
  sweep_dir = str(tmp_path / "sweep")
  assert len(sweep.run_sweep(config, sweep_dir, job_fn=job).failed) == 3
  written = report.write_report(sweep_dir)
  assert written["kind"] == "paper"
  assert written["unfinished"] == [("parity_check", "randomized_relative"),
                                   ("parity_check", "relative"), ("reverse_string", "relative")]
  assert written["encodings"] == ["relative", "randomized_relative"]
  assert sorted(written["tasks"]) == ["parity_check", "reverse_string"]
  rows = {l.split(" | ")[0]: l for l in written["table1"].splitlines() if l.startswith("| ")}
  cells = rows["| reverse_string"].strip(" |").split(" | ")
  assert cells[1].startswith(report.MISSING) and not cells[2].startswith(report.MISSING)
  assert "unfinished: 3 job(s) without a result" in written["text"]
  assert "reverse_string/relative" in written["text"]
  assert "headline: not computed: no task has both" in written["text"]
  head = json.load(open(os.path.join(sweep_dir, "report", "headline.json")))
  assert head["ours"]["average_gain_points"] is None and head["ours"]["why_none"]
  assert "reverse_string/relative" in head["unfinished_jobs"]


def test_a_checkpoint_of_another_run_is_refused_even_when_config_json_is_edited(tmp_path):
  from experiments.storage import checkpoints  # pylint: disable=import-outside-toplevel
  run = str(tmp_path / "run")
  loop.train_and_evaluate(tiny_config(steps=2), run)
  path = os.path.join(run, "config.json")
  stored = json.load(open(path))
  stored["task"] = "even_pairs"  # Edited by hand.
  with open(path, "w") as f:
    json.dump(stored, f)
  before = {name: os.path.getmtime(os.path.join(run, name)) for name in os.listdir(run)}
  other = tiny_config(steps=4)
  other.task = "even_pairs"
  with pytest.raises(ValueError, match=r"the checkpoint of step 2 in .* belongs to another "
                     r'run \(task: "reverse_string" -> "even_pairs"\)'):
    loop.train_and_evaluate(other, run)
  assert {name: os.path.getmtime(os.path.join(run, name)) for name in os.listdir(run)} == before
  assert checkpoints.Checkpoints(run).steps() == [2]
  # The run the checkpoint belongs to still resumes.
  stored["task"] = "reverse_string"
  with open(path, "w") as f:
    json.dump(stored, f)
  assert loop.train_and_evaluate(tiny_config(steps=4), run)["step"] == 4


def _file_size_limit(limit):
  import resource  # pylint: disable=import-outside-toplevel
  return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.parametrize("debug", [False, True])
def test_a_full_disk_while_saving_is_one_line_and_the_details_go_to_a_log(tmp_path, debug):
  run = tmp_path / "run"
  env = {**ENV, "RANDOMIZED_PE_DEBUG": "1" if debug else ""}
  out = subprocess.run(
      [sys.executable, "-m", "experiments.train", f"--workdir={run}", *TINY_FLAGS,
       "--config.training.steps=4", "--config.compilation_cache=off"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
      preexec_fn=_file_size_limit(4096))
  assert out.returncode == 1, out.stderr[-3000:]
  assert out.stderr.count("error: ") == 1, out.stderr[-3000:]
  assert "error: cannot save the checkpoint of step 4" in out.stderr, out.stderr[-3000:]
  if debug:
    # The libraries' threads print to stderr too, and may still be printing (orbax's
    # "Event loop is closed"): the error line can land inside one of their lines.
    assert "Traceback" in out.stderr
  else:
    last = _one_error_line(out.stderr)
    assert last.startswith("error: cannot save the checkpoint of step 4")
    assert last.endswith(f"(the libraries' messages: {run}/library.log)")
    assert "Traceback" in (run / "library.log").read_text()


def test_a_log_write_cut_short_by_the_file_size_limit_still_counts_as_written(tmp_path):
  # The full-disk test above failed in CI when the first message to reach the log was
  # longer than the 4 KiB limit: its start was in the file, but the stream said it held
  # nothing and the error line did not point to it. Here that order is forced.
  path = tmp_path / "library.log"
  script = f"""
import resource
from experiments import cli
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
log = cli._LibraryLog({str(path)!r})
log.write("Traceback (most recent call last):\\n" + "x" * 10000)
first = log.used
log.write("a second message, refused whole\\n")
print(first, log.used)
"""
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split() == ["True", "True"]
  text = path.read_text()
  assert text.startswith("Traceback (most recent call last):") and 0 < len(text) <= 4096
  # Nothing cut short went elsewhere: the terminal stays clean.
  assert "xxxx" not in out.stderr


def test_a_storage_failure_points_to_the_log_even_before_the_library_prints(tmp_path):
  # The full-disk test above depends on when orbax's threads print: here no library has
  # printed anything when the error comes, and the line must still point to the log,
  # which holds the traceback of the failure and of its cause.
  run = tmp_path / "run"
  script = f"""
import os, runpy, sys
from experiments.storage import checkpoints
from experiments.training import loop
def failing(config, workdir, *args, **kwargs):
  os.makedirs(workdir)  # As the loop does before its first save.
  try:
    raise OSError(28, "No space left on device")
  except OSError as cause:
    raise checkpoints.StorageError("cannot save the checkpoint of step 1") from cause
loop.train_and_evaluate = failing
sys.argv = ["train", "--workdir={run}", *{TINY_FLAGS!r}, "--config.compilation_cache=off"]
runpy.run_module("experiments.train", run_name="__main__")
"""
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 1, out.stderr[-3000:]
  assert _one_error_line(out.stderr) == ("error: cannot save the checkpoint of step 1 "
                                         f"(the libraries' messages: {run}/library.log)")
  log = (run / "library.log").read_text()
  assert "StorageError: cannot save the checkpoint of step 1" in log
  assert "No space left on device" in log  # The cause, chained.


def test_programs_that_cannot_fit_in_memory_are_refused_up_front(tmp_path, monkeypatch):
  from experiments.training import memory  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv(memory.LIMIT_ENV, str(2**30))  # A fake limit of 1 GiB.
  validation.check_fits(tiny_config())  # Fits.
  big_evaluation = tiny_config()
  big_evaluation.evaluation.batch_size = 50_000_000
  with pytest.raises(ValueError, match=r"the evaluation would need at least [0-9.]+ GiB of "
                     r"memory, more than the 1.0 GiB available \(\$RANDOMIZED_PE_MEMORY_LIMIT"
                     r"\); lower evaluation.batch_size"):
    validation.check_fits(big_evaluation)
  validation.validate(big_evaluation)  # Listing a job does not judge it against this machine.
  big_training = tiny_config()
  big_training.training.batch_size = 100_000
  big_training.model.num_layers = 8
  with pytest.raises(ValueError, match=r"the training would need at least .* lower "
                     r"training.batch_size"):
    loop.train_and_evaluate(big_training, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_ctrl_c_outside_the_training_loop_exits_130_and_ignores_a_second_one(monkeypatch):
  """A Ctrl-C before the loop handles signals (building, compiling) ends with 130; a second
  one while the interpreter shuts down must not turn that into death by SIGINT (-2), which
  the two-interrupt test above saw under load."""
  from absl import app  # pylint: disable=import-outside-toplevel

  from experiments import cli  # pylint: disable=import-outside-toplevel

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt

  monkeypatch.setattr(app, "run", interrupted)
  before = signal.getsignal(signal.SIGINT)
  try:
    with pytest.raises(SystemExit) as stop:
      cli.run(lambda argv: None)
    assert stop.value.code == 130
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGINT, before)


def test_the_library_log_drops_what_comes_after_its_file_was_closed(tmp_path, capsys):
  from experiments import cli  # pylint: disable=import-outside-toplevel
  log = cli._LibraryLog(str(tmp_path / "library.log"))  # pylint: disable=protected-access
  assert log.write("first\n") == 6 and log.used
  log.file.close()  # As the interpreter's shutdown may, before a last library message.
  assert log.write("Future exception was never retrieved\n") == 37
  assert capsys.readouterr().err == ""
  assert (tmp_path / "library.log").read_text() == "first\n"


def test_library_warnings_go_to_the_log_in_the_block_and_nowhere_else(tmp_path, capsys):
  import warnings  # pylint: disable=import-outside-toplevel

  from experiments import cli  # pylint: disable=import-outside-toplevel
  path = tmp_path / "library.log"
  with warnings.catch_warnings(record=True) as shown:  # As stderr, outside the block.
    warnings.simplefilter("always")
    before = warnings.showwarning
    with cli.library_output_to(str(path)):
      warnings.warn("coroutine 'write_fragment' was never awaited", RuntimeWarning)
    assert warnings.showwarning is before  # Restored.
    warnings.warn("after the block", UserWarning)
  assert [str(w.message) for w in shown] == ["after the block"]
  assert capsys.readouterr().err == ""
  assert "RuntimeWarning: coroutine 'write_fragment' was never awaited" in path.read_text()
  assert "after the block" not in path.read_text()


def _sigint_to_this_process():
  """Sends SIGINT to this process and waits until the stop-request watchdog records it."""
  from experiments.training import stopping  # pylint: disable=import-outside-toplevel
  os.kill(os.getpid(), signal.SIGINT)
  deadline = time.monotonic() + 10
  while stopping.requested() is None and time.monotonic() < deadline:
    time.sleep(0.01)


def _interrupt_while_building(monkeypatch):
  """A SIGINT to this process while the trainer is built (compiling, in XLA)."""
  from experiments.training import steps  # pylint: disable=import-outside-toplevel
  build = steps.build_trainer

  def interrupted_build(*args, **kwargs):
    _sigint_to_this_process()
    return build(*args, **kwargs)

  monkeypatch.setattr(steps, "build_trainer", interrupted_build)


def test_a_signal_while_the_model_is_built_stops_before_the_first_step(tmp_path, monkeypatch):
  # Before, the loop handled signals only from its first step: a SIGINT during building
  # raised KeyboardInterrupt inside XLA (a crash) or inside jax's gc callback (swallowed:
  # the run trained to the end).
  from experiments.storage import checkpoints  # pylint: disable=import-outside-toplevel
  from experiments.training import stopping  # pylint: disable=import-outside-toplevel
  run = str(tmp_path / "run")
  before = signal.getsignal(signal.SIGINT)
  with monkeypatch.context() as patch:
    _interrupt_while_building(patch)
    with pytest.raises(stopping.Interrupted,
                       match=r"^stopped before step 1; no checkpoint was saved yet; run the "
                       r"same command to resume$") as stop:
      loop.train_and_evaluate(tiny_config(steps=4), run)
  assert stop.value.exit_code == 130
  assert signal.getsignal(signal.SIGINT) is before  # Handlers restored.
  assert checkpoints.Checkpoints(run).steps() == []
  assert not os.path.exists(os.path.join(run, "eval.json"))
  assert loop.train_and_evaluate(tiny_config(steps=2), run)["step"] == 2  # Runs after.
  with monkeypatch.context() as patch:  # A resumed run keeps its checkpoint.
    _interrupt_while_building(patch)
    with pytest.raises(stopping.Interrupted, match=r"^stopped before step 3; the checkpoint "
                       r"of step 2 in .* is kept"):
      loop.train_and_evaluate(tiny_config(steps=4), run)
  assert checkpoints.Checkpoints(run).steps() == [2]
  assert loop.train_and_evaluate(tiny_config(steps=4), run)["step"] == 4


@pytest.mark.parametrize("fails", [False, True])
def test_closing_the_prefetcher_waits_for_its_thread(fails):
  # A daemon thread still inside jax when the interpreter exits aborts the process (seen
  # when a run stopped before its first step).
  from experiments.training import data  # pylint: disable=import-outside-toplevel

  def make(step):
    if fails and step == 1:
      raise RuntimeError("a failed batch")
    return step

  prefetch = data.Prefetcher(make, 0, 100, depth=1)
  time.sleep(0.3)  # The queue is full; the thread waits to put the next item.
  prefetch.close()
  assert not prefetch._thread.is_alive()  # pylint: disable=protected-access


def test_a_signal_during_the_final_evaluation_stops_it_and_the_rerun_evaluates(tmp_path,
                                                                              monkeypatch):
  # The loop's stop requests cover the final evaluation too (minutes at the paper's
  # scale): it stops between lengths, writes no eval.json, and keeps the last checkpoint.
  from experiments.storage import checkpoints  # pylint: disable=import-outside-toplevel
  from experiments.training import evaluation  # pylint: disable=import-outside-toplevel
  from experiments.training import stopping  # pylint: disable=import-outside-toplevel
  run = str(tmp_path / "run")
  evaluate = evaluation.RangeEvaluator.evaluate

  def interrupted_evaluate(self, *args, **kwargs):
    _sigint_to_this_process()
    return evaluate(self, *args, **kwargs)

  with monkeypatch.context() as patch:
    patch.setattr(evaluation.RangeEvaluator, "evaluate", interrupted_evaluate)
    with pytest.raises(stopping.Interrupted, match=r"^stopped during the final evaluation, "
                       r"before its result; training is finished \(the checkpoint of step 4 "
                       r"in .*\); run the same command to evaluate$"):
      loop.train_and_evaluate(tiny_config(steps=4), run)
  assert not os.path.exists(os.path.join(run, "eval.json"))
  assert checkpoints.Checkpoints(run).steps()[-1] == 4
  uninterrupted = loop.train_and_evaluate(tiny_config(steps=4), str(tmp_path / "other"))
  rerun = loop.train_and_evaluate(tiny_config(steps=4), run)  # Evaluates, trains nothing.
  assert rerun["step"] == 4
  assert rerun["models"][0]["accuracy"] == uninterrupted["models"][0]["accuracy"]
