"""compute_sqrt: floor of the square root of a binary number."""
import math

from tasks import binary
from tasks.base import Task


class ComputeSqrt(Task):
  """A number uniform in [1, 2^L - 1], big-endian in L bits -> floor(sqrt) in ceil(L/2) bits.

  Example: 1 0 0 1 0 1 (37) -> 1 1 0 (6).
  """
  name, level, input_size, output_size, chance_accuracy = "compute_sqrt", "cs", 2, 2, 50.0

  def output_length(self, length):
    return math.ceil(length / 2)

  def _generate(self, rng, batch_size, length):
    little = binary.random_nonzero_bits(rng, [length] * batch_size, length)
    big = little[:, ::-1]
    return big, binary.isqrt_bits(big, self.output_length(length))
