"""The lazy step on row-sparse leaves: gather the rows of params and state, update, scatter."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.extend import core as _jcore

from lars_optax import _row_wise
from lars_optax.sparse import _checks, _rows, _rowwise_jaxpr, _types


def _has_rows(x: Any, shape: tuple) -> bool:
  """``x`` is an array whose leading axis has the rows of a param of ``shape``."""
  x_shape = getattr(x, "shape", None)
  return x_shape is not None and len(x_shape) >= 1 and len(shape) >= 1 and (
      x_shape[0] == shape[0])


def params_shaped_leaves(node: Any, treedef: Any, shapes: list[tuple]) -> list[Any] | None:
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

  The buffers of the states listed in :func:`lars_optax._row_wise.row_wise_fields` are their
  named fields (e.g. Adam's ``mu`` and ``nu``; not ``count``). Elsewhere they
  are found by structure: a subtree with the params' structure and, at each
  leaf, an array whose leading axis is the param's rows (whatever its other
  axes) or an empty :class:`optax.MaskedNode`
  (as optax, :func:`optax.masked` and :func:`lars_optax.multi_precision` keep
  them).
  """
  known = _row_wise.row_wise_fields()

  def subtrees(node):
    return params_shaped_leaves(node, treedef, shapes)

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


def lazy_update_sparse(inner_tx: Any, updates: Any, state: Any, params: Any,
                       extra_args: dict, dense_step: Callable, where: str) -> tuple[Any, Any]:
  """The lazy step on a gradient tree with row-sparse leaves (see the module doc).

  ``dense_step(new, old, grad)`` applies the dense lazy rule to a dense leaf:
  ``new`` on the rows present in ``grad``, ``old`` elsewhere.
  """
  if params is None:
    raise ValueError(f"{where}: params are required with row-sparse gradients; call "
                     "update(updates, state, params).")
  flat_g, treedef_ = jax.tree.flatten(updates, is_leaf=_rows.is_row_sparse)
  treedef: Any = treedef_
  try:
    flat_p = treedef.flatten_up_to(params)
  except (ValueError, TypeError):
    raise ValueError(f"{where}: gradients and params have different tree structures: "
                     f"{treedef} vs {jax.tree.structure(params)}.") from None
  # numpy params (flax.serialization.from_bytes, a checkpoint) are taken as the
  # dense optimizers take them: as jax arrays.
  given_p = flat_p  # (numpy params get updates they can be added to: _types.update_like)
  flat_p = [jnp.asarray(p) if isinstance(p, np.ndarray) else p for p in flat_p]
  names = _checks.leaf_names_of(treedef)
  sparse = [_rows.is_row_sparse(g) for g in flat_g]
  rows: list[Any] = []
  g_in: list[Any] = []
  p_in: list[Any] = []
  for name, g, p, s in zip(names, flat_g, flat_p, sparse):
    if s:
      ok = _checks.check_row_sparse(name, g, p, where)
      r, values = _rows.combine(g, p.shape[0])
      r = r + jnp.asarray(ok, r.dtype)
      rows.append(r)
      g_in.append(values)
      p_in.append(_rows.gather(p, r))
    else:
      rows.append(None)
      g_in.append(g)
      p_in.append(p)
  full_shapes = [tuple(np.shape(p)) for p in flat_p]
  row_shapes = [tuple(np.shape(x)) for x in p_in]

  def gather_bufs(bufs):
    return [b if r is None or isinstance(b, optax.MaskedNode) else _rows.gather(b, r)
            for b, r in zip(bufs, rows)]

  state_in = _buffers(state, treedef, full_shapes, gather_bufs)

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

  # Traced once: the jaxpr is checked, then evaluated as the step itself.
  try:
    closed, out_shapes = jax.make_jaxpr(traced, return_shape=True)(g_in, leaves_s, p_in)
  except (TypeError, ValueError) as e:  # (naming the state leaves not gathered, if any)
    leaves = _ungathered(state, leaves_s, {sh[0] for sh, s in zip(full_shapes, sparse) if s})
    if leaves:
      first = (str(e).strip() or type(e).__name__).splitlines()[0]
      raise ValueError(_ungathered_message(
          where, f"the inner transformation fails ({first})", names, sparse, leaves)) from e
    raise
  _check_gathered_shapes(closed.out_avals, where, names, sparse, full_shapes, g_in, state,
                         leaves_s)
  _rowwise_jaxpr.check_rowwise(closed, [*tags, *taint_s, *tags], where)

  out_flat = _jcore.jaxpr_as_fun(closed)(*jax.tree.leaves((g_in, leaves_s, p_in)))
  new_updates, new_state = jax.tree.unflatten(jax.tree.structure(out_shapes), out_flat)
  flat_u = treedef.flatten_up_to(new_updates)

  def scatter_bufs(new_bufs, old_bufs):
    out = []
    for n, o, r, g in zip(new_bufs, old_bufs, rows, flat_g):
      if isinstance(n, optax.MaskedNode):
        out.append(n)
      elif r is None:
        out.append(dense_step(n, o, g))
      else:
        out.append(_rows.scatter(o, r, n))
    return out

  new_state = _buffers(new_state, treedef, row_shapes, scatter_bufs, state)
  out_updates = []
  for u, r, g, p in zip(flat_u, rows, flat_g, given_p):
    if r is None:
      out_updates.append(dense_step(u, jnp.zeros_like(u), g))
    else:
      out_updates.append(_types.update_like(g, u, r, np.shape(p)[0], p))
  return jax.tree.unflatten(treedef, out_updates), new_state
