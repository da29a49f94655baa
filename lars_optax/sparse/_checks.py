"""Run-time checks of row-sparse leaves (indices in range, the leaf fits its param), with hints."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.sparse import BCOO

from lars_optax import _utils as utils
from lars_optax import _masks as masks
from lars_optax._utils import raise_at_run_time
from lars_optax.sparse import _rows


# What walks into a BCOO: the likely cause and the replacement, for the errors.
BEFORE_HINT = (
    "A generic transformation over the whole gradient tree (optax.clip_by_global_norm, "
    "optax.clip, optax.scale, optax.MultiSteps, jax.tree.map) walks into a BCOO and "
    "changes its row indices as if they were values: use "
    "lars_optax.sparse.clip_by_global_norm, lars_optax.sparse.multi_steps and "
    "lars_optax.sparse.tree_add (to sum gradient trees), or apply the transformation "
    "to the dense leaves only (optax.masked).")
AFTER_HINT = (
    "A generic transformation after the lazy optimizer (optax.scale, "
    "optax.scale_by_schedule, ...) or a jax.tree.map over the updates walks into a "
    "BCOO and changes its row indices as if they were values: put row-wise "
    "transformations inside the lazy wrapper, e.g. "
    "lars_optax.sparse.lazy_update(optax.chain(lars_optax.mxnet.adam(lr), optax.scale(0.5))), or "
    "fold a constant factor into the learning rate.")
ADDED_HINT = (
    "jax.tree.map(jnp.add, g1, g2) (and any tree.map over gradient trees, e.g. "
    "optax.tree.add or a hand-written accumulation) walks into a BCOO and adds the two "
    "gradients' row indices, so the values would land on other rows: sum gradient trees "
    "with lars_optax.sparse.tree_add(g1, g2), and accumulate micro-batches with "
    "lars_optax.sparse.multi_steps(tx, k).")


def check_indices(what: str, grad: BCOO, num_rows: int, where: str,
                  hint: str = BEFORE_HINT) -> Any:
  """The row indices are integers, unchanged since made, and in ``[0, num_rows]``.

  ``num_rows`` itself marks padding. The digest of a :class:`RowSparseUpdate`
  and the range are checked together, at run time under ``jit``
  (:func:`raise_at_run_time`, whose zero the caller adds to the indices it
  uses).
  """
  if not jnp.issubdtype(grad.indices.dtype, jnp.integer):
    raise TypeError(
        f"{where}: {what} is a row-sparse BCOO with indices of dtype "
        f"{grad.indices.dtype}; row indices must be integers. {hint}")
  idx = grad.indices.reshape(-1)
  if not idx.size:
    return 0
  out = (idx < 0) | (idx > num_rows)
  bad = jnp.any(out)
  fingerprint = getattr(grad, "fingerprint", None)
  if fingerprint is not None and hasattr(fingerprint, "dtype"):
    if fingerprint.dtype != jnp.uint32 or np.shape(fingerprint) != ():
      raise TypeError(
          f"{where}: {what} is a row-sparse BCOO whose index digest is a "
          f"{fingerprint.dtype}{list(np.shape(fingerprint))} array, not a uint32 "
          f"scalar: a transformation walked into it. {hint}")
    # A zeros_like tree keeps no digest of its zeroed indices: a no-op, allowed.
    changed = (_rows.fingerprint(idx) != fingerprint) & ~_rows.zeroed(grad)
    bad = bad | changed
  else:
    changed = jnp.zeros((), bool)

  def report(idx, changed):
    if changed:
      return (f"{where}: {what}: the row indices of this row-sparse BCOO were changed "
              f"after it was made. {ADDED_HINT if hint is BEFORE_HINT else hint}")
    wrong = idx[(idx < 0) | (idx > num_rows)]
    return (f"{where}: {what} has row indices out of range [0, {num_rows}) (and not the "
            f"padding index {num_rows}): {wrong[:5].tolist()}. Ids past the table, or "
            f"indices changed by a transformation that walked into the BCOO: {hint}")

  return raise_at_run_time(bad, report, idx, changed)


def check_row_sparse(name: str, grad: BCOO, param: Any, where: str) -> Any:
  """The layout, index dtype, shape and index range (and digest) of one leaf.

  Returns the zero of :func:`check_indices`, to add to the indices used.
  """
  shape = tuple(np.shape(param))
  if isinstance(param, BCOO):
    raise TypeError(
        f"{where}: parameter {name!r} is a BCOO; parameters must be dense arrays (were "
        "the gradients passed as params?).")
  if grad.n_batch != 0 or grad.n_sparse != 1:
    raise ValueError(
        f"{where}: gradient {name!r} is a BCOO with n_batch={grad.n_batch}, "
        f"n_sparse={grad.n_sparse}; a row-sparse gradient has n_batch=0 and "
        "n_sparse=1 (indices of shape (K, 1), values of shape (K, *row_shape)). "
        "Build it with BCOO((values, rows[:, None]), shape=param.shape) or "
        "lars_optax.sparse.row_sparse(values, rows=rows, num_rows=num_rows).")
  if tuple(grad.shape) != shape:
    raise ValueError(
        f"{where}: gradient {name!r} has shape {tuple(grad.shape)} but the "
        f"parameter has shape {shape}.")
  if not jnp.issubdtype(grad.data.dtype, jnp.floating):
    raise TypeError(
        f"{where}: gradient {name!r} has values of dtype {grad.data.dtype}; only "
        "real floating point values are supported.")
  return check_indices(f"gradient {name!r}", grad, shape[0], where)


def reject_row_sparse(tree: Any, params: Any, where: str) -> None:
  """For optimizers that cannot take row-sparse gradients: a clear error."""
  flat, treedef = jax.tree.flatten(tree, is_leaf=_rows.is_row_sparse)
  if not any(_rows.is_row_sparse(g) for g in flat):
    return
  names = leaf_names_of(treedef)
  flat_p = params_up_to(treedef, params)
  for name, g, p in zip(names, flat, flat_p):
    if _rows.is_row_sparse(g):
      if p is not None:
        check_row_sparse(name, g, p, where)
      raise ValueError(
          f"{where}: gradient {name!r} is row-sparse (a BCOO), which this optimizer "
          "cannot take: only row-wise lazy updates can (lars_optax.mxnet.adam(..., "
          "lazy_update=True), lars_optax.mxnet.sgd(..., lazy_update=True), adagrad, "
          "groupadagrad, ftrl, lars_optax.sparse.lazy_update(tx)). Otherwise pass the dense "
          "gradient (grad.todense()).")


def leaf_names_of(treedef: Any) -> list[str]:
  return [n for n, _ in masks.named_leaves(jax.tree.unflatten(treedef, [0] * treedef.num_leaves))]


def params_up_to(treedef: Any, params: Any) -> list[Any]:
  if params is None:
    return [None] * treedef.num_leaves
  try:
    return treedef.flatten_up_to(params)
  except (ValueError, TypeError):
    return [None] * treedef.num_leaves


def split_blocks(axis_name: str | None, tables: list[tuple[str, Any]]) -> int:
  """The number of blocks of tables split by rows over ``axis_name`` inside
  ``shard_map`` (1 without one), after checking that they are: ``tables`` are
  ``(name, block)`` pairs."""
  if axis_name is None:
    return 1
  if utils.manual_axes() and axis_name not in utils.manual_axes():
    raise ValueError(f"axis_name: {axis_name!r} is not a mesh axis of the enclosing "
                     "shard_map (the axis its in_specs split the sparse leaves' rows over); "
                     f"mesh axes here: {list(utils.manual_axes())}.")
  blocks = int(utils.collective(jax.lax.psum, 1, axis_name))
  # (axis_index's type varies over the axis where shard_map checks the types.)
  typed = axis_name in utils.vma(jax.lax.axis_index(axis_name))
  if not typed:
    raise ValueError(
        "axis_name: shard_map(..., check_vma=False) (or pmap) does not type which values "
        "differ across devices, and a table split by rows needs to know which ids do (they "
        "are gathered from the other devices, and each loss must count once in the "
        "gradient). Use check_vma=True (the default), or jax.jit with the table's rows "
        "split by a NamedSharding.")
  for name, p in tables:
    if axis_name not in utils.vma(p):
      raise ValueError(f"axis_name: the sparse leaf {name!r} is the same on every device of "
                       f"{axis_name!r} (in_specs P() there), not split by rows over it; "
                       "leave axis_name out for a replicated table.")
  return blocks
