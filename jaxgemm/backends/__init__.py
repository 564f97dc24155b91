"""Backends, imported in preference order (registration order is `jaxgemm.backends()`'s)."""

from jaxgemm.backends import xla  # noqa: F401
from jaxgemm.backends import triton  # noqa: F401
from jaxgemm.backends import pallas  # noqa: F401
