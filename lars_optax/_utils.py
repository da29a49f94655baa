"""Private helpers shared by the modules: scalars and dtypes, collectives, state lookup."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
from optax import GradientTransformation

from lars_optax import _validation as v
from lars_optax import _masks as masks


def norm_dtype(dtype: Any) -> jnp.dtype:
  """Norms accumulate in float32 or wider (float64 for float64 params).

  Complex params stay complex (complex64 or wider); :func:`real_dtype` gives
  the real dtype of their norms.
  """
  return jnp.promote_types(dtype, jnp.float32)


def real_dtype(dtype: Any) -> jnp.dtype:
  """The real dtype of a dtype's values: float32 for complex64, float64 for
  complex128, the dtype itself for a real one."""
  return jnp.dtype(jnp.finfo(dtype).dtype)


def abs_sq(x: jax.Array) -> jax.Array:
  """:math:`|x|^2`, real: :math:`x^2` for real ``x``, :math:`\\mathrm{Re}(x\\bar x)` for complex."""
  return jnp.real(x * jnp.conj(x)) if jnp.iscomplexobj(x) else jnp.square(x)


def is_const(x: Any, value: float) -> bool:
  """True when ``x`` is a Python or numpy number equal to ``value``.

  Used to leave out work that a hyperparameter makes a no-op (a scale of 1, a
  momentum of 0). The value decides, not the type (``0``, ``0.0`` and
  ``np.float32(0)`` alike). JAX arrays and tracers (e.g. from
  ``optax.inject_hyperparams``, whose ``init`` sees concrete arrays and whose
  jitted ``update`` sees tracers) are never treated as constants, so the
  structure of the state does not depend on whether they are traced.
  """
  if isinstance(x, (bool, np.bool_)):
    return False
  if isinstance(x, (int, float, np.integer, np.floating)):
    return x == value
  return isinstance(x, np.ndarray) and x.ndim == 0 and bool(x == value)


def times(value: Any, mult: Any) -> Any:
  """``value * mult`` that keeps Python numbers (and skips a factor of 1).

  ``mult`` may be a numpy array of per-layer multipliers (a stacked leaf).
  """
  if not isinstance(mult, np.ndarray) and mult == 1:
    return value
  return value * mult


def is_python_number(x: Any) -> bool:
  """A Python int or float (weakly typed in JAX); not np.float64, a float subclass."""
  return type(x) in (int, float)


def cast(x: Any, dtype: Any) -> jax.Array | np.ndarray:
  """A hyperparameter in ``dtype``, as JAX treats a Python float (weak typing).

  A numpy or JAX scalar is not weakly typed: multiplied with a bfloat16 array
  it would make the result (and the state) float32. Every hyperparameter that
  meets a buffer goes through here.

  A Python or numpy number becomes a numpy scalar of ``dtype`` (the same
  rounding): a literal in the traced step, where a JAX array would be a
  device constant made at every trace, one per leaf.
  """
  if type(x) in (int, float) or isinstance(x, (np.number, np.ndarray)):
    return np.asarray(x, dtype)
  return jnp.asarray(x, dtype)


def keep_dtypes(tx: GradientTransformation, *hyperparams: Any) -> GradientTransformation:
  """``tx`` with its updates and state cast back to the dtypes they came in.

  For optax's own transformations (``scale``, ``clip``, ``ema``, ``trace``,
  ``scale_by_learning_rate``), which multiply by a hyperparameter as given: a
  typed (numpy or JAX) scalar would otherwise turn bfloat16/float16 updates and
  state into float32 and make the next jitted step trace again. ``tx`` is
  returned as it is when every hyperparameter is a Python number or a schedule.
  """
  if all(is_python_number(h) or callable(h) or h is None for h in hyperparams):
    return tx

  def cast(new, old):
    dtype = getattr(old, "dtype", None)
    if dtype is None or getattr(new, "dtype", dtype) == dtype:
      return new
    return new.astype(dtype)

  def update_fn(updates, state, params=None):
    new_updates, new_state = tx.update(updates, state, params)
    return jax.tree.map(cast, new_updates, updates), jax.tree.map(cast, new_state, state)

  return GradientTransformation(tx.init, update_fn)


def saturating_add(count: jax.Array, offset: Any) -> jax.Array:
  """``count + offset`` in int32 for ``0 <= offset <= INT32_MAX``, saturating there.

  (optax's step counts saturate at the int32 maximum, too; a plain sum would
  wrap around to a negative count.)
  """
  offset = jnp.asarray(offset, jnp.int32)
  return jnp.minimum(count, v.INT32_MAX - offset) + offset


def psum(tree: Any, axis_name: str | None) -> Any:
  """``lax.psum`` over ``axis_name`` (None: no-op), naming the option if unbound."""
  return collective(jax.lax.psum, tree, axis_name)


def collective(op: Any, tree: Any, axis_name: str | None) -> Any:
  """``op(tree, axis_name)`` (e.g. ``lax.pmean``); a ValueError naming the option if unbound."""
  if axis_name is None:
    return tree
  try:
    return op(tree, axis_name)
  except NameError as e:
    raise ValueError(
        f"axis_name: {axis_name!r} is not bound here; the update must run inside "
        "jax.pmap or shard_map over that axis (or pass axis_name=None). "
        f"JAX said: {e}") from e


def find_states(node: Any, cls: type | tuple[type, ...]) -> list[Any]:
  """Every instance of ``cls`` (a class or a tuple of classes) in a (nested)
  optimizer state, outermost first."""
  if isinstance(node, cls):
    return [node]
  children = node.values() if isinstance(node, dict) else (
      node if isinstance(node, (tuple, list)) else ())
  return [found for child in children for found in find_states(child, cls)]


def find_state(node: Any, cls: type) -> Any:
  """The first instance of ``cls`` in a (nested) optimizer state, or None."""
  found = find_states(node, cls)
  return found[0] if found else None


class LowPrecisionWarning(UserWarning):
  """Warned at ``init`` when an optimizer is known to fail in the params' dtype.

  Every rule that keeps squared gradients in its state, on float16 params
  without float32 master weights: the Adam family (:func:`lars_optax.mxnet.adam`,
  :func:`scale_by_mxnet_adam`, ...), LAMB and LANS, whose second moment
  underflows to 0 in float16 so that the steps blow up, and RMSProp, AdaGrad,
  GroupAdaGrad, AdaDelta and FTRL, whose accumulated squares overflow to inf
  once a gradient exceeds 256 in magnitude, so that the weight stops moving.
  Pass ``multi_precision=True`` (or wrap the optimizer in
  :func:`lars_optax.multi_precision`), or use bfloat16. To silence it:
  ``warnings.filterwarnings("ignore", category=lars_optax.LowPrecisionWarning)``.
  """


# The dtypes that multi_precision keeps float32 masters for.
LOW_PRECISION = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))

BLOW_UP = "the updates blow up on ordinary data"
DEGRADES = ("Adam's direction degrades towards m / epsilon on ordinary data (the trust "
             "ratio then only fixes its length)")
OVERFLOWS = ("its accumulated squared gradients overflow to inf in float16 once a gradient "
             "exceeds 256 in magnitude (and tiny ones underflow to 0), and the weight then "
             "stops moving")


def warn_float16(params: Any, where: str, effect: str = BLOW_UP, *,
                 problem: str | None = None) -> None:
  """Warns once per ``init`` when an adaptive optimizer meets float16 params.

  ``problem`` replaces the default text (Adam's second moment underflows and
  ``effect``) for rules that keep squares in another way (e.g. ``OVERFLOWS``).
  """
  low = [n for n, p in masks.named_leaves(params)
         if getattr(p, "dtype", None) == jnp.float16]
  if low:
    which = f"parameter {low[0]!r}" if low[0] else "the parameter"
    more = f" (and {len(low) - 1} more)" if len(low) > 1 else ""
    if problem is None:
      problem = ("Adam's second moment (squared gradients) underflows in float16 and "
                 f"{effect}")
    warnings.warn(
        f"{where}: {which}{more} is float16 and there are no float32 master weights: "
        f"{problem}. Pass multi_precision=True (or wrap the optimizer in "
        "lars_optax.multi_precision), or use bfloat16 params.",
        LowPrecisionWarning, stacklevel=3)


def one_minus_pow(beta: Any, t: jax.Array) -> jax.Array:
  """``1 - beta**t`` in ``t``'s dtype without the cancellation of the direct form.

  Written as ``-expm1(t * log(beta))`` with ``log(beta)`` taken in double
  precision for Python numbers, so ``1 - 0.999**1`` is 1e-3 to float32
  precision (the direct form is off by 1e-5 relative, because 0.999 is not a
  float32 number).
  """
  if is_python_number(beta) or isinstance(beta, (np.floating, np.integer)):
    beta = float(beta)
    if beta == 0:
      return jnp.ones_like(t)
    log_beta = jnp.asarray(math.log(beta), t.dtype)
  else:
    log_beta = jnp.log(jnp.asarray(beta, t.dtype))
  return -jnp.expm1(t * log_beta)


def moments(updates: Any, mu: Any, nu: Any, b1: Any, b2: Any, *, grad_averaging: bool = True,
            square: Callable[[jax.Array], jax.Array] = abs_sq) -> tuple[Any, Any]:
  r"""Adam's running moments, in the buffers' dtypes.

  :math:`m \leftarrow \beta_1 m + (1 - \beta_1) u` (without grad averaging, the first
  moment adds the whole update: :math:`m \leftarrow \beta_1 m + u`) and
  :math:`v \leftarrow \beta_2 v + (1 - \beta_2)\,\mathrm{square}(u)`.
  """
  if grad_averaging:
    mu = jax.tree.map(lambda m, u: cast(b1, m.dtype) * m + cast(1 - b1, m.dtype) * u, mu, updates)
  else:
    mu = jax.tree.map(lambda m, u: cast(b1, m.dtype) * m + u.astype(m.dtype), mu, updates)
  nu = jax.tree.map(lambda n, u: cast(b2, n.dtype) * n + cast(1 - b2, n.dtype) * square(u),
                    nu, updates)
  return mu, nu


def safe_divide(x: jax.Array, denom: jax.Array) -> jax.Array:
  """``x / denom``, 0 where ``denom`` is exactly 0 (no 0/0 is formed: ``jax_debug_nans``).

  A zero denominator means a zero step (e.g. ``epsilon=0`` and every gradient so
  far 0), where MXNet and optax divide 0 by 0. Only that case is guarded: a NaN
  or infinite denominator divides as usual, so a NaN gradient shows in the
  update (as in optax and MXNet) instead of becoming a silent zero step that
  freezes the weight.
  """
  zero = denom == 0
  return select(zero, 0, x / select(zero, 1, denom))


def divide_by(x: jax.Array, denom: jax.Array, eps: Any) -> jax.Array:
  """``x / denom`` for ``denom = sqrt(v) + eps`` (``v >= 0``, float32 or wider).

  With a Python or numpy ``eps`` that is a normal float32 number > 0 the
  denominator cannot be 0 and the division is plain (fewer operations per
  leaf); otherwise :func:`safe_divide`.
  """
  if isinstance(eps, (int, float, np.integer, np.floating)) and not isinstance(eps, bool) and (
      eps >= np.finfo(np.float32).tiny):
    return x / denom
  return safe_divide(x, denom)


def select(cond: jax.Array, x: Any, y: Any) -> jax.Array:
  """``jnp.where(cond, x, y)`` for an array and a Python number of its dtype, or two
  arrays of one shape and dtype: one ``select`` in the traced step, where
  ``jnp.where`` is a nested function (a call to trace, lower and inline, per leaf)."""
  like = x if isinstance(x, (jax.Array, np.ndarray)) else y
  x = lax.full_like(like, x) if is_python_number(x) else x
  y = lax.full_like(like, y) if is_python_number(y) else y
  if np.shape(cond) == np.shape(x) == np.shape(y) and jnp.result_type(x) == jnp.result_type(y):
    return lax.select(cond, x, y)
  return jnp.where(cond, x, y)


def full(struct: Any, value: Any) -> jax.Array:
  """An array of ``struct``'s shape and dtype (e.g. from ``jax.eval_shape``) filled
  with ``value``, and of its sharding where that is part of its type (explicit
  mesh axes): a ``lax.cond`` branch built of it has its other branch's type."""
  return lax.full(struct.shape, value, struct.dtype, sharding=getattr(struct, "sharding", None))


def struct_like(x: Any, dtype: Any) -> jax.ShapeDtypeStruct:
  """``x``'s shape with ``dtype``, and ``x``'s sharding where that is part of its
  type (explicit mesh axes; else none): for :func:`full`."""
  sharding = jax.typeof(x).sharding if typed_sharding(x) is not None else None
  return jax.ShapeDtypeStruct(np.shape(x), dtype, sharding=sharding)


def typed_sharding(x: Any) -> tuple[tuple[str, ...], ...] | None:
  """``x``'s sharding where it is part of its type (mesh axes of type
  ``Explicit``): per axis, the explicit mesh axes it is split over, None where
  none are (auto axes are the compiler's to choose, and a traced value does not
  show them)."""
  try:
    sharding = jax.typeof(x).sharding
    names, types = sharding.mesh.axis_names, sharding.mesh.axis_types
    spec = tuple(sharding.spec)
  except (AttributeError, TypeError):
    return None
  explicit = {n for n, t in zip(names, types) if t == jax.sharding.AxisType.Explicit}

  def split(entry: Any) -> tuple[str, ...]:
    axes = entry if isinstance(entry, tuple) else (entry,)
    return tuple(a for a in axes if a in explicit)

  per_axis = [split(entry) for entry in spec]
  while per_axis and not per_axis[-1]:  # P("x") and P("x", None) split alike
    per_axis.pop()
  return tuple(per_axis) or None


def replicated(x: jax.Array) -> jax.Array:
  """``x`` replicated where its type splits it over explicit mesh axes (else
  ``x`` itself): for small per-layer vectors (norms, ratios) that are
  concatenated with others, which typed shardings allow only when they agree."""
  if typed_sharding(x) is None:
    return x
  mesh = jax.typeof(x).sharding.mesh
  return jax.sharding.reshard(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


def varying(aval: Any) -> frozenset:
  """The mesh axes along which a value of this type varies inside ``shard_map``.

  Empty outside ``shard_map`` and with ``check_vma=False``. (JAX 0.7 spells
  it ``aval.vma``; newer versions ``aval.mat.varying``.)
  """
  mat = getattr(aval, "mat", None)
  if mat is not None and hasattr(mat, "varying"):
    return frozenset(mat.varying)
  return frozenset(getattr(aval, "vma", ()) or ())


def struct_vma(struct: Any) -> frozenset:
  """:func:`varying` of a :class:`jax.ShapeDtypeStruct` (e.g. from ``jax.eval_shape``)."""
  mat = getattr(struct, "manual_axis_type", None)
  if mat is not None and hasattr(mat, "varying"):
    return frozenset(mat.varying)
  return frozenset(getattr(struct, "vma", ()) or ())


def manual_axes() -> tuple[str, ...]:
  """The mesh axes of the enclosing ``shard_map`` or ``pmap`` (none outside them)."""
  get = getattr(jax.sharding, "get_abstract_mesh", None)
  mesh = None if get is None else get()
  if mesh is None or getattr(mesh, "empty", True):
    return ()
  manual = getattr(mesh, "manual_axes", None)
  if manual is not None:
    return tuple(manual)
  return tuple(n for n, t in zip(mesh.axis_names, mesh.axis_types)
               if t == jax.sharding.AxisType.Manual)


def vma(x: Any) -> frozenset:
  """:func:`varying` of a value's type."""
  return varying(jax.typeof(x))


def to_varying(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
  """``x`` typed as varying over the mesh ``axes`` (``lax.pcast(..., to="varying")``;
  JAX 0.7 spells it ``lax.pvary``)."""
  if not axes:
    return x
  pcast = getattr(jax.lax, "pcast", None)
  if pcast is not None:
    return pcast(x, axes, to="varying")
  return jax.lax.pvary(x, axes)  # type: ignore[attr-defined]


def raise_at_run_time(bad: Any, report: Callable[..., str], *operands: Any) -> Any:
  """Raises ``ValueError(report(*operands))`` when ``bad`` is true, also under ``jit``.

  Concrete ``bad`` (outside ``jit``): raises now and returns ``0``. Traced:
  returns a zero int32 scalar from a ``lax.cond`` on ``bad`` whose true
  branch calls a host callback (:func:`jax.pure_callback`) that raises. The
  caller adds the zero to an index it uses, so the check cannot be pruned.
  A pure callback (unlike :func:`jax.debug.callback`) adds no side effect to
  the compiled step, which keeps JAX's fast dispatch path: the check costs
  the reduction that makes ``bad`` and one branch per step, and the operands
  go to the host only when ``bad`` holds. The error reaches the caller as a
  ``JaxRuntimeError`` ending with the message, when the step's results are
  read.
  """
  if not isinstance(bad, jax.core.Tracer):
    if bool(bad):
      raise ValueError(report(*[np.asarray(x) for x in operands]))
    return 0

  def fail(bad, *ops):
    if np.any(bad):  # (under vmap both branches may run: look at the flag)
      raise ValueError(report(*[np.asarray(x) for x in ops]))
    return np.zeros((), np.int32)

  zero = jax.ShapeDtypeStruct((), jnp.int32)
  return jax.lax.cond(
      bad, lambda ops: jax.pure_callback(fail, zero, bad, *ops, vmap_method="sequential"),
      lambda ops: jnp.zeros((), jnp.int32), operands)
