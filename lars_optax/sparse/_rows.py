"""Row helpers of the row-sparse path: which leaves are row-sparse, their rows and digests."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.sparse import BCOO


def is_row_sparse(x: Any) -> bool:
  """True for a :class:`jax.experimental.sparse.BCOO`.

  Pass it as ``is_leaf`` to tree functions so that a row-sparse gradient is
  one leaf rather than its ``data`` and ``indices``:
  ``jax.tree.leaves(grads, is_leaf=lars_optax.sparse.is_row_sparse)``.
  """
  return isinstance(x, BCOO)


def fingerprint(indices: jax.Array) -> jax.Array:
  """A uint32 digest of the row indices: ``sum_i h(indices[i])``, with ``h(0) != 0``.

  ``h`` mixes the bits (multiply, shift, xor), so the digest is not additive:
  the digest of ``i1 + i2`` (what ``jax.tree.map(jnp.add, g1, g2)`` makes of
  two gradients' indices) differs from the sum of their digests, except with
  a probability near 2**-32. Adding an all-zero tree (``optax.tree.zeros_like``)
  keeps it, as it keeps the rows. A scale that walks into the BCOO (a learning
  rate in (0, 1) cast to the int32 indices and to the digest) zeroes both, and
  the digest of zeroed indices is not zero: :func:`zeroed` tells such an update
  from ``optax.tree.zeros_like`` of one (whose values are zero too).
  """
  x = (jnp.asarray(indices).astype(jnp.uint32) + jnp.uint32(1)) * jnp.uint32(0x9E3779B1)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x85EBCA77)
  x = x ^ (x >> 13)
  return jnp.sum(x, dtype=jnp.uint32)


def zeroed(grad: BCOO) -> jax.Array:
  """True for ``optax.tree.zeros_like`` of a row-sparse leaf (indices, digest and
  values all zero): a no-op update on row 0, whose digest no longer matches."""
  digest = getattr(grad, "fingerprint", None)
  if digest is None:
    return jnp.zeros((), bool)
  return (digest == 0) & jnp.all(grad.indices == 0) & jnp.all(grad.data == 0)


def valid_rows(idx: jax.Array, num_rows: int) -> jax.Array:
  """Indices with every out-of-range entry replaced by ``num_rows`` (dropped)."""
  idx = idx.astype(jnp.int32) if jnp.iinfo(idx.dtype).bits < 32 else idx
  return jnp.where((idx >= 0) & (idx < num_rows), idx, num_rows)


def as_read(ids: jax.Array, num_rows: int) -> jax.Array:
  """The rows ``table[ids]`` reads: a negative id counts from the end, and an id
  past either end reads the row at that end (JAX clamps a gather's indices)."""
  ids = ids.astype(jnp.int32) if jnp.iinfo(ids.dtype).bits < 32 else ids
  ids = jnp.where(ids < 0, ids + num_rows, ids)
  return jnp.clip(ids, 0, num_rows - 1)


def combine(grad: BCOO, num_rows: int) -> tuple[jax.Array, jax.Array]:
  """(unique rows, summed values); unused slots get the index ``num_rows``."""
  idx = valid_rows(grad.indices[:, 0], num_rows)
  k = idx.shape[0]
  if grad.unique_indices or k <= 1:
    return idx, grad.data
  uniq, inverse = jnp.unique(idx, size=k, fill_value=num_rows, return_inverse=True)
  values = jax.ops.segment_sum(grad.data, inverse.reshape(-1), num_segments=k)
  return uniq, values


def with_values(grad: BCOO, values: jax.Array) -> BCOO:
  """``grad`` with other values: same type, flags, indices and index digest.

  (Rebuilding a :class:`RowSparseUpdate` from its indices would digest them
  anew, hiding a change the digest is there to catch.)
  """
  children, aux = grad.tree_flatten()
  return type(grad).tree_unflatten(aux, (values, *children[1:]))


def shape_view(tree: Any) -> Any:
  """``tree`` with each row-sparse leaf replaced by its :class:`jax.ShapeDtypeStruct`.

  For the checks written for dense trees (structure, shapes, dtypes).
  """
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if is_row_sparse(x) else x,
      tree, is_leaf=is_row_sparse)


def gather(x: jax.Array, rows: jax.Array) -> jax.Array:
  # Padding rows (index num_rows) read the last row; their results are dropped
  # by the scatter back, so the gather need not check bounds.
  x = jnp.asarray(x)  # a numpy leaf (a restored checkpoint) has no .at
  if x.shape[0] == 0:
    return jnp.zeros((rows.shape[0], *x.shape[1:]), x.dtype)
  return x.at[jnp.minimum(rows, x.shape[0] - 1)].get(mode="promise_in_bounds")
