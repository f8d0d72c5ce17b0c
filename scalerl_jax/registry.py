"""A registry of named choices: the values one config string may take.

Every swappable piece is registered by name in a `Registry` of its kind
(losses, aggregations, advantage normalisations and schedules in rl/,
attention implementations in models/attention.py, verifiers in
rewards/registry.py, monitors in metrics/monitors.py, prompt sources in
data/sources.py, cluster targets in jobs/cluster.py), and a config field (or
flag) names one. `names()` is the one list of a field's allowed values: config
validation (config/fields.py) and error messages read it. A registry is
filled where its package is assembled (entries registered in other modules
are imported by the package's `__init__.py`), so it is complete whatever was
imported first. Registering a name twice raises; `get` of an unknown name
raises naming the field and the choices.
"""

from __future__ import annotations

from typing import Callable, Collection, Generic, Optional, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
  """Named entries of one kind; `field` is the config field that picks one.

  `reserved` names are allowed values of the field that no entry may take
  (e.g. `auto`, resolved by the caller); `names()` lists them first. Names
  are listed sorted, or in registration order with `sort=False` (where the
  order is part of the output, as the monitors' alerts are).
  """

  def __init__(
      self, field: str, *, reserved: Collection[str] = (), sort: bool = True
  ):
    self.field = field
    self._reserved = tuple(reserved)
    self._sort = sort
    self._entries: dict[str, T] = {}

  def register(
      self, name: str, entry: Optional[T] = None
  ) -> Callable[[T], T] | T:
    """Adds `entry` as `name`; without `entry`, a decorator that adds it.

    Returns the entry unchanged (or the decorator). ValueError if `name` is
    registered already or reserved.
    """

    def add(entry: T) -> T:
      if name in self._reserved:
        raise ValueError(f"{self.field}: {name!r} is reserved")
      if name in self._entries:
        raise ValueError(f"{self.field}: {name!r} is already registered")
      self._entries[name] = entry
      return entry

    return add if entry is None else add(entry)

  def unregister(self, name: str) -> None:
    """Removes `name` (for tests that register a temporary entry)."""
    del self._entries[name]

  def names(self) -> tuple[str, ...]:
    """The values the field allows: the reserved, then the registered."""
    registered = tuple(self._entries)
    return self._reserved + (
        tuple(sorted(registered)) if self._sort else registered
    )

  def items(self) -> tuple[tuple[str, T], ...]:
    """(name, entry) of every registered entry, in registration order."""
    return tuple(self._entries.items())

  def __contains__(self, name: object) -> bool:
    return name in self._entries

  def get(self, name: str) -> T:
    """The entry registered as `name`; ValueError naming the choices."""
    if name not in self._entries:
      raise ValueError(f"{self.field}: {name!r} is not one of {self.names()}")
    return self._entries[name]
