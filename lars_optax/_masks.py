"""Leaf names and masks: the implementation behind :mod:`lars_optax.masks`, and the
checks and resolvers that the other modules use on ``skip``, ``lr_mult`` and
``wd_mult`` arguments (private: users call the public names)."""

from __future__ import annotations

import difflib
import functools
import math
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
import optax
from jax import tree_util as jtu



def _key_str(key: Any) -> str:
  """Renders one path entry (dict key, attribute, index) as a string."""
  if isinstance(key, jtu.DictKey):
    return str(key.key)
  if isinstance(key, jtu.GetAttrKey):
    return key.name
  if isinstance(key, jtu.SequenceKey):
    return str(key.idx)
  if isinstance(key, jtu.FlattenedIndexKey):
    return str(key.key)
  # Custom key types (e.g. Flax nnx paths) render through their own str().
  name = getattr(key, "key", getattr(key, "name", key))
  return str(name)


def path_to_name(path: tuple[Any, ...]) -> str:
  """Joins a ``jax.tree_util`` key path into a ``/``-separated name."""
  return "/".join(_key_str(k) for k in path)


def is_box(x: Any) -> bool:
  """A node that holds one value: a Flax ``nnx.Variable`` or a linen metadata box
  (for the library's modules; not in ``__all__``).

  Its leaf is named by the box's own path, so ``nnx.state(model)`` (which
  holds Variables, as ``nnx.Optimizer`` passes it to ``init``) and the pure
  arrays (as passed to ``update``) give the same names: ``lin1/kernel``, not
  ``lin1/kernel/value``. Likewise the params of a linen model built with
  ``nn.with_logical_partitioning`` / ``nn.with_partitioning`` hold
  ``nn.Partitioned`` boxes (``flax.core.meta.AxisMetadata``): their leaves are
  named ``Dense_0/kernel``, as after ``nn.meta.unbox``, so the presets see them.
  """
  mro = type(x).__mro__
  if hasattr(x, "get_value") and any(c.__name__ == "Variable" for c in mro):
    return True
  if any(c.__name__ == "VariableState" and c.__module__.startswith("flax") for c in mro):
    return True  # what nnx.split gives before Flax 0.11
  return is_linen_box(x)


def is_linen_box(x: Any) -> bool:
  """A Flax linen metadata box (``nn.Partitioned``, ``nn.LogicallyPartitioned``:
  ``flax.core.meta.AxisMetadata``), for the library's modules; not in ``__all__``."""
  return hasattr(x, "unbox") and any(
      c.__name__ == "AxisMetadata" and c.__module__.startswith("flax") for c in type(x).__mro__)


def _named(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[tuple[str, Any]]:
  def stop(x):
    return is_box(x) or (is_leaf is not None and is_leaf(x))

  flat, _ = jtu.tree_flatten_with_path(tree, is_leaf=stop)
  out: list[tuple[str, Any]] = []
  for path, node in flat:
    name = path_to_name(path)
    if is_box(node):
      out.extend((name, leaf) for leaf in jax.tree.leaves(node, is_leaf=is_leaf))
    else:
      out.append((name, node))
  return out


def _map_named(fn: Callable[[str, Any], Any], tree: Any) -> Any:
  """``tree`` with each leaf replaced by ``fn(name, leaf)`` (same structure)."""
  def f(path, node):
    name = path_to_name(path)
    if is_box(node):
      return jax.tree.map(lambda leaf: fn(name, leaf), node)
    return fn(name, node)

  return jtu.tree_map_with_path(f, tree, is_leaf=is_box)


def named_leaves(tree: Any) -> list[tuple[str, Any]]:
  """Returns ``[(name, leaf), ...]`` in ``jax.tree.leaves`` order.

  >>> named_leaves({"fc1": {"weight": 1, "bias": 2}})
  [('fc1/bias', 2), ('fc1/weight', 1)]
  """
  return _named(tree)


def _placeholder_names(tree: Any) -> list[str]:
  """The names of the leaves and of the None / optax.MaskedNode placeholders."""
  return [name for name, _ in _named(
      tree, is_leaf=lambda x: x is None or isinstance(x, optax.MaskedNode))]


def check_unique_names(tree: Any, arg_name: str = "params") -> None:
  """Raises a ValueError when two leaves of ``tree`` get the same name.

  Names join path entries with ``/``, so a key ``"a/b"`` and the nested keys
  ``{"a": {"b": ...}}`` both give ``a/b``: a mask or an ``lr_mult`` entry could
  not tell them apart. Where names are used (``skip``, ``lr_mult``,
  ``wd_mult``, :func:`lars_optax.trust_ratios`), ``init`` checks this first.
  """
  seen: dict[str, Any] = {}
  for path, _ in jtu.tree_flatten_with_path(tree, is_leaf=is_box)[0]:
    name = path_to_name(path)
    if name in seen:
      raise ValueError(
          f"{arg_name}: the leaves at {jtu.keystr(seen[name])} and {jtu.keystr(path)} "
          f"share the name {name!r} (names join path entries with '/'), so masks, "
          "lr_mult/wd_mult and trust_ratios cannot tell them apart; rename a key.")
    seen[name] = path


def leaf_names(tree: Any) -> Any:
  """Returns a pytree like ``tree`` whose leaves are the leaf names.

  >>> leaf_names({"params": {"Dense_0": {"bias": 0, "kernel": 0}}})
  {'params': {'Dense_0': {'bias': 'params/Dense_0/bias', 'kernel': 'params/Dense_0/kernel'}}}

  It is a tree, not a list: zipping it with ``jax.tree.leaves(params)`` pairs
  the tree's top-level *keys* with leaves, silently wrong. For the flat form
  use :func:`named_leaves` (``[(name, leaf), ...]`` in ``jax.tree.leaves``
  order), or ``jax.tree.leaves(leaf_names(tree))``:

  >>> [name for name, _ in named_leaves({"b": 1.0, "a": {"w": 2.0}})]
  ['a/w', 'b']
  """
  return _map_named(lambda name, _: name, tree)


Rule = Callable[[str, Any], Any]


class _NameCheck(NamedTuple):
  """One name the user gave: ``test(name)`` is true for the leaf names it matches."""

  text: str  # completes "no parameter name ...", e.g. "ends with 'bias'"
  test: Callable[[str], bool]


class Mask:
  """A name-based rule that turns a pytree into a pytree of bools.

  ``mask(tree)`` evaluates ``rule(name, leaf)`` for every leaf and returns a
  pytree with the structure of ``tree`` and Python ``bool`` leaves. Combine
  masks with ``|`` (either), ``&`` (both) and ``~`` (not).

  Names must match. A mask built from names you give (:func:`by_suffix`,
  :func:`by_substring`, :func:`by_regex`, :func:`by_leaf_name`) remembers
  them, and where this library takes a mask (``skip``, ``skip_list``, the
  ``(mask, value)`` rules of ``lr_mult``/``wd_mult``) ``init`` raises a
  ValueError naming the argument when one of those names matches no leaf, so
  a typo (``by_leaf_name("bais")``) cannot silently select nothing. In a
  combination every named part is checked on its own: a typo anywhere in
  ``FLAX_SKIP | by_substring("embeding")`` is caught, while the combination
  itself may select nothing (``by_suffix("weight") & by_ndim(1)``). Exempt:
  the presets (a model may have no biases), masks turned
  :meth:`optional`, and trees without leaves. Calling a mask yourself (or
  from optax) never checks: use :meth:`unmatched` or :func:`check_matches`.

  Args:
    rule: called with the leaf name and the leaf; must return something
      ``bool()`` can convert without looking at array values (use the name,
      ``leaf.ndim``, ``leaf.shape`` or ``leaf.dtype``: under ``jit`` the leaf
      is a tracer).
    description: shown in ``repr`` and error messages.
  """

  __slots__ = ("_checks", "_rule", "description")

  def __init__(self, rule: Rule, description: str = "custom rule"):
    if not callable(rule):
      raise TypeError(f"Mask rule must be callable, got {type(rule).__name__}.")
    self._rule = rule
    self.description = description
    self._checks: tuple[_NameCheck, ...] = ()

  def _with_checks(self, checks: Iterable[_NameCheck]) -> Mask:
    self._checks = tuple(checks)
    return self

  def matches(self, name: str, leaf: Any) -> bool:
    """Whether the leaf called ``name`` is selected."""
    return bool(self._rule(name, leaf))

  def __call__(self, tree: Any) -> Any:
    return _map_named(self.matches, tree)

  def select(self, tree: Any) -> list[str]:
    """Names of the leaves of ``tree`` that the mask selects."""
    return [name for name, leaf in named_leaves(tree) if self.matches(name, leaf)]

  def optional(self) -> Mask:
    """The same mask, allowed to match nothing (its names are not checked).

    For a mask shared between models, e.g.
    ``by_substring("embedding").optional()`` for models with and without
    embeddings.
    """
    return Mask(self._rule, self.description)

  def unmatched(self, tree: Any) -> list[str]:
    """The names given to this mask that match no leaf of ``tree``.

    Each entry completes "no parameter name ...", e.g. ``"ends with 'bais'"``.
    Empty when every name matches, for :meth:`optional` masks and presets, and
    when ``tree`` has no leaves. ``None`` and :class:`optax.MaskedNode`
    placeholders count as leaves here: inside ``optax.masked`` a name may
    match a parameter that is routed elsewhere.
    """
    names = _placeholder_names(tree)
    if not names:
      return []
    return [c.text for c in self._checks if not any(c.test(n) for n in names)]

  def __or__(self, other: Mask) -> Mask:
    other = _as_mask(other)
    return Mask(lambda n, x: self.matches(n, x) or other.matches(n, x),
                f"({self.description} | {other.description})"
                )._with_checks(self._checks + other._checks)

  def __and__(self, other: Mask) -> Mask:
    other = _as_mask(other)
    return Mask(lambda n, x: self.matches(n, x) and other.matches(n, x),
                f"({self.description} & {other.description})"
                )._with_checks(self._checks + other._checks)

  def __invert__(self) -> Mask:
    return Mask(lambda n, x: not self.matches(n, x),
                f"~{self.description}")._with_checks(self._checks)

  def __repr__(self) -> str:
    return f"Mask({self.description})"


def _as_mask(value: Any) -> Mask:
  if isinstance(value, Mask):
    return value
  raise TypeError(
      f"Masks combine only with other Mask objects, got {type(value).__name__}; "
      "wrap a predicate with lars_optax.masks.by_predicate.")


def _strings(arg_name: str, values: Iterable[str]) -> tuple[str, ...]:
  values = tuple(values)
  if not values:
    raise ValueError(f"{arg_name}: give at least one string.")
  for v in values:
    if not isinstance(v, str) or not v:
      raise TypeError(f"{arg_name}: expected non-empty strings, got {v!r}.")
  return values


def _endswith(name: str, suffix: str) -> bool:
  return name.endswith(suffix)


def _contains(name: str, part: str) -> bool:
  return part in name


def _last(name: str) -> str:
  return name.rsplit("/", 1)[-1]


def _last_is(name: str, last: str) -> bool:
  return _last(name) == last


def by_suffix(*suffixes: str) -> Mask:
  """Leaves whose full name ends with any of ``suffixes`` (MXNet's rule).

  ``by_suffix("gamma", "beta", "bias")`` is :data:`MXNET_SKIP`: it selects
  ``fc1_bias`` and ``bn0_gamma`` but not ``fc1_weight``. Each suffix must match
  some leaf where an optimizer checks it (``init``).
  """
  s = _strings("suffixes", suffixes)
  return Mask(lambda name, _: name.endswith(s), f"suffix in {list(s)}")._with_checks(
      _NameCheck(f"ends with {x!r}", functools.partial(_endswith, suffix=x)) for x in s)


def by_substring(*substrings: str) -> Mask:
  """Leaves whose name contains any of ``substrings`` (TF's ``skip_list``).

  ``by_substring("batch_normalization", "bias")`` selects
  ``resnet/batch_normalization_3/gamma`` and ``dense/bias``. Each substring
  must match some leaf where an optimizer checks it (``init``).
  """
  s = _strings("substrings", substrings)
  return Mask(lambda name, _: any(x in name for x in s),
              f"substring in {list(s)}")._with_checks(
                  _NameCheck(f"contains {x!r}", functools.partial(_contains, part=x))
                  for x in s)


def by_regex(pattern: str | re.Pattern[str]) -> Mask:
  r"""Leaves whose name matches ``pattern`` anywhere (``re.search``).

  ``by_regex(r"BatchNorm_\d+/")`` selects every leaf of a Flax BatchNorm
  layer. An invalid pattern raises a ValueError naming ``pattern``.
  """
  if isinstance(pattern, bytes) or (isinstance(pattern, re.Pattern)
                                    and not isinstance(pattern.pattern, str)):
    raise TypeError(f"pattern: expected a str (leaf names are str), got the bytes "
                    f"pattern {pattern!r}.")
  try:
    compiled = re.compile(pattern)
  except (re.error, TypeError) as e:
    raise ValueError(f"pattern: not a valid regular expression: {pattern!r} ({e})") from e

  def test(name: str) -> bool:
    return compiled.search(name) is not None

  return Mask(lambda name, _: test(name), f"regex {compiled.pattern!r}")._with_checks(
      [_NameCheck(f"matches the regex {compiled.pattern!r}", test)])


def by_leaf_name(*names: str) -> Mask:
  """Leaves whose last path component is exactly one of ``names``.

  ``by_leaf_name("bias")`` selects ``params/Dense_0/bias`` but not
  ``params/Dense_0/kernel`` or ``fc1_bias``.
  """
  given = _strings("names", names)
  s = frozenset(given)
  return Mask(lambda name, _: _last(name) in s, f"leaf name in {sorted(s)}")._with_checks(
      _NameCheck(f"has the last component {x!r}", functools.partial(_last_is, last=x))
      for x in dict.fromkeys(given))


def by_predicate(fn: Callable[[str, Any], Any], *, description: str | None = None) -> Mask:
  """Leaves for which ``fn(name, leaf)`` is true (see :class:`Mask`).

  ``fn`` may look at the name, shape and dtype of the leaf, not at its
  values (under ``jit`` the leaf is a tracer), e.g.
  ``by_predicate(lambda name, leaf: leaf.size < 1024)``.
  """
  if not callable(fn):
    raise TypeError(f"fn: expected a callable, got {type(fn).__name__}.")
  return Mask(fn, description or str(getattr(fn, "__name__", "predicate")))


def by_ndim(max_ndim: int = 1) -> Mask:
  """Leaves with at most ``max_ndim`` dimensions (biases and norm scales).

  ``by_ndim(1)`` selects vectors and scalars whatever their names: a
  framework-independent way to skip biases and normalisation parameters.
  """
  if isinstance(max_ndim, bool) or not isinstance(max_ndim, int) or max_ndim < 0:
    raise ValueError(f"max_ndim: expected an int >= 0, got {max_ndim!r}.")
  return Mask(lambda _, leaf: np.ndim(leaf) <= max_ndim, f"ndim <= {max_ndim}")


# The public data below (and MaskLike, LeafValues) are documented in lars_optax.masks.
everything = Mask(lambda *_: True, "everything")
nothing = Mask(lambda *_: False, "nothing")

MXNET_SKIP = by_suffix("gamma", "beta", "bias").optional()
FLAX_SKIP = by_leaf_name("bias", "scale").optional()
HAIKU_SKIP = by_leaf_name("b", "scale", "offset").optional()
EQUINOX_SKIP = (by_leaf_name("bias") | (by_leaf_name("weight") & by_ndim(1))).optional()

PRESETS: dict[str, Mask] = {"mxnet": MXNET_SKIP, "flax": FLAX_SKIP, "haiku": HAIKU_SKIP,
                            "equinox": EQUINOX_SKIP}


class _DefaultPreset(str):
  """A preset name given as an argument's default, not by the user.

  Equal to (and used as) the name; only its identity differs, so that
  :func:`warn_foreign_names` warns only when the default is in force.
  """

  __slots__ = ()


MXNET_DEFAULT = _DefaultPreset("mxnet")
"""``"mxnet"`` as :func:`lars_optax.lars`'s default ``skip``: see :func:`warn_foreign_names`."""


def _foreign_preset(tree: Any) -> tuple[str, list[str]] | None:
  """The preset whose names ``tree`` has, with the leaves MXNet's rule would adapt.

  Only nested names count (``module/scale``): these frameworks always nest
  their params by module, while MXNet's names and toy examples (``{"w", "b"}``)
  are flat.
  """
  named = [(n, x) for n, x in named_leaves(tree) if "/" in n]
  last = {_last(n) for n, _ in named}
  if last & {"b", "offset"}:
    preset = "haiku"
  elif "scale" in last:
    preset = "flax"
  elif any(_last(n) == "weight" and np.ndim(x) == 1 for n, x in named):
    preset = "equinox"
  else:
    return None
  missed = [n for n, x in named
            if PRESETS[preset].matches(n, x) and not MXNET_SKIP.matches(n, x)]
  return (preset, missed) if missed else None


def warn_foreign_names(tree: Any, arg_name: str = "skip") -> None:
  """Warns when the default MXNet preset meets another framework's names.

  MXNet's rule skips names ending in ``gamma``, ``beta`` or ``bias``. A Flax,
  Haiku or Equinox model names its norm parameters ``scale``/``offset``/
  ``weight`` and Haiku its biases ``b``: under the default those would get a
  trust ratio. Only nested names (``layer_norm/scale``) are looked at, so
  flat MXNet-style dicts never warn. :func:`lars_optax.lars` calls this in
  ``init`` when its ``skip`` is the default (not when ``skip="mxnet"`` is
  passed explicitly).
  """
  found = _foreign_preset(tree)
  if found is None:
    return
  preset, missed = found
  warnings.warn(
      f"{arg_name}: the default preset 'mxnet' (names ending in gamma, beta or bias) "
      f"does not skip {missed[:3]}" + (f" and {len(missed) - 3} more" if len(missed) > 3
                                      else "")
      + f", which look like {preset.capitalize()} norm or bias parameters; pass "
      f"skip={preset!r} to skip them, or skip='mxnet' to keep MXNet's rule (and "
      "silence this warning).", UserWarning, stacklevel=3)


# A pytree of bools, leaf for leaf with the params (True: the leaf is masked). Trees of
# other node types (an Equinox module, a registered dataclass) are passed as Any.
BoolTree = bool | np.bool_ | jax.Array | Mapping[Any, "BoolTree"] | Sequence["BoolTree"]
MaskLike = str | Mask | Callable[[Any], Any] | BoolTree | None


def check_mask_like(mask: MaskLike, arg_name: str = "mask") -> None:
  """Rejects an unknown preset name or a number where a mask is expected."""
  if isinstance(mask, str) and mask not in PRESETS:
    raise ValueError(f"{arg_name}: unknown preset {mask!r}; valid presets are "
                     f"{sorted(PRESETS)}.")
  number = (isinstance(mask, (int, float, complex, np.number, bytes))
            or (isinstance(mask, (np.ndarray, jax.Array)) and mask.dtype != np.bool_))
  if number and not isinstance(mask, bool):
    raise TypeError(f"{arg_name}: expected a mask, a preset name or a bool pytree, "
                    f"got {mask!r}.")
  if (isinstance(mask, (list, tuple)) and mask
      and all(isinstance(x, str) for x in mask)):
    args = ", ".join(repr(x) for x in mask)
    raise TypeError(f"{arg_name}: expected a mask, a preset name or a bool pytree, got "
                    f"the strings {list(mask)!r}; build a mask from names, e.g. "
                    f"lars_optax.masks.by_substring({args}) or by_suffix({args}).")


def check_matches(mask: MaskLike, tree: Any, arg_name: str = "mask", *,
                  hint: str | None = None) -> None:
  """Raises a ValueError when a name given to ``mask`` matches no leaf of ``tree``.

  Only :class:`Mask` objects built from names you gave are checked (see
  :class:`Mask`); presets, :meth:`Mask.optional` masks, other mask-likes and
  trees without leaves pass. The optimizers call this in ``init``.
  """
  if not isinstance(mask, Mask):
    return
  missing = mask.unmatched(tree)
  if not missing:
    return
  names = _placeholder_names(tree)
  raise ValueError(
      f"{arg_name}: no parameter name " + ", and none ".join(missing)
      + f" (names look like {names[:3]}, {len(names)} in all; "
      "lars_optax.leaf_names(params) shows them). "
      + (hint or "Fix the name, or use mask.optional() for a mask that may match "
         "nothing."))


def _one_layer(tree: Any, layer_axes: Sequence[int] | None) -> Any:
  """``tree`` with each stacked leaf (``layer_axes[i]`` > 0) replaced by the shape
  and dtype of one layer, so that shape rules judge one layer."""
  if not layer_axes or not any(layer_axes):
    return tree
  it = iter(layer_axes)

  def view(leaf):
    k = next(it)
    return jax.ShapeDtypeStruct(np.shape(leaf)[k:], leaf.dtype) if k else leaf

  return jax.tree.map(view, tree)


def resolve_mask(mask: MaskLike, tree: Any, arg_name: str = "mask",
                 layer_axes: Sequence[int] | None = None) -> list[bool]:
  """Evaluates ``mask`` on ``tree`` and returns one Python bool per leaf.

  ``None`` selects nothing; a string names a preset (:data:`PRESETS`). A
  callable is called with ``tree``; a pytree of bools must have the structure
  of ``tree`` (optax's mask convention). Values must be static: a traced
  boolean is rejected with a clear error. ``layer_axes`` (one int per leaf,
  from :func:`lars_optax.stacked.layer_axes`): a stacked leaf is shown to the mask as
  the shape and dtype of one layer (``by_ndim(1)`` selects a stacked bias).
  """
  treedef: Any  # (jax's type stubs do not describe PyTreeDef's methods)
  leaves, treedef = jax.tree.flatten(tree)
  if mask is None:
    return [False] * len(leaves)
  check_mask_like(mask, arg_name)
  if isinstance(mask, str):
    mask = PRESETS[mask]
  tree = _one_layer(tree, layer_axes)
  value = mask(tree) if callable(mask) else mask
  if isinstance(value, bool):
    return [value] * len(leaves)
  try:
    flat = treedef.flatten_up_to(value)
  except (ValueError, TypeError) as e:
    raise ValueError(
        f"{arg_name}: the mask's tree structure does not match the parameters "
        f"({e}).") from e
  out = []
  for (name, _), v in zip(named_leaves(tree), flat):
    if isinstance(v, (bool, np.bool_)):
      out.append(bool(v))
    else:
      raise TypeError(
          f"{arg_name}: expected a Python bool for leaf {name!r}, got "
          f"{type(v).__name__}; masks must be static (decided from names, "
          "shapes and dtypes), not computed from array values.")
  return out


LeafValues = Mapping[str, float] | Iterable[tuple[MaskLike, float]] | None


def _check_value(arg_name: str, key: Any, value: Any) -> float | np.ndarray:
  if isinstance(value, (np.ndarray, jax.Array, list)) and np.ndim(value) >= 1:
    # Per-layer values for a stacked leaf (one per layer).
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer)
                                     or np.issubdtype(arr.dtype, np.floating)):
      raise TypeError(f"{arg_name}: the per-layer values for {key!r} must be real "
                      f"numbers, got dtype {arr.dtype}.")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
      raise ValueError(f"{arg_name}: the per-layer values for {key!r} must be finite "
                       f"and >= 0, got {arr.tolist()}.")
    return arr
  if (isinstance(value, (bool, np.bool_))
      or not isinstance(value, (int, float, np.integer, np.floating))):
    raise TypeError(f"{arg_name}: the value for {key!r} must be a real number (or, for "
                    f"a stacked leaf, a 1-d array with one per layer), got {value!r}.")
  value = float(value)
  if not math.isfinite(value) or value < 0:
    raise ValueError(f"{arg_name}: the value for {key!r} must be finite and >= 0, "
                     f"got {value}.")
  return value


def _check_per_layer(arg_name: str, name: str, value: Any, leaf: Any, k: int | None) -> None:
  """A per-layer value (an array) needs a stacked leaf with that many layers."""
  if not isinstance(value, np.ndarray):
    return
  if k is None:
    raise TypeError(
        f"{arg_name}: the value for {name!r} is an array of per-layer values; only the "
        "layer-wise optimizers (lars, tf_lars, lamb, lans) and the per-leaf "
        "transformations take those, for a stacked leaf (see stacked=).")
  shape = tuple(np.shape(leaf))
  if k == 0:
    raise ValueError(
        f"{arg_name}: the value for {name!r} has {value.size} per-layer entries, but the "
        f"leaf (shape {shape}) is not stacked; pass stacked= to name its layer axes, or "
        "give one number.")
  if value.shape != shape[:k] and not (value.ndim == 1 and k == 1):
    raise ValueError(
        f"{arg_name}: the value for {name!r} has shape {value.shape}, but the leaf "
        f"(shape {shape}) has {k} layer axes of shape {shape[:k]}.")
  if value.shape != shape[:k]:
    raise ValueError(
        f"{arg_name}: the value for {name!r} has {value.shape[0]} per-layer entries, but "
        f"the leaf (shape {shape}) has {shape[0]} layers.")


def _rules(spec: LeafValues, arg_name: str) -> list[tuple[Any, Any]] | dict[str, Any]:
  """Validates ``spec`` and returns it as a dict or a list of (mask, value)."""
  if isinstance(spec, Mapping):
    out = {}
    for key, value in spec.items():
      if not isinstance(key, str):
        raise TypeError(f"{arg_name}: dict keys must be leaf names (str), got "
                        f"{key!r}; use a list of (mask, value) rules for masks.")
      out[key] = _check_value(arg_name, key, value)
    return out
  if isinstance(spec, (str, bytes)) or not isinstance(spec, Iterable):
    raise TypeError(f"{arg_name}: expected a dict {{leaf name: value}} or a list of "
                    f"(mask, value) pairs, got {spec!r}.")
  rules = []
  for item in spec:
    if not (isinstance(item, tuple) and len(item) == 2):
      raise TypeError(f"{arg_name}: expected (mask, value) pairs, got {item!r}.")
    mask, value = item
    if mask is None:
      raise TypeError(f"{arg_name}: a rule's mask is None; give a Mask, a preset "
                      "name or a callable.")
    check_mask_like(mask, arg_name)
    rules.append((mask, _check_value(arg_name, mask, value)))
  return rules


def check_leaf_values(spec: LeafValues, arg_name: str) -> None:
  """Checks the form of a :data:`LeafValues` argument (when it is built)."""
  if spec is not None:
    _rules(spec, arg_name)


def resolve_leaf_values(spec: LeafValues, tree: Any, arg_name: str,
                        default: float = 1.0, *, check_names: bool = False,
                        layer_axes: Sequence[int] | None = None,
                        check_layers: bool = True) -> list[Any]:
  """One Python float per leaf of ``tree`` (see :data:`LeafValues`).

  With ``check_names``, a rule's mask whose names match no leaf is an error
  too (:func:`check_matches`); the transformations check in ``init``.
  ``layer_axes`` (one int per leaf): rules judge one layer of a stacked leaf,
  and a stacked leaf may get an array of per-layer values (a numpy array of
  shape ``shape[:k]``); without it, arrays are rejected (``check_layers=False``
  leaves that check to the transformation that uses the values).

  Raises:
    ValueError: a dict key that names no leaf (with the closest names), or
      per-layer values whose length is not the leaf's number of layers.
  """
  named = named_leaves(tree)
  names = [name for name, _ in named]
  if spec is None:
    return [default] * len(names)
  out = _leaf_values(spec, tree, names, arg_name, default, check_names, layer_axes)
  ks = None if layer_axes is None else (list(layer_axes) or [0] * len(names))
  for i, ((name, leaf), value) in enumerate(zip(named, out)):
    if check_layers:
      _check_per_layer(arg_name, name, value, leaf, None if ks is None else ks[i])
  return out


def _leaf_values(spec: LeafValues, tree: Any, names: list[str], arg_name: str,
                 default: float, check_names: bool,
                 layer_axes: Sequence[int] | None) -> list[Any]:
  rules = _rules(spec, arg_name)
  if isinstance(rules, dict):
    known = set(names)
    # Inside optax.masked the masked-out leaves (or subtrees) are MaskedNode
    # placeholders that keep their paths: a key may name them, as a mask may.
    hidden = [n for n in _placeholder_names(tree) if n not in known]
    unknown = [k for k in rules if k not in known
               and not any(k == h or k.startswith(h + "/") for h in hidden)]
    if unknown:
      hints = {k: difflib.get_close_matches(k, [*names, *hidden], n=3) for k in unknown}
      raise ValueError(
          f"{arg_name}: no parameter is named {unknown[0]!r}"
          + (f" (did you mean {hints[unknown[0]]}?)" if hints[unknown[0]] else "")
          + (f"; also unknown: {unknown[1:]}" if len(unknown) > 1 else "")
          + f". Leaf names look like {names[:3]}.")
    return [rules.get(n, default) for n in names]
  out: list[Any] = [None] * len(names)
  for mask, value in rules:
    if check_names:
      check_matches(mask, tree, arg_name)
    selected = resolve_mask(mask, tree, arg_name, layer_axes)
    out = [value if (o is None and s) else o for o, s in zip(out, selected)]
  return [default if o is None else o for o in out]
