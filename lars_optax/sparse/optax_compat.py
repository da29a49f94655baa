"""optax's tree-wide companions, for gradient trees with row-sparse leaves.

A generic optax transformation maps over the leaves of the gradient tree, and
a row-sparse :class:`~jax.experimental.sparse.BCOO` is a pytree of its values
*and its row indices*: ``optax.clip_by_global_norm`` would take the norm of the
indices too, ``optax.MultiSteps`` and ``jax.tree.map(jnp.add, g1, g2)`` would
add them. These do what their optax (and Equinox) counterparts do to the
equivalent dense gradients, in O(rows in the gradient):

* :func:`tree_add` sums gradient trees (micro-batches by hand): a row-sparse
  leaf's sum holds the entries of both (duplicates are summed by the
  optimizer, as for any row-sparse gradient);
* :func:`clip_by_global_norm` takes the global norm over the dense leaves and
  the row-sparse leaves' values, with repeated rows summed first;
* :func:`multi_steps` accumulates ``k`` micro-batches, as
  :class:`optax.MultiSteps`, keeping the ``k x nse`` entries of a row-sparse
  leaf (O(k x rows of one gradient)), never a table-sized buffer;
* :func:`apply_updates` applies updates to a whole model, as
  ``eqx.apply_updates`` does, row-sparse updates included;
* :func:`dense_updates` turns a lazy optimizer's row-sparse updates into
  arrays, for code that maps over the updates first (``eqx.apply_updates``).

docs/sparse.md's example of gradient accumulation and clipping (``tree_add``,
and ``multi_steps`` around ``clip_by_global_norm``) runs as written in its test.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental.sparse import BCOO
from optax import GradientTransformation, GradientTransformationExtraArgs

from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax.sparse import _checks, _grad, _rows, _types

__all__ = ["MultiStepsState", "apply_updates", "clip_by_global_norm", "dense_updates",
           "multi_steps", "tree_add"]


def _like(grad: BCOO, values: jax.Array, indices: jax.Array) -> BCOO:
  """A BCOO of ``grad``'s type and flags with other values (and indices)."""
  cls = _types.RowSparseUpdate if isinstance(grad, _types.RowSparseUpdate) else BCOO
  return cls((values, indices), shape=grad.shape, indices_sorted=grad.indices_sorted,
             unique_indices=grad.unique_indices)


def _checked_indices(what: str, grad: BCOO, where: str) -> jax.Array:
  """``grad``'s indices after the checks of ``check_indices``."""
  if grad.n_batch != 0 or grad.n_sparse != 1:
    raise ValueError(f"{where}: {what} is a BCOO with n_batch={grad.n_batch}, "
                     f"n_sparse={grad.n_sparse}; a row-sparse leaf has indices of shape (K, 1).")
  ok = _checks.check_indices(what, grad, grad.shape[0], where)
  return grad.indices + jnp.asarray(ok, grad.indices.dtype)


def tree_add(*trees: Any) -> Any:
  """``optax.tree.add`` for gradient trees with row-sparse leaves.

  Dense leaves are added. Row-sparse leaves (at the same place in every
  tree) are concatenated: the sum of ``K1``- and ``K2``-entry gradients holds
  ``K1 + K2`` entries, which is their sum, since the optimizers and
  ``BCOO.todense`` sum repeated rows. Unlike ``jax.tree.map(jnp.add, g1,
  g2)``, which adds the *row indices* of two BCOOs, this is the sum of the
  gradients. The result's row-sparse leaves are
  :class:`~lars_optax.sparse.RowSparseUpdate` arrays.

  Raises a ValueError naming the leaf where one tree has a row-sparse leaf
  and another a dense one, or their shapes differ.
  """
  if not trees:
    raise TypeError("tree_add: expected at least one tree.")

  def add(path, *leaves):
    sparse = [_rows.is_row_sparse(x) for x in leaves]
    if not any(sparse):
      return functools.reduce(operator.add, leaves)
    name = masks.path_to_name(path) or "<root>"
    if not all(sparse):
      raise ValueError(
          f"tree_add: leaf {name!r} is row-sparse in some trees and dense in others; "
          "densify the row-sparse ones (x.todense()) or make all of them row-sparse.")
    if len({tuple(x.shape) for x in leaves}) != 1:
      raise ValueError(f"tree_add: leaf {name!r} has shapes "
                       f"{[tuple(x.shape) for x in leaves]} in the trees.")
    indices = [_checked_indices(f"leaf {name!r}", x, "tree_add") for x in leaves]
    dtype = jnp.result_type(*[x.data.dtype for x in leaves])
    return _types.RowSparseUpdate(
        (jnp.concatenate([x.data.astype(dtype) for x in leaves]),
         jnp.concatenate([i.astype(jnp.result_type(*indices)) for i in indices])),
        shape=leaves[0].shape)

  return jax.tree_util.tree_map_with_path(add, *trees, is_leaf=_rows.is_row_sparse)


def apply_updates(model: Any, updates: Any) -> Any:
  """``optax.apply_updates`` for whole models, row-sparse updates included.

  Takes what ``eqx.apply_updates(model, updates)`` takes: ``updates`` is a
  prefix of ``model`` (an Equinox model, a Flax or Haiku params dict), a
  ``None`` update leaves its leaf alone (Equinox's filtered trees hold ``None``
  for the activation functions and other non-arrays), and every other leaf
  becomes ``p + u`` cast to ``p``'s dtype, as in ``optax.apply_updates``. A
  row-sparse update (a :class:`~lars_optax.sparse.RowSparseUpdate`, what a lazy
  optimizer returns for a row-sparse gradient) is added to its rows by a
  scatter, in O(rows).

  ``eqx.apply_updates`` itself cannot take a row-sparse update: it maps over
  the updates first, and a row-sparse update is a pytree node (so that it can
  leave ``jit`` and pass through ``lax.cond``) where the model holds an array.

  An Equinox model with a row-sparse gradient:

  >>> import equinox as eqx, jax, jax.numpy as jnp, lars_optax
  >>> model = eqx.nn.Embedding(100, 8, key=jax.random.key(0))
  >>> tx = lars_optax.mxnet.adam(1e-2, lazy_update=True)
  >>> state = tx.init(eqx.filter(model, eqx.is_array))
  >>> rows = lars_optax.sparse.row_sparse(jnp.ones((2, 8)), rows=jnp.array([3, 7]),
  ...                                     num_rows=100)
  >>> grads = eqx.tree_at(lambda m: m.weight, model, rows)
  >>> updates, state = tx.update(grads, state, eqx.filter(model, eqx.is_array))
  >>> new = lars_optax.sparse.apply_updates(model, updates)
  >>> [int(i) for i in jnp.nonzero((new.weight != model.weight).any(axis=1))[0]]
  [3, 7]
  """

  def apply(u: Any, p: Any) -> Any:
    if u is None:
      return p
    if _rows.is_row_sparse(u):  # (numpy + BCOO fails inside JAX's sparse rules)
      p = jnp.asarray(p)
    return jnp.asarray(p + u).astype(jnp.asarray(p).dtype)

  flat_u, treedef_ = jax.tree.flatten(
      updates, is_leaf=lambda x: x is None or _rows.is_row_sparse(x))
  treedef: Any = treedef_  # (jax's stubs do not describe flatten_up_to)
  try:
    flat_p = treedef.flatten_up_to(model)
  except (ValueError, TypeError) as e:
    raise ValueError(f"apply_updates: the updates' tree is not a prefix of the model's: "
                     f"{e}") from None
  return jax.tree.unflatten(treedef, [apply(u, p) for u, p in zip(flat_u, flat_p)])


def _densify(u: Any) -> Any:
  """A row-sparse update as the dense array it stands for (others unchanged)."""
  if not _rows.is_row_sparse(u):
    return u
  if isinstance(u, _types.RowSparseUpdate):  # (its indices are checked, as when applied)
    return jnp.zeros(u.shape, u.dtype) + u  # RowSparseUpdate.__radd__: a scatter-add
  return u.todense()


@v.keyword_hints({})
def dense_updates(inner: GradientTransformation) -> GradientTransformationExtraArgs:
  """``inner`` with its row-sparse updates returned as dense arrays.

  A lazy optimizer's update of a row-sparse gradient is row-sparse (a
  :class:`~jax.experimental.sparse.BCOO`, a pytree node, so that it can leave
  ``jit`` and pass through ``lax.cond``). Code that maps over the *updates*
  first and adds each leaf to the matching param needs an array there:
  ``eqx.apply_updates(model, updates)``, or a hand-written
  ``jax.tree.map(lambda u, p: p + u, updates, params)``. This wrapper gives
  it one: each row-sparse update leaf becomes
  ``zeros(shape).at[rows].add(values)``; dense leaves and the state are
  ``inner``'s, unchanged.

  Cost: inside one ``jit`` with the apply, XLA folds ``params + update`` into
  a scatter-add of the update's rows into ``params`` (in place when the
  params are donated), so the step costs what the row-sparse update costs
  and has no table-sized temporary (``benchmarks/sparse_embedding.py``,
  ``tests/test_sparse_optax.py``). An update that leaves the ``jit`` is a
  table-sized array: keep the row-sparse update there and apply it with
  ``optax.apply_updates`` or :func:`apply_updates`. The update keeps its
  dtype: under ``multi_precision`` it is float32, and ``eqx.apply_updates``
  then widens a float16 param to float32 (as for any ``multi_precision``
  update); ``optax.apply_updates`` and :func:`apply_updates` cast back.

  An Equinox model, applied with ``eqx.apply_updates``:

  >>> import equinox as eqx, jax, jax.numpy as jnp, lars_optax
  >>> model = eqx.nn.Embedding(100, 8, key=jax.random.key(0))
  >>> tx = lars_optax.sparse.dense_updates(lars_optax.mxnet.adam(1e-2, lazy_update=True))
  >>> state = tx.init(eqx.filter(model, eqx.is_array))
  >>> @eqx.filter_jit(donate="all")
  ... def step(model, state, grads):
  ...   updates, state = tx.update(grads, state, eqx.filter(model, eqx.is_array))
  ...   return eqx.apply_updates(model, updates), state
  >>> rows = lars_optax.sparse.row_sparse(jnp.ones((2, 8)), rows=jnp.array([3, 7]),
  ...                                     num_rows=100)
  >>> model, state = step(model, state, eqx.tree_at(lambda m: m.weight, model, rows))
  >>> start = eqx.nn.Embedding(100, 8, key=jax.random.key(0)).weight  # (the old was donated)
  >>> [int(i) for i in jnp.nonzero((model.weight != start).any(axis=1))[0]]
  [3, 7]

  Args:
    inner: the optimizer, typically a lazy one (``lazy_update=True``,
      ``create("adagrad")``, :func:`lazy_update`).

  Returns:
    A :class:`optax.GradientTransformationExtraArgs` with ``inner``'s state.
  """
  if not isinstance(inner, GradientTransformation):
    raise TypeError(f"dense_updates: `inner` must be an optax GradientTransformation, got "
                    f"{type(inner).__name__}.")
  inner_tx = optax.with_extra_args_support(inner)

  def update_fn(updates, state, params=None, **extra_args):
    updates, state = inner_tx.update(updates, state, params, **extra_args)
    return jax.tree.map(_densify, updates, is_leaf=_rows.is_row_sparse), state

  return GradientTransformationExtraArgs(inner_tx.init, update_fn)


def _sum_sq(x: Any) -> jax.Array:
  """The squared norm of a dense leaf, or of a row-sparse leaf's dense equivalent."""
  # In float32 or wider: a float16 gradient of 4096 entries of 4 has a norm of
  # 256, but its sum of squares (65536) overflows float16.
  if not _rows.is_row_sparse(x):
    return jnp.sum(utils.abs_sq(x.astype(utils.norm_dtype(x.dtype))))
  num_rows = x.shape[0]
  rows, values = _rows.combine(x, num_rows)  # repeated rows summed
  keep = (rows < num_rows).reshape((-1,) + (1,) * (values.ndim - 1))  # padding: not in the array
  values = values.astype(utils.norm_dtype(values.dtype))
  return jnp.sum(jnp.where(keep, utils.abs_sq(values), 0))


def _split_sum(sq: jax.Array, axes: frozenset) -> jax.Array:
  """``sq`` summed over the mesh ``axes`` a leaf is split over (where it varies)."""
  axes = axes & utils.vma(sq)
  return jax.lax.psum(sq, tuple(sorted(axes))) if axes else sq


def _devices_agree(what: str) -> Callable[..., str]:
  def report(lo, hi):
    return (f"clip_by_global_norm: inside shard_map with check_vma=False (or pmap) the "
            f"devices' {what} differ ({float(lo):g} to {float(hi):g}), and without types "
            "the clip cannot tell a leaf split across devices from a replicated one, so "
            "each device would clip by its own part's norm. Run shard_map with "
            "check_vma=True (its default: each leaf's type says where it is split), pass "
            "axis_name= the mesh axis every leaf is split over, or average the gradients "
            "over the data axis first (lax.pmean).")
  return report


def _typed_manual_axes() -> tuple[tuple[str, ...], bool]:
  """The enclosing shard_map/pmap's axes, and whether values carry their varying axes."""
  axes = utils.manual_axes()
  return axes, bool(axes) and bool(utils.vma(jax.lax.axis_index(axes[0])))


@v.keyword_hints({})
def clip_by_global_norm(max_norm: float, *,
                        axis_name: v.AxisNameLike = None) -> GradientTransformation:
  r"""``optax.clip_by_global_norm`` for gradient trees with row-sparse leaves.

  .. math::

    g \leftarrow g \cdot \min\left(1, \frac{\text{max\_norm}}{\lVert g \rVert}\right),
    \qquad \lVert g \rVert^2 = \sum_{\text{dense } x} \lVert x \rVert^2
      + \sum_{\text{row-sparse } x} \lVert \mathrm{todense}(x) \rVert^2

  where a row-sparse leaf's norm is that of its dense equivalent: repeated
  rows are summed first, and the padding index (the number of rows) holds
  nothing. Values are scaled, indices kept, in O(entries). On dense
  gradients this is ``optax.clip_by_global_norm``. Chain it before a lazy
  optimizer: ``optax.chain(lars_optax.sparse.clip_by_global_norm(1.0),
  lars_optax.mxnet.adam(lr, lazy_update=True))``.

  Inside ``shard_map`` (with ``check_vma``, its default), when ``update`` is
  given the params, a leaf's squared norm is summed over the mesh axes that its
  param varies over: a leaf split across devices, by features or by layers,
  counts whole, and a replicated one once, so the norm is the one-device norm.
  (``optax.clip_by_global_norm`` takes each device's part alone.) Outside
  ``shard_map`` nothing is summed. With ``check_vma=False`` (or under
  ``pmap``) the types say nothing: with ``axis_name`` every leaf's squared
  norm is summed over that axis (every leaf split over it, as the layer-wise
  rules' ``axis_name`` means), or, given per leaf (``{leaf name: axis}`` or
  ``[(mask, axis)]`` rules, as the layer-wise rules take it), over each leaf's
  own axis, a leaf without one counted once (replicated); without it the
  devices' norms must agree (the gradients replicated, e.g. after
  ``lax.pmean``), or the step raises an error at run time rather than clip each
  device by its own part.

  Args:
    max_norm: the largest global norm kept (> 0).
    axis_name: the mesh axis every leaf is split over, or one per leaf, for
      ``shard_map`` with ``check_vma=False``; with ``check_vma`` the leaves'
      types are used.

  Returns:
    A stateless :class:`optax.GradientTransformation`.
  """
  v.check_scalar("max_norm", max_norm, low=0.0, low_open=True)
  v.check_axis_names(axis_name)

  def update_fn(updates, state, params=None):
    treedef = jax.tree.structure(updates, is_leaf=_rows.is_row_sparse)
    leaves = treedef.flatten_up_to(updates)
    for x in leaves:
      if _rows.is_row_sparse(x):
        _checked_indices("a row-sparse gradient", x, "clip_by_global_norm")
    split = [frozenset()] * len(leaves)
    if params is not None and any(utils.vma(x.data if _rows.is_row_sparse(x) else x)
                                  for x in leaves):  # inside shard_map
      try:
        split = [utils.vma(p) for p in treedef.flatten_up_to(params)]
      except (ValueError, TypeError) as e:
        raise ValueError("clip_by_global_norm: params must have the gradients' tree "
                         f"structure: {e}") from None
    manual, typed = _typed_manual_axes()
    if manual and not typed and isinstance(axis_name, str):  # every leaf split over it
      sq = utils.psum(sum((_sum_sq(x) for x in leaves), jnp.zeros((), jnp.float32)), axis_name)
    elif manual and not typed and axis_name is not None:  # each leaf over its own axis
      shapes = treedef.unflatten([jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves])
      axes = v.resolve_axis_names(axis_name, shapes)
      sq = sum((_sum_sq(x) if a is None else utils.psum(_sum_sq(x), a)
                for x, a in zip(leaves, axes)), jnp.zeros((), jnp.float32))
    else:
      sq = sum((_split_sum(_sum_sq(x), axes) for x, axes in zip(leaves, split)),
               jnp.zeros((), jnp.float32))
    if manual and not typed and axis_name is None:  # no types: the devices must agree
      lo, hi = jax.lax.pmin(sq, manual), jax.lax.pmax(sq, manual)
      ok = _checks.raise_at_run_time(hi > lo, _devices_agree("gradient norms"), lo, hi)
      sq = sq + jnp.asarray(ok, sq.dtype)
    g_norm = jnp.sqrt(sq)
    trigger = g_norm < max_norm

    def clip(x):
      values = x.data if _rows.is_row_sparse(x) else x
      wide = values.astype(utils.norm_dtype(values.dtype))  # a float16 norm may not fit float16
      out = jnp.where(trigger, wide, (wide / g_norm.astype(wide.dtype)) * max_norm)
      out = out.astype(values.dtype)
      return _like(x, out, x.indices) if _rows.is_row_sparse(x) else out

    return jax.tree.map(clip, updates, is_leaf=_rows.is_row_sparse), state

  return GradientTransformation(lambda params: optax.EmptyState(), update_fn)


class MultiStepsState(NamedTuple):
  """The state of :func:`multi_steps`.

  The fields of :class:`optax.MultiStepsState`. ``acc_grads`` has the params'
  tree: the sum of the micro-batch gradients for a dense leaf, a ``(values,
  indices)`` pair of ``k x nse`` entries for a row-sparse one. ``skip_state``
  is what ``should_skip_update_fn`` returned last (``()`` without one).
  """

  mini_step: jax.Array
  gradient_step: jax.Array
  inner_opt_state: Any
  acc_grads: Any
  skip_state: Any = ()


@v.keyword_hints({})
def multi_steps(
    opt: GradientTransformation,
    *,
    every_k_schedule: int | Callable[[jax.Array], jax.Array],
    sparse: masks.MaskLike = None,
    nse: int | None = None,
    use_grad_mean: bool = True,
    should_skip_update_fn: Callable[..., tuple[Any, Any]] | None = None,
) -> GradientTransformationExtraArgs:
  r"""``optax.MultiSteps`` for gradient trees with row-sparse leaves.

  Accumulates the gradients of ``k`` calls (``k = every_k_schedule`` or
  ``every_k_schedule(gradient_step)``); the ``k``-th call passes their mean
  (their sum with ``use_grad_mean=False``) to ``opt`` and returns its
  updates, the other calls return zero updates and leave ``opt``'s state as
  it is. This is :class:`optax.MultiSteps`'s rule (``optax.MultiSteps(opt,
  k).gradient_transformation()``), and on dense gradients the two agree.

  A row-sparse leaf (selected by ``sparse``) is accumulated as its entries:
  a buffer of ``k x nse`` values and row indices, filled ``nse`` at a time,
  so its memory is O(k x nse x row), independent of the table's size. The
  ``k``-th call hands ``opt`` a row-sparse gradient of all ``k x nse``
  entries (repeated rows are summed by the optimizer).

  Args:
    opt: the transformation to apply every ``k`` calls.
    every_k_schedule: ``k`` (an int >= 1), or a function of the number of
      updates made so far returning ``k`` (dense gradients only: a row-sparse
      buffer needs a fixed ``k``).
    sparse: which leaves get row-sparse gradients (a leaf name, a full path,
      a :class:`~lars_optax.masks.Mask`, as in
      :func:`lars_optax.sparse.value_and_grad`); ``None`` for none.
    nse: the number of entries (``grad.nse``) of one micro-batch's
      row-sparse gradient of each selected leaf; every call must give that
      many (``value_and_grad`` without ``max_rows`` gives the number
      of ids of the batch).
    use_grad_mean: pass the mean of the ``k`` gradients (else their sum).
    should_skip_update_fn: as optax's: ``fn(updates, gradient_step, params)``
      returns ``(should_skip, skip_state)``; a skipped call returns zero
      updates and leaves the state as it was but for ``skip_state``.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs` with a
    :class:`MultiStepsState`.
  """
  fixed_k, sparse = _check_multi_steps(opt, every_k_schedule, sparse, nse, use_grad_mean,
                                       should_skip_update_fn)
  inner = optax.with_extra_args_support(opt)

  def k_steps(gradient_step):
    k = fixed_k if fixed_k is not None else every_k_schedule(gradient_step)
    return jnp.asarray(k, jnp.int32)

  def init_fn(params):
    flat, treedef = jax.tree.flatten(params)
    chosen = ([False] * len(flat) if sparse is None
              else masks.resolve_mask(sparse, params, "sparse"))
    acc = [_empty_buffer(p, fixed_k, nse) if c else jnp.zeros_like(p)
           for p, c in zip(flat, chosen)]
    state = MultiStepsState(mini_step=jnp.zeros([], jnp.int32),
                            gradient_step=jnp.zeros([], jnp.int32),
                            inner_opt_state=inner.init(params),
                            acc_grads=jax.tree.unflatten(treedef, acc))
    if should_skip_update_fn is None:
      return state
    zeros = jax.tree.map(jnp.zeros_like, params)
    _, skip_state = jax.eval_shape(should_skip_update_fn, zeros, state.gradient_step, params)
    return state._replace(skip_state=optax.tree_utils.tree_zeros_like(skip_state))

  def accumulate(updates, state, params=None, **extra_args):
    flat_g, treedef = jax.tree.flatten(updates, is_leaf=_rows.is_row_sparse)
    names = _checks.leaf_names_of(treedef)
    acc = [_add_micro_batch(name, g, a, state.mini_step, nse)
           for name, g, a in zip(names, flat_g, treedef.flatten_up_to(state.acc_grads))]
    k = k_steps(state.gradient_step)
    emit = state.mini_step == k - 1

    def do_emit(inner_state):
      grads = [_mean_of(g, a, k, use_grad_mean) for g, a in zip(flat_g, acc)]
      return inner.update(jax.tree.unflatten(treedef, grads), inner_state, params,
                          **extra_args)

    def skip(inner_state):
      shapes, _ = jax.eval_shape(do_emit, inner_state)
      return optax.tree_utils.tree_zeros_like(shapes), inner_state

    new_updates, inner_state = jax.lax.cond(emit, do_emit, skip, state.inner_opt_state)
    return new_updates, MultiStepsState(
        mini_step=jnp.where(emit, 0, state.mini_step + 1).astype(jnp.int32),
        gradient_step=jnp.where(emit, state.gradient_step + 1,
                                state.gradient_step).astype(jnp.int32),
        inner_opt_state=inner_state,
        acc_grads=jax.tree.unflatten(treedef, [_emptied(g, a, emit) for g, a in zip(flat_g, acc)]),
        skip_state=state.skip_state)

  def update_fn(updates, state, params=None, **extra_args):
    if should_skip_update_fn is None:
      return accumulate(updates, state, params, **extra_args)
    should_skip, skip_state = should_skip_update_fn(updates, state.gradient_step, params)
    run = lambda s: accumulate(updates, s, params, **extra_args)

    def skipped(state):
      shapes, _ = jax.eval_shape(run, state)
      return optax.tree_utils.tree_zeros_like(shapes), state

    new_updates, new_state = jax.lax.cond(should_skip, skipped, run, state)
    return new_updates, new_state._replace(skip_state=skip_state)

  return GradientTransformationExtraArgs(init_fn, update_fn)


class _SparseBuffer(NamedTuple):
  """A row-sparse leaf's accumulator: ``k x nse`` values and their rows (padding: num_rows)."""

  values: jax.Array
  rows: jax.Array


def _check_multi_steps(opt, every_k_schedule, sparse, nse, use_grad_mean, should_skip_update_fn):
  """The checks of :func:`multi_steps`' arguments: ``(fixed k or None, sparse mask)``."""
  if not isinstance(opt, GradientTransformation):
    raise TypeError(f"opt: expected an optax.GradientTransformation, got {type(opt).__name__}.")
  fixed_k = None
  if callable(every_k_schedule):
    if sparse is not None:
      raise ValueError("every_k_schedule: a row-sparse leaf's buffer needs a fixed k; pass "
                       "an int with `sparse`.")
  elif (isinstance(every_k_schedule, bool)
        or not isinstance(every_k_schedule, (int, np.integer)) or every_k_schedule < 1):
    raise ValueError(f"every_k_schedule: expected an int >= 1 or a schedule, got "
                     f"{every_k_schedule!r}.")
  else:
    fixed_k = int(every_k_schedule)
  v.check_flag("use_grad_mean", use_grad_mean)
  if should_skip_update_fn is not None and not callable(should_skip_update_fn):
    raise TypeError(f"should_skip_update_fn: expected a function, got "
                    f"{should_skip_update_fn!r}.")
  if sparse is not None:
    if isinstance(nse, bool) or not isinstance(nse, (int, np.integer)) or nse < 1:
      raise ValueError(f"nse: expected an int >= 1 (the entries of one row-sparse "
                       f"gradient) with `sparse`, got {nse!r}.")
    if isinstance(sparse, str):
      sparse = _grad.by_name(sparse)
    masks.check_mask_like(sparse, "sparse")
  return fixed_k, sparse


def _empty_buffer(param: jax.Array, k: int | None, nse: int | None) -> _SparseBuffer:
  assert k is not None and nse is not None  # checked: `sparse` needs both
  size = k * nse
  return _SparseBuffer(jnp.zeros((size, *param.shape[1:]), param.dtype),
                       jnp.full((size, 1), param.shape[0], jnp.int32))


def _add_micro_batch(name: str, g: Any, a: Any, mini_step: jax.Array, nse: int | None) -> Any:
  """The accumulator ``a`` with one micro-batch's gradient ``g`` added."""
  if isinstance(a, _SparseBuffer):
    if not _rows.is_row_sparse(g):
      raise ValueError(f"multi_steps: gradient {name!r} is dense, but `sparse` selects "
                       "it: pass its row-sparse gradient, or leave it out of `sparse`.")
    if g.nse != nse:
      raise ValueError(f"multi_steps: gradient {name!r} has {g.nse} entries, but "
                       f"nse={nse}; every micro-batch must give nse entries.")
    idx = _checked_indices(f"gradient {name!r}", g, "multi_steps")
    start = mini_step * g.nse
    return _SparseBuffer(
        jax.lax.dynamic_update_slice_in_dim(a.values, g.data.astype(a.values.dtype), start, 0),
        jax.lax.dynamic_update_slice_in_dim(a.rows, idx.astype(jnp.int32), start, 0))
  if _rows.is_row_sparse(g):
    raise ValueError(f"multi_steps: gradient {name!r} is row-sparse; name it in "
                     "`sparse` (with `nse`) so that its rows are accumulated.")
  return a + g.astype(a.dtype)


def _mean_of(g: Any, a: Any, k: jax.Array, use_grad_mean: bool) -> Any:
  """The gradient handed to the inner transformation: the mean (or sum) of ``a``."""
  if isinstance(a, _SparseBuffer):
    values = a.values / k.astype(a.values.dtype) if use_grad_mean else a.values
    return _types.RowSparseUpdate((values.astype(g.dtype), a.rows), shape=g.shape)
  return (a / k.astype(a.dtype) if use_grad_mean else a).astype(g.dtype)


def _emptied(g: Any, a: Any, emit: jax.Array) -> Any:
  """``a`` after an emitting call: empty (a row-sparse buffer all padding)."""
  if isinstance(a, _SparseBuffer):
    return _SparseBuffer(jnp.where(emit, 0, a.values).astype(a.values.dtype),
                         jnp.where(emit, g.shape[0], a.rows).astype(a.rows.dtype))
  return jnp.where(emit, 0, a).astype(a.dtype)
