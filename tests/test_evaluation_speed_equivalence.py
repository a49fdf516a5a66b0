"""Evaluation's even sub-batches and larger attention chunks (issue 27, item 6) give the
results of the batching before them (`legacy_batching=True`): the same accuracies, logits
within 1e-5 of an unchunked forward. Equality tests, not timings (those:
`python -m experiments.benchmark --sections=eval`, in
experiments/benchmarking/evaluation_speed.py; docs/benchmark.md)."""
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import randomized_pe as rpe
import tasks
from experiments.training import data
from experiments.training import evaluation
from randomized_pe import attention as attn

LOGIT_TOLERANCE = 1e-5  # Absolute; the order of moving a run between CPUs.
HEADS = 2


class _Sized:
  """A model stub with the paper model's cost hint (8 heads)."""

  def attention_logits_per_sequence(self, length):
    return 8 * length * length


def test_sub_batches_are_even_and_within_the_budget():
  per_row = 8 * 20 * 20
  for most in (1, 2, 3, 7, 16, 419, 474):
    new = evaluation.RangeEvaluator(_Sized(), None, max_logits=most * per_row)
    old = evaluation.RangeEvaluator(_Sized(), None, max_logits=most * per_row,
                                    legacy_batching=True)
    for batch in list(range(1, 60)) + [128, 500, 501]:
      rows, legacy = new.sub_batch_rows(batch, per_row), old.sub_batch_rows(batch, per_row)
      assert legacy == min(batch, most), (batch, most)  # As before.
      count = -(-batch // rows)
      # As many sub-batches, none larger, at most one padding row each.
      assert rows <= legacy and count == -(-batch // legacy), (batch, most)
      assert count * rows - batch < count, (batch, most)


def test_paper_evaluation_at_length_100_runs_two_sub_batches_of_250():
  evaluator = evaluation.RangeEvaluator(_Sized(), tasks.get("reverse_string"))
  legacy = evaluation.RangeEvaluator(_Sized(), tasks.get("reverse_string"),
                                     legacy_batching=True)
  assert evaluator.program_shapes([100], 500, 16) == [(200, 100, 250)]
  assert legacy.program_shapes([100], 500, 16) == [(200, 100, 419)]


def test_forward_only_chunks_are_scoped():
  def rows(batch=500, length=200, **kwargs):
    return attn.default_chunk_rows(batch, 8, length, length, head_size=8, **kwargs)

  assert rows(backend="cpu") == 2  # Training's chunks at the paper model's length 100.
  with attn.forward_only_chunks():
    assert rows(backend="cpu") == 10 and rows(250, backend="cpu") == 10  # >= 2 x D = 16.
    assert rows(500, 40, backend="cpu") == rows(500, 40, backend="cpu", forward_only=False)
    assert attn.default_chunk_rows(500, 8, 200, 200, backend="cpu") == 2  # No head size.
    with attn.forward_only_chunks(False):
      assert rows(backend="cpu") == 2
    assert rows(backend="gpu") == 500
  assert rows(backend="cpu") == 2


def _tiny(pe, task):
  config = rpe.EncoderConfig(vocab_size=task.input_size + 1, pe=pe, num_layers=2,
                             num_heads=HEADS, d_model=16, widening_factor=2, max_position=64,
                             dropout_rate=0.1)
  model = rpe.EncoderModel(config, task.output_size)
  return model, model.init(jax.random.PRNGKey(0), jnp.zeros((1, 3), jnp.int32))


@pytest.fixture
def small_budgets(monkeypatch):
  """Training's budget scaled to the tiny model (3 rows of 2 x 24 x 24 logits), so that both
  paths chunk, and differently: evaluation's chunks have >= 2 x D = 16 rows."""
  monkeypatch.setattr(attn, "CPU_CHUNK_ELEMENTS", 3 * HEADS * 24 * 24)


# Each with its own scorer: a relative table closed over by the scorer (the case item 6
# measured), content-only logits with an additive term, and a separate bias.
ENCODINGS = ["randomized_relative", "sin_cos", "randomized_alibi"]


@pytest.mark.parametrize("pe", ENCODINGS)
def test_new_evaluation_gives_the_legacy_accuracies(pe, small_budgets):
  del small_budgets
  task = tasks.get("reverse_string")
  model, params = _tiny(pe, task)
  lengths, batch = range(7, 13), 37
  per_row = model.attention_logits_per_sequence(24)
  kwargs = dict(max_logits=15 * per_row)  # 37 rows: 3 x 13 now, 3 x 15 before.
  new = evaluation.RangeEvaluator(model, task, **kwargs)
  old = evaluation.RangeEvaluator(model, task, legacy_batching=True, **kwargs)
  assert new.program_shapes(lengths, batch, 2) != old.program_shapes(lengths, batch, 2)
  got = new.evaluate(params, lengths, batch, seed=3, max_buckets=2)
  want = old.evaluate(params, lengths, batch, seed=3, max_buckets=2)
  assert got["accuracy"] == want["accuracy"]
  assert 0.05 < np.mean(want["accuracy"]) < 0.95  # Untrained: the comparison is not trivial.


@pytest.mark.parametrize("pe", ENCODINGS)
def test_evaluation_logits_are_within_tolerance_of_an_unchunked_forward(pe, small_budgets):
  del small_budgets
  task = tasks.get("reverse_string")
  model, params = _tiny(pe, task)
  length, padded, rows = 10, 24, 40
  batch = data.pad_batch(task, data.make_batch(task, jax.random.PRNGKey(5), rows, length),
                         padded, 12, rows)
  positions = model.sample_positions(jax.random.PRNGKey(6), 2 * length, padded_length=padded,
                                     evaluation=True)
  key_mask = jnp.broadcast_to(jnp.arange(padded)[None, :] < 2 * length, (rows, padded))

  def logits(forward_only):
    @jax.jit
    def forward(params, tokens):
      with attn.forward_only_chunks(forward_only):
        return model.apply(params, jax.random.PRNGKey(0), tokens, positions,
                           is_training=False, key_mask=key_mask)
    return np.asarray(forward(params, batch["tokens"]))[:, :2 * length]

  head_size = 16 // HEADS
  assert [attn.default_chunk_rows(rows, HEADS, padded, padded, backend="cpu",
                                  head_size=head_size, forward_only=f)
          for f in (False, True)] == [2, 10]
  training, evaluating = logits(False), logits(True)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(attn, "CPU_CHUNK_ELEMENTS", 10**9)
    whole = logits(False)  # One chunk: the oracle.
  for got in (training, evaluating):
    np.testing.assert_allclose(got, whole, rtol=0, atol=LOGIT_TOLERANCE)
  np.testing.assert_array_equal(np.argmax(evaluating, -1), np.argmax(training, -1))


def test_lengths_evaluated_two_at_a_time_give_the_accuracies_of_one_at_a_time():
  task = tasks.get("reverse_string")
  model, params = _tiny("randomized_relative", task)
  lengths, batch = range(3, 11), 9
  one_at_a_time = evaluation.RangeEvaluator(model, task, workers=1)
  two_at_a_time = evaluation.RangeEvaluator(model, task, workers=2)
  checks = []
  got = two_at_a_time.evaluate(params, lengths, batch, seed=4, max_buckets=3,
                               before_each=lambda: checks.append(threading.current_thread()))
  want = one_at_a_time.evaluate(params, lengths, batch, seed=4, max_buckets=3)
  assert got == want  # Lengths, accuracies (bit for bit) and buckets, in order.
  assert 0.05 < np.mean(want["accuracy"]) < 0.95  # Untrained: the comparison is not trivial.
  assert checks == [threading.main_thread()] * len(lengths)  # The stop check: the caller's.
  assert two_at_a_time.traces == one_at_a_time.traces == 3  # Each bucket's program once.


def test_lengths_run_two_at_a_time_and_a_stop_starts_no_further_length():
  both_running = threading.Barrier(2, timeout=30)  # Broken (an error) if one waits alone.
  started = []

  def one(n):
    started.append(n)
    if n in (1, 2):
      both_running.wait()
    return n * 10

  assert evaluation._map_lengths(one, [1, 2, 3, 4], 2) == {1: 10, 2: 20, 3: 30, 4: 40}
  stops = iter([None, None, None, KeyboardInterrupt])

  def before_each():
    stop = next(stops)
    if stop is not None:
      raise stop

  started.clear()
  with pytest.raises(KeyboardInterrupt):
    evaluation._map_lengths(lambda n: started.append(n), [5, 6, 7, 8, 9], 2, before_each)
  assert sorted(started) == [5, 6, 8]  # The first three of the start order.
  assert evaluation.start_order([5, 6, 7, 8, 9], 2) == [5, 8, 6, 9, 7]
  assert evaluation.start_order(range(41, 101), 2)[:4] == [41, 71, 42, 72]
  assert sorted(evaluation.start_order(range(41, 101), 2)) == list(range(41, 101))
  assert evaluation.start_order([5, 6, 7], 1) == [5, 6, 7]
  with pytest.raises(ZeroDivisionError):  # A length's error reaches the caller.
    evaluation._map_lengths(lambda n: 1 / (n - 2), [1, 2, 3], 2)


def test_two_lengths_at_a_time_only_on_a_cpu_with_two_cores(monkeypatch):
  monkeypatch.setattr(evaluation.os, "cpu_count", lambda: 2)
  assert evaluation.default_workers() == (2 if jax.default_backend() == "cpu" else 1)
  monkeypatch.setattr(evaluation.os, "cpu_count", lambda: 1)
  assert evaluation.default_workers() == 1
  monkeypatch.setattr(evaluation.os, "cpu_count", lambda: 64)
  monkeypatch.setattr(evaluation.jax, "default_backend", lambda: "gpu")
  assert evaluation.default_workers() == 1


def _padded_batch(task, length, padded, rows):
  batch = data.pad_batch(task, data.make_batch(task, jax.random.PRNGKey(5), rows, length),
                         padded, padded // 2, rows)
  return batch["tokens"], jax.random.PRNGKey(6)  # Tokens, the positions' key.


@pytest.mark.parametrize("pe", ENCODINGS)
def test_the_output_rows_alone_give_the_full_forward_rows(pe):
  """Evaluation runs the model's last layer on the output rows only (`num_outputs` from a
  traced `outputs_from`): the logits of those rows of the full pass, within tolerance."""
  task = tasks.get("reverse_string")
  model, params = _tiny(pe, task)
  tokens, pos_key = _padded_batch(task, 8, 24, 6)
  positions = model.sample_positions(pos_key, 17, padded_length=24, evaluation=True)
  key_mask = jnp.broadcast_to(jnp.arange(24)[None, :] < 17, tokens.shape)
  full = np.asarray(model.apply(params, None, tokens, positions, key_mask=key_mask))

  @jax.jit
  def rows(start):
    return model.apply(params, None, tokens, positions, key_mask=key_mask, num_outputs=9,
                       outputs_from=start)

  for start in (0, 8, 15):
    np.testing.assert_allclose(np.asarray(rows(start)), full[:, start:start + 9], rtol=0,
                               atol=LOGIT_TOLERANCE)


@pytest.mark.parametrize("compat", ["paper", "release"])
def test_evaluation_predictions_are_those_of_every_row(compat):
  """`predict_padded` reads output j at row in_len + j (the last row past the end), also
  where those rows end past the padded length, and with dropout at evaluation
  (compat="release", whose masks are those of the full pass: bit for bit)."""
  task = tasks.get("reverse_string")
  config = rpe.EncoderConfig(vocab_size=task.input_size + 1, pe="randomized_relative",
                             num_layers=2, num_heads=HEADS, d_model=16, widening_factor=2,
                             max_position=64, dropout_rate=0.3, compat=compat)
  model = rpe.EncoderModel(config, task.output_size)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 3), jnp.int32))
  tokens, pos_key = _padded_batch(task, 8, 24, 6)
  dropout_key = jax.random.PRNGKey(7)
  for in_len, out_len in ((9, 8), (9, 12), (15, 12), (20, 12)):
    predict = jax.jit(lambda in_len, legacy: evaluation.predict_padded(
        model, params, pos_key, dropout_key, tokens, 17, in_len, out_len,
        legacy_batching=legacy), static_argnums=1)
    got, every_row = np.asarray(predict(in_len, False)), np.asarray(predict(in_len, True))
    assert got.shape == (6, out_len)
    np.testing.assert_array_equal(got, every_row, err_msg=f"{compat} {in_len} {out_len}")
    # The oracle: every row's logits of an unjitted pass, read at in_len + j.
    positions = model.sample_positions(pos_key, 17, padded_length=24, evaluation=True)
    key_mask = jnp.broadcast_to(jnp.arange(24)[None, :] < 17, tokens.shape)
    full = model.apply(params, dropout_key, tokens, positions, key_mask=key_mask)
    want = np.argmax(np.asarray(full)[:, np.minimum(in_len + np.arange(out_len), 23)], -1)
    np.testing.assert_array_equal(got, want)
