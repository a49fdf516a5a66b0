"""Every task against an independent brute-force oracle, plus distribution checks.

The oracles are written plainly in Python from the task definitions (the task
docstrings, with the release's semantics): they parse each generated input,
recompute the expected output and mask with Python integers, and never call the
vectorised generators.
"""
import collections
import math

import jax
import numpy as np
import pytest

import tasks

LENGTHS = (1, 2, 3, 4, 5, 6, 7, 40, 257)
BATCHES = 3  # Batches per length; batch size 24 (8 at length 257).

# ---------------------------------------------------------------------------
# Oracles: (input tokens as a list) -> expected output list.


def _parse_expression(tokens, symbols):
  """Value of a bracketed expression (recursive descent, Python ints)."""
  pos = 0

  def expr():
    nonlocal pos
    tok = symbols.get(tokens[pos], tokens[pos])
    if tok == "(":  # ( expr ) or ( expr op expr )
      pos += 1
      value = expr()
      if symbols[tokens[pos]] != ")":
        op = symbols[tokens[pos]]
        pos += 1
        right = expr()
        value = {"+": value + right, "-": value - right, "*": value * right}[op]
      assert symbols[tokens[pos]] == ")", tokens
      pos += 1
      return value
    if tok == "-":
      pos += 1
      return -digit()
    return digit()

  def digit():
    nonlocal pos
    assert 0 <= tokens[pos] <= 4, tokens
    pos += 1
    return tokens[pos - 1]

  value = expr()
  assert pos == len(tokens), ("trailing tokens", tokens)
  return value


MAB_SYMBOLS = {5: "+", 6: "-", 7: "*", 8: "(", 9: ")"}
EQ_SYMBOLS = {5: "+", 6: "-", 7: "(", 8: ")"}


def _bits_to_int(bits):
  return sum(b << i for i, b in enumerate(bits))


def _int_to_bits(n):
  return [int(c) for c in bin(n)[2:][::-1]]


def _terminated(bits, length):
  return bits + [2] + [0] * (length - len(bits) - 1)


def oracle(name, x, length):
  if name == "even_pairs":
    return [sum(a != b for a, b in zip(x, x[1:])) % 2]
  if name == "modular_arithmetic":
    assert len(x) == (length if length % 2 else length - 1)
    assert all(0 <= d <= 4 for d in x[0::2]) and all(o in (5, 6, 7) for o in x[1::2])
    text = "".join(str(t) if i % 2 == 0 else {5: "+", 6: "-", 7: "*"}[t] for i, t in enumerate(x))
    return [eval(text) % 5]  # Python applies the standard precedence.
  if name == "parity_check":
    return [sum(x) % 2]
  if name == "cycle_navigation":
    return [sum(a - 1 for a in x) % 5]
  if name == "stack_manipulation":
    if length == 1:
      return [x[0], 2]
    split = next(i for i, t in enumerate(x) if t >= 2)
    assert 1 <= split <= length - 1 and all(t >= 2 for t in x[split:])
    stack = list(x[:split])
    for action in x[split:]:
      if action == 2:
        if stack:
          stack.pop()
      else:
        stack.append(action - 3)
    return _terminated(stack[::-1], length + 1)
  if name == "reverse_string":
    return x[::-1]
  if name == "modular_arithmetic_brackets":
    return [_parse_expression(x, MAB_SYMBOLS) % 5]
  if name == "solve_equation":
    if length < 3:
      assert x == [0] * length
      return [0]
    assert x[-2] == 10 and x.count(9) == 1
    solutions = []
    for d in range(5):
      expr = [d if t == 9 else t for t in x[:-2]]
      if _parse_expression(expr, EQ_SYMBOLS) % 5 == x[-1]:
        solutions.append(d)
    assert len(solutions) == 1, x  # Without '*', x has coefficient +-1: unique.
    return solutions
  if name == "duplicate_string":
    return x + x
  if name == "missing_duplicate_string":
    if length == 1:
      assert x == [1]
      return [1]
    half = length // 2
    assert x[2 * half:] == [3] * (length % 2) and x[:2 * half].count(2) == 1
    i = x.index(2)
    return [x[i + half] if i < half else x[i - half]]
  if name == "odds_first":
    return x[1::2] + x[0::2]
  if name in ("binary_addition", "binary_multiplication"):
    add = name == "binary_addition"
    out_len = length + 1 if add else length
    if length <= 2:
      assert 0 <= _bits_to_int(x) <= 2**length - 2
      return _terminated(_int_to_bits(_bits_to_int(x)), out_len) if add else [0] * (length - 1) + [2]
    assert x.count(2) == 1
    i = x.index(2)
    a, b = _bits_to_int(x[:i]), _bits_to_int(x[i + 1:])
    assert a >= 1 and b >= 1 and 1 <= i <= length - 2
    return _terminated(_int_to_bits(a + b if add else a * b), out_len)
  if name == "compute_sqrt":
    n = int("".join(map(str, x)), 2)
    assert 1 <= n <= 2**length - 1
    out_len = math.ceil(length / 2)
    return [int(c) for c in bin(math.isqrt(n))[2:].zfill(out_len)]
  if name == "bucket_sort":
    return sorted(x)
  raise AssertionError(name)


def _oracle_mask(name, output):
  if name in ("binary_addition", "binary_multiplication", "stack_manipulation"):
    stop = output.index(2)
    return [i <= stop for i in range(len(output))]
  return [True] * len(output)


@pytest.mark.parametrize("name", tasks.NAMES)
def test_task_matches_brute_force_oracle(name):
  task = tasks.get(name)
  for length in LENGTHS:
    batch_size = 8 if length > 100 else 24
    for i in range(BATCHES):
      batch = task.sample_batch(jax.random.PRNGKey(1000 * length + i), batch_size, length)
      x, y, m = batch["input"], batch["output"], batch["mask"]
      assert x.dtype == np.int32 and y.dtype == np.int32 and m.dtype == bool
      assert x.shape == (batch_size, task.input_length(length))
      assert y.shape == (batch_size, task.output_length(length))
      assert m.shape == y.shape
      assert x.min() >= 0 and x.max() < task.input_size
      assert y.min() >= 0 and y.max() < task.output_size
      for row in range(batch_size):
        want = oracle(name, x[row].tolist(), length)
        assert y[row].tolist() == want, (name, length, x[row].tolist())
        assert m[row].tolist() == _oracle_mask(name, want)


# ---------------------------------------------------------------------------
# Distributions.


def _many(name, batch_size, length, seeds=1):
  task = tasks.get(name)
  return [task.sample_batch(jax.random.PRNGKey(s), batch_size, length) for s in range(seeds)]


def _assert_uniform(values, low, high, tol):
  """Every value in [low, high] occurs with relative frequency 1/(high-low+1) +- tol."""
  counts = collections.Counter(values)
  assert set(counts) <= set(range(low, high + 1)), sorted(counts)
  n = len(values)
  for v in range(low, high + 1):
    assert abs(counts[v] / n - 1 / (high - low + 1)) < tol, (v, counts[v], n)


@pytest.mark.parametrize("name", ["binary_addition", "binary_multiplication"])
def test_operand_length_split_is_uniform(name):
  (batch,) = _many(name, 20_000, 12)
  first_len = np.argmax(batch["input"] == 2, axis=1)
  _assert_uniform(first_len.tolist(), 1, 10, tol=0.01)  # 10 values, 1/10 each.


def test_stack_length_is_uniform():
  (batch,) = _many("stack_manipulation", 20_000, 11)
  stack_len = np.argmax(batch["input"] >= 2, axis=1)
  _assert_uniform(stack_len.tolist(), 1, 10, tol=0.01)


def test_missing_index_is_uniform_over_both_halves():
  (batch,) = _many("missing_duplicate_string", 20_000, 11)
  _assert_uniform(np.argmax(batch["input"] == 2, axis=1).tolist(), 0, 9, tol=0.01)


def _root_left_length(tokens):
  """Length of the left operand of the root '(' left op right ')'."""
  if tokens[1] in range(5):
    return 1
  if tokens[1] == 6:  # -d
    return 2
  depth = 0
  for i in range(1, len(tokens)):
    depth += {8: 1, 9: -1}.get(tokens[i], 0)
    if depth == 0:
      return i
  raise AssertionError(tokens)


def test_bracket_grammar_left_length_is_uniform():
  (batch,) = _many("modular_arithmetic_brackets", 20_000, 14)
  _assert_uniform([_root_left_length(t) for t in batch["input"].tolist()], 1, 10, tol=0.01)


def _reference_expression_values(rng, n, length, mult):
  """Values mod 5 from a plain recursive sampler of the grammar (the release's recursion)."""
  def gen(size):
    if size <= 4:
      d = rng.randrange(5)
      return -d if size in (2, 4) else d
    left = rng.randint(1, size - 4)
    a, b = gen(left), gen(size - 3 - left)
    op = rng.randrange(3 if mult else 2)
    return (a + b, a - b, a * b)[op]
  return [gen(length) % 5 for _ in range(n)]


def _class_frequencies(values, classes=5):
  counts = np.bincount(np.asarray(values), minlength=classes)
  return counts / counts.sum()


def test_mod5_output_classes_match_reference_frequencies():
  import random
  rng = random.Random(0)
  n = 20_000
  # Bracketed arithmetic: compare with a plain recursive sampler of the grammar.
  (batch,) = _many("modular_arithmetic_brackets", n, 15)
  ref = _class_frequencies(_reference_expression_values(rng, n, 15, mult=True))
  got = _class_frequencies(batch["output"][:, 0])
  assert ref[0] > 0.25  # Products make 0 more frequent: the check is not vacuous.
  np.testing.assert_allclose(got, ref, atol=0.015)
  # Simple modular arithmetic: plain sampler of digits and operators.
  def simple():
    text = str(rng.randrange(5))
    for _ in range(7):
      text += rng.choice("+*-") + str(rng.randrange(5))
    return eval(text) % 5
  (batch,) = _many("modular_arithmetic", n, 15)
  np.testing.assert_allclose(_class_frequencies(batch["output"][:, 0]),
                             _class_frequencies([simple() for _ in range(n)]), atol=0.015)
  # Cycle navigation: exact distribution of a sum of uniform {-1, 0, 1} steps mod 5.
  exact = np.zeros(5)
  exact[0] = 1.0
  for _ in range(9):
    exact = sum(np.roll(exact, s) for s in (-1, 0, 1)) / 3
  (batch,) = _many("cycle_navigation", n, 9)
  np.testing.assert_allclose(_class_frequencies(batch["output"][:, 0]), exact, atol=0.012)
  # Solve equation: the hidden digit is uniform over 0..4.
  (batch,) = _many("solve_equation", n, 12)
  np.testing.assert_allclose(_class_frequencies(batch["output"][:, 0]), 0.2, atol=0.012)


def test_hidden_digit_is_first_digit_at_or_after_a_uniform_index():
  # At length 5 the expression has 3 tokens: '(d)' or a digit-free impossibility;
  # with 3 tokens the grammar gives '(d)', so x replaces the only digit.
  (batch,) = _many("solve_equation", 2_000, 5)
  assert np.all(batch["input"][:, :3] == [7, 9, 8])
  # Length 6 expressions have 4 tokens '(-d)': x at index 2 always.
  (batch,) = _many("solve_equation", 2_000, 6)
  assert np.all(batch["input"][:, 2] == 9)
  # Length 7 -> 5 tokens '(d op d)': index uniform in [0, 5) -> first digit at
  # or after it: index 0,1 -> digit 1; 2,3 -> digit 3; 4 -> wraps to digit 1.
  (batch,) = _many("solve_equation", 20_000, 7)
  at_first = np.mean(batch["input"][:, 1] == 9)
  assert abs(at_first - 0.6) < 0.015, at_first


def test_compute_sqrt_inputs_uniform_over_nonzero_numbers():
  (batch,) = _many("compute_sqrt", 30_000, 3)
  values = (batch["input"] * [4, 2, 1]).sum(axis=1)
  _assert_uniform(values.tolist(), 1, 7, tol=0.01)


# ---------------------------------------------------------------------------
# Determinism, errors, registry.


@pytest.mark.parametrize("name", tasks.NAMES)
def test_same_key_same_batch_different_key_different_batch(name):
  task = tasks.get(name)
  a = task.sample_batch(jax.random.PRNGKey(5), 16, 20)
  b = task.sample_batch(jax.random.PRNGKey(5), 16, 20)
  c = task.sample_batch(jax.random.PRNGKey(6), 16, 20)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert any(not np.array_equal(a[k], c[k]) for k in ("input", "output"))


def test_typed_keys_work_like_raw_keys():
  task = tasks.get("reverse_string")
  raw = task.sample_batch(jax.random.PRNGKey(3), 4, 6)
  typed = task.sample_batch(jax.random.wrap_key_data(jax.random.PRNGKey(3)), 4, 6)
  np.testing.assert_array_equal(raw["input"], typed["input"])


@pytest.mark.parametrize("batch_size,length", [(0, 5), (4, 0), (-1, 5), (4, 2.5)])
def test_bad_arguments_raise(batch_size, length):
  with pytest.raises(ValueError, match="must be an int >= 1"):
    tasks.get("stack_manipulation").sample_batch(jax.random.PRNGKey(0), batch_size, length)


def test_registry():
  assert len(tasks.NAMES) == 15
  with pytest.raises(ValueError, match="valid names: even_pairs, modular_arithmetic"):
    tasks.get("sorting")
  levels = collections.Counter(tasks.get(n).level for n in tasks.NAMES)
  assert levels == {"regular": 4, "dcf": 4, "cs": 7}
  for name in tasks.NAMES:
    assert tasks.get(name).chance_accuracy == (20.0 if tasks.get(name).output_size == 5 else 50.0)
