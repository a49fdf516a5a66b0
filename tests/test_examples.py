"""examples/: the Flax NNX and Equinox encoder blocks run, and their logits are right.

Each block's attention logits are checked against a float64 numpy reference written from
the formulas (RoPE, Transformer-XL relative, ALiBi), and its outputs must change with the
position draw under the randomized sampler while the classic one is deterministic.
"""

import importlib.util
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from randomized_pe import encodings as enc
from randomized_pe import families

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
B, T, M, H = 2, 5, 16, 2
D = M // H
MAX_POSITION = 64


def _load(name: str):
  pytest.importorskip({"flax_nnx_encoder": "flax", "equinox_encoder": "equinox"}[name])
  spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _block(example: str, pe: str):
  module = _load(example)
  if example == "flax_nnx_encoder":
    block = module.EncoderBlock(pe, M, H, rngs=module.nnx.Rngs(0))
    params = {n: np.asarray(p[...]) for n, p in block.pe_params.items()}
    run = block
    logits = block.logits  # [B, T, H, D] -> [B, H, T, T]
  else:
    block = module.EncoderBlock(pe, M, H, key=jax.random.PRNGKey(0))
    params = {n: np.asarray(p) for n, p in block.pe_params.items()}
    run = lambda x, p: module.apply_batch(block, x, p)
    logits = lambda q, k, p: jnp.stack([block.logits(q[b], k[b], p) for b in range(q.shape[0])])
  return run, logits, params


def _reference_logits(pe, q, k, positions, params):
  """float64 logits [B, H, T, T] from the formulas."""
  q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
  p = np.asarray(positions, np.float64)
  dist = p[None, :] - p[:, None]  # p_j - p_i
  if pe == "rope":
    freqs = enc.DEFAULT_MAX_TIMESCALE ** -(np.arange(0, D, 2) / D)

    def rotate(x):
      angles = p[:, None, None] * freqs  # [T, 1, D/2]
      out = np.empty_like(x)
      out[..., 0::2] = x[..., 0::2] * np.cos(angles) - x[..., 1::2] * np.sin(angles)
      out[..., 1::2] = x[..., 1::2] * np.cos(angles) + x[..., 0::2] * np.sin(angles)
      return out

    return np.einsum("bthd,bshd->bhts", rotate(q), rotate(k)) / math.sqrt(D)
  content = np.einsum("bthd,bshd->bhts", q, k)
  if pe == "alibi":
    slopes = np.asarray(enc.alibi_slopes(H), np.float64)
    return content / math.sqrt(D) + slopes[None, :, None, None] * (-np.abs(dist) + 0.5 * (dist < 0))
  u, v = np.asarray(params["content_bias"], np.float64), np.asarray(params["relative_bias"],
                                                                    np.float64)
  kernel = np.asarray(params["relative_kernel"], np.float64).reshape(M, H, D)
  freqs = enc.DEFAULT_MAX_TIMESCALE ** -(np.arange(0, M, 2) / M)
  sinus = np.concatenate([np.sin(dist[..., None] * freqs), np.cos(dist[..., None] * freqs)], -1)
  rel_keys = np.einsum("tsr,rhd->tshd", sinus, kernel)  # [T, T, H, D]
  content = np.einsum("bthd,bshd->bhts", q + u, k)
  relative = np.einsum("bthd,tshd->bhts", q + v, rel_keys)
  return (content + relative) / math.sqrt(D)


CASES = [(e, pe) for e in ("flax_nnx_encoder", "equinox_encoder") for pe in ("rope", "relative",
                                                                             "alibi")]


@pytest.mark.parametrize("example, pe", CASES)
def test_example_logits_match_the_formulas(example, pe):
  _, logits, params = _block(example, pe)
  q = jax.random.normal(jax.random.PRNGKey(1), (B, T, H, D))
  k = jax.random.normal(jax.random.PRNGKey(2), (B, T, H, D))
  positions = families.sample_positions("randomized_" + pe, jax.random.PRNGKey(3), T,
                                        MAX_POSITION)
  got = np.asarray(logits(q, k, positions))
  assert got.shape == (B, H, T, T)
  np.testing.assert_allclose(got, _reference_logits(pe, q, k, positions, params), atol=2e-5)


@pytest.mark.parametrize("example, pe", CASES)
def test_example_block_outputs_follow_the_position_draw(example, pe):
  run, _, _ = _block(example, pe)
  x = jax.random.normal(jax.random.PRNGKey(4), (B, T, M))
  draw = lambda name, seed: families.sample_positions(name, jax.random.PRNGKey(seed), T,
                                                      MAX_POSITION)
  first, second = run(x, draw("randomized_" + pe, 5)), run(x, draw("randomized_" + pe, 6))
  assert first.shape == (B, T, M) and np.all(np.isfinite(first))
  assert np.abs(np.asarray(first - second)).max() > 1e-3  # Another draw, another output.
  np.testing.assert_array_equal(run(x, draw(pe, 5)), run(x, draw(pe, 6)))  # Classic: 0..T-1.
  # Positions per sequence [B, T]: each row as if it were alone.
  rows = jnp.stack([draw("randomized_" + pe, 5), draw("randomized_" + pe, 6)])
  per_row = np.asarray(run(x, rows))
  np.testing.assert_allclose(per_row[0], first[0], atol=1e-5)
  np.testing.assert_allclose(per_row[1], second[1], atol=1e-5)


@pytest.mark.parametrize("example", ["flax_nnx_encoder", "equinox_encoder"])
def test_example_main_runs(example, capsys):
  _load(example).main(batch=2, length=5, d_model=16, num_heads=2, max_position=64)
  lines = capsys.readouterr().out.splitlines()
  assert [line.split()[0] for line in lines] == ["rope", "relative", "alibi"]
  assert all("-> (2, 5, 16)" in line for line in lines)
