"""The order-blind bound of Table 3's report (experiments/analysis/order_blind.py): the best
accuracy of a model that sees its input as a multiset and cannot tell its output
positions apart, against exact counts, and the property it rests on."""
from math import comb

import numpy as np
import pytest

import tasks
from experiments.analysis import order_blind


def _majority_share(n: int) -> float:
  """Exact E[max(k, n - k)] / n in % for n uniform random bits."""
  return 100 * sum(comb(n, k) * max(k, n - k) for k in range(n + 1)) / (n * 2**n)


@pytest.mark.parametrize("name", ["reverse_string", "duplicate_string", "odds_first"])
def test_binary_permutations_are_bounded_by_the_majority_bit(name):
  lengths = [1, 2, 3, 4, 7, 20]
  got = order_blind.order_blind_accuracy(name, lengths)
  # 4,096 sequences a length: the estimate's standard error is below 0.2 points.
  # Each output is its input rearranged (duplicate_string's twice over): the same shares.
  for n in lengths:
    assert got[n] == pytest.approx(_majority_share(n), abs=1.0), (n, got[n])
  assert got[1] == 100.0 and got[2] == pytest.approx(75.0, abs=1.0)


def test_bucket_sort_two_tokens_of_five():
  # Equal with probability 1/5 (share 1), else share 1/2: 60%.
  assert order_blind.order_blind_accuracy("bucket_sort", [2])[2] == pytest.approx(60.0, abs=1.0)


@pytest.mark.parametrize("name", ["cycle_navigation", "missing_duplicate_string"])
def test_one_token_decided_by_the_counts_is_within_reach(name):
  assert order_blind.order_blind_accuracy(name, [2, 5, 12]) == {2: 100.0, 5: 100.0, 12: 100.0}


def test_a_task_where_order_decides_has_no_bound():
  assert order_blind.order_blind_accuracy("stack_manipulation", [4]) is None


def _multiset_conflicts(name: str, length: int, samples: int = 3000) -> int:
  """Inputs with the same multiset of tokens but outputs with different multisets."""
  batch = tasks.get(name).sample_batch(7, samples, length)
  outputs = {}
  conflicts = 0
  for inp, out, mask in zip(batch["input"], batch["output"], batch["mask"]):
    key, value = tuple(np.sort(inp)), tuple(np.sort(out[mask]))
    conflicts += outputs.setdefault(key, value) != value
  return conflicts


@pytest.mark.parametrize("name", order_blind.ORDER_FREE_TASKS)
def test_order_free_tasks_outputs_are_a_function_of_the_input_multiset(name):
  assert sum(_multiset_conflicts(name, n) for n in (2, 3, 4, 5, 6)) == 0


def test_the_multiset_check_finds_a_task_where_order_matters():
  assert sum(_multiset_conflicts("stack_manipulation", n) for n in (3, 4, 5, 6)) > 0
