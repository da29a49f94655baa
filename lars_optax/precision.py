"""Multi-precision training: float32 master weights for float16/bfloat16 params.

MXNet's ``multi_precision=True`` keeps, for every float16 weight, a float32
copy (the *master*) and float32 optimizer state. The update is computed and
applied on the master, and the float16 weight is the master cast down.
:func:`multi_precision` does the same around any optax transformation, for
float16 and bfloat16 leaves; float32 and float64 leaves pass through.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax import GradientTransformation, GradientTransformationExtraArgs

from lars_optax import _row_wise
from lars_optax import _masks as masks
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax.sparse import _rows, _types
from lars_optax.sparse._rows import is_row_sparse

__all__ = ["MultiPrecisionState", "master_params", "multi_precision"]


def _is_low(x: Any) -> bool:
  return jnp.dtype(getattr(x, "dtype", jnp.float32)) in utils.LOW_PRECISION


@_row_wise.row_wise("master")
class MultiPrecisionState(NamedTuple):
  """State of :func:`multi_precision`.

  Attributes:
    master: float32 copies of the float16/bfloat16 params, with the params'
      tree structure; other leaves hold an empty :class:`optax.MaskedNode`.
    inner_state: the wrapped transformation's state, built on the float32
      params (so its buffers are float32).
  """

  master: Any
  inner_state: optax.OptState


@v.keyword_hints({})
def multi_precision(inner: GradientTransformation) -> GradientTransformationExtraArgs:
  r"""Runs ``inner`` on float32 master copies of the low-precision params.

  For every float16 or bfloat16 leaf :math:`w` (with master :math:`\bar w`,
  initially :math:`\bar w = \mathrm{f32}(w)`):

  .. math::

    \Delta &= \mathrm{inner}(\mathrm{f32}(g), \bar w) \\
    \bar w &\leftarrow \bar w + \Delta \\
    \text{update} &= \mathrm{f32}(\mathrm{low}(\bar w)) - \mathrm{f32}(w)

  so that :func:`optax.apply_updates` sets :math:`w` to the master cast down,
  :math:`\mathrm{low}(\bar w)`. ``inner`` sees float32 gradients and float32
  params, so its state (momentum, Adam's moments) is float32 too. float32 and
  float64 leaves are passed to ``inner`` unchanged. This is MXNet's
  ``multi_precision=True``, extended to bfloat16.

  A row-sparse (BCOO) gradient goes to ``inner`` with float32 values, for a
  lazy ``inner`` (``adam(..., lazy_update=True, multi_precision=True)``, as
  MXNet 2.0's Adam takes both): its row-sparse :math:`\Delta` is added to
  the master's rows, and the update is row-sparse too, on the same rows.

  The update of a low-precision leaf is float32; apply it with
  :func:`optax.apply_updates` (which casts the sum back to the param dtype).
  The result equals the cast master exactly whenever the difference of the two
  low-precision values is a float32 number, which holds unless one step moves
  a weight between magnitudes more than about :math:`2^{16}` apart (e.g. from
  2.0 to below 3e-5 in float16). Even then the next step starts again from
  the master: the error does not accumulate. :func:`master_params` returns
  the masters.

  Args:
    inner: the transformation to run in float32.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs` with a
    :class:`MultiPrecisionState`.
  """
  v.check_transformation(inner)
  inner_tx = optax.with_extra_args_support(inner)
  name = "multi_precision"

  def master_tree(params, master):
    return jax.tree.map(lambda p, m: m if _is_low(p) else p, params, master)

  def init_fn(params):
    v.check_float_params(params, name)
    master = jax.tree.map(
        lambda p: p.astype(jnp.float32) if _is_low(p) else optax.MaskedNode(), params)
    return MultiPrecisionState(master, inner_tx.init(master_tree(params, master)))

  def update_fn(updates, state, params=None, **extra_args):
    params = v.align_params(updates, params)
    shapes = _rows.shape_view(updates)
    v.check_same_structure(shapes, params, name)
    v.check_float_params(shapes, name, "gradient")
    full = master_tree(params, state.master)

    def to_f32(g, p):
      return _rows.astype(g, jnp.float32) if _is_low(p) else g

    grads = jax.tree.map(to_f32, updates, params, is_leaf=is_row_sparse)
    try:
      inner_updates, inner_state = inner_tx.update(grads, state.inner_state, full,
                                                   **extra_args)
    except (ValueError, TypeError) as e:
      sparse = [n for n, x in masks.named_leaves(shapes)
                if isinstance(x, jax.ShapeDtypeStruct)]
      if not sparse or "row-sparse" in str(e):
        raise
      raise ValueError(
          f"{name}: gradient {sparse[0]!r} is row-sparse (a BCOO), and the wrapped "
          f"optimizer failed on it ({type(e).__name__}: {str(e).splitlines()[0]}). "
          "Only row-wise lazy updates take row-sparse gradients (lars_optax.mxnet.adam(..., "
          "lazy_update=True), lars_optax.sparse.lazy_update(tx)); otherwise pass "
          "grad.todense().") from e

    def new_master(p, m, u):
      if not _is_low(p):
        return optax.MaskedNode()
      return m + _rows.astype(u, jnp.float32)  # a lazy inner step: a scatter-add of its rows

    master = jax.tree.map(new_master, params, state.master, inner_updates)

    def cast_down(p, m):
      return m.astype(p.dtype).astype(jnp.float32) - p.astype(jnp.float32)

    def out(p, m, u):
      if not _is_low(p):
        return u
      if is_row_sparse(u):  # only the rows the inner step moved
        rows = _rows.combine(u, p.shape[0])[0]
        values = cast_down(_rows.gather(p, rows), _rows.gather(m, rows))
        # The rows are distinct now (sorted, unless they were distinct already):
        # flagged so, applying this float32 update to the float16 table does not
        # sort them a second time.
        return _types.RowSparseUpdate((values, rows[:, None].astype(u.indices.dtype)),
                                       shape=u.shape, unique_indices=True,
                                       indices_sorted=u.indices_sorted or not u.unique_indices)
      return cast_down(p, m)

    new_updates = jax.tree.map(out, params, master, inner_updates)
    return new_updates, MultiPrecisionState(master, inner_state)

  return GradientTransformationExtraArgs(init_fn, update_fn)


def master_params(state: optax.OptState, params: Any) -> Any:
  """The params at full precision: masters for low-precision leaves.

  Finds the first :class:`MultiPrecisionState` in ``state`` and returns
  ``params`` with every float16/bfloat16 leaf replaced by its float32 master
  (e.g. for evaluation or for saving a float32 checkpoint).

  Raises:
    ValueError: when ``state`` holds no :class:`MultiPrecisionState`.
  """
  found = utils.find_state(state, MultiPrecisionState)
  if found is None:
    raise ValueError("state: no MultiPrecisionState found; pass the state of an "
                     "optimizer built with multi_precision=True or wrapped in "
                     "lars_optax.multi_precision.")
  return jax.tree.map(lambda p, m: m if _is_low(p) else p, params, found.master)

