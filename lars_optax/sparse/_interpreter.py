"""The jaxpr interpreter behind :func:`lars_optax.sparse.value_and_grad`.

It evaluates the loss's jaxpr equation by equation and rewrites each lookup of a
sparse leaf. It leans on JAX internals (``get_bind_params``, ``eqn.ctx``, gather
dimension numbers, ``jax.extend.core``), and is the one module a JAX upgrade is
likely to break."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as _jcore

from lars_optax import _utils as utils
from lars_optax.sparse import _checks, _rowwise_jaxpr


class Table:
  """A sparse leaf inside the interpreted loss: only row lookups may read it.

  ``dtype``: the dtype a cast (``convert_element_type``, as Flax's
  ``Embed(dtype=...)`` casts the whole table) gave it; the lookup reads the
  rows and casts them instead. ``value`` may be the table after ``pvary``
  (inside ``shard_map``), a change of type only. ``split``: the mesh axes the
  leaf itself varies over (a table split across devices), as it came in.
  ``cast``: the ``reshard`` equation that moved the table to automatic mesh
  axes (on an explicit mesh, ``table.at[ids].get(out_sharding=...)``); the
  lookup's own arrays take the same cast, and its rows the way back to the
  table's mesh, ``home``. ``axis``: the mesh axis whose devices each hold
  ``blocks`` consecutive rows of a table split by rows (``value_and_grad(...,
  axis_name=)``); the loss was traced with the whole table's shape and reads
  global ids.
  """

  def __init__(self, index: int, value: jax.Array, name: str, dtype: Any = None,
               split: frozenset | None = None, cast: Any = None, axis: str | None = None,
               blocks: int = 1):
    self.index, self.value, self.name = index, value, name
    self.dtype = value.dtype if dtype is None else jnp.dtype(dtype)
    self.split = utils.vma(value) - {axis} if split is None else split
    self.cast, self.axis, self.blocks = cast, axis, blocks
    self.home: Any = None  # with cast: the (abstract) mesh the table came in on

  def like(self, value: jax.Array | None = None, **changes: Any) -> Table:
    """This table with another value (a change of type) or other attributes."""
    new = object.__new__(Table)
    new.__dict__.update(self.__dict__)
    new.__dict__.update(changes)
    if value is not None:
      new.value = value
    return new


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


def _past_table(name: str, total: int) -> Callable[..., str]:
  def report(ids):
    bad = ids[(ids < 0) | (ids >= total)]
    return (f"sparse: a lookup of {name!r} reads ids {sorted(set(bad.tolist()))[:5]} past the "
            f"table's {total} rows (its blocks over axis_name together): no device holds "
            "them.")
  return report


def _split_table(name: str, axes: tuple[str, ...], n: int) -> Callable[..., str]:
  def report(rows):
    bad = rows[(rows < 0) | (rows >= n)]
    return (f"sparse: leaf {name!r} varies over the mesh axes {axes} inside shard_map (a "
            f"table split across devices), and a lookup reads rows {sorted(set(bad.tolist()))[:5]} "
            f"past this block's {n} rows: read as the block's own, a global id reads a "
            "clamped row and its gradient is dropped. For a table split by rows and a "
            f"model that reads global ids, pass axis_name={axes[0]!r} to "
            "sparse.value_and_grad (and to catch_up); or replicate the table over those "
            "axes (in_specs P()).")
  return report


class Interpreter:
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

  def lookup(self, table: Table, out: jax.Array | None, indices: jax.Array, dnums: Any,
             slice_sizes: Sequence[int], row: int, clip: bool, vma: frozenset) -> jax.Array:
    """``out`` (the lookup's value) plus the gathered rows of a new ``delta``."""
    if table.axis is not None:
      return self.split_lookup(table, indices, dnums, slice_sizes, row, clip)
    assert out is not None
    n = table.value.shape[0]
    rows = indices[..., row]
    split = tuple(sorted(table.split))
    if split:  # a block of a table split over the mesh: ids must be the block's own
      ok = _checks.raise_at_run_time(jnp.any((rows < 0) | (rows >= n)),
                                     _split_table(table.name, split, n), rows)
      rows = rows + jnp.asarray(ok, rows.dtype)
    if clip:
      rows, valid = jnp.clip(rows, 0, n - 1), jnp.ones(rows.shape, bool)
    else:
      valid = (rows >= 0) & (rows < n)
    extra = self.delta_rows(table, jnp.where(valid, rows, n), valid, indices, dnums,
                            slice_sizes, row, vma)
    return out + extra.astype(out.dtype)

  def split_lookup(self, table: Table, indices: jax.Array, dnums: Any,
                   slice_sizes: Sequence[int], row: int, clip: bool) -> jax.Array:
    """A lookup of global ids in a table whose rows are split over ``table.axis``.

    Each device reads the ids that fall in its block (zeros for the others) and
    the rows read are summed over the axis. Where the ids differ along the axis
    (a batch split over the same devices) every device's ids are gathered first
    and the sums scattered back, so that each device gets the rows of its own
    ids. The delta (the gradient's rows) holds the device's own rows.
    """
    axis, n = table.axis, table.value.shape[0]
    total = n * table.blocks
    gathered = axis in utils.vma(indices)
    if gathered:
      indices = jax.lax.all_gather(indices, axis)
      dnums = dnums._replace(offset_dims=tuple(d + 1 for d in dnums.offset_dims))
    ids = indices[..., row]
    if clip:
      ids = jnp.clip(ids, 0, total - 1)
    else:
      ok = _checks.raise_at_run_time(jnp.any((ids < 0) | (ids >= total)),
                                     _past_table(table.name, total), ids)
      ids = ids + jnp.asarray(ok, ids.dtype)
    local = ids - jax.lax.axis_index(axis).astype(ids.dtype) * n
    mine = (local >= 0) & (local < n)
    rows = jnp.where(mine, local, n)
    part = jax.lax.gather(
        jax.lax.stop_gradient(table.value),
        jnp.zeros_like(indices).at[..., row].set(rows.astype(indices.dtype)), dnums,
        tuple(slice_sizes), mode=jax.lax.GatherScatterMode.FILL_OR_DROP, fill_value=0)
    extra = self.delta_rows(table, rows, mine, indices, dnums, slice_sizes, row,
                            utils.vma(part))
    both = part.astype(table.dtype) + extra.astype(table.dtype)
    if gathered:
      return jax.lax.psum_scatter(both, axis, scatter_dimension=0, tiled=False)
    return jax.lax.psum(both, axis)

  def delta_rows(self, table: Table, rows: jax.Array, valid: jax.Array, indices: jax.Array,
                 dnums: Any, slice_sizes: Sequence[int], row: int,
                 vma: frozenset) -> jax.Array:
    """The lookup's gather on a new ``delta`` (zero rows, one per distinct row read).

    ``rows``: the block's rows each id reads, ``num_rows`` where ``valid`` is false.
    """
    n = table.value.shape[0]
    # Without a bound, one row per id: never too few.
    size = self.max_rows or max(1, min(int(rows.size), n))
    uniq = jnp.unique(rows.reshape(-1), size=size, fill_value=n)
    slot = jnp.clip(jnp.searchsorted(uniq, rows), 0, size - 1)
    found = valid & (uniq[slot] == rows)
    if self.max_rows is not None:
      ok = _checks.raise_at_run_time(jnp.any(valid & ~found), _too_many_rows(table.name, size),
                             rows, valid)
      uniq = uniq + jnp.asarray(ok, uniq.dtype)
    k = len(self.lookups)
    self.lookups.append(_Lookup(table.index, uniq, vma))
    shape = (size, *table.value.shape[1:])
    delta = jnp.zeros(shape, table.value.dtype) if self.deltas is None else self.deltas[k]
    if table.cast is not None:
      delta = _bind(table.cast, [delta])
    # The same gather on delta, with the row replaced by its slot (out of range,
    # so 0, where the id was not found) and the other (whole) dimensions at 0.
    new_idx = jnp.zeros_like(indices).at[..., row].set(
        jnp.where(found, slot, size).astype(indices.dtype))
    return jax.lax.gather(delta, new_idx, dnums, tuple(slice_sizes),
                          mode=jax.lax.GatherScatterMode.FILL_OR_DROP, fill_value=0)

  def cast_home(self, table: Table, out: jax.Array) -> jax.Array:
    """``out``, and the last lookup's rows moved back from automatic mesh axes (see
    :class:`Table`'s ``cast``) to the mesh of the step, as the gradient is built there."""
    if table.cast is not None:
      lk = self.lookups[-1]
      # The cast's own primitive back to the step's mesh (JAX 0.7: mesh_cast; later
      # reshard, which can change axis types), as JAX casts the lookup's result.
      home = jax.sharding.NamedSharding(table.home, jax.sharding.PartitionSpec(None))
      rows = table.cast.primitive.bind(lk.rows, **dict(table.cast.params, dst_sharding=home))
      self.lookups[-1] = lk._replace(rows=rows)
    return out

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
      tables = [x for x in invals if isinstance(x, Table)]
      ans = self.sparse_eqn(eqn, invals, tables[0]) if tables else _bind(eqn, invals)
      if eqn.primitive.multiple_results:
        for var, val in zip(eqn.outvars, ans):
          env[var] = val
      else:
        env[eqn.outvars[0]] = ans
    return [read(v) for v in jaxpr.outvars]

  def sparse_eqn(self, eqn: Any, invals: list, table: Table) -> Any:
    name = eqn.primitive.name
    others_dense = all(not isinstance(x, Table) for x in invals[1:])
    shape = table.value.shape
    if name == "gather" and invals[0] is table and others_dense:
      dnums, sizes = eqn.params["dimension_numbers"], eqn.params["slice_sizes"]
      row = _row_component(dnums, sizes, shape)
      if row is not None:
        out = None if table.axis is not None else _bind(
            eqn, [jax.lax.stop_gradient(table.value), invals[1]]).astype(table.dtype)
        clip = "CLIP" in str(eqn.params.get("mode"))
        with eqn.ctx.manager:  # (the mesh the gather was traced under)
          out = self.lookup(table, out, invals[1], dnums, sizes, row, clip, _out_vma(eqn))
        return self.cast_home(table, out)
    if name == "dynamic_slice" and invals[0] is table and others_dense and tuple(
        eqn.params["slice_sizes"]) == (1, *shape[1:]):
      # x[i] with a scalar i: a lookup of one row (dynamic_slice clamps).
      out = None if table.axis is not None else _bind(
          eqn, [jax.lax.stop_gradient(table.value), *invals[1:]]).astype(table.dtype)
      starts = jnp.stack([jnp.asarray(i, jnp.int32) for i in invals[1:]])
      return self.lookup(table, out, starts, _dynamic_slice_as_gather(len(shape)),
                         eqn.params["slice_sizes"], 0, True, _out_vma(eqn))
    if name in ("convert_element_type", "copy", "copy_p") and invals[0] is table:
      # A cast followed by a lookup is a lookup followed by a cast.
      new_dtype = eqn.params.get("new_dtype")
      if new_dtype is None or jnp.issubdtype(new_dtype, jnp.floating):
        return table.like(dtype=jnp.dtype(new_dtype or table.dtype))
    if name in ("reshard", "mesh_cast") and invals[0] is table:
      # On an explicit mesh, table.at[ids].get(out_sharding=...) gathers under
      # automatic axes: it casts the table (and the ids) to them, a change of type
      # that moves no data, and XLA reads each device's own rows.
      return table.like(_bind(eqn, [table.value]), cast=eqn,
                        home=jax.typeof(table.value).sharding.mesh)
    if name == "pvary":
      # shard_map (check_vma=True) marks a replicated table as varying before
      # it meets per-device ids: a change of type, applied to the table itself.
      # (A block of a table split over axis_name already varies over that axis,
      # though the whole table it was traced as did not.)
      def pvary(x):
        value = x.value if isinstance(x, Table) else x
        axes = tuple(a for a in eqn.params["axes"] if a not in utils.vma(value))
        out = utils.to_varying(value, axes)
        return x.like(out) if isinstance(x, Table) else out

      outs = [pvary(x) for x in invals]
      return outs if eqn.primitive.multiple_results else outs[0]
    subs = _rowwise_jaxpr.sub_jaxprs(eqn.params)
    if len(subs) == 1 and len(subs[0].invars) == len(invals) and name not in (
        "cond", "scan", "while"):
      sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
      outs = self.run(subs[0], getattr(sub, "consts", ()), invals)
      return outs if eqn.primitive.multiple_results else outs[0]
    raise ValueError(
        f"sparse: the leaf {table.name!r} is used by '{name}', not only by row "
        "lookups (table[ids], jnp.take(table, ids, axis=0)), so its gradient is "
        "not row-sparse. Leave this leaf out of `sparse`.")
