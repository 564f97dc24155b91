"""Backends, imported in preference order (registration order is `jaxgemm.backends()`'s)."""

from jaxgemm.backends import xla  # noqa: F401
