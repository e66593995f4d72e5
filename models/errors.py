"""Errors raised at the model boundary (loading, configs, inputs).

All derive from ValueError so callers that only know "bad input" can catch one type, and every
message names the offending file, key or value.
"""


class ModelError(ValueError):
  """Base class for model-side input errors."""


class UnknownModelError(ModelError):
  """A model name that is neither a known preset nor an existing path."""


class CheckpointError(ModelError):
  """Missing, partial, corrupt or mismatched weight files."""


class UnsupportedArchitectureError(ModelError):
  """A config.json / GGUF architecture this decoder does not implement."""
