"""Position samplers: ranges, order, distinctness, uniformity, padding and errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from randomized_pe import samplers as positions


@pytest.mark.parametrize("length,max_position", [(1, 1), (5, 5), (7, 64), (40, 2048)])
def test_randomized_sorted_distinct_in_range_int32(length, max_position):
  for seed in range(5):
    p = positions.randomized(jax.random.PRNGKey(seed), length, max_position)
    assert p.dtype == jnp.int32 and p.shape == (length,)
    p = np.asarray(p)
    assert np.all(np.diff(p) > 0), p  # Sorted and distinct.
    assert p.min() >= 0 and p.max() < max_position


def test_length_equal_to_range_gives_every_position():
  p = positions.randomized(jax.random.PRNGKey(3), 16, 16)
  np.testing.assert_array_equal(p, np.arange(16))


def test_randomized_marginals_uniform():
  # 20,000 draws of 10 positions from [0, 50): each position is chosen with
  # probability 10/50, so it is expected 4,000 times (std about 57).
  keys = jax.random.split(jax.random.PRNGKey(0), 20_000)
  draws = jax.vmap(lambda k: positions.randomized(k, 10, 50))(keys)
  counts = np.bincount(np.asarray(draws).ravel(), minlength=50)
  expected = 20_000 * 10 / 50
  assert np.max(np.abs(counts / expected - 1)) < 0.06, counts
  # The smallest sampled position has the order-statistic mean (L+1)/(n+1) - 1.
  mean_first = np.asarray(draws)[:, 0].mean()
  assert abs(mean_first - (51 / 11 - 1)) < 0.1, mean_first


def test_length_above_max_position_raises_with_both_numbers():
  with pytest.raises(ValueError, match=r"length=10 > max_position=5"):
    positions.randomized(jax.random.PRNGKey(0), 10, 5)
  # At trace time under jit too, not a silent clamp.
  with pytest.raises(ValueError, match=r"length=10 > max_position=5"):
    jax.jit(lambda k: positions.randomized(k, 10, 5))(jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match=r"length=9 > max_position=8"):
    positions.offsets(jax.random.PRNGKey(0), 9, 8)


def test_unsorted_is_the_same_draw_unsorted_and_prefix_stable():
  key = jax.random.PRNGKey(7)
  u = np.asarray(positions.unsorted(key, 30, 100))
  np.testing.assert_array_equal(np.sort(u), positions.randomized(key, 30, 100))
  assert len(set(u.tolist())) == 30
  assert np.any(np.diff(u) < 0)  # Really unsorted.
  np.testing.assert_array_equal(positions.unsorted(key, 12, 100), u[:12])


def test_sorted_offsets_table():
  for seed in range(5):
    t = np.asarray(positions.offsets(jax.random.PRNGKey(seed), 20, 64))
    assert t.dtype == np.int32 and t.shape == (20,)
    assert t[0] == 0 and np.all(np.diff(t) > 0) and t.max() < 64


def test_arange():
  np.testing.assert_array_equal(positions.arange(None, 4), [0, 1, 2, 3])
  assert positions.arange(None, 4).dtype == jnp.int32


@pytest.mark.parametrize("name", ["arange", "randomized", "unsorted", "evenly_spaced", "offsets",
                                  "linspace", "equal_mean_exponential", "equal_mean_beta"])
def test_padded_draw_equals_the_unpadded_draw_for_every_length(name):
  # One program (length traced) for every length up to 12; its first n entries are
  # the unpadded draw for n (bit for bit, floats included).
  sampler = positions.get(name)
  settings = {"beta_max_length": 30} if "beta_max_length" in sampler.settings else {}
  key = jax.random.PRNGKey(11)
  jitted = jax.jit(lambda n: sampler(key, n, 64, padded_length=12, **settings))
  for n in range(1, 13):
    got = np.asarray(jitted(n))
    assert got.shape == (12,)
    np.testing.assert_array_equal(got[:n], sampler(key, n, 64, **settings))
    if name != "arange":
      assert np.all(got[n:] == 63)


def test_evenly_spaced():
  even = np.asarray(positions.evenly_spaced(None, 8, 64))
  np.testing.assert_array_equal(even, [0, 8, 16, 24, 32, 40, 48, 56])
  # Su's example: 512 positions spread over L = 2048.
  np.testing.assert_array_equal(positions.evenly_spaced(None, 512, 2048), np.arange(0, 2048, 4))


def test_float_samplers_are_declared_as_such():
  assert [n for n in positions.names() if positions.get(n).floats] == [
      "linspace", "equal_mean_exponential", "equal_mean_beta"]
  assert positions.get("equal_mean_beta").settings == {"beta_max_length": 0,
                                                       "beta_concentration": 1.0}


def test_registry_lists_valid_choices_and_refuses_twins():
  assert positions.names()[:5] == ("arange", "randomized", "unsorted", "evenly_spaced", "offsets")
  with pytest.raises(ValueError, match="unknown position sampler 'sorted'; valid choices: "
                                       "arange, randomized, unsorted, evenly_spaced, offsets"):
    positions.get("sorted")
  with pytest.raises(ValueError, match="already registered"):
    positions.register(positions.Sampler("arange", positions.arange, random=False))
  assert [s.random for s in map(positions.get, ["arange", "randomized", "unsorted",
                                                "evenly_spaced", "offsets"])] == [
                                                    False, True, True, False, True]
