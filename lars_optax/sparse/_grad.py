"""Row-sparse gradients from unchanged models: :func:`value_and_grad`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax.sparse import _checks, _interpreter, _rows, _types


def by_name(name: str) -> masks.Mask:
  """A string ``sparse``: a leaf's full path (as leaf_names prints it) or last component."""
  return masks.by_predicate(
      lambda path, _: path == name or path.rsplit("/", 1)[-1] == name,
      description=f"full path or last name {name!r}")


def _whole(block: Any, axis_name: str, blocks: int) -> jax.ShapeDtypeStruct:
  """The type of the whole table whose block over ``axis_name`` ``block`` is: the
  rows of every block, the same on every device of the axis."""
  return jax.eval_shape(
      lambda b: jnp.concatenate([jax.lax.psum(b, axis_name)] * blocks), block)


def value_and_grad(
    fun: Callable[..., Any],
    *,
    sparse: masks.MaskLike,
    max_rows: int | None = None,
    argnums: int = 0,
    has_aux: bool = False,
    axis_name: str | None = None,
) -> Callable[..., Any]:
  """Like :func:`jax.value_and_grad`, with chosen leaves' gradients row-sparse.

  ``value_and_grad(fun, sparse)(params, *args, **kwargs)`` returns
  ``(value, grads)`` (``((value, aux), grads)`` with ``has_aux``) where
  ``grads`` has the tree of ``params`` (the argument ``argnums``) and every
  leaf selected by ``sparse`` is a row-sparse :class:`_types.RowSparseUpdate` (a
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
  :func:`psum` it again. With ``check_vma=False`` or under ``pmap``
  each device gets its own rows: sum them with :func:`psum`.

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
    axis_name: inside :func:`jax.shard_map`, the mesh axis over which the
      ``sparse`` leaves' rows are split (``in_specs`` ``P(axis_name)`` for
      them): each device holds one block of consecutive rows, and ``fun``,
      written for the whole table, reads global ids. Each device reads the
      ids in its block, the rows read are summed over the axis (where the ids
      differ along it, every device's ids are gathered first and each
      device gets its own ids' rows back), and the gradient is row-sparse in
      the device's own rows, so the optimizer touches only them. What crosses
      the devices is the ids and the rows read, never the table. An id past
      the whole table is an error. ``None`` (the default): each sparse leaf
      is read as the device holds it.

  Returns:
    A function with the signature of ``fun`` returning ``(value, grads)``.
  """
  if max_rows is not None and (not isinstance(max_rows, (int, np.integer))
                               or isinstance(max_rows, bool) or max_rows < 1):
    raise ValueError(f"max_rows: expected an integer >= 1 or None, got {max_rows!r}.")
  if isinstance(argnums, bool) or not isinstance(argnums, (int, np.integer)):
    raise TypeError(f"argnums: expected an int (the position of the params), got {argnums!r}; "
                    "value_and_grad differentiates one argument.")
  if not isinstance(has_aux, (bool, np.bool_)):
    raise TypeError(f"has_aux: expected a bool, got {has_aux!r}.")
  if not callable(fun):
    raise TypeError(f"fun: expected a callable, got {type(fun).__name__}.")
  v.check_axis_name(axis_name)
  text = sparse if isinstance(sparse, str) else None
  if isinstance(sparse, str):
    sparse = by_name(sparse)
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
    tables = [(n, p) for n, p, c in zip(names, flat_p, chosen) if c]
    blocks = _checks.split_blocks(axis_name, tables)
    # The other arguments: arrays are traced, Python values stay as they are.
    rest = (args[:pos] + args[pos + 1:], kwargs)
    rest_leaves, rest_def = jax.tree.flatten(rest)
    dynamic = [isinstance(x, (jax.Array, np.ndarray, np.generic)) for x in rest_leaves]

    def call(params, *dyn):
      it = iter(dyn)
      leaves = [next(it) if d else x for x, d in zip(rest_leaves, dynamic)]
      others, kw = jax.tree.unflatten(rest_def, leaves)
      return fun(*others[:pos], params, *others[pos:], **kw)

    dyn_args = [x for x, d in zip(rest_leaves, dynamic) if d]
    # With axis_name, fun is traced on the whole table (as written for one device).
    traced = params if axis_name is None else jax.tree.unflatten(treedef, [
        _whole(p, axis_name, blocks) if c else p for p, c in zip(flat_p, chosen)])
    closed, out_shape = jax.make_jaxpr(call, return_shape=True)(traced, *dyn_args)
    flat_args = jax.tree.leaves(dyn_args)

    def evaluate(dense_leaves, interp):
      it = iter(dense_leaves)
      leaves = [_interpreter.Table(i, p, n, axis=axis_name, blocks=blocks) if c else next(it)
                for i, (p, n, c) in enumerate(zip(flat_p, names, chosen))]
      return interp.run(closed.jaxpr, closed.consts, [*leaves, *flat_args])

    dense = [p for p, c in zip(flat_p, chosen) if not c]
    # A first, abstract pass counts the lookups (one delta each).
    probe = _interpreter.Interpreter(max_rows, None)
    jax.eval_shape(lambda d: evaluate(d, probe), dense)

    def zeros(lk):
      p = flat_p[lk.leaf]
      z = jnp.zeros((lk.rows.shape[0], *p.shape[1:]), p.dtype)
      return utils.to_varying(z, tuple(sorted(lk.vma)))

    deltas = [zeros(lk) for lk in probe.lookups]
    interp = _interpreter.Interpreter(max_rows, None)

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
        r, g = _rows.gather_over(r, axes), _rows.gather_over(g, axes)
      per_leaf.setdefault(lk.leaf, []).append((r, g))
    it = iter(g_dense)
    grads = []
    for i, (p, c) in enumerate(zip(flat_p, chosen)):
      if not c:
        grads.append(next(it))
        continue
      parts = per_leaf.get(i, [])
      if not parts:  # never looked up: an empty row-sparse gradient
        grads.append(_types.RowSparseUpdate(
            (jnp.zeros((0, *p.shape[1:]), p.dtype), jnp.zeros((0, 1), jnp.int32)),
            shape=p.shape, unique_indices=True, indices_sorted=True))
        continue
      idx = jnp.concatenate([r for r, _ in parts])[:, None]
      data = jnp.concatenate([g for _, g in parts])
      single = len(parts) == 1 and not any(
          lk.vma - utils.vma(p) for lk in probe.lookups if lk.leaf == i)
      grads.append(_types.RowSparseUpdate((data.astype(p.dtype), idx), shape=p.shape,
                                   unique_indices=single, indices_sorted=single))
    return value, jax.tree.unflatten(treedef, grads)

  return wrapped
