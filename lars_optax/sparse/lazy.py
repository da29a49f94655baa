"""Lazy (row-sparse) updates, as MXNet's ``lazy_update=True`` does them.

MXNet sends embedding-style gradients as ``row_sparse`` arrays and, with
``lazy_update=True``, updates only the rows that appear in the gradient: the
weights *and* every optimizer buffer of an absent row stay as they were. A
dense JAX gradient has no list of rows, so :func:`lazy_update` calls a row
present when any of its entries is non-zero. A row-sparse (BCOO) gradient leaf
lists its rows: :mod:`lars_optax.sparse` then updates just those, in O(rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import GradientTransformation, GradientTransformationExtraArgs

from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax.sparse import _checks, _lazy_step, _rows

__all__ = ["lazy_update", "present_rows"]


def present_rows(grad: jax.Array) -> jax.Array:
  """A bool vector with one entry per row (axis 0): any entry non-zero.

  NaN counts as non-zero, so a non-finite gradient row is updated (and shows
  up) rather than silently skipped.
  """
  if not hasattr(grad, "ndim") or not hasattr(grad, "dtype"):
    raise TypeError(f"grad: expected an array, got {type(grad).__name__}.")
  if grad.ndim == 0:
    raise ValueError("grad: a 0-d array has no rows (present_rows needs axis 0).")
  return jnp.any(grad != 0, axis=tuple(range(1, grad.ndim)))


def _check_rows(tree: Any, where: str, what: str = "parameter") -> None:
  # A row-sparse gradient is judged by its values (its other children, such as
  # the indices' digest, are not rows).
  tree = jax.tree.map(lambda g: g.data if _rows.is_row_sparse(g) else g, tree,
                      is_leaf=_rows.is_row_sparse)
  for name, leaf in masks.named_leaves(tree):
    if np.ndim(leaf) == 0:
      raise ValueError(
          f"{where}: {what} {name!r} is 0-d (a scalar), so it has no rows; "
          "lazy_update needs every leaf to have at least one axis. Exclude "
          "scalars, e.g. with optax.masked or optax.partition.")


def _keep_rows(new: jax.Array, old: jax.Array, rows: jax.Array) -> jax.Array:
  where = rows.reshape(rows.shape + (1,) * (new.ndim - 1))
  return jnp.where(where, new, old)


@v.keyword_hints({})
def lazy_update(inner: GradientTransformation, *,
                axis_name: str | None = None) -> GradientTransformationExtraArgs:
  r"""Applies ``inner`` only to the rows present in the gradient.

  For every leaf, a row (an index along axis 0) is *present* when any entry of
  its gradient is non-zero (:func:`present_rows`). Then, per row :math:`r`:

  .. math::

    (u_r, s_r) = \begin{cases}
      \mathrm{inner}(g, s)_r & r \text{ present} \\
      (0,\ s_r) & r \text{ absent}
    \end{cases}

  i.e. an absent row gets a zero update and keeps every state buffer that has
  the shape of the parameters (momentum, Adam's moments, ...). Scalar state
  such as a step count still advances, as in MXNet (Adam's :math:`t` is the
  step count of the whole parameter). With every row present this is exactly
  ``inner``.

  The buffers are found by structure: a subtree of the state with the params'
  tree structure and, at each leaf, an array whose leading axis is the
  param's rows, whatever its other axes (the param's shape, or GroupAdaGrad's
  ``(rows, 1)``), or an empty :class:`optax.MaskedNode` (as optax,
  :func:`optax.masked` and :func:`lars_optax.multi_precision` keep them).
  Buffers held in another layout are not recognised and are updated densely;
  a state array that happens to have the params' structure and their rows
  first is treated as a buffer.

  A gradient leaf may also be a row-sparse
  :class:`jax.experimental.sparse.BCOO` (``indices`` of shape ``(K, 1)``):
  then only its K rows of the param and of every buffer are gathered,
  updated by ``inner`` and scattered back, in O(K) (see
  :mod:`lars_optax.sparse`); its update comes back row-sparse, and
  ``inner`` must be row-wise (checked, with an error naming the leaf). When
  ``inner`` fails on the gathered rows, or returns another shape, because a
  state leaf holding the rows was not recognised as a buffer (kept
  transposed, or outside the params' structure), a ValueError names that
  state leaf and says how buffers are found.

  Example: MXNet's ``Adam(lazy_update=True)`` is
  ``lazy_update(lars_optax.mxnet.adam(...))``, and the wrapper works the same way
  around :func:`lars_optax.mxnet.sgd`, :func:`lars_optax.signum` or any optax
  transformation.

  Args:
    inner: the transformation to apply lazily.
    axis_name: inside ``shard_map``/``pmap`` with params split over this mesh
      axis along a non-row axis (e.g. an embedding table split by columns),
      a row is present when it is present in any block (an OR over the axis).
      Do not use it for leaves split along axis 0: their blocks hold
      different rows.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs` whose state is
    ``inner``'s state. Raises a ValueError naming the leaf when a parameter
    is 0-d (it has no rows).
  """
  v.check_transformation(inner)
  v.check_axis_name(axis_name)
  inner_tx = optax.with_extra_args_support(inner)

  def init_fn(params):
    _check_rows(params, "lazy_update")
    return inner_tx.init(params)

  def rows_present(flat_g):
    """Each dense gradient leaf's present rows, ORed over ``axis_name`` when given."""
    rows = [present_rows(g) for g in flat_g]
    if axis_name is not None:
      rows = [r > 0 for r in utils.psum([r.astype(jnp.int32) for r in rows], axis_name)]
    return rows

  def update_fn(updates, state, params=None, **extra_args):
    if any(_rows.is_row_sparse(g)
           for g in jax.tree.leaves(updates, is_leaf=_rows.is_row_sparse)):
      # Row-sparse (BCOO) leaves: gather, update and scatter their rows
      # (lars_optax.sparse); dense leaves in the tree follow the rule above.
      _check_rows(updates, "lazy_update", "gradient")
      return _lazy_step.lazy_update_sparse(
          inner_tx, updates, state, params, extra_args,
          lambda new, old, grad: _keep_rows(new, old, rows_present([grad])[0]), "lazy_update")
    params = v.align_params(updates, params)
    if params is not None:
      v.check_same_structure(updates, params, "lazy_update")
    _check_rows(updates, "lazy_update", "gradient")
    flat_g, treedef = jax.tree.flatten(updates)
    rows = rows_present(flat_g)
    new_updates, new_state = inner_tx.update(updates, state, params, **extra_args)
    flat_u = treedef.flatten_up_to(new_updates)
    new_updates = jax.tree.unflatten(
        treedef, [_keep_rows(u, jnp.zeros_like(u), r) for u, r in zip(flat_u, rows)])
    shapes = [np.shape(g) for g in flat_g]

    def subtrees(node):
      return _lazy_step.params_shaped_leaves(node, treedef, shapes)

    def is_params_like(node):
      return subtrees(node) is not None

    def keep(new, old):
      flat_new = subtrees(new)
      if flat_new is None:
        return new
      flat_old = treedef.flatten_up_to(old)
      return jax.tree.unflatten(treedef, [
          n if isinstance(n, optax.MaskedNode) else _keep_rows(n, o, r)
          for n, o, r in zip(flat_new, flat_old, rows)])

    new_state = jax.tree.map(keep, new_state, state, is_leaf=is_params_like)
    return new_updates, new_state

  return GradientTransformationExtraArgs(init_fn, update_fn)


def on_row_sparse(inner: GradientTransformation, name: str, *,
                  check: Callable[[list[str], Any], None] | None = None
                  ) -> GradientTransformationExtraArgs:
  """``inner``, taking row-sparse (BCOO) gradient leaves as MXNet's ``row_sparse`` kernels do.

  For optimizers whose MXNet version has a row-sparse kernel but no
  ``lazy_update`` flag (AdaGrad, GroupAdaGrad, FTRL). A tree of dense
  gradients gets ``inner``'s ordinary update, unchanged. A tree with
  row-sparse leaves gets the lazy step of :func:`lazy_update` on those
  leaves' rows, in O(rows) (:mod:`lars_optax.sparse`); its dense leaves get
  ``inner``'s ordinary dense update (no row is skipped). ``check(names,
  params)``, when given, is called with the names of the row-sparse leaves
  first, to reject a setting the row-sparse step does not support.
  Errors are prefixed with ``name``.
  """
  inner_tx = optax.with_extra_args_support(inner)

  def update_fn(updates, state, params=None, **extra_args):
    flat, treedef = jax.tree.flatten(updates, is_leaf=_rows.is_row_sparse)
    if not any(_rows.is_row_sparse(g) for g in flat):
      return inner_tx.update(updates, state, params, **extra_args)
    _check_rows(updates, name, "gradient")
    if check is not None:
      check([n for n, g in zip(_checks.leaf_names_of(treedef), flat)
             if _rows.is_row_sparse(g)], params)
    return _lazy_step.lazy_update_sparse(inner_tx, updates, state, params, extra_args,
                                      lambda new, old, grad: new, name)

  return GradientTransformationExtraArgs(inner_tx.init, update_fn)
