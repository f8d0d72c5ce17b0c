"""A registry of named choices: the values one config string may take.

Each swappable piece of the RL step (losses, aggregations, advantage
normalisations, schedules) is registered by name with `@REGISTRY.register`,
and the config names it. `names()` are the allowed values that
`config/fields.py` checks; `get` raises naming them. Registering a name
twice raises.
"""

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
  """Named entries of one kind; `field` is the config field that picks one."""

  def __init__(self, field: str):
    self.field = field
    self._entries: dict[str, T] = {}

  def register(self, name: str) -> Callable[[T], T]:
    """Decorator adding an entry as `name`; returns the entry unchanged."""

    def add(entry: T) -> T:
      if name in self._entries:
        raise ValueError(f"{self.field}: {name!r} is already registered")
      self._entries[name] = entry
      return entry

    return add

  def unregister(self, name: str) -> None:
    """Removes `name` (for tests that register a temporary entry)."""
    del self._entries[name]

  def names(self) -> tuple[str, ...]:
    """The registered names, sorted."""
    return tuple(sorted(self._entries))

  def get(self, name: str) -> T:
    """The entry registered as `name`; ValueError naming the choices."""
    if name not in self._entries:
      raise ValueError(f"{self.field}: {name!r} is not one of {self.names()}")
    return self._entries[name]
