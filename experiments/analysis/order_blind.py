"""The best accuracy a model blind to the order of its tokens can reach: the bound that
Table 3's unsorted positions (the sampled positions in random order) leave a model.

With unsorted positions an encoding tells tokens apart but not which comes first, so the
model sees its input as a multiset, and its output positions, which differ only by
positions drawn in random order, cannot be told apart either: it predicts the same
token at every output position of a sequence. On a task whose output tokens form a
multiset that the input's multiset determines (ORDER_FREE_TASKS), the best such
prediction is the output's most frequent token, and the bound is that token's share of
the output, estimated here on the task's own sequences (`order_blind_accuracy`). It is
100% where the output is one token that the counts decide (cycle_navigation: the walk's
end is the sum of its moves; missing_duplicate_string: the missing bit is the one whose
count is odd) and about 50% + O(1/sqrt(n)) for the binary permutations (reverse_string,
duplicate_string, odds_first). Other tasks (stack_manipulation: the order of the pushes
and pops decides the stack) get no bound.
"""
from __future__ import annotations

import numpy as np

import tasks as tasks_lib

# Tasks whose output multiset is a function of the input multiset (tests/test_order_blind.py
# checks it on sampled sequences, and that stack_manipulation's is not).
ORDER_FREE_TASKS = ("reverse_string", "duplicate_string", "odds_first", "bucket_sort",
                    "cycle_navigation", "missing_duplicate_string")
SAMPLES = 4096


def order_blind_accuracy(task_name: str, lengths, samples: int = SAMPLES,
                         seed: int = 0) -> dict[int, float] | None:
  """{length: accuracy in %} of the best order-blind predictor, counted as evaluation
  counts accuracy (correct output tokens over the counted ones, the task's mask), on
  `samples` sequences a length; None for a task outside ORDER_FREE_TASKS."""
  if task_name not in ORDER_FREE_TASKS:
    return None
  task = tasks_lib.get(task_name)
  bound = {}
  for length in lengths:
    batch = task.sample_batch(seed * 100_003 + int(length), samples, int(length))
    output, mask = np.asarray(batch["output"]), np.asarray(batch["mask"], bool)
    counts = np.stack([((output == token) & mask).sum(axis=1)
                       for token in range(task.output_size)], axis=1)  # [samples, symbols]
    bound[int(length)] = float(100 * counts.max(axis=1).sum() / mask.sum())
  return bound
