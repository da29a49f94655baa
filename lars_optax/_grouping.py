"""Private: a layer-wise rule run on its leaves stacked by shape (``group_by_shape=True``).

An unrolled model repeats a few shapes many times (a transformer block's
kernels, biases and norm scales). Each leaf of a per-leaf step is a handful of
kernels and some hundred operations for XLA to compile, so launches and
compile time grow with the leaf count. :func:`by_shape` stacks the leaves of
one shape, dtype, layer axes and per-leaf settings (masks, multipliers) into
one array with a leading axis, and runs the rule on the stacks as on a
scanned model (one norm and one ratio per slice, see
:mod:`lars_optax.stacked`): the same numbers, computed per group instead of
per leaf. Its state holds the rule's state for the stacks. Where a leaf's
sharding is part of its type (explicit mesh axes), leaves split differently
get stacks of their own: a stack of them would be a type error.

Each leaf's update is read back from its stack: on a CPU with an index kept
in the state (``dynamic_index_in_dim``), so that every leaf's kernel is the
same one and XLA compiles it once (a constant slice per leaf compiles one
kernel per leaf); elsewhere with a constant slice, which XLA's GPU backend
fuses into few kernels (``benchmarks/grouped_leaves.py --by-shape``) and its
TPU backend compiles faster. The platform the step is lowered for decides
(``lax.platform_dependent``), not the process's backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import GradientTransformation

from lars_optax import _ratios
from lars_optax import _masks as masks
from lars_optax import _utils as utils
from lars_optax import _stacked as stacked_mod


@_ratios.ratio_state
class ByShapeState(NamedTuple):
  """State of a layer-wise optimizer built with ``group_by_shape=True``.

  Attributes:
    trust_ratio: the per-leaf ratios of the last step, as in
      :class:`lars_optax.ScaleByLarsTrustRatioState` (read them with
      :func:`lars_optax.trust_ratios`).
    layer_trust_ratio: the per-layer ratios of stacked leaves, as there (their
      shapes also keep the leaves' layer axes for ``update``).
    positions: per group of leaves, each member's position in its stack (int32).
    inner: the optimizer's state for the stacks (one leaf per group).
  """

  trust_ratio: jax.Array
  layer_trust_ratio: tuple[Any, ...]
  positions: tuple[tuple[jax.Array, ...], ...]
  inner: optax.OptState


def _key(value: Any, i: int) -> Any:
  """A per-leaf setting as part of a grouping key (per-layer arrays: the leaf alone)."""
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if isinstance(value, (int, float, np.integer, np.floating)) or (
      isinstance(value, np.ndarray) and value.ndim == 0):
    return float(value)
  return ("own", i)


class _Plan(NamedTuple):
  groups: list[list[int]]  # leaf positions (in jax.tree.leaves order), per group
  names: list[str]  # a group's name in the stacked tree: its first leaf's
  ks: list[int]  # per leaf: its own layer axes
  settings: dict[str, Any]  # per setting: its value for the stacked tree


def _named_stacks(chosen: frozenset[str], arg: str) -> masks.Mask:
  return masks.by_predicate(lambda name, _: name in chosen, description=f"{arg} of the stacks")


def _plan(params: Any, ks: Sequence[int], mask_specs: Mapping[str, masks.MaskLike],
          value_specs: Mapping[str, masks.LeafValues]) -> _Plan:
  named = masks.named_leaves(params)
  flat = [leaf for _, leaf in named]
  decided = {arg: masks.resolve_mask(spec, params, arg, ks) for arg, spec in mask_specs.items()}
  valued = {arg: masks.resolve_leaf_values(spec, params, arg, layer_axes=ks, check_layers=False)
            for arg, spec in value_specs.items()}
  by_key: dict[Any, list[int]] = {}
  for i, leaf in enumerate(flat):
    key = (np.shape(leaf), jnp.dtype(leaf.dtype), ks[i], utils.typed_sharding(leaf),
           *(decided[arg][i] for arg in decided), *(_key(valued[arg][i], i) for arg in valued))
    by_key.setdefault(key, []).append(i)
  groups = list(by_key.values())
  names = [named[idx[0]][0] for idx in groups]
  settings: dict[str, Any] = {}
  for arg in decided:  # by name: the stacks may be in Flax boxes (see _boxed)
    settings[arg] = _named_stacks(
        frozenset(n for n, idx in zip(names, groups) if decided[arg][idx[0]]), arg)
  for arg in valued:
    settings[arg] = {n: (valued[arg][idx[0]][None] if isinstance(valued[arg][idx[0]], np.ndarray)
                         and valued[arg][idx[0]].ndim else valued[arg][idx[0]])
                     for n, idx in zip(names, groups)}
  settings["stacked"] = {n: ks[idx[0]] + 1 for n, idx in zip(names, groups)}
  return _Plan(groups, names, list(ks), settings)


def _boxed(stack: jax.Array, members: list[Any]) -> Any:
  """A stack in its members' Flax linen box (``nn.Partitioned``, ...), its new
  leading axis unnamed, when they share one box with the same names: then the
  state's stacks keep partition names (``nn.get_partition_spec(state)``), as a
  per-leaf state's buffers keep their params'. Otherwise the bare stack."""
  first = members[0]
  if not masks.is_linen_box(first) or any(
      type(m) is not type(first) or m.replace_boxed(0) != first.replace_boxed(0)
      for m in members[1:]):
    return stack
  return first.replace_boxed(stack).add_axis(0, {"partition_name": None})  # nn.PARTITION_NAME


def _stack(tree: Any, plan: _Plan) -> dict[str, Any]:
  flat = jax.tree.leaves(tree)
  nodes = jax.tree.leaves(tree, is_leaf=masks.is_box)
  # The barrier keeps each stack one copy: fused into its readers, a
  # concatenation of a hundred operands is slow to compile and to run.
  # A 0-d leaf (a temperature) is stacked as a (1,) one: a layer needs an axis of its own.
  stacks = jax.lax.optimization_barrier(
      {n: jnp.stack([jnp.reshape(flat[i], np.shape(flat[i]) or (1,)) for i in idx])
       for n, idx in zip(plan.names, plan.groups)})
  if len(nodes) != len(flat):  # a box of several leaves: no names to keep
    return stacks
  return {n: _boxed(stacks[n], [nodes[i] for i in idx]) if np.ndim(flat[idx[0]]) else stacks[n]
          for n, idx in zip(plan.names, plan.groups)}


def _per_leaf_ratios(inner: Any, plan: _Plan, params: Any) -> tuple[jax.Array, tuple[Any, ...]]:
  """The leaves' ratios (vector and per-layer, as a ratio state keeps them) from
  the stacks' per-layer ratios in ``inner``: the vector is gathered from the
  stacks in one operation (a slice per leaf would be a kernel per leaf)."""
  found = utils.find_states(inner, _ratios.ratio_states())
  dt = _ratios.ratio_dtype(params)
  if not found:
    return _ratios.ratio_vector(params), _ratios.layer_ratios(params, plan.ks)
  stacks = [jax.tree.leaves(x)[0].astype(dt) for x in found[0].layer_trust_ratio]
  pieces: list[jax.Array] = [jnp.asarray([-1], dt)]
  where = [0] * len(plan.ks)  # per leaf: its entry in the table
  layer: list[Any] = [None] * len(plan.ks)
  size = 1
  for stack, idx in zip(stacks, plan.groups):
    if plan.ks[idx[0]] == 0:
      pieces.append(stack)
      for pos, i in enumerate(idx):
        where[i] = size + pos
      size += len(idx)
    else:  # a stacked leaf: its layers' ratios, and their mean in the vector
      for pos, i in enumerate(idx):
        layer[i] = stack[pos]
        pieces.append(jnp.mean(stack[pos], keepdims=True).reshape(1))
        where[i] = size
        size += 1
  table = jnp.concatenate(pieces)
  entries = iter(where)
  index = np.array([next(entries) if real else 0 for real in _ratios.leaf_slots(params)],
                   np.int32)
  return table[index], _ratios.layer_ratios(params, plan.ks, layer)


def _read_back(stacked_u: dict[str, jax.Array], plan: _Plan,
               positions: tuple[tuple[jax.Array, ...], ...]) -> list[jax.Array]:
  """The members' updates from their stacks, group by group: by index on a CPU,
  by constant slices elsewhere (see the module docstring), as the platform the
  step is lowered for decides (an ahead-of-time compile for a GPU or TPU from a
  CPU host gets the slices)."""
  def by_index(u_by_name, pos_by_group):
    return [jax.lax.dynamic_index_in_dim(u_by_name[name], p, keepdims=False)
            for name, ps in zip(plan.names, pos_by_group) for p in ps]

  def by_slices(u_by_name, pos_by_group):
    return [u_by_name[name][j] for name, ps in zip(plan.names, pos_by_group)
            for j in range(len(ps))]

  return jax.lax.platform_dependent(stacked_u, positions, cpu=by_index, default=by_slices)


def by_shape(build: Callable[..., Sequence[GradientTransformation]], *,
             masks_by_arg: Mapping[str, masks.MaskLike],
             values_by_arg: Mapping[str, masks.LeafValues],
             stacked: stacked_mod.StackedLike) -> GradientTransformation:
  """``optax.chain(*build(**settings))`` run on the leaves stacked by shape.

  ``build`` takes, by keyword, each argument of ``masks_by_arg`` (a bool per
  stack) and of ``values_by_arg`` (a value per stack), and ``stacked`` (the
  stacks' layer axes), as dicts keyed by the stacks' names. Leaves share a
  stack when their shape, dtype, layer axes (``stacked``), masks and values
  are the same. The rule must take one ratio per layer of a stacked leaf
  (the layer-wise rules do) and must not mix leaves otherwise.
  """
  # ``build`` chains the links' unchecked twins, as the constructor does: it checked the
  # arguments once, when it was built, and its check_inputs link checks the user's trees
  # (these are stacks of them), so the links rebuilt at each trace check nothing again.
  def inner_tx(plan: _Plan) -> GradientTransformation:
    return optax.chain(*build(**plan.settings))

  def init_fn(params: optax.Params) -> ByShapeState:
    ks = stacked_mod.resolve(stacked, params)
    plan = _plan(params, ks, masks_by_arg, values_by_arg)
    inner = inner_tx(plan).init(_stack(params, plan))
    positions = tuple(tuple(jnp.asarray(pos, jnp.int32) for pos in range(len(idx)))
                      for idx in plan.groups)
    return ByShapeState(trust_ratio=_ratios.ratio_vector(params),
                        layer_trust_ratio=_ratios.layer_ratios(params, ks),
                        positions=positions, inner=inner)

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("params: group_by_shape needs the params in update "
                       "(tx.update(grads, state, params)).")
    flat, treedef = jax.tree.flatten(updates)
    ks = _ratios.layer_axes(state.layer_trust_ratio, params)
    plan = _plan(params, ks, masks_by_arg, values_by_arg)
    stacked_u, inner = inner_tx(plan).update(_stack(updates, plan), state.inner,
                                             _stack(params, plan))
    stacked_u = {n: jax.tree.leaves(u)[0] for n, u in stacked_u.items()}  # (unboxed)
    out: list[Any] = [None] * len(flat)
    for i, leaf in zip([i for idx in plan.groups for i in idx],
                       _read_back(stacked_u, plan, state.positions)):
      out[i] = jnp.reshape(leaf, np.shape(flat[i]))  # (a 0-d leaf's stack is (n, 1))
    vector, layer = _per_leaf_ratios(inner, plan, params)
    return jax.tree.unflatten(treedef, out), state._replace(
        trust_ratio=vector, layer_trust_ratio=layer, inner=inner)

  return GradientTransformation(init_fn, update_fn)


def maybe_by_shape(group: bool, build: Callable[..., Sequence[GradientTransformation]], *,
                   masks_by_arg: Mapping[str, masks.MaskLike],
                   values_by_arg: Mapping[str, masks.LeafValues],
                   stacked: stacked_mod.StackedLike) -> list[GradientTransformation]:
  """``build``'s links as they are, or (``group``) one :func:`by_shape` link."""
  if not group:
    return list(build(**masks_by_arg, **values_by_arg, stacked=stacked))
  return [by_shape(build, masks_by_arg=masks_by_arg, values_by_arg=values_by_arg,
                   stacked=stacked)]
