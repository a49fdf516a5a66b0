"""stack_manipulation: apply POP / PUSH 0 / PUSH 1 to a stack, output it top first."""
import numpy as np

from tasks.base import Task

POP, PUSH_0, PUSH_1, TERMINATION = 2, 3, 4, 2


class StackManipulation(Task):
  """A stack (bits, bottom to top) followed by actions; output the final stack.

  The stack length is uniform in [1, L-1]; the actions POP (2), PUSH 0 (3),
  PUSH 1 (4) fill the rest; POP on an empty stack is ignored. The output is the
  final stack top to bottom, the termination token 2, then zeros up to L+1.
  Length 1: a single bit, output that bit.
  Example: 0 1 1 0 PUSH1 POP POP -> 1 1 0 2 0 0 0 0.
  """
  name, level, input_size, output_size, chance_accuracy = "stack_manipulation", "dcf", 5, 3, 50.0
  termination_token = TERMINATION

  def output_length(self, length):
    return length + 1

  def _generate(self, rng, batch_size, length):
    if length == 1:
      stack_size = np.ones(batch_size, np.int64)
    else:
      stack_size = rng.integers(1, length, batch_size)
    position = np.arange(length)[None, :]
    tokens = np.where(position < stack_size[:, None],
                      rng.integers(0, 2, (batch_size, length)),
                      rng.integers(POP, PUSH_1 + 1, (batch_size, length)))
    # Simulate all stacks at once, one token per step. Stack bits and pushes
    # write at the pointer; cells above the pointer are never read.
    stack = np.zeros((batch_size, length + 1), np.int64)
    pointer = np.zeros(batch_size, np.int64)
    rows = np.arange(batch_size)
    values = np.where(tokens >= PUSH_0, tokens - PUSH_0, tokens)
    pops = tokens == POP
    for t in range(length):
      stack[rows, pointer] = values[:, t]
      pointer = np.where(pops[:, t], np.maximum(pointer - 1, 0), pointer + 1)
    source = pointer[:, None] - 1 - np.arange(length + 1)[None, :]
    output = np.where(source >= 0, stack[rows[:, None], np.maximum(source, 0)], 0)
    output[rows, pointer] = TERMINATION
    return tokens, output
