"""Argument checks shared by the transformations and optimizers.

Hyperparameters are checked when a transformation is built; parameter and
gradient trees when it is first traced. Every error names the argument (or the
leaf) and says what is accepted.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lars_optax import masks


def _is_traced(value: Any) -> bool:
  return isinstance(value, jax.core.Tracer)


def check_scalar(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
  """Checks that ``value`` is a finite real scalar inside the given range."""
  if isinstance(value, (bool, np.bool_, str)) or value is None:
    raise TypeError(f"{name}: expected a real number, got {value!r}.")
  if _is_traced(value):
    return  # A traced hyperparameter (e.g. under jit) can't be checked here.
  try:
    arr = np.asarray(value)
  except Exception as e:  # pragma: no cover - exotic objects
    raise TypeError(f"{name}: expected a real number, got {value!r}.") from e
  if arr.ndim != 0 or not (np.issubdtype(arr.dtype, np.integer)
                           or np.issubdtype(arr.dtype, np.floating)):
    raise TypeError(f"{name}: expected a real scalar, got {value!r}.")
  v = float(arr)
  if not math.isfinite(v):
    raise ValueError(f"{name}: must be finite, got {v}.")
  lo_bad = low is not None and (v <= low if low_open else v < low)
  hi_bad = high is not None and (v >= high if high_open else v > high)
  if lo_bad or hi_bad:
    lo = "" if low is None else ("(" if low_open else "[") + f"{low:g}"
    hi = "" if high is None else f"{high:g}" + (")" if high_open else "]")
    if low is not None and high is not None:
      rng = f"in {lo}, {hi}"
    elif low is not None:
      rng = f"{'>' if low_open else '>='} {low:g}"
    else:
      rng = f"{'<' if high_open else '<='} {high:g}"
    raise ValueError(f"{name}: must be {rng}, got {v:g}.")


def check_learning_rate(name: str, value: Any) -> None:
  """A learning rate is a schedule (callable) or a finite scalar >= 0."""
  if callable(value):
    return
  check_scalar(name, value, low=0.0)


def check_float_params(tree: Any, where: str) -> None:
  """Rejects integer, boolean and complex leaves (they can't be trained)."""
  for name, leaf in masks.named_leaves(tree):
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:
      dtype = np.asarray(leaf).dtype
    if not jnp.issubdtype(dtype, jnp.floating):
      raise TypeError(
          f"{where}: parameter {name!r} has dtype {dtype}; only real floating "
          "point leaves (float16, bfloat16, float32, float64) are supported.")


def check_same_structure(updates: Any, params: Any, where: str) -> None:
  """Raises a ValueError naming the leaves when two trees differ."""
  if params is None:
    raise ValueError(f"{where}: params are required; call "
                     "update(updates, state, params).")
  t_u, t_p = jax.tree.structure(updates), jax.tree.structure(params)
  if t_u == t_p:
    for (name, u), (_, p) in zip(masks.named_leaves(updates),
                                 masks.named_leaves(params)):
      if np.shape(u) != np.shape(p):
        raise ValueError(
            f"{where}: gradient {name!r} has shape {np.shape(u)} but the "
            f"parameter has shape {np.shape(p)}.")
    return
  u_names = {n for n, _ in masks.named_leaves(updates)}
  p_names = {n for n, _ in masks.named_leaves(params)}
  detail = []
  if p_names - u_names:
    detail.append(f"missing from gradients: {sorted(p_names - u_names)[:5]}")
  if u_names - p_names:
    detail.append(f"not in params: {sorted(u_names - p_names)[:5]}")
  raise ValueError(
      f"{where}: gradients and params have different tree structures"
      + (" (" + "; ".join(detail) + ")" if detail else f": {t_u} vs {t_p}")
      + ".")
