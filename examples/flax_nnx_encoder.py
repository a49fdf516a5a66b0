"""A Flax NNX encoder block with randomized RoPE, relative (Transformer-XL) or ALiBi.

The encodings come from the pure core of `randomized_pe` (no Haiku); positions are data,
drawn once per batch outside the model (`randomized_pe.families.sample_positions`) and
passed in. The block is the paper's post-layer-norm block: multi-head attention, then a
ReLU feed-forward network, each followed by a residual and a LayerNorm.

Shapes: B batch, T sequence length, M d_model, H heads, D head size (M = H D).

Run: python examples/flax_nnx_encoder.py   (needs flax: pip install flax)
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

import randomized_pe as rpe
from randomized_pe import encodings as enc
from randomized_pe import families

PES = ("rope", "relative", "alibi")


class EncoderBlock(nnx.Module):
  """One post-LN Transformer block whose attention logits come from `pe`."""

  def __init__(self, pe: str, d_model: int, num_heads: int, *, rngs: nnx.Rngs,
               widening_factor: int = 4):
    if pe not in PES:
      raise ValueError(f"unknown pe {pe!r}; valid choices: {', '.join(PES)}")
    self.pe, self.num_heads, self.head_size = pe, num_heads, d_model // num_heads
    self.qkv = nnx.Linear(d_model, 3 * d_model, use_bias=False, rngs=rngs)
    self.out = nnx.Linear(d_model, d_model, use_bias=False, rngs=rngs)
    self.ffn_in = nnx.Linear(d_model, widening_factor * d_model, rngs=rngs)
    self.ffn_out = nnx.Linear(widening_factor * d_model, d_model, rngs=rngs)
    self.norm1 = nnx.LayerNorm(d_model, rngs=rngs)
    self.norm2 = nnx.LayerNorm(d_model, rngs=rngs)
    # The family declares the parameters it needs (shapes and initializers); the
    # framework creates them. The relative family: content and relative biases [H, D]
    # and the kernel [R, H * D] projecting the R = d_model sin/cos features of a distance.
    ctx = families.Context.create(d_model, num_heads)
    specs = families.get(pe).family.params(ctx)
    self.pe_params = nnx.Dict({name: nnx.Param(spec.init(rngs.params(), spec.shape,
                                                          jnp.float32))
                               for name, spec in specs.items()})

  def logits(self, q, k, positions):
    """Attention logits [B, H, T, T] of q, k [B, T, H, D] at positions [T] or [B, T]."""
    if self.pe == "rope":
      q, k = enc.apply_rope(q, positions), enc.apply_rope(k, positions)
      return jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(self.head_size)
    if self.pe == "relative":
      p = {name: param[...] for name, param in self.pe_params.items()}
      return enc.relative_attention_logits(q, k, positions, p["relative_kernel"],
                                           content_bias=p["content_bias"],
                                           relative_bias=p["relative_bias"])
    bias = enc.alibi_bias(positions, positions, enc.alibi_slopes(self.num_heads))
    bias = bias if bias.ndim == 4 else bias[None]  # [B or 1, H, T, T]
    return jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(self.head_size) + bias

  def __call__(self, x, positions):
    """x: [B, T, M], positions: [T] or [B, T] -> [B, T, M]."""
    batch, length, d_model = x.shape
    q, k, v = (y.reshape(batch, length, self.num_heads, self.head_size)
               for y in jnp.split(self.qkv(x), 3, axis=-1))  # [B, T, H, D] each
    weights = jax.nn.softmax(self.logits(q, k, positions), axis=-1)  # [B, H, T, T]
    attended = jnp.einsum("bhts,bshd->bthd", weights, v).reshape(batch, length, d_model)
    h = self.norm1(x + self.out(attended))
    return self.norm2(h + self.ffn_out(jax.nn.relu(self.ffn_in(h))))


def main(batch: int = 4, length: int = 12, d_model: int = 32, num_heads: int = 4,
         max_position: int = 256):
  key = jax.random.PRNGKey(0)
  x = jax.random.normal(key, (batch, length, d_model))
  for pe in PES:
    block = EncoderBlock(pe, d_model, num_heads, rngs=nnx.Rngs(0))
    # Training: one sorted draw of `length` distinct positions from [0, max_position).
    positions = families.sample_positions("randomized_" + pe, jax.random.PRNGKey(1), length,
                                          max_position)
    out = nnx.jit(lambda m, x, p: m(x, p))(block, x, positions)
    # Evaluation on the classic positions 0..T-1 (or keep sampling: both are valid).
    classic = block(x, rpe.samplers.arange(None, length))
    print(f"{pe:8s} positions {positions.tolist()} -> {out.shape}, "
          f"mean |randomized - classic| {float(jnp.abs(out - classic).mean()):.3f}")


if __name__ == "__main__":
  main()
