"""binary_multiplication: little-endian product of two binary numbers."""
import numpy as np

from tasks import binary
from tasks.base import Task
from tasks.cs.binary_addition import TERMINATION, short_operand, split_operands, terminated


class BinaryMultiplication(Task):
  """first 2 second (little-endian) -> their product, little-endian, 2, zeros up to L.

  Lengths 1 and 2 follow the release: the output is L-1 zeros then 2.
  Example: 0 0 1 2 0 1 1 0 1 (4 * 22) -> 0 0 0 1 1 0 1 2 0 (88).
  """
  name, level, input_size, output_size, chance_accuracy = (
      "binary_multiplication", "cs", 3, 3, 50.0)
  termination_token = TERMINATION

  def output_length(self, length):
    return length

  def _generate(self, rng, batch_size, length):
    if length <= 2:
      output = np.zeros((batch_size, length), np.int64)
      output[:, -1] = TERMINATION
      return short_operand(rng, batch_size, length), output
    inputs, first, second = split_operands(rng, batch_size, length)
    # Operands have at most L-2 bits together... their product fits in L-1 bits.
    product = binary.multiply_bits(first[:, :length - 1], second[:, :length - 1])
    return inputs, terminated(product, length)
