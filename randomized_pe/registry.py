"""One registry of positional encodings by name (no Haiku here).

Every encoding is a *family* (how positions enter the model) fed by a *sampler*
(which positions). "randomized_X" is family X fed with `positions.randomized`;
nothing else about the model changes (DESIGN.md section 3).

  name                  family    acts in     paper sampler          release sampler
  none                  none      -           arange                 arange
  sin_cos               sin_cos   embedding   arange                 arange
  learned               learned   embedding   arange                 arange
  relative              relative  attention   arange                 arange (offset table)
  rope                  rope      attention   arange                 arange
  alibi                 alibi     attention   arange                 arange (offset table)
  randomized_sin_cos    sin_cos   embedding   randomized, per batch  randomized, per batch
  randomized_learned    learned   embedding   randomized, per batch  randomized, per batch
  randomized_relative   relative  attention   randomized, per batch  sorted_offsets, per layer
  randomized_rope       rope      attention   randomized, per batch  randomized, per layer
  randomized_alibi      alibi     attention   randomized, per batch  sorted_offsets, per layer

In `compat="release"` the relative and ALiBi families read their positions as
an offset table (|j - i| -> distance, see `positions.sorted_offsets`), and the
randomized attention encodings draw one sample per layer (DESIGN.md section 4,
items 2 and 5); arange(T) is the classic table in both readings.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax

from randomized_pe import positions as positions_lib

COMPAT_MODES = ("paper", "release")

# family -> where it acts.
FAMILIES = {
    "none": "none",
    "sin_cos": "embedding",
    "learned": "embedding",
    "relative": "attention",
    "rope": "attention",
    "alibi": "attention",
}


def _arange_sampler(key, length, max_position):
  del key, max_position
  return positions_lib.arange(length)


@dataclasses.dataclass(frozen=True)
class Encoding:
  """A positional encoding: a family and the samplers that feed it.

  Attributes:
    name: registry name.
    family: one of FAMILIES; decides how positions enter the model.
    randomized: whether positions are sampled from [0, max_position).
    acts: "embedding" (added to token embeddings), "attention" or "none".
    paper_sampler: (key, length, max_position) -> int32[T], called once per batch.
    release_sampler: the same under compat="release".
    release_per_layer: under compat="release", draw one sample per layer.
  """

  name: str
  family: str
  randomized: bool
  acts: str
  paper_sampler: Callable[..., jax.Array]
  release_sampler: Callable[..., jax.Array]
  release_per_layer: bool = False
  # (key, length, padded_length, max_position) twins with a traced length.
  paper_sampler_padded: Callable[..., jax.Array] = positions_lib.arange_padded
  release_sampler_padded: Callable[..., jax.Array] = positions_lib.arange_padded

  def sample_positions(
      self, key: jax.Array, length: int, max_position: int, *,
      compat: str = "paper", num_layers: int = 1,
  ) -> jax.Array:
    """Positions for one batch.

    Returns:
      int32[T]; under compat="release" for randomized attention encodings,
      int32[num_layers, T] (one independent draw per layer).
    """
    check_compat(compat)
    if compat == "paper":
      return self.paper_sampler(key, length, max_position)
    if not self.release_per_layer:
      return self.release_sampler(key, length, max_position)
    keys = jax.random.split(key, num_layers)
    return jax.vmap(lambda k: self.release_sampler(k, length, max_position))(keys)

  def sample_positions_padded(
      self, key: jax.Array, length, padded_length: int, max_position: int, *,
      compat: str = "paper", num_layers: int = 1,
  ) -> jax.Array:
    """`sample_positions` for a traced `length`, padded to a static `padded_length`.

    The first `length` entries equal `sample_positions(key, length, ...)`.
    """
    check_compat(compat)
    if compat == "paper":
      return self.paper_sampler_padded(key, length, padded_length, max_position)
    if not self.release_per_layer:
      return self.release_sampler_padded(key, length, padded_length, max_position)
    keys = jax.random.split(key, num_layers)
    return jax.vmap(
        lambda k: self.release_sampler_padded(k, length, padded_length, max_position))(keys)


def _make_registry() -> dict[str, Encoding]:
  registry = {}
  for family, acts in FAMILIES.items():
    registry[family] = Encoding(
        name=family, family=family, randomized=False, acts=acts,
        paper_sampler=_arange_sampler, release_sampler=_arange_sampler,
    )
    if family == "none":
      continue
    # Release item 5: relative and ALiBi sample sorted distances, not positions.
    offsets = family in ("relative", "alibi")
    registry["randomized_" + family] = Encoding(
        name="randomized_" + family, family=family, randomized=True, acts=acts,
        paper_sampler=positions_lib.randomized,
        release_sampler=positions_lib.sorted_offsets if offsets else positions_lib.randomized,
        paper_sampler_padded=positions_lib.randomized_padded,
        release_sampler_padded=(positions_lib.sorted_offsets_padded if offsets
                                else positions_lib.randomized_padded),
        # Release item 2: attention encodings draw inside every layer.
        release_per_layer=acts == "attention",
    )
  return registry


ENCODINGS: dict[str, Encoding] = _make_registry()
NAMES: tuple[str, ...] = tuple(ENCODINGS)


def get(name: str) -> Encoding:
  """Returns the encoding called `name`; an unknown name raises ValueError listing the valid ones."""
  try:
    return ENCODINGS[name]
  except KeyError:
    raise ValueError(
        f"unknown positional encoding {name!r}; valid names: {', '.join(NAMES)}"
    ) from None


def check_compat(compat: str) -> None:
  if compat not in COMPAT_MODES:
    raise ValueError(f"unknown compat {compat!r}; valid choices: {', '.join(COMPAT_MODES)}")
