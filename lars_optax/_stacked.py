"""Stacked (scanned) layers: the implementation behind :mod:`lars_optax.stacked`, with the
checks, the layer markers kept in states and :func:`layer_sq_norms`, the one place where
every layer-wise rule takes its per-layer norms (private: users call the public names)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from lars_optax import _utils as utils
from lars_optax import _masks as masks
# (AxisNameLike and its check and resolver live in _validation, below sparse/, which
# takes them too; the layer-wise links take them from here.)
from lars_optax._validation import (  # noqa: F401
    AxisNameLike, check_axis_names, check_keys, resolve_axis_names)


# PARTITION_NAME, FROM_METADATA, StackedLike and AxisNameLike are documented in
# lars_optax.stacked, their public face.
PARTITION_NAME = "layers"

# nnx Variables keep their partition names under one of these metadata keys
# (the name changed across Flax versions).
_NNX_KEYS = ("out_sharding", "sharding_names", "sharding")


class FromMetadata:
  """Reads the layer axes from Flax metadata (see :func:`from_metadata`)."""

  __slots__ = ("names",)

  def __init__(self, names: tuple[str, ...]):
    self.names = names

  def __repr__(self) -> str:
    return f"from_metadata({', '.join(repr(n) for n in self.names)})"

  def __eq__(self, other: object) -> bool:
    return isinstance(other, FromMetadata) and other.names == self.names

  def __hash__(self) -> int:
    return hash(self.names)


def from_metadata(*partition_names: str) -> FromMetadata:
  """Layer axes read from Flax partition metadata.

  A leaf in a linen ``nn.Partitioned``/``nn.LogicallyPartitioned`` box, or an
  nnx Variable, whose partition names start with one or more of
  ``partition_names`` (default ``"layers"``) has that many leading layer
  axes. A configured name that appears after another axis is an error at
  ``init`` (a layer axis must lead). Leaves without metadata are not stacked.

  Args:
    *partition_names: the names of layer axes, as given to ``nn.scan``'s
      ``metadata_params={nn.PARTITION_NAME: ...}`` or ``nnx.vmap``'s
      ``transform_metadata``. Default ``("layers",)``.
  """
  names = partition_names or (PARTITION_NAME,)
  bad = [n for n in names if not isinstance(n, str) or not n]
  if bad:
    raise TypeError(f"partition_names: expected non-empty strings, got {bad!r}.")
  return FromMetadata(tuple(names))


FROM_METADATA = from_metadata(PARTITION_NAME)

StackedLike = FromMetadata | masks.MaskLike | Mapping[str, int] | Iterable[tuple[Any, int]] | None


def is_int(x: Any) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _as_rules(stacked: Any) -> dict[str, int] | list[tuple[Any, int]] | None:
  """``{name: k}`` or ``[(mask, k)]`` when ``stacked`` has that form, else None."""
  if isinstance(stacked, Mapping):
    if stacked and all(is_int(k) for k in stacked.values()):
      return dict(stacked)
    return None
  if (isinstance(stacked, (list, tuple)) and stacked
      and all(isinstance(r, tuple) and len(r) == 2 and is_int(r[1]) for r in stacked)):
    return list(stacked)
  return None


def check_stacked(stacked: StackedLike, arg_name: str = "stacked") -> None:
  """Checks the form of a ``stacked`` argument (when an optimizer is built)."""
  if stacked is None or isinstance(stacked, FromMetadata):
    return
  rules = _as_rules(stacked)
  if rules is None:  # (not rules: a mask)
    masks.check_mask_like(cast(masks.MaskLike, stacked), arg_name)
    return
  items = rules.items() if isinstance(rules, dict) else rules
  for key, k in items:
    if isinstance(rules, dict) and not isinstance(key, str):
      raise TypeError(f"{arg_name}: dict keys must be leaf names (str), got {key!r}.")
    if not isinstance(rules, dict):
      if key is None:
        raise TypeError(f"{arg_name}: a rule's mask is None; give a Mask or a callable.")
      masks.check_mask_like(key, arg_name)
    if int(k) < 1:
      raise ValueError(f"{arg_name}: the number of layer axes for {key!r} must be >= 1, "
                       f"got {int(k)}.")


def _partition_names(node: Any) -> tuple[Any, ...] | None:
  """A Flax box's or nnx Variable's partition names (None without any)."""
  names = getattr(node, "names", None)
  if names is None and hasattr(node, "get_metadata"):
    meta = node.get_metadata()
    for key in _NNX_KEYS:
      if meta.get(key) is not None:
        names = meta[key]
        break
  if names is None:
    return None
  try:
    return tuple(names)
  except TypeError:
    return None


def _metadata_axes(spec: FromMetadata, tree: Any, arg_name: str) -> list[int]:
  def is_layer(entry: Any) -> bool:
    if isinstance(entry, (tuple, list)):
      return bool(entry) and all(e in spec.names for e in entry)
    return entry in spec.names

  out = []
  flat, _ = jtu.tree_flatten_with_path(tree, is_leaf=masks.is_box)
  for path, node in flat:
    if not masks.is_box(node):
      out.append(0)
      continue
    names = _partition_names(node) or ()
    k = 0
    while k < len(names) and is_layer(names[k]):
      k += 1
    later = [i for i in range(k, len(names)) if is_layer(names[i])]
    name = masks.path_to_name(path)
    if later:
      raise ValueError(
          f"{arg_name}: leaf {name!r} has the layer axis {names[later[0]]!r} at position "
          f"{later[0]} of its partition names {names}; layer axes must lead (scan or "
          "vmap with the layer axis at 0), or pass stacked= explicitly.")
    out.extend([k] * len(jax.tree.leaves(node)))
  return out


def _check_selects(mask: Any, tree: Any, selected: list[bool], arg_name: str) -> None:
  """A stacked rule must select some leaf (placeholders of optax.masked aside)."""
  masks.check_matches(mask, tree, arg_name)
  placeholders = len(masks._placeholder_names(tree)) > len(selected)
  if selected and not any(selected) and not placeholders:
    raise ValueError(f"{arg_name}: the rule {mask!r} selects no parameter; "
                     "lars_optax.leaf_names(params) shows the names.")


def resolve(stacked: StackedLike, tree: Any, arg_name: str = "stacked") -> list[int]:
  """The number of leading layer axes of each leaf of ``tree`` (``jax.tree.leaves`` order).

  Raises:
    ValueError: a rule that matches no leaf, a dict key that names no leaf,
      ``k`` >= the leaf's ndim (naming the leaf), or metadata whose layer
      axis is not leading.
  """
  named = masks.named_leaves(tree)
  if stacked is None:
    ks = [0] * len(named)
  elif isinstance(stacked, FromMetadata):
    ks = _metadata_axes(stacked, tree, arg_name)
  else:
    check_stacked(stacked, arg_name)
    rules = _as_rules(stacked)
    if rules is None:
      selected = masks.resolve_mask(cast(masks.MaskLike, stacked), tree, arg_name)
      _check_selects(stacked, tree, selected, arg_name)
      ks = [1 if s else 0 for s in selected]
    elif isinstance(rules, dict):
      names = [n for n, _ in named]
      check_keys(rules, names, arg_name)
      ks = [int(rules.get(n, 0)) for n in names]
    else:
      found: list[int | None] = [None] * len(named)
      for mask, k in rules:
        selected = masks.resolve_mask(mask, tree, arg_name)
        _check_selects(mask, tree, selected, arg_name)
        found = [int(k) if (f is None and s) else f for f, s in zip(found, selected)]
      ks = [0 if f is None else f for f in found]
  for (name, leaf), k in zip(named, ks):
    if k and k >= np.ndim(leaf):
      raise ValueError(
          f"{arg_name}: leaf {name!r} of shape {tuple(np.shape(leaf))} cannot have {k} "
          f"layer axes: a layer needs at least one axis of its own (k < ndim = "
          f"{np.ndim(leaf)}).")
  return ks


# Module names that scanned stacks get: Flax linen's nn.scan(Block) is a module
# class "ScanBlock" (instances "ScanBlock_0"), Haiku's hk.layer_stack without a
# name "__layer_stack_no_per_layer".
_SCANNED_NAME = re.compile(r"(?:^|/)(Scan[A-Z]\w*_\d+|__layer_stack\w*)(?:/|$)")


def _shares_a_leading_size(leaves: Sequence[Any]) -> bool:
  """All at least 2-d, with one leading size (the layer count of a stack)."""
  return (bool(leaves) and all(np.ndim(leaf) >= 2 for leaf in leaves)
          and len({np.shape(leaf)[0] for leaf in leaves}) == 1)


def _looks_stacked(module: str, named: Sequence[tuple[str, Any]]) -> bool:
  """Do the leaves under ``module`` look like a stack of layers?

  Haiku's unnamed ``hk.layer_stack`` says so by its name. A Flax module named
  ``Scan<Name>_<n>`` may be ``nn.scan``'s or a user's own class (``ScanNet``): a
  scanned stack gives every leaf, biases and norm scales too, the same leading
  layer axis, so all its leaves are at least 2-d with one leading size, and a
  lone leaf (a Dense without bias) is at least 3-d.
  """
  if module.startswith("__layer_stack"):
    return True
  leaves = [leaf for n, leaf in named
            if (m := _SCANNED_NAME.search(n)) is not None and m.group(1) == module]
  return _shares_a_leading_size(leaves) and (len(leaves) >= 2 or np.ndim(leaves[0]) >= 3)


# Leaf names that are 1-d in an ordinary layer: biases, norm scales and offsets
# (Flax, nnx, Equinox: bias, scale; Haiku: b, offset).
_ONE_D_NAME = re.compile(r"(?:^|/)(?:bias|scale|b|offset)$")


def _stacks_by_shape(named: Sequence[tuple[str, Any]], ks: Sequence[int]) -> list[str]:
  """The prefixes of unmarked stacks that their shapes give away.

  A layer built once per layer by ``nnx.vmap``, ``eqx.filter_vmap`` or ``nn.scan``
  under any name has a bias or norm scale with 2 or more axes longer than 1, beside
  a kernel of another shape, and every leaf of its module shares its leading size
  (the layer count). From such a module the prefix
  climbs while every leaf under it still does, so that it covers the whole stack.
  """
  def under(prefix: str) -> list[Any]:
    return [leaf for n, leaf in named if n.startswith(prefix + "/")]

  prefixes: list[str] = []
  for (n, leaf), k in zip(named, ks):
    # (Equinox's conv bias, (out, 1, 1), is one vector with singleton axes.)
    if (k or sum(d > 1 for d in np.shape(leaf)) < 2 or "/" not in n
        or not _ONE_D_NAME.search(n)):
      continue
    parts = n.split("/")[:-1]
    module = under("/".join(parts))
    # A layer's bias or scale beside a kernel of another shape (a norm over
    # several axes has a scale and a bias of one shape, and no kernel).
    if (not _shares_a_leading_size(module)
        or len({np.shape(leaf) for leaf in module}) < 2):
      continue
    while len(parts) > 1 and _shares_a_leading_size(under("/".join(parts[:-1]))):
      parts = parts[:-1]
    prefix = "/".join(parts)
    if prefix not in prefixes and not any(prefix.startswith(p + "/") for p in prefixes):
      prefixes.append(prefix)
  return prefixes


def _stacks_by_name(named: Sequence[tuple[str, Any]], ks: Sequence[int]) -> list[str]:
  """The prefixes of unmarked stacks that their module names give away (``Scan…_0``,
  Haiku's ``__layer_stack…``)."""
  prefixes: list[str] = []
  for (n, leaf), k in zip(named, ks):
    m = _SCANNED_NAME.search(n)
    if not k and np.ndim(leaf) >= 2 and m and _looks_stacked(m.group(1), named):
      prefix = n[:m.end(1)]
      if prefix not in prefixes:
        prefixes.append(prefix)
  return prefixes


def warn_one_ratio_per_stack(tx: Any, name: str, peer: str) -> Any:
  """``tx`` whose ``init`` warns when leaves carry Flax ``"layers"`` partition metadata
  (a scanned or vmapped stack) that ``tx``, with ``stacked=None`` as its peer ``peer``
  has it, does not read. The state and the update are ``tx``'s own."""
  def init_fn(params: Any) -> Any:
    try:
      ks = resolve(FROM_METADATA, params)
    except ValueError:  # (metadata that stacked= could not read anyway)
      ks = []
    hits = [n for (n, _), k in zip(masks.named_leaves(params), ks) if k]
    if hits:
      more = f" and {len(hits) - 3} more" if len(hits) > 3 else ""
      warnings.warn(
          f"stacked: {hits[:3]}{more} carry Flax 'layers' partition metadata (a stack of "
          f"layers, from nn.scan or nnx.vmap). {name} takes one trust ratio per stack, as "
          f"{peer} does; the unrolled model takes one per layer. Pass "
          "stacked=lars_optax.stacked.FROM_METADATA for one per layer (the default of "
          "lars_optax's own lars, lamb and lans).", UserWarning, stacklevel=2)
    return tx.init(params)

  return tx._replace(init=init_fn)


def warn_unstacked(tx: Any, stacked: StackedLike, name: str) -> Any:
  """``tx`` whose ``init`` warns when ``stacked`` is the default and leaves look stacked.

  A stack without partition metadata keeps each stacked leaf as one leaf; with
  ``stacked`` left at its default nothing marks it, and a layer-wise rule takes
  one norm over the whole stack. Such stacks are told by their module names (a
  Flax ``nn.scan`` module ``ScanBlock_0/...``, Haiku's ``hk.layer_stack``
  ``__layer_stack_no_per_layer/...``) or by their shapes (an nnx ``nnx.vmap``
  stack of layers built without ``nnx.with_partitioning``, an Equinox
  ``filter_vmap`` stack: see :func:`_stacks_by_shape`). The state and the
  update are ``tx``'s own.
  """
  if stacked is not FROM_METADATA:
    return tx

  def init_fn(params: Any) -> Any:
    named = masks.named_leaves(params)
    ks = resolve(stacked, params)
    prefixes = _stacks_by_name(named, ks)
    prefixes += [p for p in _stacks_by_shape(named, ks)
                 if not any(p == q or p.startswith(q + "/") or q.startswith(p + "/")
                            for q in prefixes)]
    if prefixes:
      hits = [n for (n, leaf), k in zip(named, ks) if not k and np.ndim(leaf) >= 2
              and any(n.startswith(p + "/") for p in prefixes)]
      more = f" and {len(hits) - 3} more" if len(hits) > 3 else ""
      alternatives = "|".join(re.escape(p) for p in prefixes)
      regex = "^" + (alternatives if len(prefixes) == 1 else f"(?:{alternatives})") + "/"
      warnings.warn(
          f"stacked: {hits[:3]}{more} look like a stack of layers (nnx.vmap, Flax "
          f"nn.scan, Haiku hk.layer_stack, eqx.filter_vmap: every leaf under "
          f"{prefixes[0]!r} has the same leading size, biases and norm scales too), but "
          f"stacked= was left at its default and they carry no 'layers' partition "
          f"metadata, so {name} takes one norm and one trust ratio over each whole stack "
          f"instead of one per layer as the unrolled model would. Pass "
          f"stacked=lars_optax.by_regex({regex!r}) (one leading layer axis; see "
          f"lars_optax.stacked), or stacked=None to keep one ratio per stack and silence "
          f"this warning.", UserWarning, stacklevel=2)
    return tx.init(params)

  return tx._replace(init=init_fn)


def layer_axes(params: Any, stacked: StackedLike = FROM_METADATA) -> dict[str, int]:
  """``{leaf name: number of leading layer axes}`` as the optimizers resolve ``stacked``.

  For checking what a ``stacked`` argument (or the default detection from Flax
  metadata) selects before training.
  """
  ks = resolve(stacked, params)
  return {name: k for (name, _), k in zip(masks.named_leaves(params), ks)}


def layer_markers(tree: Any, ks: Sequence[int]) -> tuple[Any, ...]:
  """What a state keeps of the layer axes: ``()`` when nothing is stacked, else per
  leaf None (not stacked) or an int8 array of shape ``shape[:k]`` (its layer grid)."""
  if not any(ks):
    return ()
  return tuple(jnp.zeros(np.shape(leaf)[:k], jnp.int8) if k else None
               for leaf, k in zip(jax.tree.leaves(tree), ks))


def axes_from_markers(markers: Sequence[Any], n: int) -> list[int]:
  """The layer axes kept by :func:`layer_markers` (or per-layer arrays): their ndims."""
  if not markers:
    return [0] * n
  return [0 if m is None else jnp.ndim(m) for m in markers]


def sq_norm(x: jax.Array, k: int = 0) -> jax.Array:
  """Per-layer sum of squares (over all axes but the first ``k``), in float32 or wider.

  For complex ``x`` the sum of :math:`|x|^2`, real (float32 for complex64).
  """
  x = x.astype(utils.norm_dtype(x.dtype))
  return jnp.sum(utils.abs_sq(x), axis=tuple(range(k, x.ndim)))


# How a small leaf's arrays (the weight and its update) are best reduced
# depends on the platform the step is lowered for, so the choice is made there
# (``lax.platform_dependent``: an ahead-of-time compile for a TPU from a CPU
# host, or an export, gets the TPU's code):
#
# * CPU. Below _SMALL elements XLA's CPU backend reduces an array in up to
#   three kernels (a multiply, a windowed partial sum, the final sum), and an
#   array stacked from several the same; at or above it, in one. So a small
#   leaf's arrays are reduced together: over their stack, or, in a process with
#   one device and up to _ONE_PASS elements a layer, in one variadic reduction
#   (one kernel). That one adds in a single pass: measured, its relative error
#   is 1.1e-6 of the squared norm at 1,024 elements and 2.5e-6 at 4,095, against
#   9e-8 for the stack's windowed sum. Not with several devices: XLA's SPMD
#   partitioner all-gathers the operands of a variadic reduction (a sharded
#   bias, in tests/test_distributed.py), where it all-reduces a plain sum's
#   partial results.
# * TPU. Each array on its own: XLA's TPU backend fuses a leaf's two sums with
#   the moments that produce the update into one multi-output fusion. A stack
#   costs LAMB's step a third more estimated cycles, one more fusion a leaf
#   (``step_time.py --scaling --tpu``).
# * Other platforms (GPUs) keep the stack: the H200 figures of docs/speed.md
#   were measured with it, and the other ways were not.
_SMALL = 4096
_ONE_PASS = 1024


def _sq_norms(arrays: Sequence[jax.Array], k: int, platform: str) -> tuple[jax.Array, ...]:
  """:func:`sq_norm` of each of one leaf's arrays; small ones of one shape and
  dtype together, as suits ``platform`` ("cpu", "tpu" or another, see ``_SMALL``)."""
  first = arrays[0]
  if platform != "tpu" and _reduced_together(arrays):
    if (platform == "cpu" and jax.device_count() == 1
        and np.prod(np.shape(first)[k:], dtype=np.int64) <= _ONE_PASS):
      squares = tuple(utils.abs_sq(x.astype(utils.norm_dtype(x.dtype))) for x in arrays)
      zero = np.zeros((), squares[0].dtype)
      return tuple(jax.lax.reduce(squares, (zero,) * len(squares), _add_each,
                                  tuple(range(k, first.ndim))))
    sums = sq_norm(jnp.stack(arrays), k + 1)
    return tuple(sums[j] for j in range(len(arrays)))
  return tuple(sq_norm(x, k) for x in arrays)


def _reduced_together(arrays: Sequence[jax.Array]) -> bool:
  """Whether a leaf's arrays are small and alike enough to be reduced together."""
  first = arrays[0]
  return len(arrays) > 1 and np.size(first) < _SMALL and all(
      np.shape(x) == np.shape(first) and jnp.result_type(x) == jnp.result_type(first)
      and utils.vma(x) == utils.vma(first) for x in arrays[1:])


def _all_sq_norms(groups: Sequence[Sequence[jax.Array] | None],
                  ks: Sequence[int]) -> list[Any]:
  """:func:`_sq_norms` of every leaf's group, the way the lowering platform sums best."""
  def on(platform: str) -> Callable[[Any], list[Any]]:
    return lambda gs: [None if g is None else _sq_norms(g, k, platform)
                       for g, k in zip(gs, ks)]

  if not any(g is not None and _reduced_together(g) for g in groups):
    return on("any")(groups)  # every platform sums each array on its own
  return jax.lax.platform_dependent(list(groups), cpu=on("cpu"), tpu=on("tpu"),
                                    default=on("other"))


def _add_each(a: tuple[jax.Array, ...], b: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
  return tuple(x + y for x, y in zip(a, b))


def _check_split_leaves(groups: Sequence[Sequence[jax.Array] | None], ks: Sequence[int],
                        axis_name: str | Sequence[str | None] | None) -> None:
  for i, (group, k) in enumerate(zip(groups, ks)):
    if group is None or k:  # a stack split by layers holds whole layers: no sum needed
      continue
    summed = (axis_name if isinstance(axis_name, str) or axis_name is None
              else axis_name[i])
    left = frozenset().union(*(utils.vma(x) for x in group)) - {summed}
    if left:
      raise ValueError(
          f"axis_name: a leaf of shape {tuple(group[0].shape)} (this device's block) varies "
          f"over the mesh axes {sorted(left)} inside shard_map: it is split across devices, "
          "and without a sum over those axes its norm would be each block's, not the "
          f"layer's. Pass axis_name={sorted(left)[0]!r} (or per-leaf rules, "
          "{leaf name: axis}); average gradients over a data axis first (lax.pmean).")


def layer_sq_norms(groups: Sequence[Sequence[jax.Array] | None], ks: Sequence[int],
                   axis_name: str | Sequence[str | None] | None = None) -> list[Any]:
  """Per leaf, the per-layer squared norms of each array in its group.

  ``groups[i]`` is a tuple of arrays of leaf ``i``'s shape (e.g. the weight and
  its update), or None for a skipped leaf (which costs nothing). Each array's
  squares are summed over all axes but the first ``ks[i]`` (the layer axes),
  in float32 (float64 for float64 leaves), giving arrays of shape
  ``shape[:k]`` (scalars for unstacked leaves). With ``axis_name`` the sums of
  all leaves are added over that mesh axis in one collective: a layer split
  over it gets its whole norm. A stack split along its *layer* axis needs no
  sum (each device holds whole layers), so leave ``axis_name`` None there.

  This is the one place the layer-wise rules (LARS, TF LARS, LAMB, LANS and
  :func:`~lars_optax.normalize_per_leaf`) take their norms.

  Inside ``shard_map`` (with ``check_vma``) an unstacked leaf whose arrays vary
  over a mesh axis that its sums do not cover is split across devices: its
  norm would be each device's block's. That is an error naming ``axis_name``.
  """
  _check_split_leaves(groups, ks, axis_name)
  squares = _all_sq_norms(groups, ks)
  if axis_name is None or isinstance(axis_name, str):
    return utils.psum(squares, axis_name)
  # Per leaf (from resolve_axis_names): one collective per mesh axis, over its leaves.
  out = list(squares)
  for axis in sorted({a for a, sq in zip(axis_name, squares) if a is not None and sq}):
    idx = [i for i, a in enumerate(axis_name) if a == axis and squares[i] is not None]
    for i, summed in zip(idx, utils.psum([squares[i] for i in idx], axis)):
      out[i] = summed
  return out


def per_layer(value: Any, x: jax.Array) -> Any:
  """A per-layer array (shape ``shape[:k]``) shaped to broadcast against ``x``."""
  nd = jnp.ndim(value)
  if nd == 0:
    return value
  return jnp.reshape(value, jnp.shape(value) + (1,) * (x.ndim - nd))
