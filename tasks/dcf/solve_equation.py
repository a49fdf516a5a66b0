"""solve_equation: find the digit hidden behind x in a modular equation."""
import numpy as np

from tasks import expressions
from tasks.base import Task

# Release token ids: digits 0..4, then + - ( ) x = as 5..10.
X, EQUALS = 9, 10
_REMAP = np.array([0, 1, 2, 3, 4, 5, 6, -1, 7, 8])  # Grammar codes -> task ids.


class SolveEquation(Task):
  """An expression of length L-2 (+, - and brackets) with one digit replaced by x, then = value.

  The replaced digit is the first digit at or after a uniformly drawn index,
  wrapping around; the output is that digit. Lengths below 3: all-zero input
  and output 0, as in the release. Example: ( x - 2 ) = 4 -> 1.
  """
  name, level, input_size, output_size, chance_accuracy = "solve_equation", "dcf", 11, 5, 20.0

  def _generate(self, rng, batch_size, length):
    if length < 3:
      return np.zeros((batch_size, length), np.int64), np.zeros((batch_size, 1), np.int64)
    size = length - 2
    tokens, values = expressions.random_expressions(rng, batch_size, size, with_mult=False)
    start = rng.integers(0, size, batch_size)
    position = np.arange(size)[None, :]
    is_digit = tokens < expressions.MODULUS
    after = np.where(is_digit & (position >= start[:, None]), position, size).min(axis=1)
    first = np.where(is_digit, position, size).min(axis=1)
    hidden = np.where(after < size, after, first)
    rows = np.arange(batch_size)
    solution = tokens[rows, hidden]
    equation = _REMAP[tokens]
    equation[rows, hidden] = X
    inputs = np.concatenate(
        [equation, np.full((batch_size, 1), EQUALS), values[:, None]], axis=1)
    return inputs, solution[:, None]
