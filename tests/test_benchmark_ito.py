"""The `ito` section of the benchmark (experiments/benchmarking/ito_speed.py) on a tiny
config: XLA's cost analysis of the compiled training step against an analytic count of
the model's matrix products, a grid's FLOPs as the models' sum, and the profile's op
shares."""
import pytest

from experiments.benchmarking import ito_speed
from experiments.benchmarking import throughput


def _tiny(seeds=1):
  from configs import latin_square  # pylint: disable=import-outside-toplevel

  config = latin_square.get_config(f"encoding=learn,sigma=0.2,scale=small,seeds={seeds}")
  # Wide enough that the matrix products dominate, as in the real model (d 160).
  config.model.update(num_layers=1, d_model=64, mlp_size=256)
  config.training.batch_size = 32
  return config


def test_cost_analysis_flops_match_the_analytic_matmul_count(tmp_path):
  one = ito_speed.ito_step_figures(_tiny(), timed_steps=2, profile_steps=2,
                                   scratch=str(tmp_path))
  analytic = ito_speed.ito_matmul_flops(_tiny())
  # 3 x 32 x 16 x (2 (4 d^2 + 2 T d + 2 d m) + embed + read-out), d 64, m 256.
  assert analytic == pytest.approx(3 * 512 * (2 * (4 * 64 ** 2 + 2 * 16 * 64 + 2 * 64 * 256)
                                              + 2 * 6 * 64 + 2 * 64 * 4) - 512 * 2 * 6 * 64)
  # XLA counts the products and the elementwise work (GELU, LayerNorm, softmax, Adam):
  # at width 64 the products are all but 25% of it (at width 160, 10%; docs/ito.md).
  assert analytic <= one["flops_per_step"] <= 1.25 * analytic
  assert one["steps_per_s"] > 0 and one["models"] == 1
  shares = one["profile"]["shares"]
  assert sum(shares.values()) == pytest.approx(1.0)
  # The profile finds the products (a share of time, so not a fixed fraction: a run
  # beside five other busy processes gave them 4.4%, elementwise fusions 91.5%).
  assert shares.get("matmul", 0) > 0, shares
  for layout in ("vmap", "loop"):  # `loop` runs the models in a loop: costed as vmap.
    config = _tiny(seeds=2)
    config.grid.layout = layout
    grid = ito_speed.ito_step_figures(config, timed_steps=2)
    assert grid["models"] == 2
    assert grid["flops_per_model_step"] == pytest.approx(one["flops_per_step"], rel=0.02)


def test_matmul_throughput_is_measured():
  figures = throughput.matmul_throughput(size=256, repeats=3)
  assert figures["gflops_best"] >= figures["gflops_median"] > 0
