"""The row-sparse type: :class:`RowSparseUpdate`, :func:`row_sparse`, :func:`is_row_sparse`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.sparse import BCOO

from lars_optax.sparse import _checks, _rows


@jax.tree_util.register_pytree_node_class
class RowSparseUpdate(BCOO):
  """A row-sparse BCOO, as lars_optax makes them: gradients and updates.

  :func:`value_and_grad`, :func:`row_sparse`, :func:`tree_add`,
  :func:`psum` and the lazy optimizers (for such a gradient) return
  this :class:`~jax.experimental.sparse.BCOO` subclass. It differs from a
  BCOO in two ways:

  * ``dense + update`` (as :func:`optax.apply_updates` computes it) returns
    ``dense.at[indices[:, 0]].add(values, mode="drop")``: O(K) work, and in
    place under ``jit`` when ``dense`` is donated (a plain BCOO densifies,
    which XLA folds into the same scatter under ``jit`` only).
    When the update's dtype is the wider (float32 values for a float16
    table), the sum is formed in it on the update's rows and cast back to the
    table's dtype, which the result keeps: the table is never widened whole;
  * it carries a digest of its row indices (the pytree leaf
    ``fingerprint``). ``jax.tree.map`` walks into a BCOO, so
    ``jax.tree.map(jnp.add, g1, g2)`` adds the two gradients' *row
    indices*; the optimizers and ``apply_updates`` compare the digest and
    raise an error naming the leaf instead of updating the wrong rows (under
    ``jit`` at run time). Sum such trees with :func:`tree_add`.
  """

  # numpy defers to __radd__: ``numpy_params + update`` is the scatter-add too.
  __array_ufunc__ = None

  def __init__(self, args: tuple[Any, Any], *, shape: Sequence[int],
               indices_sorted: bool = False, unique_indices: bool = False):
    super().__init__(args, shape=shape, indices_sorted=indices_sorted,
                     unique_indices=unique_indices)
    self.fingerprint = _rows.fingerprint(self.indices)

  def tree_flatten(self) -> tuple[tuple[Any, Any, Any], dict]:
    return (self.data, self.indices, self.fingerprint), self._info._asdict()

  @classmethod
  def tree_unflatten(cls, aux_data: dict, children: Sequence[Any]) -> RowSparseUpdate:
    obj = object.__new__(cls)
    obj.data, obj.indices, obj.fingerprint = children
    obj.__dict__.update(**aux_data)
    return obj

  def _scatter_add(self, other: Any) -> Any:
    other = jnp.asarray(other)
    if other.shape != tuple(self.shape):
      return NotImplemented
    ok = _checks.check_indices("a row-sparse update", self, other.shape[0], "apply_updates",
                       hint=_checks.AFTER_HINT)
    wide = jnp.result_type(other.dtype, self.data.dtype)
    if wide == other.dtype:
      return _rows.scatter(other, self.indices[:, 0] + ok, self.data, add=True)
    # A wider update (float32 into a float16 table, as multi_precision makes):
    # the sums are formed in the wider dtype on the update's rows only and cast
    # back, so the table is never widened whole (optax.apply_updates would cast
    # the sum back to the table's dtype anyway).
    rows, values = _rows.combine(self, other.shape[0])
    rows = rows + jnp.asarray(ok, rows.dtype)
    summed = _rows.gather(other, rows).astype(wide) + values.astype(wide)
    return _rows.scatter(other, rows, summed)

  def __radd__(self, other: Any) -> Any:
    if isinstance(other, BCOO):
      return super().__radd__(other)
    return self._scatter_add(other)

  def __add__(self, other: Any) -> Any:
    if isinstance(other, BCOO):
      return super().__add__(other)
    return self._scatter_add(other)


def row_sparse(values: jax.Array, *, rows: jax.Array, num_rows: int) -> RowSparseUpdate:
  """A row-sparse gradient: ``values[i]`` is the gradient of row ``rows[i]``.

  Returns ``BCOO((values, rows[:, None]), shape=(num_rows, *values.shape[1:]))``
  (a :class:`RowSparseUpdate`), the layout :func:`lars_optax.sparse.lazy_update`
  takes. Repeated rows are summed by the optimizer; the index ``num_rows``
  marks padding.

  Raises:
    TypeError: for ``rows`` that are not integers (float indices would put the
      values on truncated rows), or a ``num_rows`` that is not an int.
  """
  rows = jnp.asarray(rows)
  if not jnp.issubdtype(rows.dtype, jnp.integer):
    raise TypeError(f"rows: expected integer row indices, got an array of {rows.dtype}; "
                    "cast them, e.g. rows.astype(jnp.int32).")
  if isinstance(num_rows, (bool, np.bool_)) or not isinstance(num_rows, (int, np.integer)):
    raise TypeError(f"num_rows: expected an int, got {num_rows!r}.")
  return RowSparseUpdate((jnp.asarray(values), rows.reshape(-1, 1)),
                         shape=(num_rows, *jnp.shape(values)[1:]))


def update_like(grad: BCOO, values: jax.Array, rows: jax.Array, num_rows: int,
                param: Any = None) -> BCOO:
  """The row-sparse update of ``grad``'s rows, with ``grad``'s pytree structure.

  Same type (a plain BCOO gradient gets a plain BCOO, a
  :class:`RowSparseUpdate` a :class:`RowSparseUpdate`), flags
  (``indices_sorted``, ``unique_indices``; the rows after summing duplicates
  keep them) and index dtype as the gradient, so that a wrapper that selects
  between the update and a zero tree of the gradient
  (:func:`optax.apply_if_finite`) sees one structure. ``params + update`` of
  a plain BCOO densifies the update; under ``jit`` XLA folds
  ``params + densified`` into an in-place scatter-add of the rows, so the
  step stays O(K) there (``benchmarks/sparse_embedding.py``).

  Where ``param`` is a numpy array (params restored from a checkpoint, taken
  eagerly) the update is a :class:`RowSparseUpdate` whatever the gradient:
  ``numpy_params + BCOO`` fails inside JAX's sparse rules, while a
  :class:`RowSparseUpdate` adds itself to numpy params (``optax.apply_updates``).
  """
  dtype = grad.indices.dtype
  if jnp.iinfo(dtype).max >= num_rows:
    rows = rows.astype(dtype)
  numpy_param = isinstance(param, np.ndarray)
  cls = RowSparseUpdate if isinstance(grad, RowSparseUpdate) or numpy_param else BCOO
  return cls((values, rows[:, None]), shape=grad.shape,
             indices_sorted=grad.indices_sorted, unique_indices=grad.unique_indices)
