"""An Equinox encoder block with randomized RoPE, relative (Transformer-XL) or ALiBi.

Equinox modules see one sequence at a time (vmap adds the batch), so the queries are
[T, H, D]: `apply_rope` is told so with heads=True (a 3-D input is ambiguous otherwise).
Positions come from the pure core of `randomized_pe`, once per batch, outside the model.

Shapes: B batch, T sequence length, M d_model, H heads, D head size (M = H D).

Run: python examples/equinox_encoder.py   (needs equinox: pip install equinox)
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp

import randomized_pe as rpe
from randomized_pe import encodings as enc
from randomized_pe import families

PES = ("rope", "relative", "alibi")


class EncoderBlock(eqx.Module):
  """One post-LN Transformer block whose attention logits come from `pe`."""

  pe: str = eqx.field(static=True)
  num_heads: int = eqx.field(static=True)
  head_size: int = eqx.field(static=True)
  qkv: eqx.nn.Linear
  out: eqx.nn.Linear
  ffn_in: eqx.nn.Linear
  ffn_out: eqx.nn.Linear
  norm1: eqx.nn.LayerNorm
  norm2: eqx.nn.LayerNorm
  pe_params: dict

  def __init__(self, pe: str, d_model: int, num_heads: int, *, key, widening_factor: int = 4):
    if pe not in PES:
      raise ValueError(f"unknown pe {pe!r}; valid choices: {', '.join(PES)}")
    self.pe, self.num_heads, self.head_size = pe, num_heads, d_model // num_heads
    keys = jax.random.split(key, 5)
    self.qkv = eqx.nn.Linear(d_model, 3 * d_model, use_bias=False, key=keys[0])
    self.out = eqx.nn.Linear(d_model, d_model, use_bias=False, key=keys[1])
    self.ffn_in = eqx.nn.Linear(d_model, widening_factor * d_model, key=keys[2])
    self.ffn_out = eqx.nn.Linear(widening_factor * d_model, d_model, key=keys[3])
    self.norm1, self.norm2 = eqx.nn.LayerNorm(d_model), eqx.nn.LayerNorm(d_model)
    # The parameters the family declares (shapes, initializers), created here.
    specs = families.get(pe).family.params(families.Context.create(d_model, num_heads))
    self.pe_params = {name: spec.init(k, spec.shape, jnp.float32)
                      for (name, spec), k in zip(specs.items(),
                                                 jax.random.split(keys[4], max(len(specs), 1)))}

  def logits(self, q, k, positions):
    """Attention logits [H, T, T] of one sequence's q, k [T, H, D] at positions [T]."""
    if self.pe == "rope":
      q, k = enc.apply_rope(q, positions, heads=True), enc.apply_rope(k, positions, heads=True)
      return jnp.einsum("thd,shd->hts", q, k) / math.sqrt(self.head_size)
    if self.pe == "relative":
      p = self.pe_params
      return enc.relative_attention_logits(
          q[None], k[None], positions, p["relative_kernel"], content_bias=p["content_bias"],
          relative_bias=p["relative_bias"])[0]
    bias = enc.alibi_bias(positions, positions, enc.alibi_slopes(self.num_heads))  # [H, T, T]
    return jnp.einsum("thd,shd->hts", q, k) / math.sqrt(self.head_size) + bias

  def __call__(self, x, positions):
    """x: [T, M] (one sequence), positions: [T] -> [T, M]."""
    length, d_model = x.shape
    q, k, v = (y.reshape(length, self.num_heads, self.head_size)
               for y in jnp.split(jax.vmap(self.qkv)(x), 3, axis=-1))  # [T, H, D] each
    weights = jax.nn.softmax(self.logits(q, k, positions), axis=-1)  # [H, T, T]
    attended = jnp.einsum("hts,shd->thd", weights, v).reshape(length, d_model)
    h = jax.vmap(self.norm1)(x + jax.vmap(self.out)(attended))
    ff = jax.vmap(self.ffn_out)(jax.nn.relu(jax.vmap(self.ffn_in)(h)))
    return jax.vmap(self.norm2)(h + ff)


def apply_batch(block: EncoderBlock, x, positions):
  """x: [B, T, M]; positions [T] shared by the batch, or [B, T] -> [B, T, M]."""
  in_axes = 0 if jnp.ndim(positions) == 2 else None
  return jax.vmap(block, in_axes=(0, in_axes))(x, positions)


def main(batch: int = 4, length: int = 12, d_model: int = 32, num_heads: int = 4,
         max_position: int = 256):
  x = jax.random.normal(jax.random.PRNGKey(0), (batch, length, d_model))
  for pe in PES:
    block = EncoderBlock(pe, d_model, num_heads, key=jax.random.PRNGKey(0))
    # Training: one sorted draw of `length` distinct positions from [0, max_position).
    positions = families.sample_positions("randomized_" + pe, jax.random.PRNGKey(1), length,
                                          max_position)
    out = eqx.filter_jit(apply_batch)(block, x, positions)
    classic = apply_batch(block, x, rpe.samplers.arange(None, length))
    print(f"{pe:8s} positions {positions.tolist()} -> {out.shape}, "
          f"mean |randomized - classic| {float(jnp.abs(out - classic).mean()):.3f}")


if __name__ == "__main__":
  main()
