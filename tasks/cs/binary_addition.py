"""binary_addition: little-endian sum of two binary numbers."""
import numpy as np

from tasks import binary
from tasks.base import Task

SEPARATOR = TERMINATION = 2


def split_operands(rng, batch_size, length):
  """The operands of binary_addition and binary_multiplication (length >= 3).

  The first operand's length n is uniform in [1, L-2], the second's is L-1-n;
  each number is uniform in [1, 2^len - 1], little-endian with high zeros.

  Returns:
    inputs [B, L] (first, separator 2, second), first bits [B, L], second bits [B, L].
  """
  first_size = rng.integers(1, length - 1, batch_size)
  second_size = length - 1 - first_size
  first = binary.random_nonzero_bits(rng, first_size, length)
  second = binary.random_nonzero_bits(rng, second_size, length)
  position = np.arange(length)[None, :]
  offset = first_size[:, None] + 1
  shifted = np.take_along_axis(second, np.maximum(position - offset, 0), axis=1)
  inputs = np.where(position < first_size[:, None], first,
                    np.where(position == first_size[:, None], SEPARATOR, shifted))
  return inputs, first, second


def short_operand(rng, batch_size, length):
  """Lengths 1 and 2 as in the release: one number uniform in [0, 2^L - 2], no separator."""
  number = rng.integers(0, 2**length - 1, batch_size)
  return (number[:, None] >> np.arange(length)[None, :]) & 1


def terminated(bits, output_length):
  """Little-endian bits without high zeros (0 is written as 0), then 2, then zeros."""
  size = np.maximum(binary.bit_length(bits), 1)
  position = np.arange(output_length)[None, :]
  padded = np.zeros((bits.shape[0], output_length), np.int64)
  width = min(bits.shape[1], output_length)
  padded[:, :width] = bits[:, :width]
  return np.where(position < size[:, None], padded,
                  np.where(position == size[:, None], TERMINATION, 0))


class BinaryAddition(Task):
  """first 2 second (little-endian) -> their sum, little-endian, 2, zeros up to L+1.

  Example: 0 0 1 2 0 1 1 0 1 (4 + 22) -> 0 1 0 1 1 2 0 0 0 0 (26).
  """
  name, level, input_size, output_size, chance_accuracy = "binary_addition", "cs", 3, 3, 50.0
  termination_token = TERMINATION

  def output_length(self, length):
    return length + 1

  def _generate(self, rng, batch_size, length):
    if length <= 2:
      bits = short_operand(rng, batch_size, length)
      return bits, terminated(bits, length + 1)
    inputs, first, second = split_operands(rng, batch_size, length)
    return inputs, terminated(binary.add_bits(first, second), length + 1)
