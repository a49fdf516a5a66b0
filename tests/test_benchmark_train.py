"""The `train`, `eval` and `roofline` sections of the benchmark (experiments/benchmarking/)
on tiny settings: the side-by-side runner (today's code and a temporary worktree of a
commit, in subprocesses), the release's one-line error, the step figures of a config of
several programs, and the roofline arithmetic on a fake cost table. Figures are never
asserted."""
import os
import subprocess

import pytest

from experiments.benchmarking import processes
from experiments.benchmarking import roofline
from experiments.benchmarking import throughput

TINY = {"num_layers": 1, "d_model": 16, "num_heads": 2}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _worktrees() -> str:
  return subprocess.run(["git", "-C", ROOT, "worktree", "list"], capture_output=True,
                        text=True, check=True).stdout


def test_baseline_commit_runner_on_head(tmp_path):
  import sys  # pylint: disable=import-outside-toplevel
  with processes.baseline_worktree("HEAD") as (path, commit):
    assert os.path.isfile(os.path.join(path, "experiments", "benchmark.py"))
    assert path in _worktrees()
    parts = [{"label": f"commit {commit}", "kind": "ours", "root": path,
              "python": sys.executable}]
    results = processes.compare_training(parts, "randomized_relative", "paper", [2, 3],
                                         steps=2, round_steps=1, batch=4,
                                         malloc_modes=[False], scratch=str(tmp_path),
                                         model=TINY, echo=lambda *a: None)
  # Gone (other worktrees, e.g. of a benchmark running beside the test, may come and go).
  assert path not in _worktrees() and not os.path.exists(os.path.dirname(path))
  row = results[f"commit {commit}/plain malloc"]
  assert set(row) >= {"params", "compile_s", "programs", "steps_per_s", "round_seconds",
                      "gflops", "flops_per_step", "flops"}
  assert row["programs"] == 2 and len(row["round_seconds"]) == 2
  assert row["steps_per_s"] > 0 and row["flops"]["3"] > row["flops"]["2"] > 0


def test_attention_free_bound_drops_attention_only(tmp_path):
  """The bound's participant builds the same model (same parameters) whose programs do
  less arithmetic at every length: the stand-in reached the driver and replaced attention."""
  import sys  # pylint: disable=import-outside-toplevel
  parts = [{"label": "today", "kind": "ours", "root": ROOT, "python": sys.executable},
           {"label": "bound", "kind": "ours", "root": ROOT, "python": sys.executable,
            "stand_in": "attention_free"},
           {"label": "typo", "kind": "ours", "root": ROOT, "python": sys.executable,
            "stand_in": "attention_fre"}]
  results = processes.compare_training(parts, "randomized_relative", "paper", [2, 6],
                                       steps=1, round_steps=1, batch=4,
                                       malloc_modes=[False], scratch=str(tmp_path),
                                       model=TINY, echo=lambda *a: None)
  today, bound = results["today/plain malloc"], results["bound/plain malloc"]
  assert bound["params"] == today["params"] and today["costed"] == "one piece"
  for n in ("2", "6"):
    assert 0 < bound["flops"][n] < today["flops"][n]
  error = results["typo/plain malloc"]["error"]
  assert "\n" not in error and "attention_free" in error, error


def test_release_that_cannot_be_imported_is_one_line(tmp_path):
  import sys  # pylint: disable=import-outside-toplevel
  parts = [{"label": "release", "kind": "release", "root": str(tmp_path / "nowhere"),
            "python": sys.executable}]
  results = processes.compare_training(parts, "randomized_relative", "paper", [2], steps=1,
                                       round_steps=1, batch=4, malloc_modes=[False],
                                       scratch=str(tmp_path), echo=lambda *a: None)
  error = results["release/plain malloc"]["error"]
  assert "\n" not in error and "randomized_positional_encodings" in error, error


def test_bad_baseline_commit_is_one_line():
  with pytest.raises(ValueError, match="no_such_rev"):
    with processes.baseline_worktree("no_such_rev"):
      pass


def test_malloc_environment():
  env = processes.malloc_environment(False, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:a=1"})
  assert env["GLIBC_TUNABLES"] == "a=1" and env["RANDOMIZED_PE_MALLOC_TUNING"] == "0"
  tuned = processes.malloc_environment(True, {"RANDOMIZED_PE_MALLOC_TUNING": "0"})
  if tuned is not None:  # Where huge-page malloc applies (Linux, glibc >= 2.35, THP).
    assert "glibc.malloc.hugetlb=1" in tuned["GLIBC_TUNABLES"]


def test_evaluation_runner_identical_accuracies(tmp_path):
  import sys  # pylint: disable=import-outside-toplevel
  parts = [{"label": "today", "root": ROOT, "python": sys.executable}]
  runs = processes.compare_evaluation(
      parts, "randomized_relative", range(3, 5), rounds=2, scratch=str(tmp_path),
      overrides={"model": TINY, "evaluation": {"batch_size": 8, "max_buckets": 2}})
  for row in runs.values():
    assert len(row["seconds"]) == 2 and row["traces"][0] >= 1 and row["traces"][1] == 0
    assert len(row["accuracy"]) == 2 and row["identical_to_first"]


def test_step_figures_of_several_programs():
  from configs import default  # pylint: disable=import-outside-toplevel
  config = default.get_config()
  config.model.update(**TINY)
  config.training.update(batch_size=4, min_length=1, max_length=3, max_programs=2)
  figures = throughput.step_figures(config, timed_steps=4, batches=6)
  flops = sorted(figures["flops_per_program"].values())
  assert figures["programs"] == len(flops) == 2
  assert flops[0] < figures["flops_per_step"] < flops[1] or figures["flops_per_step"] in flops
  assert figures["steps_per_s"] > 0 and figures["models"] == 1


def test_roofline_arithmetic_on_a_fake_cost_table():
  gpus = {"G": {"FP32": 1e12, "FP16": 4e12, "bandwidth": 1e11}}
  protocol = {"steps": 1000, "models": 10}
  # Length 1: 1 GFLOP, 1 MB (compute-bound at both precisions: 1 ms / 0.25 ms vs 0.01 ms);
  # length 2: 1 GFLOP, 0.2 GB (memory-bound: 2 ms).
  train = {1: (1e9, 1e6), 2: (1e9, 2e8)}
  evals = {3: (2e12, 0.0)}  # 2 s at FP32, 0.5 s at FP16.
  out = roofline.roofline_projection(train, evals, gpus, protocol)["G"]
  assert out["FP32"]["step_ms"] == pytest.approx(1.5)
  assert out["FP16"]["step_ms"] == pytest.approx((0.25 + 2) / 2)
  assert out["FP32"]["eval_s"] == pytest.approx(2.0)
  assert out["FP32"]["hours_per_model"] == pytest.approx((1000 * 1.5e-3 + 2) / 3600)
  assert out["FP32"]["gpu_hours"] == pytest.approx(10 * (1.5 + 2) / 3600)
  assert out["FP32"]["memory_bound_lengths"] == pytest.approx(0.5)
  fitted = roofline.fit_costs({1: (1.0, 2.0), 2: (4.0, 3.0), 4: (16.0, 5.0)}, range(1, 6))
  assert fitted[3][0] == pytest.approx(9.0) and fitted[5][1] == pytest.approx(6.0)
  assert roofline.paper_table2_hours()[("reverse_string", "randomized_relative")] == 2.75


def test_sizes_section_settings_and_its_one_line_errors():
  from experiments.benchmarking import model_sizes  # pylint: disable=import-outside-toplevel
  assert model_sizes.parse_model("2x64x8") == (2, 64, 8)
  for bad, words in (("2x64", "LAYERSxD_MODELxHEADS"), ("0x64x8", "LAYERSxD_MODELxHEADS"),
                     ("3x48x5", "not a multiple of 5 heads")):
    with pytest.raises(ValueError, match=words):
      model_sizes.parse_model(bad)
  chosen = model_sizes.settings(["3x48x4"], "odds_first")
  shapes = [(c.model.num_layers, c.model.d_model, c.model.num_heads, len(c.grid.seeds),
             c.grid.layout, c.training.batch_size, c.training.max_length, c.task)
            for _, c in chosen]
  # One model of the size asked for, then each CPU scale's own grid, at one batch.
  assert shapes == [(3, 48, 4, 1, "vmap", 128, 12, "odds_first"),
                    (5, 64, 8, 3, "vmap", 128, 12, "odds_first"),
                    (2, 64, 8, 3, "loop", 128, 12, "odds_first")]
  assert [name for name, _ in chosen][1:] == ["scale=cpu: 3 seeds of 5 x 64, vmap",
                                               "scale=cpu_lite: 3 seeds of 2 x 64, loop"]
