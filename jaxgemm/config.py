"""Kernel configs: frozen, hashable, JSON-serializable, validated on creation.

Every backend declares one config dataclass (tile sizes, stages, warps...)
deriving from :class:`KernelConfig`. Field constraints live next to the field
(`check(...)` metadata), so validation is one loop here rather than a
hand-written `__post_init__` per backend. Constraints that depend on the
problem or the variant (shared memory, dtype support) are the backend's
`check`, which runs before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, ClassVar


def check(predicate: Callable[[Any], bool], constraint: str, **field_kwargs):
  """A dataclass field whose value must satisfy `predicate`.

  `constraint` completes the sentence "must be ...", e.g. "a power of two".
  """
  metadata = {"predicate": predicate, "constraint": constraint}
  return dataclasses.field(metadata=metadata, **field_kwargs)


def is_power_of_two(x: int) -> bool:
  return x > 0 and (x & (x - 1)) == 0


def power_of_two(lo: int, hi: int, **field_kwargs):
  return check(lambda v: is_power_of_two(v) and lo <= v <= hi,
               f"a power of two in [{lo}, {hi}]", **field_kwargs)


def int_range(lo: int, hi: int, **field_kwargs):
  return check(lambda v: lo <= v <= hi, f"an integer in [{lo}, {hi}]",
               **field_kwargs)


_FIELD_TYPES = {"int": int, "bool": bool}


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """Base class of the backends' config dataclasses.

  Subclasses are `@dataclasses.dataclass(frozen=True)` with every field an
  int or bool declared through `check`, `power_of_two` or `int_range`.
  """

  backend: ClassVar[str] = ""

  def __post_init__(self):
    cls = type(self).__name__
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      expected = _FIELD_TYPES.get(f.type, f.type)  # string under `from __future__ import annotations`
      if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{cls}.{f.name} must be an int, got {value!r}")
      if expected is bool and not isinstance(value, bool):
        raise TypeError(f"{cls}.{f.name} must be a bool, got {value!r}")
      predicate = f.metadata.get("predicate")
      if predicate is not None and not predicate(value):
        raise ValueError(
            f"{cls}.{f.name}={value!r} is invalid: it must be "
            f"{f.metadata['constraint']}")

  def to_dict(self) -> dict[str, Any]:
    return {"backend": self.backend, **dataclasses.asdict(self)}

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), sort_keys=True)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "KernelConfig":
    d = dict(d)
    backend = d.pop("backend", cls.backend)
    if backend != cls.backend:
      raise ValueError(f"{cls.__name__} is for backend={cls.backend!r}, "
                       f"got a config for backend={backend!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
      raise ValueError(f"{cls.__name__} has no field(s) {unknown}; "
                       f"valid fields: {sorted(names)}")
    return cls(**d)

  @classmethod
  def from_json(cls, s: str) -> "KernelConfig":
    return cls.from_dict(json.loads(s))


def check_shared_memory(what: str, smem: int, formula: str, capacity: int) -> None:
  """ValueError naming the launch (`what`), its shared memory and how it adds up
  (`formula`) where it needs more than `capacity` bytes: every Triton backend's check."""
  if smem > capacity:
    raise ValueError(f"{what}: config needs {smem} bytes of shared memory ({formula}), more "
                     f"than the {capacity} available; lower num_stages or the tiles")


def within_shared_memory(config, smem_bytes: Callable[[Any], int], capacity: int):
  """`config` with fewer pipeline stages, then narrower N tiles, until `smem_bytes(config)`
  fits in `capacity` (the Triton backends' configs: `num_stages`, `block_n`); as it is
  when nothing is left to shrink (the backend's `check` then reports the overflow)."""
  while smem_bytes(config) > capacity:
    if config.num_stages > 2:
      config = dataclasses.replace(config, num_stages=config.num_stages - 1)
    elif config.block_n > 16:
      config = dataclasses.replace(config, block_n=config.block_n // 2)
    else:
      break
  return config
