"""The one registry mechanism behind samplers, encoding families and models.

A `Registry` maps names to entries. An unknown name raises a one-line ValueError that
lists the valid names; registering a name twice is refused (an experiment or a test
that adds an entry can take it out again with `unregister`).
"""

from __future__ import annotations

from typing import Generic, Iterator, TypeVar

T = TypeVar("T")

_REGISTRIES: list = []  # Every registry made, in order (see `all_registries`).


class Registry(Generic[T]):
  """Entries by name, in registration order.

  Args:
    what: what an entry is, for messages ("position sampler").
    listing: the words before the valid names in the unknown-name message.
  """

  def __init__(self, what: str, listing: str = "valid choices"):
    self._what = what
    self._listing = listing
    self._entries: dict[str, T] = {}
    _REGISTRIES.append(self)

  @property
  def what(self) -> str:
    return self._what

  def register(self, name: str, entry: T) -> T:
    if name in self._entries:
      raise ValueError(f"a {self._what} called {name!r} is already registered")
    self._entries[name] = entry
    return entry

  def unregister(self, name: str) -> T:
    return self._entries.pop(name)

  def names(self) -> tuple[str, ...]:
    return tuple(self._entries)

  def get(self, name: str) -> T:
    try:
      return self._entries[name]
    except KeyError:
      raise ValueError(f"unknown {self._what} {name!r}; {self._listing}: "
                       f"{', '.join(self._entries)}") from None

  def __contains__(self, name: str) -> bool:
    return name in self._entries

  def __iter__(self) -> Iterator[T]:
    return iter(list(self._entries.values()))


def all_registries() -> tuple[Registry, ...]:
  """Every registry made so far (e.g. to check where all registered code comes from)."""
  return tuple(_REGISTRIES)
