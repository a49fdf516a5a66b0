"""TensorBoard event files (experiments/training/events.py) equal metrics.jsonl, also after a
resume; the report's curves of a run (python -m experiments.report --run_dir)."""
import os

import numpy as np
import pytest

from experiments.training import events
from experiments.storage import io_utils
from experiments.training import loop
from experiments.training import stopping
from tests import entry_points
from tests.test_training import ENV, ROOT, tiny_config


def _expected(records, count=1):
  """{(member, tag): [(step, value)]} of metrics.jsonl's records, in float32."""
  names = events.member_names([(i, 1.0) for i in range(count)])
  out = {}
  for record in records:
    for name, values in zip(names, events.scalars(record, count)):
      for tag, value in values:
        out.setdefault((name, tag), []).append((record["step"], np.float32(value)))
  return out


def _read_back(workdir, names=("",)):
  """The same from the event files, each folder holding exactly one event file."""
  out = {}
  for name in names:
    files = events.event_files(os.path.join(workdir, events.FOLDER, name))
    assert len(files) == 1, files
    for event in events.read(files[0]):
      for tag, value in event["values"].items():
        out.setdefault((name, tag), []).append((event["step"], np.float32(value)))
  return out


def _assert_events_equal_metrics(workdir, count=1, names=("",)):
  records = io_utils.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  expected, got = _expected(records, count), _read_back(workdir, names)
  assert sorted(got) == sorted(expected)
  for key, points in expected.items():
    assert [s for s, _ in got[key]] == [s for s, _ in points], key  # Each step once.
    np.testing.assert_array_equal([v for _, v in got[key]], [v for _, v in points])
  return records, got


def test_tags_of_a_single_model_and_of_a_grid():
  record = {"step": 4, "loss": 0.5, "accuracy": 0.25, "steps_per_second": 10.0}
  assert events.scalars(record, 1) == [[("train/accuracy", 0.25), ("train/loss", 0.5),
                                        ("train/steps_per_second", 10.0)]]
  evaluation = {"step": 4, "train_seconds": 3.0, "evaluation": {
      "lengths": [2, 12], "accuracy": [[1.0, 0.5], [0.0, 0.25]], "mean": [0.5, 0.375],
      "train_range": [1.0, 0.5], "unseen": [0.0, None]}}
  first, second = events.scalars(evaluation, 2)
  assert first == [("eval/train_seconds", 3.0), ("eval_length/002", 1.0),
                   ("eval_length/012", 0.0), ("eval/mean", 0.5), ("eval/train_range", 1.0),
                   ("eval/unseen", 0.0)]
  assert ("eval/unseen", None) not in second and ("eval_length/012", 0.25) in second
  dataset = {"step": 6, "epoch": 2.0, "train_seconds": 1.0,
             "evaluation": {"test": {"all": 0.75, "long": 0.5}}}
  assert events.scalars(dataset, 1) == [[("eval/epoch", 2.0), ("eval/train_seconds", 1.0),
                                         ("eval/test/all", 0.75), ("eval/test/long", 0.5)]]
  assert events.member_names([(0, 1e-3)]) == [""]
  assert events.member_names([(0, 1e-3), (1, 1e-3)]) == ["seed0", "seed1"]
  assert events.member_names([(0, 1e-3), (0, 3e-4)]) == ["lr0.001", "lr0.0003"]
  assert events.member_names([(0, 1e-3), (0, 3e-4), (1, 1e-3), (1, 3e-4)]) == [
      "seed0_lr0.001", "seed0_lr0.0003", "seed1_lr0.001", "seed1_lr0.0003"]


def _crash_after(monkeypatch, calls):
  """Makes the loop die (not a graceful stop: no checkpoint) after `calls` steps (it
  polls for a stop request before its first step and after each)."""
  count = {"n": 0}
  requested = stopping.requested

  def crash():
    count["n"] += 1
    if count["n"] == calls + 1:
      raise RuntimeError("simulated crash")
    return requested()
  monkeypatch.setattr(stopping, "requested", crash)


def test_events_equal_metrics_after_a_crash_and_a_resume(tmp_path, monkeypatch):
  # Log every step, checkpoint every 4, evaluate every 3: the crash after step 6 leaves
  # records of steps 5 and 6 (and the evaluation at 6) beyond the checkpoint of step 4,
  # which the resume redoes; the event file must not hold them twice.
  run = str(tmp_path / "run")
  config = tiny_config(steps=8, log_every=1, checkpoint_every=4)
  config.evaluation.every_steps = 3
  _crash_after(monkeypatch, 6)
  with pytest.raises(RuntimeError, match="simulated crash"):
    loop.train_and_evaluate(config, run)
  monkeypatch.undo()
  records, _ = _assert_events_equal_metrics(run)
  assert [(r["step"], "evaluation" in r) for r in records] == [
      (1, False), (2, False), (3, False), (3, True), (4, False), (5, False), (6, False),
      (6, True)]
  before = events.event_files(os.path.join(run, events.FOLDER))

  loop.train_and_evaluate(config, run)
  records, got = _assert_events_equal_metrics(run)
  assert [r["step"] for r in records if "evaluation" not in r] == list(range(1, 9))
  assert [s for s, _ in got[("", "train/loss")]] == list(range(1, 9))
  assert [s for s, _ in got[("", "eval/mean")]] == [3, 6]
  assert [s for s, _ in got[("", "eval_length/006")]] == [3, 6]
  assert len(events.event_files(os.path.join(run, events.FOLDER))) == 1
  assert before  # Replaced, not added to (same name when within the same second).
  assert not [f for f in os.listdir(os.path.join(run, events.FOLDER)) if f.startswith(".tmp")]

  # A finished run started again evaluates again and keeps its records and events.
  loop.train_and_evaluate(config, run)
  assert io_utils.read_jsonl(os.path.join(run, "metrics.jsonl")) == records
  _assert_events_equal_metrics(run)


def test_a_resume_that_drops_an_open_interval_record_rewrites_the_events(tmp_path):
  # As tests/test_training.py's resume: 4 steps (records at 3 and at 4, the latter of an
  # open interval), then 6: the record at 4 is dropped and steps 4-6 make the one at 6.
  run = str(tmp_path / "run")
  loop.train_and_evaluate(tiny_config(steps=4, log_every=3), run)
  records, _ = _assert_events_equal_metrics(run)
  assert [r["step"] for r in records] == [3, 4]
  loop.train_and_evaluate(tiny_config(steps=6, log_every=3), run)
  records, got = _assert_events_equal_metrics(run)
  assert [r["step"] for r in records] == [3, 6]
  assert [s for s, _ in got[("", "train/accuracy")]] == [3, 6]


def test_a_grid_writes_one_tensorboard_run_per_model(tmp_path):
  run = str(tmp_path / "grid")
  config = tiny_config(steps=2, log_every=1)
  config.grid.seeds = (0, 1)
  config.evaluation.every_steps = 2
  loop.train_and_evaluate(config, run)
  names = ("seed0", "seed1")
  assert sorted(os.listdir(os.path.join(run, events.FOLDER))) == list(names)
  records, got = _assert_events_equal_metrics(run, count=2, names=names)
  for i, name in enumerate(names):
    assert [v for _, v in got[(name, "train/loss")]] == [
        np.float32(r["loss"][i]) for r in records if "evaluation" not in r]
  assert got[("seed0", "train/loss")] != got[("seed1", "train/loss")]


def test_tensorboard_reads_the_event_file(tmp_path):
  accumulator = pytest.importorskip(
      "tensorboard.backend.event_processing.event_accumulator",
      reason="tensorboard not installed (optional: pip install tensorboard)")
  run = str(tmp_path / "run")
  config = tiny_config(steps=4, log_every=1)
  config.evaluation.every_steps = 2
  loop.train_and_evaluate(config, run)
  records = io_utils.read_jsonl(os.path.join(run, "metrics.jsonl"))
  reader = accumulator.EventAccumulator(os.path.join(run, events.FOLDER))
  reader.Reload()
  expected = _expected(records)
  assert sorted(reader.Tags()["scalars"]) == sorted(tag for _, tag in expected)
  for (_, tag), points in expected.items():
    assert [(e.step, np.float32(e.value)) for e in reader.Scalars(tag)] == points


def _report(*args):
  return entry_points.run("experiments.report", args, env=ENV, timeout=120)


def test_the_report_draws_a_runs_curves_and_refuses_a_folder_without_metrics(tmp_path):
  run = tmp_path / "run"
  config = tiny_config(steps=4, log_every=1)
  config.evaluation.every_steps = 2
  loop.train_and_evaluate(config, str(run))
  out = _report(f"--run_dir={run}")
  assert out.returncode == 0, out.stderr[-2000:]
  assert "4 log records and 2 evaluations (steps 1-4)" in out.stdout
  png = (run / "curves.png").read_bytes()
  assert png.startswith(b"\x89PNG") and len(png) > 10_000

  empty = tmp_path / "empty"
  empty.mkdir()
  for folder, message in ((empty, "no metrics records in"), (tmp_path / "missing", "no run")):
    out = _report(f"--run_dir={folder}")
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith(f"error: {message}")
  assert not os.listdir(empty)
