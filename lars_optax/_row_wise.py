"""Which fields of a state hold row-wise buffers: a protocol the state types declare.

A lazy (row-sparse) step gathers the rows of every state buffer shaped like
the params, runs the inner transformation on them and scatters them back
(:mod:`lars_optax.sparse`). A state type of this library names those fields
where it is defined, with the :func:`row_wise` decorator, so that
:mod:`lars_optax.sparse` reads them here without importing the modules that
define the states (modules import downward only, with no circles). optax's
states are listed here; the buffers of other states are found by their structure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import optax

_T = TypeVar("_T", bound=type)

_FIELDS: dict[type, tuple[str, ...]] = {}


def row_wise(*fields: str) -> Callable[[_T], _T]:
  """Class decorator: the fields of a NamedTuple state that hold params-shaped buffers.

  Each named field holds, per parameter, an array of the parameter's shape
  (or an empty :class:`optax.MaskedNode`); a lazy step updates only the rows
  the gradient touches. Other fields (a ``count``, an inner state) are walked
  as usual.

  Raises:
    TypeError: when a name is not a field of the decorated class.
  """

  def declare(cls: _T) -> _T:
    names = getattr(cls, "_fields", ())
    unknown = [f for f in fields if f not in names]
    if unknown:
      raise TypeError(f"row_wise: {cls.__name__} has no field {unknown[0]!r} "
                      f"(its fields: {', '.join(names) or 'none'}).")
    _FIELDS[cls] = tuple(fields)
    return cls

  return declare


# optax's states, declared here since optax cannot declare them.
_OPTAX_FIELDS: dict[type, tuple[str, ...]] = {
    optax.ScaleByRssState: ("sum_of_squares",),
    optax.ScaleByAdamState: ("mu", "nu"),
    optax.TraceState: ("trace",),
    optax.EmaState: ("ema",),
    optax.ScaleByRmsState: ("nu",),
    optax.ScaleByRStdDevState: ("mu", "nu"),
    optax.ScaleByBeliefState: ("mu", "nu"),
}


def row_wise_fields() -> dict[type, tuple[str, ...]]:
  """The state types with row-wise fields, each with those fields: optax's, and this
  library's (declared with :func:`row_wise`)."""
  return {**_OPTAX_FIELDS, **_FIELDS}
