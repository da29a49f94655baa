"""Row helpers of the row-sparse path: which leaves are row-sparse, their rows and digests."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.sparse import BCOO

from lars_optax import _utils as utils


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


def astype(x: Any, dtype: Any) -> Any:
  """``x`` in ``dtype``; a row-sparse ``x``: its rows' values, its indices and digest kept."""
  if is_row_sparse(x):
    return with_values(x, x.data.astype(dtype))
  return x.astype(dtype)


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


def on_split_rows(fn: Any, x: jax.Array, *args: Any, out_spec: Any = None) -> Any:
  """``fn(x, *args)``; where ``x``'s type splits its rows over explicit mesh axes, run
  with the mesh's axes automatic (:func:`jax.sharding.auto_axes`).

  On an explicit mesh JAX asks a gather or scatter on a row-split array for its
  result's sharding, and ``table.at[ids].get(out_sharding=...)`` gathers the whole
  table first. Under automatic axes XLA reads (or writes) each device's own rows
  and combines the rows read, never the table. The results are typed with
  ``out_spec`` (a :class:`~jax.sharding.PartitionSpec` or a tree of them, one per
  result), by default as ``x``.
  """
  if not splits_rows(x):
    return fn(x, *args)
  sharding = jax.typeof(x).sharding
  out = jax.tree.map(lambda spec: jax.sharding.NamedSharding(sharding.mesh, spec),
                     sharding.spec if out_spec is None else out_spec,
                     is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
  return jax.sharding.auto_axes(fn, out_sharding=out)(x, *args)


def splits_rows(x: Any) -> bool:
  """Whether ``x``'s type splits its rows over explicit mesh axes."""
  split = utils.typed_sharding(x)
  return bool(split and split[0])


def typed_spec(x: Any) -> Any:
  """``x``'s :class:`~jax.sharding.PartitionSpec` where its type has one (explicit
  mesh axes), else None."""
  return jax.typeof(x).sharding.spec if utils.typed_sharding(x) else None


def gather(x: jax.Array, rows: jax.Array) -> jax.Array:
  """Rows ``rows`` of ``x``; a padding row (index ``num_rows``) reads the last row.

  Their results are dropped by the scatter back (:func:`scatter`), so the
  gather need not check bounds. A table split by rows over explicit mesh axes
  is read where it lies (see :func:`on_split_rows`).
  """
  x = jnp.asarray(x)  # a numpy leaf (a restored checkpoint) has no .at
  if x.shape[0] == 0:
    return jnp.zeros((rows.shape[0], *x.shape[1:]), x.dtype)
  by = (utils.typed_sharding(rows) or ((),))[0]  # the ids' split: the rows read keep it
  spec = tuple(typed_spec(x) or ())
  spec += (None,) * (x.ndim - len(spec))
  out_spec = jax.sharding.PartitionSpec(by if len(by) > 1 else by[0] if by else None,
                                        *spec[1:])
  return on_split_rows(
      lambda x, r: x.at[jnp.minimum(r, x.shape[0] - 1)].get(mode="promise_in_bounds"),
      x, rows, out_spec=out_spec)


def scatter(x: Any, rows: jax.Array, values: jax.Array, *, add: bool = False) -> jax.Array:
  """``x`` with ``values`` written to (``add``: added to) rows ``rows``; a row out of
  range (padding) is dropped. ``values`` are cast to ``x``'s dtype. A table split
  by rows over explicit mesh axes is written where it lies and stays split."""
  x = jnp.asarray(x)  # numpy too

  def write(x, r, v):
    at = x.at[r]
    v = v.astype(x.dtype)
    return at.add(v, mode="drop") if add else at.set(v, mode="drop")

  return on_split_rows(write, x, rows, values)


def gather_over(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
  """Every device's ``x`` along ``axes``, concatenated on axis 0, invariant over ``axes``.

  Each device writes its block into its slot of a zero buffer and a ``psum``
  adds them (an all-gather whose result the type system knows to be equal
  on every device, as the gradient of a replicated table is).
  """
  n = jax.lax.psum(1, axes)
  buf = jnp.zeros((n, *x.shape), x.dtype).at[jax.lax.axis_index(axes)].set(x)
  return jax.lax.psum(buf, axes).reshape(n * x.shape[0], *x.shape[1:])
