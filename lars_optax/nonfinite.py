"""Skipping steps whose gradients are not finite.

A NaN or an infinity in one batch's gradients (an overflow, a bad example)
would otherwise poison the momentum buffers and the weights for good.
:func:`skip_nonfinite` wraps any optimizer so that such a step changes
nothing: the params get a zero update, every state buffer (momentum, Adam's
moments, ``multi_precision`` masters, trust ratios, step counts) keeps its
value, and the skip is counted.

It is :func:`optax.apply_if_finite` with two differences: the zero update has
the dtypes of the wrapped optimizer's updates, so it also works around
:func:`lars_optax.multi_precision` (whose updates of float16/bfloat16 leaves
are float32; ``optax.apply_if_finite`` fails to trace there), and by default
it never gives up (``optax.apply_if_finite`` applies a non-finite update after
``max_consecutive_errors`` skips in a row).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import GradientTransformation, GradientTransformationExtraArgs

from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax.precision import MultiPrecisionState
from lars_optax.sparse import _rows

__all__ = ["skip_nonfinite"]


def _finite(x: Any) -> jax.Array:
  """All of ``x`` finite; for a row-sparse leaf, the values of the rows it holds.

  A row-sparse gradient's padding slots (row index == number of rows) are not
  in the array, and every optimizer ignores them: a NaN there is no NaN step.
  """
  if not _rows.is_row_sparse(x):
    return jnp.all(jnp.isfinite(x))
  used = (x.indices[..., 0] < x.shape[0]).reshape((-1,) + (1,) * (x.data.ndim - 1))
  return jnp.all(jnp.isfinite(x.data) | ~used)


def _all_finite(tree: Any) -> jax.Array:
  leaves = jax.tree.leaves(tree, is_leaf=_rows.is_row_sparse)
  if not leaves:
    return jnp.array(True)
  return jnp.all(jnp.stack([_finite(x) for x in leaves]))


def _as_used(updates: Any, params: Any, inner_state: Any) -> Any:
  """The gradients in the dtypes the optimizer will compute with.

  This library's optimizers cast a gradient to its parameter's dtype (a float32
  gradient of 1e5 is inf for a float16 parameter), or to float32 for
  float16/bfloat16 parameters when they keep ``multi_precision`` masters (found
  in the state). A gradient is never cast to a wider dtype here: widening
  cannot make a finite value infinite.
  """
  if params is None:
    return updates
  masters = utils.find_state(inner_state, MultiPrecisionState) is not None

  def cast(g, p):
    dtype = getattr(p, "dtype", None)
    if (dtype is None or not jnp.issubdtype(dtype, jnp.floating)
        or not jnp.issubdtype(getattr(g, "dtype", jnp.int32), jnp.floating)):
      return g
    if masters and jnp.dtype(dtype) in utils.LOW_PRECISION:
      dtype = jnp.float32
    if jnp.finfo(dtype).max >= jnp.finfo(g.dtype).max:
      return g
    return _rows.astype(g, dtype)  # a row-sparse one: its rows' values

  try:
    return jax.tree.map(cast, updates, params, is_leaf=_rows.is_row_sparse)
  except (ValueError, TypeError):  # trees that differ: inner reports it
    return updates


def _decided_everywhere(finite: jax.Array, axis_name: Any) -> jax.Array:
  """``finite`` on every device: the non-finite count summed over the mesh axes.

  Inside ``shard_map`` or ``pmap`` each device sees its own block of the
  gradients; a step skipped on some devices only would let replicas diverge, and
  would leave the others waiting in the inner optimizer's collectives. The
  axes are ``axis_name``'s, or by default every axis of the enclosing
  ``shard_map``/``pmap``.
  """
  axes = utils.manual_axes() if axis_name is None else (axis_name,)
  if not axes:
    return finite
  bad = (~finite).astype(jnp.int32)
  if axis_name is None:
    bad = utils.to_varying(bad, tuple(a for a in axes if a not in utils.vma(bad)))
    total = jax.lax.psum(bad, axes)
  else:
    total = utils.psum(bad, axis_name)  # an unbound axis_name is named
  left = utils.vma(total)
  if left:
    raise ValueError(
        f"skip_nonfinite: axis_name: the gradients vary over the mesh axes {sorted(left)}, "
        f"which axis_name={axis_name!r} leaves out: the devices along them could take "
        "different branches (some skip the step, others apply it). Name every axis the "
        "gradients are split over, or leave axis_name out (all of the mesh's axes).")
  return total == 0


def _uncountable(total: Any) -> str:
  return (f"skip_nonfinite: total_notfinite is {int(total)}, int32's largest value, so this "
          "skipped step cannot be counted (a restored or hand-set count?). Reset it: "
          "state._replace(total_notfinite=jnp.zeros([], jnp.int32)).")


def _like(struct: Any, value: Any) -> jax.Array:
  """:func:`utils.full` of ``struct``, typed as varying where ``struct`` is (shard_map)."""
  return utils.to_varying(utils.full(struct, value), tuple(sorted(utils.struct_vma(struct))))


def _as_varying_as(old: Any, struct: Any) -> Any:
  """``old`` typed as varying over the axes ``struct`` varies over and it does not."""
  if not hasattr(old, "dtype"):
    return old
  extra = utils.struct_vma(struct) - utils.vma(old)
  return utils.to_varying(old, tuple(sorted(extra)))


@v.keyword_hints({})
def skip_nonfinite(
    inner: GradientTransformation,
    *,
    max_consecutive_errors: int | None = None,
    axis_name: str | None = None,
) -> GradientTransformationExtraArgs:
  """Skips the steps whose incoming gradients hold a NaN or an infinity.

  On a step where every gradient entry is finite this is ``inner``. On any
  other step the update is zero (``-0.0``, in the dtypes ``inner``'s updates
  have) and ``inner``'s state is returned unchanged, so after
  :func:`optax.apply_updates` the params (``-0.0`` entries included) and every
  state buffer are bit for bit what they were, eagerly and under ``jit``.
  Only the gradients are checked, as in :func:`optax.apply_if_finite`, but in
  the dtype the optimizer will use them in: a float32 gradient of 1e5 for a
  float16 parameter is infinite once cast (float32 for float16/bfloat16
  parameters under :func:`lars_optax.multi_precision`, whose masters are
  float32).

  Example:

  >>> import jax.numpy as jnp
  >>> import optax
  >>> import lars_optax
  >>> params = {"w": jnp.ones(3)}
  >>> tx = lars_optax.skip_nonfinite(lars_optax.lars(0.1, momentum=0.9))
  >>> state = tx.init(params)
  >>> grads = {"w": jnp.array([1.0, jnp.nan, 0.0])}
  >>> updates, state = tx.update(grads, state, params)
  >>> int(state.total_notfinite)   # skipped, and counted
  1
  >>> optax.apply_updates(params, updates)["w"]   # unchanged
  Array([1., 1., 1.], dtype=float32)

  ``lars_optax.trust_ratios`` and ``lars_optax.master_params`` find their
  state inside the wrapper. Put the wrapper outermost (around the whole
  optimizer, including ``multi_precision``) so that nothing runs on a bad
  step.

  Inside ``jax.shard_map`` or ``jax.pmap`` every device takes the same branch:
  the count of non-finite entries is summed over the mesh axes first, so a NaN
  in one device's block skips the step everywhere (and no device waits alone
  in the inner optimizer's collectives). The zero update and the kept state
  keep the inner step's types, split ones included.

  Args:
    inner: the optimizer to protect.
    max_consecutive_errors: None (the default) skips every non-finite step.
      An int ``n >= 0`` gives up as :func:`optax.apply_if_finite` does: the
      step after ``n`` consecutive skips is applied whatever it holds.
    axis_name: inside ``shard_map``/``pmap``, the mesh axes over which the
      decision is taken; default (None): every axis of the enclosing
      ``shard_map`` or ``pmap`` (outside them, nothing is summed).

  Returns:
    An :class:`optax.GradientTransformationExtraArgs` whose state is an
    :class:`optax.ApplyIfFiniteState`: ``notfinite_count`` (consecutive
    skipped steps, reset by a finite one), ``last_finite`` (whether the last
    step was applied as finite), ``total_notfinite`` (skipped steps in all;
    a skip it can no longer count, at int32's largest value, is an error)
    and ``inner_state``.
  """
  v.check_transformation(inner)
  if max_consecutive_errors is not None and (
      isinstance(max_consecutive_errors, (bool, np.bool_))
      or not isinstance(max_consecutive_errors, (int, np.integer))
      or max_consecutive_errors < 0):
    raise ValueError("max_consecutive_errors: expected None or an int >= 0, got "
                     f"{max_consecutive_errors!r}.")
  if axis_name is not None:
    v.check_axis_name(axis_name)
  inner_tx = optax.with_extra_args_support(inner)

  def init_fn(params):
    return optax.ApplyIfFiniteState(
        notfinite_count=jnp.zeros([], jnp.int32),
        last_finite=jnp.array(True, jnp.bool_),
        total_notfinite=jnp.zeros([], jnp.int32),
        inner_state=inner_tx.init(params))

  def update_fn(updates, state, params=None, **extra_args):
    inner_state = state.inner_state
    isfinite = _decided_everywhere(_all_finite(_as_used(updates, params, inner_state)),
                                   axis_name)
    notfinite_count = jnp.where(isfinite, jnp.zeros([], jnp.int32),
                                optax.safe_int32_increment(state.notfinite_count))
    apply = isfinite
    if max_consecutive_errors is not None:
      apply = isfinite | (notfinite_count > max_consecutive_errors)

    def do_update(_):
      return inner_tx.update(updates, inner_state, params, **extra_args)

    # The zero update takes the dtypes of inner's updates, which may differ
    # from the gradients' (multi_precision returns float32 updates).
    out_shapes, state_shapes = jax.eval_shape(do_update, None)

    def reject_update(_):
      # -0.0, not +0.0: w + (-0.0) is w bit for bit, also for w = -0.0
      # (-0.0 + +0.0 is +0.0, which jit's simplification hides but eager mode shows).
      zeros = jax.tree.map(lambda s: _like(s, -0.0), out_shapes)
      try:  # the kept state, typed as the step's (inside shard_map a buffer may vary)
        kept = jax.tree.map(_as_varying_as, inner_state, state_shapes)
      except (ValueError, TypeError):
        kept = inner_state
      return zeros, kept

    new_updates, new_inner_state = jax.lax.cond(apply, do_update, reject_update, None)
    # A skip that total_notfinite cannot count (it holds int32's largest value: a
    # restored or hand-set count) is an error, not a step that goes uncounted.
    full = (~isfinite) & (state.total_notfinite >= jnp.iinfo(jnp.int32).max)
    ok = utils.raise_at_run_time(full, _uncountable, state.total_notfinite)
    total = jnp.where(isfinite, state.total_notfinite,
                      optax.safe_int32_increment(state.total_notfinite)) + ok
    return new_updates, optax.ApplyIfFiniteState(
        notfinite_count=notfinite_count,
        last_finite=isfinite,
        total_notfinite=total,
        inner_state=new_inner_state)

  return GradientTransformationExtraArgs(init_fn, update_fn)
