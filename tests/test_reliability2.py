"""Runs that cannot be corrupted, continued (issue 28): numeric settings, settings the
grid shadows, progress lines, reports of unfinished sweeps, a checkpoint's identity,
library failures, memory estimates and signals."""
import os
import subprocess
import sys

import pytest

from experiments import loop
from experiments import validation
from tests.test_reliability import TINY_FLAGS, _one_error_line
from tests.test_training import ENV, ROOT, tiny_config


def _run(module, args, timeout=300, env=None):
  return subprocess.run([sys.executable, "-m", f"experiments.{module}", *args], cwd=ROOT,
                        env=env or ENV, capture_output=True, text=True, timeout=timeout)


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
    # 2: a setting the grid replaces.
    ("train", ["--config.grid.learning_rates=(0.001,0.002)",
               "--config.training.learning_rate=0.01"],
     "--config.training.learning_rate has no effect: grid.learning_rates=(0.001, 0.002)"),
    ("train", ["--config.grid.seeds=(1,2)", "--config.data_seed=0", "--config.seed=5"],
     "--config.seed has no effect: grid.seeds=(1, 2)"),
    ("sweep", ["--config=configs/table1.py:scale=small", "--config.training.learning_rate=0.01"],
     "--config.training.learning_rate has no effect: grid.learning_rates="),
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
