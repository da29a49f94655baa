"""MXNet 2.0's learning-rate schedulers as pure functions of the update count.

``FactorScheduler``, ``MultiFactorScheduler``, ``PolyScheduler`` and
``CosineScheduler`` take MXNet's names, arguments and defaults (``mx.lr_scheduler``)
and return MXNet's rate for every ``num_update``: the update count, 1 at the
first update. MXNet's Factor and MultiFactor schedulers keep state and must be
called once per update, in order; these keep none. Each is a closed form of
``num_update``, so it is traced by ``jit`` and never calls the host:

>>> import jax.numpy as jnp
>>> import lars_optax
>>> sched = lars_optax.mxnet.lr_scheduler.PolyScheduler(max_update=1000, base_lr=0.1, pwr=2,
...                                            warmup_steps=100)
>>> [round(float(sched(n)), 6) for n in (1, 50, 100, 550, 1000, 2000)]
[0.001, 0.05, 0.1, 0.025, 0.0, 0.0]
>>> tx = lars_optax.mxnet.create("lars", learning_rate=0.1, momentum=0.9, lr_scheduler=sched)
>>> tx = lars_optax.lars(learning_rate=sched.as_optax(), momentum=0.9)  # the same rates
>>> float(sched.as_optax()(jnp.int32(99)))  # optax's count 99 is MXNet's update 100
0.10000000149011612

In ``create`` (as in MXNet's optimizer) ``learning_rate`` replaces the
scheduler's ``base_lr`` (:meth:`FactorScheduler.with_base_lr`; the object passed
in is not changed). :meth:`~FactorScheduler.as_optax` (or :func:`to_optax`) gives
the optax schedule of a 0-based step count: optax's count ``c`` is MXNet's
``num_update = c + 1``.

Notation in the docstrings: ``n`` is ``num_update``, ``w`` is ``warmup_steps``.
During the warm-up (``n < w``) every scheduler returns

* ``warmup_mode="linear"``: ``warmup_begin_lr + (warmup_final_lr - warmup_begin_lr) * n / w``;
* ``warmup_mode="constant"``: ``warmup_begin_lr``;

where ``warmup_final_lr`` is the ``base_lr`` given to the constructor (MXNet keeps
it when an optimizer later replaces ``base_lr``). The rate is float32 (float64
when ``jax_enable_x64`` is on); MXNet computes it as a Python float, so the two
agree to float32 rounding.

MXNet's checks raise a ValueError naming the argument here too; a few
arguments that MXNet accepts but that cannot give a rate for every count are
rejected as well (each class says which).
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from lars_optax import _utils as utils
from lars_optax import _validation as v

__all__ = ["CosineScheduler", "FactorScheduler", "MultiFactorScheduler", "PolyScheduler",
           "to_optax"]

WARMUP_MODES = ("linear", "constant")

# Factor's rates are the products MXNet forms (base_lr *= factor), taken in float64
# on the host up to this many decays; past it, the last one times factor**(k - this).
_MAX_TABLE = 4096

_S = TypeVar("_S", bound="_Scheduler")


def _check_int(name: str, value: Any, minimum: int) -> int:
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"{name}: expected an int, got {value!r}.")
  if value < minimum:
    raise ValueError(f"{name}: must be >= {minimum}, got {value}.")
  if value > v.INT32_MAX:
    raise ValueError(f"{name}: must be <= {v.INT32_MAX} (update counts are int32, and a "
                     f"schedule saturates there), got {value}.")
  return int(value)


def _check_float(name: str, value: Any, **bounds: Any) -> float:
  v.check_scalar(name, value, **bounds)
  return float(value)


def _lr_dtype() -> Any:
  # float64 when x64 is on (as MXNet's Python-float rate), else float32.
  return jax.dtypes.canonicalize_dtype(jnp.float64)


def _count(num_update: Any) -> jax.Array:
  """``num_update`` as an int32 scalar, saturated (never wrapped) at the int32 range;
  a float or bool count is a TypeError."""
  dtype = getattr(num_update, "dtype", None)
  if dtype is None:
    if isinstance(num_update, (bool, np.bool_)) or not isinstance(num_update, (int, np.integer)):
      raise TypeError(f"num_update: expected an integer update count (1 at the first "
                      f"update), got {num_update!r}.")
  elif not jnp.issubdtype(dtype, jnp.integer):
    raise TypeError(f"num_update: expected an integer update count (1 at the first "
                    f"update), got an array of {dtype}.")
  if jnp.ndim(num_update) != 0:
    raise TypeError(f"num_update: expected a scalar count, got shape {jnp.shape(num_update)}.")
  if dtype is None or isinstance(num_update, (np.generic, np.ndarray)):  # Python or numpy
    return jnp.asarray(min(max(int(num_update), -v.INT32_MAX), v.INT32_MAX), jnp.int32)
  if jnp.iinfo(dtype).max > v.INT32_MAX:
    # A wider (or unsigned 32-bit) count saturates instead of wrapping around.
    low = max(int(jnp.iinfo(dtype).min), -v.INT32_MAX)
    num_update = jnp.clip(num_update, low, v.INT32_MAX)
  return jnp.asarray(num_update).astype(jnp.int32)


class _Scheduler:
  """What the four share: the warm-up, ``base_lr``, ``as_optax`` and immutability."""

  base_lr: float
  warmup_steps: int
  warmup_begin_lr: float
  warmup_mode: str
  warmup_final_lr: float

  def _init_warmup(self, base_lr: Any, warmup_steps: Any, warmup_begin_lr: Any,
                   warmup_mode: Any) -> None:
    base_lr = _check_float("base_lr", base_lr)
    warmup_steps = _check_int("warmup_steps", warmup_steps, 0)
    warmup_begin_lr = _check_float("warmup_begin_lr", warmup_begin_lr)
    if warmup_begin_lr > base_lr:
      raise ValueError(f"warmup_begin_lr: must be <= base_lr ({base_lr}), got "
                       f"{warmup_begin_lr}.")
    if warmup_mode not in WARMUP_MODES:
      raise ValueError(f"warmup_mode: expected one of {list(WARMUP_MODES)}, got "
                       f"{warmup_mode!r}.")
    self._set(base_lr=base_lr, warmup_steps=warmup_steps, warmup_begin_lr=warmup_begin_lr,
              warmup_mode=warmup_mode, warmup_final_lr=base_lr)

  def _set(self, **fields: Any) -> None:
    for name, value in fields.items():
      object.__setattr__(self, name, value)

  def __setattr__(self, name: str, value: Any) -> None:
    raise AttributeError(f"{type(self).__name__} is immutable; use with_base_lr(...) for "
                         "another base_lr, or build a new scheduler.")

  def _fields(self) -> dict[str, Any]:
    return {k: getattr(self, k) for k in self._ARGS}

  _ARGS: tuple[str, ...] = ()

  def __repr__(self) -> str:
    # As built: the constructor's base_lr, then with_base_lr(...) if it was replaced.
    fields = dict(self._fields(), base_lr=self.warmup_final_lr)
    args = ", ".join(f"{k}={v!r}" for k, v in fields.items())
    replaced = "" if self.base_lr == self.warmup_final_lr else f".with_base_lr({self.base_lr!r})"
    return f"{type(self).__name__}({args}){replaced}"

  def __eq__(self, other: object) -> bool:
    return (isinstance(other, _Scheduler) and type(other) is type(self)
            and self._fields() == other._fields()
            and self.warmup_final_lr == other.warmup_final_lr)

  def __hash__(self) -> int:
    return hash((type(self), tuple(self._fields().values()), self.warmup_final_lr))

  def with_base_lr(self: _S, base_lr: float) -> _S:
    """A copy with ``base_lr`` replaced, as MXNet's optimizer sets it.

    ``create(..., learning_rate=lr, lr_scheduler=sched)`` calls this (MXNet's
    optimizer assigns ``sched.base_lr = lr``). As in MXNet, only ``base_lr``
    changes: the warm-up still climbs to the ``base_lr`` the scheduler was built
    with, and ``warmup_begin_lr`` is not checked again. ``self`` is not changed.
    """
    new = copy.copy(self)
    new._set(base_lr=_check_float("base_lr", base_lr))
    return new

  def as_optax(self) -> Callable[[Any], jax.Array]:
    """The optax schedule of these rates: ``count -> self(count + 1)``.

    optax counts the updates done so far (0 at the first update), MXNet the
    update being done (1 at the first), so optax's count ``c`` is
    ``num_update = c + 1`` (saturating at the int32 maximum). Usable as the
    ``learning_rate`` of any optimizer of this library or of optax.
    """
    return lambda count: self(utils.saturating_add(_count(count), 1))

  def __call__(self, num_update: Any) -> jax.Array:
    """The rate for update ``num_update`` (an int or an integer array; 1 at the first)."""
    n = _count(num_update)
    dtype = _lr_dtype()
    if self.warmup_steps == 0:
      return self._decay(n, dtype)
    if self.warmup_mode == "linear":
      warm = (self.warmup_begin_lr + (self.warmup_final_lr - self.warmup_begin_lr)
              * n.astype(dtype) / self.warmup_steps)
    else:
      warm = jnp.asarray(self.warmup_begin_lr, dtype)
    return jnp.where(n < self.warmup_steps, warm.astype(dtype), self._decay(n, dtype))

  def _decay(self, n: jax.Array, dtype: Any) -> jax.Array:
    raise NotImplementedError


class FactorScheduler(_Scheduler):
  """MXNet's ``FactorScheduler``: ``base_lr`` times ``factor`` every ``step`` updates.

  After the warm-up (``n >= warmup_steps``), with ``k = floor((n - 1) / step)``
  decays (``k = 0`` for ``n <= step``; MXNet counts them from update 0, not
  from the end of the warm-up)::

      k == 0:  base_lr
      k >= 1:  max(base_lr * factor**k, stop_factor_lr)

  ``base_lr * factor**k`` is the product MXNet forms (``factor`` applied ``k``
  times in float64), rounded once to the rate's dtype. As in MXNet, a
  ``base_lr`` below ``stop_factor_lr`` is kept until the first decay, which
  raises it to ``stop_factor_lr``.

  Args:
    step: updates between decays, an int >= 1.
    factor: the decay, in [0, 1] (MXNet rejects ``factor > 1``; a negative
      factor is rejected here too).
    stop_factor_lr: the rate never decays below this.
    base_lr: the rate before the first decay (``create`` replaces it with its
      ``learning_rate``).
    warmup_steps, warmup_begin_lr, warmup_mode: the warm-up (module docstring).

  Raises:
    ValueError: ``step < 1``, ``factor`` outside [0, 1], ``warmup_steps < 0``,
      ``warmup_begin_lr > base_lr`` or an unknown ``warmup_mode``; TypeError:
      ``step`` or ``warmup_steps`` not an int.
  """

  _ARGS = ("step", "factor", "stop_factor_lr", "base_lr", "warmup_steps", "warmup_begin_lr",
           "warmup_mode")
  step: int
  factor: float
  stop_factor_lr: float

  def __init__(self, step: int, factor: float = 1, stop_factor_lr: float = 1e-8,
               base_lr: float = 0.01, warmup_steps: int = 0, warmup_begin_lr: float = 0,
               warmup_mode: str = "linear"):
    self._init_warmup(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
    self._set(step=_check_int("step", step, 1),
              factor=_check_float("factor", factor, low=0.0, high=1.0),
              stop_factor_lr=_check_float("stop_factor_lr", stop_factor_lr))

  def _rates(self) -> list[float]:
    """MXNet's rate after k decays, for k = 0, 1, ... until it stops changing."""
    rates = [self.base_lr]
    rate = self.base_lr
    while len(rates) < _MAX_TABLE:
      rate = rate * self.factor
      if rate < self.stop_factor_lr:
        rate = self.stop_factor_lr
      if rate == rates[-1] and len(rates) > 1:
        break
      rates.append(rate)
    return rates

  def _decay(self, n: jax.Array, dtype: Any) -> jax.Array:
    k = jnp.maximum(n - 1, 0) // self.step
    rates = self._rates()
    table = jnp.asarray(np.asarray(rates, np.float64), dtype)
    last = len(rates) - 1
    rate = table[jnp.minimum(k, last)]
    if last == _MAX_TABLE - 1:  # still decaying: the rest by a power
      beyond = jnp.maximum(k - last, 0).astype(dtype)
      rate = jnp.maximum(rate * jnp.power(jnp.asarray(self.factor, dtype), beyond),
                         self.stop_factor_lr).astype(dtype)
    return rate


class MultiFactorScheduler(_Scheduler):
  """MXNet's ``MultiFactorScheduler``: ``base_lr`` times ``factor`` past each listed step.

  After the warm-up (``n >= warmup_steps``), with ``k`` the number of entries of
  ``step`` that are ``< n``::

      base_lr * factor**k

  (the product MXNet forms in float64, rounded once). The rate at update
  ``step[i] + 1`` is the first with ``i + 1`` decays: with ``step=[30, 60]``
  the rate drops at updates 31 and 61, as MXNet's code does (its docstring
  says 30 and 60; the code is what MXNet runs, and the reference values of
  ``tests/reference/make_mxnet_schedules.py`` come from it).

  Args:
    step: the updates after which the rate decays: a list (or tuple) of ints
      >= 1, strictly increasing.
    factor: the decay, <= 1 (MXNet's check).
    base_lr: the rate before the first decay (``create`` replaces it with its
      ``learning_rate``).
    warmup_steps, warmup_begin_lr, warmup_mode: the warm-up (module docstring).

  Raises:
    ValueError: an empty ``step``, an entry < 1, a list that does not increase,
      ``factor > 1``, or a bad warm-up argument (as :class:`FactorScheduler`).
  """

  _ARGS = ("step", "factor", "base_lr", "warmup_steps", "warmup_begin_lr", "warmup_mode")
  step: tuple[int, ...]
  factor: float

  def __init__(self, step: Sequence[int], factor: float = 1, base_lr: float = 0.01,
               warmup_steps: int = 0, warmup_begin_lr: float = 0,
               warmup_mode: str = "linear"):
    self._init_warmup(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
    if not isinstance(step, (list, tuple)) or not step:
      raise ValueError(f"step: expected a non-empty list of ints, got {step!r}.")
    steps = tuple(_check_int("step", s, 1) for s in step)
    if any(b <= a for a, b in itertools.pairwise(steps)):
      raise ValueError(f"step: must be a strictly increasing list, got {list(steps)}.")
    self._set(step=steps, factor=_check_float("factor", factor, high=1.0))

  def _decay(self, n: jax.Array, dtype: Any) -> jax.Array:
    rates = [self.base_lr]
    for _ in self.step:
      rates.append(rates[-1] * self.factor)
    k = jnp.sum(jnp.asarray(self.step, jnp.int32) < n)
    return jnp.asarray(np.asarray(rates, np.float64), dtype)[k]


class _DecayToMax(_Scheduler):
  """Poly and Cosine: a decay over ``[warmup_steps, max_update]``, then constant."""

  max_update: int
  final_lr: float

  def _init_decay(self, max_update: Any, final_lr: Any) -> None:
    max_update = _check_int("max_update", max_update, 1)
    if self.warmup_steps >= max_update:
      raise ValueError(f"warmup_steps: must be < max_update ({max_update}), got "
                       f"{self.warmup_steps} (MXNet divides by max_update - warmup_steps).")
    self._set(max_update=max_update, final_lr=_check_float("final_lr", final_lr))

  def _left(self, n: jax.Array, dtype: Any) -> jax.Array:
    """``(max_update - n) / (max_update - warmup_steps)``, in [0, 1] after the warm-up.

    Past ``max_update`` it is 0: the rate stays at its value there. (Formed from
    the integer difference, so it keeps its precision near the end.)
    """
    left = jnp.maximum(self.max_update - n, 0).astype(dtype)
    return left / (self.max_update - self.warmup_steps)

  def _mix(self, fraction: jax.Array, dtype: Any) -> jax.Array:
    # The rate falls from the constructor's base_lr, as MXNet's (see the class docstring).
    return (self.final_lr + (self.warmup_final_lr - self.final_lr) * fraction).astype(dtype)


class PolyScheduler(_DecayToMax):
  """MXNet's ``PolyScheduler``: a polynomial decay from ``base_lr`` to ``final_lr``.

  After the warm-up (``n >= warmup_steps``), with ``m = min(n, max_update)``::

      final_lr + (base_lr - final_lr) * ((max_update - m) / (max_update - warmup_steps))**pwr

  so the rate reaches ``final_lr`` at ``max_update`` (``base_lr`` for ``pwr=0``)
  and stays there. ``base_lr`` here is the one given to the constructor: MXNet's
  ``PolyScheduler`` keeps it, so the ``learning_rate`` of ``create`` (which
  replaces ``base_lr``, as MXNet's optimizer does) does not change these rates.
  (MXNet would return that replaced ``base_lr`` if its first call came after
  ``max_update``, i.e. with ``begin_num_update >= max_update``; here the rate
  past ``max_update`` is always the one above.)

  Args:
    max_update: the update at which the decay ends, an int >= 1.
    base_lr: the rate at the end of the warm-up.
    pwr: the power, >= 0 (MXNet divides by zero at ``max_update`` for a
      negative one).
    final_lr: the rate from ``max_update`` on.
    warmup_steps: the warm-up's length, < ``max_update`` (MXNet divides by
      ``max_update - warmup_steps``).
    warmup_begin_lr, warmup_mode: the warm-up (module docstring).

  Raises:
    ValueError: ``max_update < 1``, ``warmup_steps >= max_update``, ``pwr < 0``,
      or a bad warm-up argument (as :class:`FactorScheduler`).
  """

  _ARGS = ("max_update", "base_lr", "pwr", "final_lr", "warmup_steps", "warmup_begin_lr",
           "warmup_mode")
  pwr: float

  def __init__(self, max_update: int, base_lr: float = 0.01, pwr: float = 2,
               final_lr: float = 0, warmup_steps: int = 0, warmup_begin_lr: float = 0,
               warmup_mode: str = "linear"):
    self._init_warmup(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
    self._set(pwr=_check_float("pwr", pwr, low=0.0))
    self._init_decay(max_update, final_lr)

  def _decay(self, n: jax.Array, dtype: Any) -> jax.Array:
    left = self._left(n, dtype)
    if float(self.pwr).is_integer() and self.pwr < 2**15:
      fraction = jax.lax.integer_pow(left, int(self.pwr))  # repeated products, as exact as MXNet's
    else:
      fraction = jnp.power(left, jnp.asarray(self.pwr, dtype))
    return self._mix(fraction, dtype)


class CosineScheduler(_DecayToMax):
  """MXNet's ``CosineScheduler``: a half cosine from ``base_lr`` down to ``final_lr``.

  After the warm-up (``n >= warmup_steps``), with ``m = min(n, max_update)``::

      final_lr + (base_lr - final_lr) * (1 + cos(pi * (m - w) / (max_update - w))) / 2

  computed as ``sin(pi/2 * (max_update - m) / (max_update - w))**2`` (the
  same value, without the cancellation of ``1 + cos`` near the end). The rate
  reaches ``final_lr`` at ``max_update`` and stays there. As for
  :class:`PolyScheduler`, ``base_lr`` is the constructor's: ``create``'s
  ``learning_rate`` does not change these rates, as in MXNet.

  Args:
    max_update: the update at which the decay ends, an int >= 1.
    base_lr: the rate at the end of the warm-up.
    final_lr: the rate from ``max_update`` on.
    warmup_steps: the warm-up's length, < ``max_update``.
    warmup_begin_lr, warmup_mode: the warm-up (module docstring).

  Raises:
    ValueError: ``max_update < 1``, ``warmup_steps >= max_update``, or a bad
      warm-up argument (as :class:`FactorScheduler`).
  """

  _ARGS = ("max_update", "base_lr", "final_lr", "warmup_steps", "warmup_begin_lr",
           "warmup_mode")

  def __init__(self, max_update: int, base_lr: float = 0.01, final_lr: float = 0,
               warmup_steps: int = 0, warmup_begin_lr: float = 0,
               warmup_mode: str = "linear"):
    self._init_warmup(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
    self._init_decay(max_update, final_lr)

  def _decay(self, n: jax.Array, dtype: Any) -> jax.Array:
    half = jnp.sin(self._left(n, dtype) * (math.pi / 2))
    return self._mix(half * half, dtype)


def to_optax(scheduler: _Scheduler) -> Callable[[Any], jax.Array]:
  """``scheduler.as_optax()``: the optax schedule, optax count ``c`` -> ``num_update = c + 1``."""
  if not isinstance(scheduler, _Scheduler):
    raise TypeError(f"scheduler: expected one of this module's schedulers, got "
                    f"{type(scheduler).__name__} (wrap another MXNet-style callable with "
                    "lars_optax.mxnet.mxnet_schedule).")
  return scheduler.as_optax()
