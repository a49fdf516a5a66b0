"""Vectorised sampling of the bracketed modular-arithmetic grammar.

The grammar of the original release (its modular_arithmetic_brackets and
solve_equation generators) for an expression of exactly `length` tokens: 1: d;
2: -d; 3: (d); 4: (-d); >= 5: (left op right), with the left length uniform in
[1, length - 4] and the right taking the rest. Digits are uniform in
[0, modulus), operators uniform in {+, -} or {+, -, *}.

All expressions of a batch grow together, one tree level per round: every
pending segment of every sample is expanded at once, so the Python loop runs
over tree depth, not over samples or nodes.
"""

from __future__ import annotations

import numpy as np

MODULUS = 5
# Internal token codes (the modular_arithmetic_brackets ids of the release).
PLUS, MINUS, TIMES, LPAR, RPAR = 5, 6, 7, 8, 9
OPERATORS = (PLUS, MINUS, TIMES)


def random_expressions(rng: np.random.Generator, batch_size: int, length: int,
                       with_mult: bool) -> tuple[np.ndarray, np.ndarray]:
  """Samples expressions of exactly `length` tokens and their values mod 5.

  Returns:
    tokens int32[B, length] (digits 0..4, then PLUS, MINUS, TIMES, LPAR, RPAR),
    values int64[B].
  """
  if length < 1:
    raise ValueError(f"cannot generate expressions of length < 1, got {length}")
  tokens = np.zeros((batch_size, length), np.int32)
  # Pending segments: sample row, first token, number of tokens, tree node id.
  rows = np.arange(batch_size)
  start = np.zeros(batch_size, np.int64)
  size = np.full(batch_size, length, np.int64)
  node = np.arange(batch_size)
  num_nodes = batch_size
  leaves, internals = [], []  # (node, value) and (node, left, right, op) per round.
  while rows.size:
    leaf = size <= 4
    # Leaves: d, -d, (d), (-d).
    lr, ls, ln, lsize = rows[leaf], start[leaf], node[leaf], size[leaf]
    digit = rng.integers(0, MODULUS, lr.size)
    negated = (lsize == 2) | (lsize == 4)
    bracketed = lsize >= 3
    tokens[lr, ls + bracketed + negated] = digit
    tokens[lr[negated], (ls + bracketed)[negated]] = MINUS
    tokens[lr[bracketed], ls[bracketed]] = LPAR
    tokens[lr[bracketed], (ls + lsize - 1)[bracketed]] = RPAR
    leaves.append((ln, np.where(negated, -digit, digit) % MODULUS))
    # Internal nodes: (left op right).
    inner = ~leaf
    ir, is_, isize, inode = rows[inner], start[inner], size[inner], node[inner]
    count = ir.size
    left_size = rng.integers(1, isize - 3) if count else isize  # Uniform in [1, size-4].
    right_size = isize - 3 - left_size
    op = rng.integers(0, 3 if with_mult else 2, count)
    tokens[ir, is_] = LPAR
    tokens[ir, is_ + 1 + left_size] = np.asarray(OPERATORS)[op]
    tokens[ir, is_ + isize - 1] = RPAR
    left = num_nodes + np.arange(count)
    right = num_nodes + count + np.arange(count)
    num_nodes += 2 * count
    internals.append((inode, left, right, op))
    rows = np.concatenate([ir, ir])
    start = np.concatenate([is_ + 1, is_ + 2 + left_size])
    size = np.concatenate([left_size, right_size])
    node = np.concatenate([left, right])
  values = np.zeros(num_nodes, np.int64)
  for ids, value in leaves:
    values[ids] = value
  # Children are created in later rounds, so evaluating rounds backwards is bottom-up.
  for ids, left, right, op in reversed(internals):
    a, b = values[left], values[right]
    values[ids] = np.choose(op, [a + b, a - b, a * b]) % MODULUS
  return tokens, values[:batch_size]
