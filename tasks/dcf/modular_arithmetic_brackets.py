"""modular_arithmetic_brackets: value mod 5 of a random bracketed expression."""
from tasks import expressions
from tasks.base import Task


class ModularArithmeticBrackets(Task):
  """An expression of exactly L tokens from the release's grammar; output its value mod 5.

  Tokens: digits 0..4, then + - * ( ) as 5..9 (vocabulary 11 as in the release).
  Example: ( 3 * ( - 2 ) ) -> -6 mod 5 = 4.
  """
  name, level, input_size, output_size, chance_accuracy = (
      "modular_arithmetic_brackets", "dcf", 11, 5, 20.0)

  def _generate(self, rng, batch_size, length):
    tokens, values = expressions.random_expressions(rng, batch_size, length, with_mult=True)
    return tokens, values[:, None]
