"""How the models of a grid run inside one program (`config.grid.layout`).

A grid's state carries a leading models axis [M, ...]; a function written for one model
is lifted over that axis by the layout:

  vmap  every operation of the program takes the models axis as a batch axis: one
        matrix product of M models' shapes where one model has one (the default, and
        what every run before `grid.layout` existed trained with).
  loop  the models run one after another (`jax.lax.map`), each with one model's shapes
        and memory; the program's size does not grow with M.

Both give the same models to within float rounding (about 1e-6 after a step: XLA orders
the sums of a batched product otherwise), so the layout is part of a run's identity; a
`loop` grid's model is bitwise that model trained alone. A grid of one model runs the
model's own program under either layout (`over_members`). On a 2-core CPU the
loop trains a grid 1.1-1.4x faster than `vmap` (within 4-8% of one model's rate): XLA's
CPU kernels run a batched product of M small matrices slower than M products one after
another (docs/benchmark.md, "Grids").
"""
import dataclasses
import functools
from typing import Callable, Sequence

import jax


def _vmap(fn: Callable, in_axes: Sequence) -> Callable:
  return jax.vmap(fn, in_axes=tuple(in_axes))


def _loop(fn: Callable, in_axes: Sequence) -> Callable:
  """fn lifted over the leading axis of the arguments whose in_axes entry is 0, one model
  after another; the others are shared."""
  in_axes = tuple(in_axes)
  if any(axis not in (0, None) for axis in in_axes):
    raise ValueError(f"the loop layout maps axis 0 or nothing, not {in_axes}")

  def looped(*args):
    mapped = tuple(a for a, axis in zip(args, in_axes) if axis == 0)

    def one(xs):
      it = iter(xs)
      return fn(*(next(it) if axis == 0 else a for a, axis in zip(args, in_axes)))

    return jax.lax.map(one, mapped)

  return looped


@dataclasses.dataclass(frozen=True)
class Layout:
  """lift(fn, in_axes) -> fn over the models axis; side_by_side: the models' operations
  run together, so several devices can each take a share of the models (otherwise they
  share each model's batch)."""
  lift: Callable
  side_by_side: bool


# The one place a layout is defined.
LAYOUTS = {"vmap": Layout(_vmap, side_by_side=True), "loop": Layout(_loop, side_by_side=False)}
DEFAULT = "vmap"


def check(layout: str) -> str:
  """`layout` if it is a layout; a one-line ValueError naming the valid ones otherwise."""
  if layout not in LAYOUTS:
    raise ValueError(f"unknown grid.layout {layout!r}; valid choices: {', '.join(LAYOUTS)}")
  return layout


def of(config) -> str:
  """The layout of a run's config; a config stored before `grid.layout` existed trained
  with the default."""
  return check(config.grid.get("layout", DEFAULT))


def _alone(fn: Callable, in_axes: Sequence) -> Callable:
  """fn run on the one model of a models axis of size 1: the model's own program, its
  outputs given the axis back."""

  def one(*args):
    args = [jax.tree_util.tree_map(lambda x: x[0], a) if axis == 0 else a
            for a, axis in zip(args, in_axes)]
    return jax.tree_util.tree_map(lambda y: y[None], fn(*args))

  return one


def _num_models(args, in_axes: Sequence) -> int:
  """The (static) size of the models axis: the leading size of the mapped arguments."""
  return next((x.shape[0] for a, axis in zip(args, in_axes) if axis == 0
               for x in jax.tree_util.tree_leaves(a)), 0)


def over_members(fn: Callable, layout: str, in_axes: Sequence) -> Callable:
  """`fn` (one model's function) lifted over the models axis of the arguments whose
  `in_axes` entry is 0 (None: shared by every model), as `layout` runs a grid.

  A grid of one model has nothing to lay out: under either layout it runs the model's own
  program (`_alone`), the program `loop` runs for each of its models, so a one-model
  `vmap` grid is bitwise the one-model `loop` grid. (Until 28 Nov 2026 a one-model `vmap`
  grid ran every operation batched over a models axis of size 1: the same model to within
  float rounding, with programs that compiled up to a quarter slower at the paper's
  lengths; docs/benchmark.md.)
  """
  in_axes = tuple(in_axes)
  lifted, alone = LAYOUTS[check(layout)].lift(fn, in_axes), _alone(fn, in_axes)
  leading = all(axis in (0, None) for axis in in_axes)

  @functools.wraps(fn)  # Programs keep the model function's name (profiles read it).
  def run(*args):
    return alone(*args) if leading and _num_models(args, in_axes) == 1 else lifted(*args)

  return run
