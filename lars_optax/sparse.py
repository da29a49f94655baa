"""Row-sparse gradients: lazy steps that touch only the rows in the gradient.

MXNet sends an embedding table's gradient as a ``row_sparse`` array: the ids of
the rows a batch used and their gradient rows. With ``lazy_update=True`` an
optimizer then reads and writes only those rows, so a step costs
O(rows touched), not O(table). This module brings that to JAX with
:class:`jax.experimental.sparse.BCOO`, the ecosystem's sparse array:

* a gradient leaf may be a row-sparse BCOO, ``BCOO((values, indices),
  shape=param.shape)`` with ``values`` of shape ``(K, *param.shape[1:])`` and
  ``indices`` of shape ``(K, 1)`` (``n_batch == 0``, ``n_sparse == 1``, dense
  trailing dimensions). Repeated indices are summed;
* :func:`lars_optax.lazy_update`, ``adam(lazy_update=True)``,
  ``sgd(lazy_update=True)`` and ``create(..., lazy_update=True)`` take such
  leaves: they gather the K rows of the param and of every params-shaped
  state buffer, run the inner transformation on them and scatter them back.
  The update of a sparse leaf is row-sparse too, of the gradient's type (a
  :class:`RowSparseUpdate`, or a plain BCOO for a plain BCOO, so that
  :func:`optax.apply_if_finite` matches it), and
  ``optax.apply_updates(params, updates)`` adds it with a scatter, in O(K).
  Under ``jit`` with donated params and state, nothing the size of the table
  is allocated (XLA turns ``params + densified plain BCOO`` into the same
  scatter). :func:`~lars_optax.dense_updates` returns it as an array, for
  ``eqx.apply_updates``;
* :func:`sparse_value_and_grad` gives such gradients for unchanged models
  (Flax, Haiku, Equinox): it differentiates with respect to the rows a batch
  looks up, never the whole table;
* :func:`sparse_psum` sums gradient trees with row-sparse leaves over a
  ``pmap``/``shard_map`` axis (data parallelism).

A whole training loop (Flax linen; the other frameworks work the same way)::

  import jax, jax.numpy as jnp, numpy as np, optax
  import flax.linen as nn
  import lars_optax

  class Bag(nn.Module):  # an embedding bag: mean of the ids' rows, then a linear layer
    @nn.compact
    def __call__(self, ids):
      return nn.Dense(1)(nn.Embed(10_000, 16)(ids).mean(axis=1))[:, 0]

  model = Bag()
  params = model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
  tx = lars_optax.adam(1e-2, lazy_update=True)
  state = tx.init(params)

  def loss_fn(params, ids, y):
    return jnp.mean((model.apply({"params": params}, ids) - y) ** 2)

  # Gradients of the leaves named "embedding" come back as row-sparse BCOOs
  # holding at most 256 rows (the distinct ids of a batch of 32 x 4 ids: 128).
  grad_fn = lars_optax.sparse_value_and_grad(loss_fn, sparse="embedding", max_rows=256)

  @jax.jit
  def train_step(params, state, ids, y):
    loss, grads = grad_fn(params, ids, y)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  rng = np.random.default_rng(0)
  for step in range(20):
    ids = jnp.asarray(rng.zipf(1.3, size=(32, 4)) % 10_000, jnp.int32)
    y = jnp.asarray(rng.normal(size=32), jnp.float32)
    params, state, loss = train_step(params, state, ids, y)

With ``jax.jit(train_step, donate_argnums=(0, 1))`` the table, Adam's moments
and the step are updated in place.

Out-of-range indices (negative or > the number of rows) in a row-sparse
gradient raise a ValueError naming the leaf: at once outside ``jit``, at run
time under ``jit`` (a host callback in a ``lax.cond``, called only on error).
The index equal to the number of rows marks padding, as in BCOO's own padded
arrays (:func:`sparse_value_and_grad` pads with it). A generic optax
transformation or ``jax.tree.map`` walks into a BCOO and changes its indices:
use :func:`lars_optax.clip_by_global_norm`, :func:`lars_optax.multi_steps`
and :func:`lars_optax.tree_add` (see :mod:`lars_optax.sparse_optax`).

Inner transformations must be *row-wise*: every row of their output may depend
only on the same row of the gradient, params and state (Adam, SGD, momentum,
clipping by value, weight decay). A LARS trust ratio or a global-norm clip
needs the whole leaf; lazy_update checks the traced computation and raises a
ValueError naming the leaf instead of returning a different answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental.sparse import BCOO
from jax.extend import core as _jcore

from lars_optax import _row_wise
from lars_optax import _utils as utils
from lars_optax import masks

__all__ = [
    "RowSparseUpdate",
    "is_row_sparse",
    "row_sparse",
    "sparse_psum",
    "sparse_value_and_grad",
]


def is_row_sparse(x: Any) -> bool:
  """True for a :class:`jax.experimental.sparse.BCOO`.

  Pass it as ``is_leaf`` to tree functions so that a row-sparse gradient is
  one leaf rather than its ``data`` and ``indices``:
  ``jax.tree.leaves(grads, is_leaf=lars_optax.is_row_sparse)``.
  """
  return isinstance(x, BCOO)


def _fingerprint(indices: jax.Array) -> jax.Array:
  """A uint32 digest of the row indices: ``sum_i h(indices[i])`` with ``h(0) == 0``.

  ``h`` mixes the bits (multiply, shift, xor), so the digest is not additive:
  the digest of ``i1 + i2`` (what ``jax.tree.map(jnp.add, g1, g2)`` makes of
  two gradients' indices) differs from the sum of their digests, except with
  a probability near 2**-32. Adding an all-zero tree (``optax.tree.zeros_like``)
  keeps it, as it keeps the rows.
  """
  x = jnp.asarray(indices).astype(jnp.uint32) * jnp.uint32(0x9E3779B1)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x85EBCA77)
  x = x ^ (x >> 13)
  return jnp.sum(x, dtype=jnp.uint32)


@jax.tree_util.register_pytree_node_class
class RowSparseUpdate(BCOO):
  """A row-sparse BCOO, as lars_optax makes them: gradients and updates.

  :func:`sparse_value_and_grad`, :func:`row_sparse`, :func:`tree_add`,
  :func:`sparse_psum` and the lazy optimizers (for such a gradient) return
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
    self.fingerprint = _fingerprint(self.indices)

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
    ok = check_indices("a row-sparse update", self, other.shape[0], "apply_updates",
                       hint=_AFTER_HINT)
    wide = jnp.result_type(other.dtype, self.data.dtype)
    if wide == other.dtype:
      return other.at[self.indices[:, 0] + ok].add(self.data.astype(wide), mode="drop")
    # A wider update (float32 into a float16 table, as multi_precision makes):
    # the sums are formed in the wider dtype on the update's rows only and cast
    # back, so the table is never widened whole (optax.apply_updates would cast
    # the sum back to the table's dtype anyway).
    rows, values = _combine(self, other.shape[0])
    rows = rows + jnp.asarray(ok, rows.dtype)
    summed = _gather(other, rows).astype(wide) + values.astype(wide)
    return other.at[rows].set(summed.astype(other.dtype), mode="drop")

  def __radd__(self, other: Any) -> Any:
    if isinstance(other, BCOO):
      return super().__radd__(other)
    return self._scatter_add(other)

  def __add__(self, other: Any) -> Any:
    if isinstance(other, BCOO):
      return super().__add__(other)
    return self._scatter_add(other)


def row_sparse(values: jax.Array, rows: jax.Array, num_rows: int) -> RowSparseUpdate:
  """A row-sparse gradient: ``values[i]`` is the gradient of row ``rows[i]``.

  Returns ``BCOO((values, rows[:, None]), shape=(num_rows, *values.shape[1:]))``
  (a :class:`RowSparseUpdate`), the layout :func:`lars_optax.lazy_update`
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


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------


# What walks into a BCOO: the likely cause and the replacement, for the errors.
_BEFORE_HINT = (
    "A generic transformation over the whole gradient tree (optax.clip_by_global_norm, "
    "optax.clip, optax.scale, optax.MultiSteps, jax.tree.map) walks into a BCOO and "
    "changes its row indices as if they were values: use lars_optax.clip_by_global_norm, "
    "lars_optax.multi_steps and lars_optax.tree_add (to sum gradient trees), or apply "
    "the transformation to the dense leaves only (optax.masked).")
_AFTER_HINT = (
    "A generic transformation after the lazy optimizer (optax.scale, "
    "optax.scale_by_schedule, ...) or a jax.tree.map over the updates walks into a "
    "BCOO and changes its row indices as if they were values: put row-wise "
    "transformations inside the lazy wrapper, e.g. "
    "lars_optax.lazy_update(optax.chain(lars_optax.adam(lr), optax.scale(0.5))), or "
    "fold a constant factor into the learning rate.")
_ADDED_HINT = (
    "jax.tree.map(jnp.add, g1, g2) (and any tree.map over gradient trees, e.g. "
    "optax.tree.add or a hand-written accumulation) walks into a BCOO and adds the two "
    "gradients' row indices, so the values would land on other rows: sum gradient trees "
    "with lars_optax.tree_add(g1, g2), and accumulate micro-batches with "
    "lars_optax.multi_steps(tx, k).")


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


def check_indices(what: str, grad: BCOO, num_rows: int, where: str,
                  hint: str = _BEFORE_HINT) -> Any:
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
  fingerprint = getattr(grad, "fingerprint", None) if isinstance(grad, RowSparseUpdate) else None
  if fingerprint is not None and hasattr(fingerprint, "dtype"):
    if fingerprint.dtype != jnp.uint32 or np.shape(fingerprint) != ():
      raise TypeError(
          f"{where}: {what} is a row-sparse BCOO whose index digest is a "
          f"{fingerprint.dtype}{list(np.shape(fingerprint))} array, not a uint32 "
          f"scalar: a transformation walked into it. {hint}")
    changed = _fingerprint(idx) != fingerprint
    bad = bad | changed
  else:
    changed = jnp.zeros((), bool)

  def report(idx, changed):
    if changed:
      return (f"{where}: {what}: the row indices of this row-sparse BCOO were changed "
              f"after it was made. {_ADDED_HINT if hint is _BEFORE_HINT else hint}")
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
        "lars_optax.row_sparse(values, rows, num_rows).")
  if not jnp.issubdtype(grad.indices.dtype, jnp.integer):
    raise TypeError(
        f"{where}: gradient {name!r} has indices of dtype {grad.indices.dtype}; "
        f"row indices must be integers. {_BEFORE_HINT}")
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
  flat, treedef = jax.tree.flatten(tree, is_leaf=is_row_sparse)
  if not any(is_row_sparse(g) for g in flat):
    return
  names = _leaf_names(treedef)
  flat_p = _params_up_to(treedef, params)
  for name, g, p in zip(names, flat, flat_p):
    if is_row_sparse(g):
      if p is not None:
        check_row_sparse(name, g, p, where)
      raise ValueError(
          f"{where}: gradient {name!r} is row-sparse (a BCOO), which this optimizer "
          "cannot take: only row-wise lazy updates can (lars_optax.adam(..., "
          "lazy_update=True), lars_optax.sgd(..., lazy_update=True), adagrad, "
          "groupadagrad, ftrl, lars_optax.lazy_update(tx)). Otherwise pass the dense "
          "gradient (grad.todense()).")


def _leaf_names(treedef: Any) -> list[str]:
  return [n for n, _ in masks.named_leaves(jax.tree.unflatten(treedef, [0] * treedef.num_leaves))]


def _params_up_to(treedef: Any, params: Any) -> list[Any]:
  if params is None:
    return [None] * treedef.num_leaves
  try:
    return treedef.flatten_up_to(params)
  except (ValueError, TypeError):
    return [None] * treedef.num_leaves


# --------------------------------------------------------------------------
# Row-wise check of the inner transformation (on its traced computation)
# --------------------------------------------------------------------------

_ROWWISE = frozenset("""
abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp convert_element_type
copy copy_p cos cosh div eq erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite
le log log1p logistic lt max min mul ne neg nextafter not or pow real reduce_precision rem round
rsqrt select_n sign sin sinh sqrt square sub tan tanh xor stop_gradient optimization_barrier
""".split())  # noqa: SIM905  (element-wise primitives: row r of the output needs row r of the inputs)
_REDUCTIONS = frozenset(
    "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin".split())  # noqa: SIM905


class _NotRowWise(Exception):

  def __init__(self, leaves: frozenset, what: str):
    super().__init__(what)
    self.leaves, self.what = leaves, what


def _sub_jaxprs(params: dict) -> list[Any]:
  out = []
  for value in params.values():
    for item in (value if isinstance(value, (tuple, list)) else (value,)):
      if isinstance(item, _jcore.ClosedJaxpr):
        out.append(item.jaxpr)
      elif isinstance(item, _jcore.Jaxpr):
        out.append(item)
  return out


def _is_rowwise(eqn: Any) -> bool:
  """Element-wise, a reduction over other axes, or a broadcast that keeps axis 0."""
  name = eqn.primitive.name
  if name in _ROWWISE:
    return True
  if name in _REDUCTIONS:
    return 0 not in eqn.params.get("axes", (0,))
  if name == "broadcast_in_dim":
    return (not eqn.invars[0].aval.shape
            or tuple(eqn.params["broadcast_dimensions"][:1]) == (0,))
  return False


def _walk(jaxpr: Any, taints: list[frozenset]) -> list[frozenset]:
  """Propagates which sparse leaves each value depends on; raises if not row-wise."""
  env: dict[Any, frozenset] = {}
  empty: frozenset = frozenset()
  for var, t in zip(jaxpr.invars, taints):
    env[var] = t

  def read(v):
    return env.get(v, empty) if isinstance(v, _jcore.Var) else empty

  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    union = frozenset().union(*ins)
    name = eqn.primitive.name
    if union:
      subs = _sub_jaxprs(eqn.params)
      if _is_rowwise(eqn):
        pass
      elif name == "cond" and subs:
        for sub in subs:
          _walk(sub, ins[1:])
      elif len(subs) == 1 and len(subs[0].invars) == len(eqn.invars):
        outs = _walk(subs[0], ins)
        for var, t in zip(eqn.outvars, outs):
          env[var] = t
        continue
      else:
        raise _NotRowWise(union, name)
    for var in eqn.outvars:
      env[var] = union
  return [read(v) for v in jaxpr.outvars]


def _check_rowwise(closed: Any, taints: list[frozenset], where: str) -> None:
  try:
    _walk(closed.jaxpr, taints)
  except _NotRowWise as e:
    names = ", ".join(repr(n) for n in sorted(e.leaves))
    raise ValueError(
        f"{where}: gradient {names} is row-sparse, but the inner transformation "
        f"is not row-wise (its '{e.what}' mixes rows, as a LARS trust ratio or a "
        "global-norm clip does), so it cannot run on the gathered rows only. "
        "Use a row-wise optimizer (e.g. lars_optax.adam or lars_optax.sgd with "
        "lazy_update=True), or pass the dense gradient (grad.todense()).") from None


# --------------------------------------------------------------------------
# The lazy step on row-sparse leaves
# --------------------------------------------------------------------------


def _valid_rows(idx: jax.Array, num_rows: int) -> jax.Array:
  """Indices with every out-of-range entry replaced by ``num_rows`` (dropped)."""
  idx = idx.astype(jnp.int32) if jnp.iinfo(idx.dtype).bits < 32 else idx
  return jnp.where((idx >= 0) & (idx < num_rows), idx, num_rows)


def _combine(grad: BCOO, num_rows: int) -> tuple[jax.Array, jax.Array]:
  """(unique rows, summed values); unused slots get the index ``num_rows``."""
  idx = _valid_rows(grad.indices[:, 0], num_rows)
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


def unique_rows(grad: BCOO, num_rows: int) -> jax.Array:
  """The distinct rows of ``grad``; unused slots (and bad indices) get ``num_rows``."""
  return _combine(grad, num_rows)[0]


def gather_rows(x: jax.Array, rows: jax.Array) -> jax.Array:
  """``x[rows]``; a row ``x.shape[0]`` (padding) reads a row whose result is dropped."""
  return _gather(x, rows)


def shape_view(tree: Any) -> Any:
  """``tree`` with each row-sparse leaf replaced by its :class:`jax.ShapeDtypeStruct`.

  For the checks written for dense trees (structure, shapes, dtypes).
  """
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if is_row_sparse(x) else x,
      tree, is_leaf=is_row_sparse)


def _gather(x: jax.Array, rows: jax.Array) -> jax.Array:
  # Padding rows (index num_rows) read the last row; their results are dropped
  # by the scatter back, so the gather need not check bounds.
  x = jnp.asarray(x)  # a numpy leaf (a restored checkpoint) has no .at
  if x.shape[0] == 0:
    return jnp.zeros((rows.shape[0], *x.shape[1:]), x.dtype)
  return x.at[jnp.minimum(rows, x.shape[0] - 1)].get(mode="promise_in_bounds")


def _row_buffer_fields() -> dict[type, tuple[str, ...]]:
  """The row-wise fields of the states this library knows, by state type."""
  return {
      optax.ScaleByRssState: ("sum_of_squares",),
      optax.ScaleByAdamState: ("mu", "nu"),
      optax.TraceState: ("trace",),
      optax.EmaState: ("ema",),
      optax.ScaleByRmsState: ("nu",),
      optax.ScaleByRStdDevState: ("mu", "nu"),
      optax.ScaleByBeliefState: ("mu", "nu"),
      **_row_wise.row_wise_fields(),  # this library's states declare theirs
  }


def _has_rows(x: Any, shape: tuple) -> bool:
  """``x`` is an array whose leading axis has the rows of a param of ``shape``."""
  x_shape = getattr(x, "shape", None)
  return x_shape is not None and len(x_shape) >= 1 and len(shape) >= 1 and (
      x_shape[0] == shape[0])


def _params_shaped_leaves(node: Any, treedef: Any, shapes: list[tuple]) -> list[Any] | None:
  """``node`` split along the params' structure if it is a row-wise buffer, else None.

  A buffer holds, per leaf, an array whose leading axis is the param's rows:
  the param's shape (momentum, Adam's moments) or any other trailing axes
  (GroupAdaGrad's ``(rows, 1)`` accumulator). Wrappers such as
  :func:`lars_optax.multi_precision` or :func:`optax.masked` put an empty
  :class:`optax.MaskedNode` where they keep none.
  """
  try:
    subs = treedef.flatten_up_to(node)
  except (ValueError, TypeError):
    return None
  fits = all(isinstance(x, optax.MaskedNode) or _has_rows(x, sh) for x, sh in zip(subs, shapes))
  return subs if fits and any(hasattr(x, "shape") for x in subs) else None


def _buffers(state: Any, treedef: Any, shapes: list[tuple], fn: Callable, *rest: Any) -> Any:
  """Maps ``fn(buffer_leaves, *rest_leaves)`` over the row-wise buffers of ``state``.

  The buffers of the states listed in :func:`_row_buffer_fields` are their
  named fields (e.g. Adam's ``mu`` and ``nu``; not ``count``). Elsewhere they
  are found by structure: a subtree with the params' structure and, at each
  leaf, an array whose leading axis is the param's rows (whatever its other
  axes) or an empty :class:`optax.MaskedNode`
  (as optax, :func:`optax.masked` and :func:`lars_optax.multi_precision` keep
  them).
  """
  known = _row_buffer_fields()

  def subtrees(node):
    return _params_shaped_leaves(node, treedef, shapes)

  def buffer(node, *others):
    subs = subtrees(node)
    if subs is None:
      return node
    return jax.tree.unflatten(
        treedef, fn(subs, *[treedef.flatten_up_to(o) for o in others]))

  def visit(node, *others):  # a known state, a buffer or a leaf
    fields = known.get(type(node))
    if fields is None:
      return buffer(node, *others)
    return type(node)(*[
        (buffer if name in fields else walk)(value, *[getattr(o, name) for o in others])
        for name, value in zip(node._fields, node)])

  def walk(node, *others):
    return jax.tree.map(visit, node, *others, is_leaf=lambda n: (
        type(n) in known or subtrees(n) is not None))

  return walk(state, *rest)


def _ungathered(state: Any, gathered_leaves: list, row_counts: set[int]) -> list[str]:
  """The state leaves with a sparse leaf's rows on some axis that were not gathered."""
  flat = jax.tree_util.tree_flatten_with_path(state)[0]
  return [f"state{jax.tree_util.keystr(path)} (shape {tuple(leaf.shape)})"
          for (path, leaf), new in zip(flat, gathered_leaves)
          if hasattr(leaf, "shape") and tuple(leaf.shape) == tuple(np.shape(new))
          and row_counts.intersection(leaf.shape)]


def _ungathered_message(where: str, what: str, names: list[str], sparse: list[bool],
                        leaves: list[str]) -> str:
  grads = ", ".join(repr(n) for n, s in zip(names, sparse) if s)
  return (
      f"{where}: on the gathered rows of the row-sparse gradient {grads}, {what}. "
      f"These state leaves were not gathered with them: {', '.join(leaves[:5])}. "
      "A state leaf is gathered when its leading axis is the param's rows (whatever "
      "its other axes) and it sits in a subtree with the params' tree structure, as "
      "optax keeps its buffers. Keep row-wise buffers that way, or pass the dense "
      "gradient (grad.todense()).")


def _raise_ungathered(error: Exception, where: str, names: list[str], sparse: list[bool],
                      shapes: list[tuple], state: Any, gathered_leaves: list) -> None:
  """Raises a ValueError naming the state leaves not gathered, if any may be the cause."""
  leaves = _ungathered(state, gathered_leaves, {sh[0] for sh, s in zip(shapes, sparse) if s})
  if leaves:
    first = (str(error).strip() or type(error).__name__).splitlines()[0]
    raise ValueError(_ungathered_message(
        where, f"the inner transformation fails ({first})", names, sparse, leaves)) from error


def _check_gathered_shapes(out_avals: Sequence[Any], where: str, names: list[str],
                           sparse: list[bool], shapes: list[tuple], g_in: list,
                           state: Any, gathered_leaves: list) -> None:
  """The inner update keeps the shapes of the gathered rows.

  A state leaf left ungathered can broadcast with one gathered row into the
  whole table, which the scatter back would not notice.
  """
  if len(out_avals) != len(g_in) + len(gathered_leaves):
    return
  wrong = [f"the update of {n!r} has shape {tuple(a.shape)}, not {tuple(np.shape(g))}"
           for n, s, a, g in zip(names, sparse, out_avals, g_in)
           if s and tuple(a.shape) != tuple(np.shape(g))]
  wrong += [f"a state leaf has shape {tuple(a.shape)}, not {tuple(np.shape(x))}"
            for a, x in zip(out_avals[len(g_in):], gathered_leaves)
            if tuple(a.shape) != tuple(np.shape(x))]
  if wrong:
    leaves = _ungathered(state, gathered_leaves, {sh[0] for sh, s in zip(shapes, sparse) if s})
    raise ValueError(_ungathered_message(where, wrong[0], names, sparse, leaves or ["none"]))


class _Tag:
  """Stands for a state leaf in a tree of tags (a pytree leaf, unlike a frozenset of names)."""

  def __init__(self, leaves: frozenset):
    self.leaves = leaves


def _update_like(grad: BCOO, values: jax.Array, rows: jax.Array, num_rows: int) -> BCOO:
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
  """
  dtype = grad.indices.dtype
  if jnp.iinfo(dtype).max >= num_rows:
    rows = rows.astype(dtype)
  cls = RowSparseUpdate if isinstance(grad, RowSparseUpdate) else BCOO
  return cls((values, rows[:, None]), shape=grad.shape,
             indices_sorted=grad.indices_sorted, unique_indices=grad.unique_indices)


def lazy_update_sparse(inner_tx: Any, updates: Any, state: Any, params: Any,
                       extra_args: dict, dense_step: Callable, where: str) -> tuple[Any, Any]:
  """The lazy step on a gradient tree with row-sparse leaves (see the module doc).

  ``dense_step(new, old, grad)`` applies the dense lazy rule to a dense leaf:
  ``new`` on the rows present in ``grad``, ``old`` elsewhere.
  """
  if params is None:
    raise ValueError(f"{where}: params are required with row-sparse gradients; call "
                     "update(updates, state, params).")
  flat_g, treedef_ = jax.tree.flatten(updates, is_leaf=is_row_sparse)
  treedef: Any = treedef_
  try:
    flat_p = treedef.flatten_up_to(params)
  except (ValueError, TypeError):
    raise ValueError(f"{where}: gradients and params have different tree structures: "
                     f"{treedef} vs {jax.tree.structure(params)}.") from None
  # numpy params (flax.serialization.from_bytes, a checkpoint) are taken as the
  # dense optimizers take them: as jax arrays.
  flat_p = [jnp.asarray(p) if isinstance(p, np.ndarray) else p for p in flat_p]
  names = _leaf_names(treedef)
  sparse = [is_row_sparse(g) for g in flat_g]
  rows: list[Any] = []
  g_in: list[Any] = []
  p_in: list[Any] = []
  for name, g, p, s in zip(names, flat_g, flat_p, sparse):
    if s:
      ok = check_row_sparse(name, g, p, where)
      r, values = _combine(g, p.shape[0])
      r = r + jnp.asarray(ok, r.dtype)
      rows.append(r)
      g_in.append(values)
      p_in.append(_gather(p, r))
    else:
      rows.append(None)
      g_in.append(g)
      p_in.append(p)
  full_shapes = [tuple(np.shape(p)) for p in flat_p]
  row_shapes = [tuple(np.shape(x)) for x in p_in]

  def gather_bufs(bufs):
    return [b if r is None or isinstance(b, optax.MaskedNode) else _gather(b, r)
            for b, r in zip(bufs, rows)]

  state_in = _buffers(state, treedef, full_shapes, gather_bufs)
  g_tree, p_tree = jax.tree.unflatten(treedef, g_in), jax.tree.unflatten(treedef, p_in)

  # The inner transformation must be row-wise on the sparse leaves.
  tags = [frozenset([n]) if s else frozenset() for n, s in zip(names, sparse)]
  # State leaves are tagged through the buffers they belong to.
  state_tags = _buffers(state_in, treedef, row_shapes, lambda bufs: [
      b if isinstance(b, optax.MaskedNode) else _Tag(t) for b, t in zip(bufs, tags)])
  leaves_s, tdef_s = jax.tree.flatten(state_in)
  taint_s = [t.leaves if isinstance(t, _Tag) else frozenset()
             for t in jax.tree.leaves(state_tags, is_leaf=lambda x: isinstance(x, _Tag))]
  if len(taint_s) != len(leaves_s):  # (a structure we cannot label: check without it)
    taint_s = [frozenset()] * len(leaves_s)

  def traced(g_leaves, s_leaves, p_leaves):
    return inner_tx.update(jax.tree.unflatten(treedef, g_leaves),
                           jax.tree.unflatten(tdef_s, s_leaves),
                           jax.tree.unflatten(treedef, p_leaves), **extra_args)

  try:
    closed = jax.make_jaxpr(traced)(g_in, leaves_s, p_in)
  except (TypeError, ValueError) as e:
    _raise_ungathered(e, where, names, sparse, full_shapes, state, leaves_s)
    raise
  _check_gathered_shapes(closed.out_avals, where, names, sparse, full_shapes, g_in, state,
                         leaves_s)
  _check_rowwise(closed, [*tags, *taint_s, *tags], where)

  new_updates, new_state = inner_tx.update(g_tree, state_in, p_tree, **extra_args)
  flat_u = treedef.flatten_up_to(new_updates)

  def scatter_bufs(new_bufs, old_bufs):
    out = []
    for n, o, r, g in zip(new_bufs, old_bufs, rows, flat_g):
      if isinstance(n, optax.MaskedNode):
        out.append(n)
      elif r is None:
        out.append(dense_step(n, o, g))
      else:
        out.append(jnp.asarray(o).at[r].set(n.astype(o.dtype), mode="drop"))  # numpy too
    return out

  new_state = _buffers(new_state, treedef, row_shapes, scatter_bufs, state)
  out_updates = []
  for u, r, g, p in zip(flat_u, rows, flat_g, flat_p):
    if r is None:
      out_updates.append(dense_step(u, jnp.zeros_like(u), g))
    else:
      out_updates.append(_update_like(g, u, r, p.shape[0]))
  return jax.tree.unflatten(treedef, out_updates), new_state


# --------------------------------------------------------------------------
# Data parallelism
# --------------------------------------------------------------------------


def sparse_psum(tree: Any, axis_name: str, *, mean: bool = False) -> Any:
  """``lax.psum`` (or ``pmean``) of a gradient tree with row-sparse leaves.

  Dense leaves are summed with :func:`jax.lax.psum`. A row-sparse leaf is
  all-gathered: the result holds every replica's indices and values
  (``n_devices * K`` entries; duplicate rows are summed by the optimizer),
  which is the sum of the replicas' gradients. With ``mean=True`` the values
  are divided by the axis size (``lax.pmean``).

  Use it inside ``jax.pmap`` or ``shard_map`` over ``axis_name`` with the
  params (the table) replicated over that axis (data parallelism). Tables
  split along axis 0 over the axis are not supported: every replica would
  need the rows of the others.
  """

  n = utils.collective(jax.lax.psum, 1, axis_name)

  def one(x):
    if not is_row_sparse(x):
      out = utils.collective(jax.lax.psum, x, axis_name)
      return out / n if mean else out
    ok = check_indices("a row-sparse leaf", x, x.shape[0], "sparse_psum")
    data = utils.collective(lambda v, a: jax.lax.all_gather(v, a, tiled=True), x.data, axis_name)
    idx = utils.collective(lambda v, a: jax.lax.all_gather(v, a, tiled=True),
                           x.indices + jnp.asarray(ok, x.indices.dtype), axis_name)
    return RowSparseUpdate((data / n if mean else data, idx), shape=x.shape)

  return jax.tree.map(one, tree, is_leaf=is_row_sparse)


# --------------------------------------------------------------------------
# Row-sparse gradients from unchanged models
# --------------------------------------------------------------------------


class _Table:
  """A sparse leaf inside the interpreted loss: only row lookups may read it.

  ``dtype``: the dtype a cast (``convert_element_type``, as Flax's
  ``Embed(dtype=...)`` casts the whole table) gave it; the lookup reads the
  rows and casts them instead. ``value`` may be the table after ``pvary``
  (inside ``shard_map``), a change of type only.
  """

  def __init__(self, index: int, value: jax.Array, name: str, dtype: Any = None):
    self.index, self.value, self.name = index, value, name
    self.dtype = value.dtype if dtype is None else jnp.dtype(dtype)


def _bind(eqn: Any, invals: list) -> Any:
  """``eqn``'s primitive applied to ``invals`` (as ``jax.core.eval_jaxpr`` does)."""
  bind_params = eqn.primitive.get_bind_params(eqn.params)
  subfuns: Sequence[Any] = ()
  if isinstance(bind_params, tuple):  # (older JAX: (subfuns, params))
    subfuns, bind_params = bind_params
  with eqn.ctx.manager:
    return eqn.primitive.bind(*subfuns, *invals, **bind_params)


def _row_component(dnums: Any, slice_sizes: Sequence[int], shape: tuple) -> int | None:
  """Where a gather's index vectors hold the row, if the gather reads whole rows.

  A row lookup slices one row (``slice_sizes[0] == 1``) and every other
  dimension whole, so the only start index that matters is the row's.
  """
  if tuple(getattr(dnums, "operand_batching_dims", ())) or 0 not in dnums.start_index_map:
    return None
  if tuple(slice_sizes) != (1, *shape[1:]):
    return None
  return tuple(dnums.start_index_map).index(0)


def _dynamic_slice_as_gather(ndim: int) -> Any:
  """The dimension numbers of ``dynamic_slice`` (all start indices in one vector)."""
  return jax.lax.GatherDimensionNumbers(
      offset_dims=tuple(range(ndim)), collapsed_slice_dims=(), start_index_map=tuple(range(ndim)))


def _out_vma(eqn: Any) -> frozenset:
  """The mesh axes along which an equation's (first) result varies, from the jaxpr."""
  return utils.varying(eqn.outvars[0].aval)


def _gather_over(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
  """Every device's ``x`` along ``axes``, concatenated on axis 0, invariant over ``axes``.

  Each device writes its block into its slot of a zero buffer and a ``psum``
  adds them (an all-gather whose result the type system knows to be equal
  on every device, as the gradient of a replicated table is).
  """
  n = jax.lax.psum(1, axes)
  buf = jnp.zeros((n, *x.shape), x.dtype).at[jax.lax.axis_index(axes)].set(x)
  return jax.lax.psum(buf, axes).reshape(n * x.shape[0], *x.shape[1:])


class _Lookup(NamedTuple):
  leaf: int  # which sparse leaf
  rows: jax.Array  # the lookup's distinct rows, padded with num_rows
  vma: frozenset  # the mesh axes the looked-up rows vary along (inside shard_map)


def _too_many_rows(name: str, max_rows: int) -> Callable[..., str]:
  def report(rows, valid):
    distinct = int(np.unique(rows[valid]).size)
    return (f"max_rows: a lookup of {name!r} reads {distinct} distinct rows, more than "
            f"max_rows={max_rows}; raise max_rows, or leave it out (the default, the "
            "number of ids of each lookup, always suffices).")
  return report


class _Interpreter:
  """Evaluates a jaxpr where sparse leaves are read only through row lookups.

  Each lookup ``table[ids]`` becomes ``stop_gradient(table)[ids] +
  delta[slot(ids)]`` where ``delta`` is a zero array with one row per
  distinct id (``max_rows``, or the number of ids of the lookup): the value
  is unchanged and the gradient with respect to ``delta`` is the gradient of
  the looked-up rows, O(ids) to compute.
  """

  def __init__(self, max_rows: int | None, deltas: list | None):
    self.max_rows, self.deltas = max_rows, deltas
    self.lookups: list[_Lookup] = []

  def lookup(self, table: _Table, out: jax.Array, indices: jax.Array, dnums: Any,
             slice_sizes: Sequence[int], row: int, clip: bool, vma: frozenset) -> jax.Array:
    """``out`` (the lookup's value) plus the gathered rows of a new ``delta``."""
    n = table.value.shape[0]
    rows = indices[..., row]
    if clip:
      rows, valid = jnp.clip(rows, 0, n - 1), jnp.ones(rows.shape, bool)
    else:
      valid = (rows >= 0) & (rows < n)
    rows = jnp.where(valid, rows, n)
    # Without a bound, one row per id: never too few.
    size = self.max_rows or max(1, min(int(rows.size), n))
    uniq = jnp.unique(rows.reshape(-1), size=size, fill_value=n)
    slot = jnp.clip(jnp.searchsorted(uniq, rows), 0, size - 1)
    found = valid & (uniq[slot] == rows)
    if self.max_rows is not None:
      ok = raise_at_run_time(jnp.any(valid & ~found), _too_many_rows(table.name, size),
                             rows, valid)
      uniq = uniq + jnp.asarray(ok, uniq.dtype)
    k = len(self.lookups)
    self.lookups.append(_Lookup(table.index, uniq, vma))
    shape = (size, *table.value.shape[1:])
    delta = jnp.zeros(shape, table.value.dtype) if self.deltas is None else self.deltas[k]
    # The same gather on delta, with the row replaced by its slot (out of range,
    # so 0, where the id was not found) and the other (whole) dimensions at 0.
    new_idx = jnp.zeros_like(indices).at[..., row].set(
        jnp.where(found, slot, size).astype(indices.dtype))
    extra = jax.lax.gather(delta, new_idx, dnums, tuple(slice_sizes),
                           mode=jax.lax.GatherScatterMode.FILL_OR_DROP, fill_value=0)
    return out + extra.astype(out.dtype)

  def run(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    env: dict[Any, Any] = {}

    def read(v):
      return v.val if isinstance(v, _jcore.Literal) else env[v]

    for var, val in zip(jaxpr.constvars, consts):
      env[var] = val
    for var, val in zip(jaxpr.invars, args):
      env[var] = val
    for eqn in jaxpr.eqns:
      invals = [read(v) for v in eqn.invars]
      tables = [x for x in invals if isinstance(x, _Table)]
      ans = self.sparse_eqn(eqn, invals, tables[0]) if tables else _bind(eqn, invals)
      if eqn.primitive.multiple_results:
        for var, val in zip(eqn.outvars, ans):
          env[var] = val
      else:
        env[eqn.outvars[0]] = ans
    return [read(v) for v in jaxpr.outvars]

  def sparse_eqn(self, eqn: Any, invals: list, table: _Table) -> Any:
    name = eqn.primitive.name
    others_dense = all(not isinstance(x, _Table) for x in invals[1:])
    shape = table.value.shape
    if name == "gather" and invals[0] is table and others_dense:
      dnums, sizes = eqn.params["dimension_numbers"], eqn.params["slice_sizes"]
      row = _row_component(dnums, sizes, shape)
      if row is not None:
        out = _bind(eqn, [jax.lax.stop_gradient(table.value), invals[1]]).astype(table.dtype)
        clip = "CLIP" in str(eqn.params.get("mode"))
        return self.lookup(table, out, invals[1], dnums, sizes, row, clip, _out_vma(eqn))
    if name == "dynamic_slice" and invals[0] is table and others_dense and tuple(
        eqn.params["slice_sizes"]) == (1, *shape[1:]):
      # x[i] with a scalar i: a lookup of one row (dynamic_slice clamps).
      out = _bind(eqn, [jax.lax.stop_gradient(table.value), *invals[1:]]).astype(table.dtype)
      starts = jnp.stack([jnp.asarray(i, jnp.int32) for i in invals[1:]])
      return self.lookup(table, out, starts, _dynamic_slice_as_gather(len(shape)),
                         eqn.params["slice_sizes"], 0, True, _out_vma(eqn))
    if name in ("convert_element_type", "copy", "copy_p") and invals[0] is table:
      # A cast followed by a lookup is a lookup followed by a cast.
      new_dtype = eqn.params.get("new_dtype")
      if new_dtype is None or jnp.issubdtype(new_dtype, jnp.floating):
        return _Table(table.index, table.value, table.name, new_dtype or table.dtype)
    if name == "pvary":
      # shard_map (check_vma=True) marks a replicated table as varying before
      # it meets per-device ids: a change of type, applied to the table itself.
      outs = _bind(eqn, [x.value if isinstance(x, _Table) else x for x in invals])
      outs = list(outs) if eqn.primitive.multiple_results else [outs]
      outs = [_Table(x.index, o, x.name, x.dtype) if isinstance(x, _Table) else o
              for x, o in zip(invals, outs)]
      return outs if eqn.primitive.multiple_results else outs[0]
    subs = _sub_jaxprs(eqn.params)
    if len(subs) == 1 and len(subs[0].invars) == len(invals) and name not in (
        "cond", "scan", "while"):
      sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
      outs = self.run(subs[0], getattr(sub, "consts", ()), invals)
      return outs if eqn.primitive.multiple_results else outs[0]
    raise ValueError(
        f"sparse: the leaf {table.name!r} is used by '{name}', not only by row "
        "lookups (table[ids], jnp.take(table, ids, axis=0)), so its gradient is "
        "not row-sparse. Leave this leaf out of `sparse`.")


def _is_dynamic(x: Any) -> bool:
  """An argument ``jax.value_and_grad`` would hand on as an array (not a Python value)."""
  return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _by_name(name: str) -> masks.Mask:
  """A string ``sparse``: a leaf's full path (as leaf_names prints it) or last component."""
  return masks.by_predicate(
      lambda path, _: path == name or path.rsplit("/", 1)[-1] == name,
      f"full path or last name {name!r}")


def sparse_value_and_grad(
    fun: Callable[..., Any],
    sparse: masks.MaskLike,
    *,
    max_rows: int | None = None,
    argnums: int = 0,
    has_aux: bool = False,
) -> Callable[..., Any]:
  """Like :func:`jax.value_and_grad`, with chosen leaves' gradients row-sparse.

  ``sparse_value_and_grad(fun, sparse)(params, *args, **kwargs)`` returns
  ``(value, grads)`` (``((value, aux), grads)`` with ``has_aux``) where
  ``grads`` has the tree of ``params`` (the argument ``argnums``) and every
  leaf selected by ``sparse`` is a row-sparse :class:`RowSparseUpdate` (a
  :class:`~jax.experimental.sparse.BCOO`): the gradient with respect to the
  rows ``fun`` looks up. The other leaves get their ordinary dense gradients.
  The other arguments are passed as :func:`jax.value_and_grad` passes them:
  keyword arguments too, and Python values (a ``bool`` flag, a string) as
  they are, not traced.

  The model code stays as it is: ``fun`` is traced, and each lookup of a
  sparse leaf (``table[ids]``, ``jnp.take(table, ids, axis=0)``: the gathers
  that ``nn.Embed``, ``nnx.Embed``, ``hk.Embed`` and ``eqx.nn.Embedding``
  do) reads ``stop_gradient(table)[ids] + delta[slot(ids)]``, where ``delta``
  is a zero array with a row per distinct id and ``slot`` numbers the
  distinct ids of the lookup. The value is unchanged and the gradient flows
  into ``delta`` only: time and memory are O(ids x row), never O(table). A
  cast of the whole table before the lookup (``nn.Embed(...,
  dtype=jnp.bfloat16)``) becomes a cast of the rows. A sparse leaf used in
  any other way (a tied output projection, a weight penalty inside ``fun``)
  raises a ValueError naming it.

  Inside :func:`jax.shard_map` with ``check_vma=True`` (the default) the
  gradient of a replicated table is, as :func:`jax.grad`'s, the sum over the
  devices: every device's rows are gathered (``n_devices x`` the rows of one
  lookup) and the result is the same on every device. Do not
  :func:`sparse_psum` it again. With ``check_vma=False`` or under ``pmap``
  each device gets its own rows: sum them with :func:`sparse_psum`.

  Args:
    fun: the loss, ``fun(params, *args, **kwargs) -> scalar`` (or
      ``(scalar, aux)``).
    sparse: which leaves of ``params`` are looked up: a string matches a
      leaf's full path as :func:`lars_optax.leaf_names` prints it
      (``"Embed_0/embedding"``) or its last component (``"embedding"``); or a
      :class:`~lars_optax.masks.Mask`, a callable or a bool pytree, as
      elsewhere in lars_optax.
    max_rows: a static bound on the distinct rows of one lookup (one call of
      the embedding), for a smaller gradient than the default. Each lookup's
      gradient holds this many rows, the unused ones with the index
      ``num_rows`` (padding, ignored by the optimizers and by
      ``BCOO.todense``). More distinct rows raise a ValueError naming the
      leaf: at once outside ``jit``, at run time under ``jit`` (a host
      callback, called only when the bound is exceeded). ``None`` (the
      default): the number of ids of each lookup, never too few.
    argnums: the position of ``params`` among the arguments (an int).
    has_aux: as in :func:`jax.value_and_grad`.

  Returns:
    A function with the signature of ``fun`` returning ``(value, grads)``.
  """
  if max_rows is not None and (not isinstance(max_rows, (int, np.integer))
                               or isinstance(max_rows, bool) or max_rows < 1):
    raise ValueError(f"max_rows: expected an integer >= 1 or None, got {max_rows!r}.")
  if isinstance(argnums, bool) or not isinstance(argnums, (int, np.integer)):
    raise TypeError(f"argnums: expected an int (the position of the params), got {argnums!r}; "
                    "sparse_value_and_grad differentiates one argument.")
  if not isinstance(has_aux, (bool, np.bool_)):
    raise TypeError(f"has_aux: expected a bool, got {has_aux!r}.")
  if not callable(fun):
    raise TypeError(f"fun: expected a callable, got {type(fun).__name__}.")
  text = sparse if isinstance(sparse, str) else None
  if isinstance(sparse, str):
    sparse = _by_name(sparse)
  masks.check_mask_like(sparse, "sparse")
  max_rows = None if max_rows is None else int(max_rows)
  argnums = int(argnums)

  def wrapped(*args, **kwargs):
    if not -len(args) <= argnums < len(args):
      raise TypeError(f"argnums: {argnums} but the function was called with {len(args)} "
                      "positional arguments.")
    pos = argnums % len(args)
    params = args[pos]
    flat_p, treedef = jax.tree.flatten(params)
    chosen = masks.resolve_mask(sparse, params, "sparse")
    names = [n for n, _ in masks.named_leaves(params)]
    if not any(chosen):
      how = (f"the string {text!r} matches a leaf whose full path (as "
             "lars_optax.leaf_names prints it) or last path component equals it"
             if text is not None else "it")
      raise ValueError(f"sparse: selects no leaf of params ({how}); names: {names[:10]}.")
    for name, p, c in zip(names, flat_p, chosen):
      if c and np.ndim(p) == 0:
        raise ValueError(f"sparse: leaf {name!r} is 0-d; a row-sparse leaf needs rows.")
    # The other arguments: arrays are traced, Python values stay as they are.
    rest = (args[:pos] + args[pos + 1:], kwargs)
    rest_leaves, rest_def = jax.tree.flatten(rest)
    dynamic = [_is_dynamic(x) for x in rest_leaves]

    def call(params, *dyn):
      it = iter(dyn)
      leaves = [next(it) if d else x for x, d in zip(rest_leaves, dynamic)]
      others, kw = jax.tree.unflatten(rest_def, leaves)
      return fun(*others[:pos], params, *others[pos:], **kw)

    dyn_args = [x for x, d in zip(rest_leaves, dynamic) if d]
    closed, out_shape = jax.make_jaxpr(call, return_shape=True)(params, *dyn_args)
    flat_args = jax.tree.leaves(dyn_args)

    def evaluate(dense_leaves, interp):
      it = iter(dense_leaves)
      leaves = [_Table(i, p, n) if c else next(it)
                for i, (p, n, c) in enumerate(zip(flat_p, names, chosen))]
      return interp.run(closed.jaxpr, closed.consts, [*leaves, *flat_args])

    dense = [p for p, c in zip(flat_p, chosen) if not c]
    # A first, abstract pass counts the lookups (one delta each).
    probe = _Interpreter(max_rows, None)
    jax.eval_shape(lambda d: evaluate(d, probe), dense)

    def zeros(lk):
      p = flat_p[lk.leaf]
      z = jnp.zeros((lk.rows.shape[0], *p.shape[1:]), p.dtype)
      return utils.to_varying(z, tuple(sorted(lk.vma)))

    deltas = [zeros(lk) for lk in probe.lookups]
    interp = _Interpreter(max_rows, None)

    def loss(dense_leaves, deltas):
      interp.deltas = deltas
      interp.lookups = []
      outs = evaluate(dense_leaves, interp)
      rows = [lk.rows for lk in interp.lookups]
      return outs[0], (outs[1:], rows)

    (value, aux), (g_dense, g_deltas) = jax.value_and_grad(
        loss, argnums=(0, 1), has_aux=True)(dense, deltas)
    aux_leaves, rows = aux
    if has_aux:
      value = jax.tree.unflatten(jax.tree.structure(out_shape), [value, *aux_leaves])
    per_leaf: dict[int, list] = {}
    for lk, r, g in zip(probe.lookups, rows, g_deltas):
      # Inside shard_map, the rows of a replicated table's lookups vary over
      # the devices; its gradient is their sum: gather every device's rows.
      axes = tuple(sorted(lk.vma - utils.vma(flat_p[lk.leaf])))
      if axes:
        r, g = _gather_over(r, axes), _gather_over(g, axes)
      per_leaf.setdefault(lk.leaf, []).append((r, g))
    it = iter(g_dense)
    grads = []
    for i, (p, c) in enumerate(zip(flat_p, chosen)):
      if not c:
        grads.append(next(it))
        continue
      parts = per_leaf.get(i, [])
      if not parts:  # never looked up: an empty row-sparse gradient
        grads.append(RowSparseUpdate(
            (jnp.zeros((0, *p.shape[1:]), p.dtype), jnp.zeros((0, 1), jnp.int32)),
            shape=p.shape, unique_indices=True, indices_sorted=True))
        continue
      idx = jnp.concatenate([r for r, _ in parts])[:, None]
      data = jnp.concatenate([g for _, g in parts])
      single = len(parts) == 1 and not any(
          lk.vma - utils.vma(p) for lk in probe.lookups if lk.leaf == i)
      grads.append(RowSparseUpdate((data.astype(p.dtype), idx), shape=p.shape,
                                   unique_indices=single, indices_sorted=single))
    return value, jax.tree.unflatten(treedef, grads)

  return wrapped
