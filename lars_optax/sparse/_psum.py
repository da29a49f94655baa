"""Data parallelism: ``psum`` of gradient trees with row-sparse leaves."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from lars_optax import _utils as utils
from lars_optax.sparse import _checks, _rows, _types


def psum(tree: Any, axis_name: str, *, mean: bool = False) -> Any:
  """``lax.psum`` (or ``pmean``) of a gradient tree with row-sparse leaves.

  Dense leaves are summed with :func:`jax.lax.psum`. A row-sparse leaf is
  all-gathered: the result holds every replica's indices and values
  (``n_devices * K`` entries; duplicate rows are summed by the optimizer),
  which is the sum of the replicas' gradients. With ``mean=True`` the values
  are divided by the axis size (``lax.pmean``).

  Use it inside ``jax.pmap`` or ``shard_map`` over ``axis_name`` with the
  params (the table) replicated over that axis (data parallelism). For a
  table split by rows over an axis, pass that axis to
  :func:`value_and_grad`'s ``axis_name`` instead: each device then gets the
  gradient of its own rows, and nothing is to be summed over that axis.
  """

  n = utils.collective(jax.lax.psum, 1, axis_name)

  def one(x):
    if not _rows.is_row_sparse(x):
      out = utils.collective(jax.lax.psum, x, axis_name)
      return out / n if mean else out
    ok = _checks.check_indices("a row-sparse leaf", x, x.shape[0], "lars_optax.sparse.psum")
    data = utils.collective(lambda v, a: jax.lax.all_gather(v, a, tiled=True), x.data, axis_name)
    idx = utils.collective(lambda v, a: jax.lax.all_gather(v, a, tiled=True),
                           x.indices + jnp.asarray(ok, x.indices.dtype), axis_name)
    return _types.RowSparseUpdate((data / n if mean else data, idx), shape=x.shape)

  return jax.tree.map(one, tree, is_leaf=_rows.is_row_sparse)
