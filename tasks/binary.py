"""Vectorised arbitrary-precision binary arithmetic on bit arrays.

Numbers are little-endian bit arrays [B, W] (uint8 or int), one number per row,
so a batch of 500 numbers of 500 bits is handled by a few array operations
instead of Python integers.
"""

from __future__ import annotations

import numpy as np


def random_nonzero_bits(rng: np.random.Generator, num_bits: np.ndarray, width: int) -> np.ndarray:
  """Uniform numbers in [1, 2^num_bits - 1] per row, as little-endian bits [B, width]."""
  num_bits = np.asarray(num_bits)
  valid = np.arange(width)[None, :] < num_bits[:, None]
  bits = rng.integers(0, 2, (num_bits.size, width), dtype=np.uint8) & valid
  redo = ~bits.any(axis=1)
  while redo.any():  # Rejection of zero keeps the rest uniform.
    bits[redo] = rng.integers(0, 2, (int(redo.sum()), width), dtype=np.uint8) & valid[redo]
    redo = ~bits.any(axis=1)
  return bits


def bit_length(bits: np.ndarray) -> np.ndarray:
  """Position of the highest set bit plus one, per row (0 for zero)."""
  width = bits.shape[1]
  reversed_any = bits[:, ::-1].astype(bool)
  return np.where(reversed_any.any(axis=1), width - np.argmax(reversed_any, axis=1), 0)


def add_bits(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """x + y for little-endian bit arrays [B, W] -> [B, W + 1], by carry look-ahead.

  A carry leaves position i iff, scanning down from i, a position generating a
  carry (both bits 1) comes before one killing it (both bits 0).
  """
  x = x.astype(bool)
  y = y.astype(bool)
  index = np.arange(x.shape[1])
  last_generate = np.maximum.accumulate(np.where(x & y, index, -1), axis=1)
  last_kill = np.maximum.accumulate(np.where(~(x | y), index, -1), axis=1)
  carry_out = last_generate > last_kill  # [B, W]
  carry_in = np.concatenate([np.zeros_like(carry_out[:, :1]), carry_out[:, :-1]], axis=1)
  total = (x ^ y) ^ carry_in
  return np.concatenate([total, carry_out[:, -1:]], axis=1).astype(np.uint8)


def multiply_bits(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """x * y for little-endian bit arrays [B, Wx], [B, Wy] -> [B, Wx + Wy].

  Bits are packed into bytes; one FFT convolution of the byte rows gives the
  column sums of the schoolbook product exactly (they stay far below 2^53),
  and one pass over the columns propagates the carries.
  """
  width = x.shape[1] + y.shape[1]
  x_bytes = np.packbits(x.astype(np.uint8), axis=1, bitorder="little").astype(np.float64)
  y_bytes = np.packbits(y.astype(np.uint8), axis=1, bitorder="little").astype(np.float64)
  num_columns = x_bytes.shape[1] + y_bytes.shape[1]
  n_fft = 1 << int(np.ceil(np.log2(max(num_columns, 2))))
  columns = np.fft.irfft(np.fft.rfft(x_bytes, n_fft, axis=1) * np.fft.rfft(y_bytes, n_fft, axis=1),
                         n_fft, axis=1)[:, :num_columns]
  columns = np.rint(columns).astype(np.int64)
  product = np.empty_like(columns)
  carry = np.zeros(columns.shape[0], np.int64)
  for j in range(num_columns):
    value = columns[:, j] + carry
    product[:, j] = value & 0xFF
    carry = value >> 8
  product = product.astype(np.uint8)
  return np.unpackbits(product, axis=1, bitorder="little")[:, :width]


_LIMB = 32
_MASK = (1 << _LIMB) - 1


def _shift_left(limbs: np.ndarray, k: int) -> np.ndarray:
  out = (limbs << k) & _MASK
  out[:, 1:] |= limbs[:, :-1] >> (_LIMB - k)
  return out


def _subtract(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """a - b on little-endian 32-bit limbs (int64) -> (difference mod 2^W, borrowed)."""
  diff = a - b
  index = np.arange(a.shape[1])
  last_negative = np.maximum.accumulate(np.where(diff < 0, index, -1), axis=1)
  last_positive = np.maximum.accumulate(np.where(diff > 0, index, -1), axis=1)
  borrow_out = last_negative > last_positive
  borrow_in = np.concatenate([np.zeros_like(borrow_out[:, :1]), borrow_out[:, :-1]], axis=1)
  return (diff - borrow_in) & _MASK, borrow_out[:, -1]


def isqrt_bits(bits_big_endian: np.ndarray, out_bits: int) -> np.ndarray:
  """floor(sqrt(x)) of big-endian bit rows [B, L] -> big-endian bits [B, out_bits].

  Numbers below 2^52 go through float64 with an exact integer correction; longer
  ones through the restoring digit-by-digit method (two input bits per step) on
  32-bit limbs, all rows at once.
  """
  batch, length = bits_big_endian.shape
  if length <= 52:
    weights = np.left_shift(np.int64(1), np.arange(length - 1, -1, -1, dtype=np.int64))
    x = bits_big_endian.astype(np.int64) @ weights
    root = np.floor(np.sqrt(x.astype(np.float64))).astype(np.int64)
    root -= root * root > x
    root += (root + 1) * (root + 1) <= x
    shifts = np.arange(out_bits - 1, -1, -1, dtype=np.int64)
    return ((root[:, None] >> shifts) & 1).astype(np.uint8)
  pairs = (length + 1) // 2
  padded = np.zeros((batch, 2 * pairs), np.int64)
  padded[:, 2 * pairs - length:] = bits_big_endian
  num_limbs = (pairs + 2) // _LIMB + 2
  root = np.zeros((batch, num_limbs), np.int64)
  remainder = np.zeros((batch, num_limbs), np.int64)
  for step in range(pairs):
    remainder = _shift_left(remainder, 2)
    remainder[:, 0] |= 2 * padded[:, 2 * step] + padded[:, 2 * step + 1]
    trial = _shift_left(root, 2)
    trial[:, 0] |= 1
    reduced, borrowed = _subtract(remainder, trial)
    fits = ~borrowed
    remainder = np.where(fits[:, None], reduced, remainder)
    root = _shift_left(root, 1)
    root[:, 0] |= fits
  positions = np.arange(out_bits - 1, -1, -1)
  return ((root[:, positions // _LIMB] >> (positions % _LIMB)) & 1).astype(np.uint8)
