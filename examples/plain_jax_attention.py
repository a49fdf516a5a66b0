"""Randomized RoPE inside a plain-JAX attention function (no Haiku).

Run: python examples/plain_jax_attention.py
"""
import jax
import jax.numpy as jnp

import randomized_pe as rpe


def attention(params, x, positions):
  """x: [B, T, M] -> [B, T, M], single head, RoPE at the given positions."""
  q = (x @ params["wq"])[:, :, None, :]  # [B, T, 1, D]
  k = (x @ params["wk"])[:, :, None, :]
  q = rpe.encodings.apply_rope(q, positions)
  k = rpe.encodings.apply_rope(k, positions)
  logits = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(q.shape[-1])
  return jnp.einsum("bhts,bsd->btd", jax.nn.softmax(logits), x @ params["wv"])


key = jax.random.PRNGKey(0)
k_params, k_x, k_pos = jax.random.split(key, 3)
params = {n: jax.random.normal(k, (16, 16)) * 0.1
          for n, k in zip(["wq", "wk", "wv"], jax.random.split(k_params, 3))}
x = jax.random.normal(k_x, (4, 10, 16))
# Training: one sorted subset of 10 positions from [0, 2048) per batch.
positions = rpe.samplers.randomized(k_pos, length=10, max_position=2048)
print("positions:", positions)
print("output:", jax.jit(attention)(params, x, positions).shape)
