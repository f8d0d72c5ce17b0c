"""The error every config check raises."""


class ConfigError(ValueError):
  """A field holds a value it does not allow, or fields are inconsistent."""
