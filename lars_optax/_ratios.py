"""The maths the layer-wise rules share: ratios from norms, their state layout, Adam's moments.

Private: :mod:`lars_optax._trust_ratio`, :mod:`lars_optax._lamb` and
:mod:`lars_optax._lans` build on these.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax import _stacked as stacked_mod


class PackedLeaves(list):
  """Per-leaf results of :func:`packed_map` (a list: per leaf an array or None),
  which also keeps the same results packed into vectors (``vectors[key]``) and
  where each leaf's lies in them (``spans[i]``: ``(key, offset, size)`` or
  None), so that :func:`ratio_vector` gathers the logged ratios in one
  operation."""

  vectors: dict[Any, jax.Array]
  spans: list[tuple[Any, int, int] | None]


def packed_map(fn: Any, squares: Sequence[Any], *leaf_args: Sequence[Any]) -> Any:
  """An elementwise ``fn`` of every leaf's squared norms: per leaf its result, or None.

  ``squares[i]`` is leaf ``i``'s tuple of squared norms (shape ``shape[:k]``)
  or None (a skipped leaf); ``leaf_args`` are further per-leaf arguments (a
  scalar, or a per-layer array, such as a weight decay).

  ``fn`` is applied twice, with the same operations and so the same numbers:

  * per leaf, on that leaf's own norms, for the leaf's update. With
    :func:`_guarded_divide` XLA computes it in one small kernel per leaf,
    the same kernel for every leaf (compiled once), and folds the final
    choice into the kernel that applies the result. (Slicing each leaf's
    entry out of one packed vector would give every leaf a kernel of its
    own, a different offset each: measured, 288 leaves compiled 2x slower.)
  * once on all leaves' norms packed into vectors (one per dtype), kept in
    the result's ``vectors`` for the logged ratios (:func:`ratio_vector`):
    one kernel for the model instead of one per leaf.

  Returns a :class:`PackedLeaves`, or a tuple of them when ``fn`` returns a
  tuple of arrays.
  """
  spans: list[tuple[Any, int, int] | None] = [None] * len(squares)
  per_leaf: list[Any] = [None] * len(squares)
  by_dtype: dict[Any, list[int]] = {}
  for i, sq in enumerate(squares):
    if sq is not None:
      by_dtype.setdefault(jnp.result_type(sq[0]), []).append(i)
      per_leaf[i] = fn(*sq, *(values[i] for values in leaf_args))
  arity = next((len(r) if isinstance(r, tuple) else None for r in per_leaf if r is not None),
               None)
  vectors: dict[Any, tuple[jax.Array, ...]] = {}
  for dt, idx in by_dtype.items():
    shapes = [np.shape(squares[i][0]) for i in idx]
    # One flat concatenation, leaf by leaf, of each leaf's norms in turn (a
    # small leaf's are one reduction's output already: _stacked.layer_sq_norms),
    # read back with a stride; nested concatenations would cost a kernel a leaf.
    arity_in = len(squares[idx[0]])
    # (A stacked leaf's per-layer norms, split with its layers over explicit
    # mesh axes, are replicated first: a concatenation's operands must agree.)
    flat = jnp.concatenate([jnp.ravel(jnp.stack([utils.replicated(x) for x in squares[i]], -1))
                            for i in idx])
    cols = [flat[j::arity_in] for j in range(arity_in)]
    args = []
    for values in leaf_args:
      picked = [values[i] for i in idx]
      if all(x is picked[0] for x in picked) or all(
          utils.is_python_number(x) and x == picked[0] for x in picked):
        args.append(picked[0])  # one value for all: a scalar
      else:
        args.append(jnp.concatenate([jnp.ravel(jnp.broadcast_to(utils.cast(x, dt), shape))
                                     for x, shape in zip(picked, shapes)]))
    result = fn(*cols, *args)
    vectors[dt] = result if isinstance(result, tuple) else (result,)
    offset = 0
    for i, shape in zip(idx, shapes):
      size = int(np.prod(shape, dtype=np.int64))
      spans[i] = (dt, offset, size)
      offset += size
  outs = []
  for j in range(arity or 1):
    leaves = PackedLeaves(r if r is None or arity is None else r[j] for r in per_leaf)
    leaves.vectors = {dt: vec[j] for dt, vec in vectors.items()}
    leaves.spans = spans
    outs.append(leaves)
  return tuple(outs) if arity is not None else outs[0]


def ratio_from_squares(w2, g2, eta, weight_decay, epsilon, grad_scale):
  """The LARS ratio from the squared norms, eta |w| / (s |g| + wd |w| + eps), with
  MXNet's fallback to 1 where a norm is 0 or not finite.

  The fallback's test is taken on the squares (a square is > 0, or finite,
  exactly when its root is); see :func:`_guarded_divide`.
  """
  ok = _positive_and_finite(w2, g2)
  w_norm, g_norm = jnp.sqrt(w2), jnp.sqrt(g2)
  if not utils.is_const(grad_scale, 1):
    g_norm = g_norm * jnp.abs(utils.cast(grad_scale, g_norm.dtype))
    ok = ok & jnp.isfinite(g_norm)  # the scaled norm may overflow
  dt = w_norm.dtype  # float32 or wider, whatever the hyperparameters' types
  num = utils.cast(eta, dt) * w_norm
  den = g_norm
  if not utils.is_const(weight_decay, 0):
    den = den + utils.cast(weight_decay, dt) * w_norm
  if not utils.is_const(epsilon, 0):
    den = den + utils.cast(epsilon, dt)
  return _guarded_divide(ok, num, den)


def _positive_and_finite(a: jax.Array, b: jax.Array) -> jax.Array:
  """``0 < a, b < inf`` (False for NaN: XLA's min and max keep a NaN), in
  fewer operations than four tests: this is per-leaf scalar work."""
  return (jnp.minimum(a, b) > 0) & (jnp.maximum(a, b) < np.inf)


def _guarded_divide(ok: jax.Array, num: jax.Array, den: jax.Array) -> jax.Array:
  """``num / den`` where ``ok``, else 1; ``ok`` must imply a positive, finite ``den``.

  The denominator is 1 where not ``ok`` (so that a masked-out 0 / 0 never
  happens: ``jax_debug_nans`` stays quiet), and the fallback is chosen after
  the division: XLA then computes the division in one small kernel per leaf
  and folds the cheap choice into the (large) kernel that applies the ratio.
  Plain ``select`` operations: this runs once per leaf, so every operation
  counts in the step's compile time."""
  ratio = num / utils.select(ok, den, 1)
  return utils.select(ok, ratio, 1)


def leaf_ratios(flat_p, flat_g, skipped, eta, weight_decays, epsilon, grad_scale,
                 axis_name, ks, larc_bound=None):
  """Per-leaf (per-layer for stacked leaves) trust ratios, None for skipped leaves
  (which cost nothing); with ``larc_bound``, LARC-clipped (:func:`clip_ratio`).

  With ``axis_name`` the squared norms of all leaves are summed over the axis
  in one collective. The ratios of all leaves are computed at once
  (:func:`packed_map`).
  """
  squares = stacked_mod.layer_sq_norms(
      [None if s else (p, g) for p, g, s in zip(flat_p, flat_g, skipped)], ks, axis_name)

  def ratios(w2, g2, wd):
    r = ratio_from_squares(w2, g2, eta, wd, epsilon, grad_scale)
    return r if larc_bound is None else clip_ratio(r, larc_bound)

  return packed_map(ratios, squares, weight_decays)


def ratio_dtype(params: Any) -> jnp.dtype:
  """float32, or float64 when a leaf is float64: the dtype of the ratio vector."""
  return functools.reduce(jnp.promote_types,
                          (utils.real_dtype(utils.norm_dtype(p.dtype))
                           for p in jax.tree.leaves(params)),
                          jnp.dtype(jnp.float32))


def leaf_slots(params: Any) -> list[bool]:
  """Per leaf of the whole tree: True for a leaf, False for a MaskedNode placeholder."""
  return [not isinstance(x, optax.MaskedNode) for x in jax.tree.leaves(
      params, is_leaf=lambda x: isinstance(x, optax.MaskedNode))]


def ratio_vector(params: Any, ratios: PackedLeaves | None = None) -> jax.Array:
  """A state's ratio vector: the leaves' ratios from :func:`packed_map` (1 where
  None or not given; the mean over the layers of a stacked leaf), -1 for
  MaskedNode placeholders, gathered from the packed vectors in one operation
  (and one mean per stacked leaf)."""
  dt = ratio_dtype(params)
  slots = leaf_slots(params)
  if ratios is None or all(r is None for r in ratios):
    return jnp.asarray(np.array([1 if real else -1 for real in slots], dtype=dt))
  vectors = [vec.astype(dt) for vec in ratios.vectors.values()]
  starts = dict(zip(ratios.vectors, np.cumsum([2] + [vec.size for vec in vectors])))
  base = 2 + sum(vec.size for vec in vectors)  # the stacked leaves' means follow
  index: list[int] = []
  means: list[jax.Array] = []
  pieces = iter(zip(ratios, ratios.spans))
  for real in slots:
    if not real:
      index.append(1)  # -1: a MaskedNode placeholder
      continue
    r, span = next(pieces)
    if span is None:
      index.append(0)  # 1: a skipped leaf
    elif span[2] == 1 and jnp.ndim(r) == 0:
      index.append(int(starts[span[0]]) + span[1])
    else:  # a stacked leaf: the mean of its layers' ratios
      index.append(base + len(means))
      means.append(jnp.mean(r).astype(dt))
  table = jnp.concatenate([jnp.asarray([1, -1], dt), *vectors,
                           *([jnp.stack(means)] if means else [])])
  return table[np.array(index, dtype=np.int32)]


def layer_ratios(params: Any, ks: Sequence[int], ratios: Sequence[Any] | None = None
                  ) -> tuple[Any, ...]:
  """A state's per-layer ratios: ``()`` when no leaf is stacked, else per leaf None
  (not stacked) or its ratios, shape ``shape[:k]`` (1 where None or not given).

  Their shapes also keep the layer axes for ``update``: nnx passes ``init``
  Variables with their metadata, but ``update`` bare arrays."""
  if not any(ks):
    return ()
  dt = ratio_dtype(params)
  it = iter(zip(jax.tree.leaves(params), ks, ratios if ratios is not None else [None] * len(ks)))
  out: list[Any] = []
  for real in leaf_slots(params):  # one entry per slot, MaskedNode placeholders included
    if not real:
      out.append(None)
      continue
    p, k, r = next(it)
    out.append(None if not k else jnp.ones(np.shape(p)[:k], dt) if r is None else r.astype(dt))
  return tuple(out)


def layer_axes(state_layers: Sequence[Any], params: Any) -> list[int]:
  """The layer axes of each leaf (placeholders left out), as kept by :func:`layer_ratios`."""
  real_slots = leaf_slots(params)
  if not state_layers:
    return [0] * sum(real_slots)
  return [0 if m is None else jnp.ndim(m) for m, real in zip(state_layers, real_slots) if real]


def clip_ratio(r: jax.Array, bound: Any) -> jax.Array:
  """LARC's clip: the ratios ``r`` become min(r / bound, 1).

  A bound of 0 (a warm-up from 0) gives 1, as in timm where rho / 0 is
  infinite, also for a ratio of 0 (``eta=0``), where 0 / 0 would be NaN; the
  step is then 0 either way (the rate is 0). 1 is divided there, not 0, so that
  ``jax_debug_nans`` stays quiet."""
  b = utils.cast(bound, r.dtype)
  positive = b > 0
  clipped = jnp.minimum(r / jnp.where(positive, b, 1), 1)
  return jnp.where(positive, clipped, 1).astype(r.dtype)


def apply_ratios(flat_u: Sequence[jax.Array], ratios: Sequence[Any]) -> list[jax.Array]:
  """Each update times its ratio (None: unchanged; per layer for a stacked leaf).

  The product is taken in the ratio's dtype (float32 or wider) and rounded
  once: a float16 ratio would overflow above 65504 (w = 10, g = 1e-7).
  """
  return [u if r is None else (u.astype(jnp.promote_types(u.dtype, r.dtype))
                               * stacked_mod.per_layer(r, u)).astype(u.dtype)
          for u, r in zip(flat_u, ratios)]


def bound_order(*, lower_bound: Any, upper_bound: Any, **_: Any) -> None:
  """LAMB's bounds on the weight norm: ``lower_bound <= upper_bound`` (each is declared
  in :data:`lars_optax._links.DECLARED`: None, or a number >= 0, > 0 for the upper)."""
  if v.is_constant(lower_bound) and v.is_constant(upper_bound) and (
      float(np.asarray(lower_bound)) > float(np.asarray(upper_bound))):
    raise ValueError(
        f"lower_bound: must be <= upper_bound (the weight norm is clipped to "
        f"[lower_bound, upper_bound]), got lower_bound={float(np.asarray(lower_bound)):g} "
        f"and upper_bound={float(np.asarray(upper_bound)):g}.")


def bounded_ratio(w2: jax.Array, u2: jax.Array, lower_bound: Any,
                   upper_bound: Any, max_ratio: Any = None) -> jax.Array:
  """LAMB's ratio from squared norms: the bounded weight norm over the update norm.

  MXNet's fallback to 1 for a zero norm (after the bounds), extended to
  non-finite norms as for LARS, is tested on the squares (see
  :func:`ratio_from_squares` and :func:`_guarded_divide`).
  """
  dt = jnp.result_type(w2)  # float32 or wider
  if lower_bound is None and upper_bound is None:
    ok = _positive_and_finite(w2, u2)
  else:
    w_pos = w2 > 0
    if lower_bound is not None:
      w_pos = w_pos | (utils.cast(lower_bound, dt) > 0)
    # An infinite norm is finite once bounded above; NaN stays NaN.
    w_finite = jnp.isfinite(w2) if upper_bound is None else ~jnp.isnan(w2)
    ok = w_pos & w_finite & (u2 > 0) & (u2 < np.inf)
  w_norm, u_norm = jnp.sqrt(w2), jnp.sqrt(u2)
  if lower_bound is not None:
    w_norm = jnp.maximum(w_norm, utils.cast(lower_bound, dt))
  if upper_bound is not None:
    w_norm = jnp.minimum(w_norm, utils.cast(upper_bound, dt))
  ratio = _guarded_divide(ok, w_norm, u_norm)
  if max_ratio is not None:
    ratio = utils.select(ok, jnp.minimum(ratio, utils.cast(max_ratio, ratio.dtype)), 1)
  return ratio


def ratio_axes(params: Any, skip: masks.MaskLike, stacked: stacked_mod.StackedLike) -> list[int]:
  """The layer axes at ``init`` of LAMB's and LANS's ratios (a bad ``skip`` fails here)."""
  ks = stacked_mod.resolve(stacked, params)
  masks.resolve_mask(skip, params, "skip", ks)  # a bad mask fails here already
  return ks


def update_inputs(updates: Any, state: Any, params: Any, skip: masks.MaskLike,
                  name: str) -> tuple[Any, list[int], list[bool]]:
  """A layer-wise rule's ``update`` preamble: the params (aligned with the updates, and
  required), the layer axes kept in ``state`` and the leaves ``skip`` leaves out."""
  params = v.align_params(updates, params)
  v.require_params(params, name)
  ks = layer_axes(state.layer_trust_ratio, params)
  return params, ks, masks.resolve_mask(skip, params, "skip", ks)


def bias_corrections(count: jax.Array, b1: Any, b2: Any) -> Any:
  """dtype -> ``(1 - b1^t, 1 - b2^t)`` in that dtype (float32 or wider).

  The powers are taken in that dtype, as MXNet's kernels (``power`` in float)
  and :func:`optax.scale_by_adam` take them.
  """
  cache: dict[Any, tuple[jax.Array, jax.Array]] = {}

  def get(dt):
    if dt not in cache:
      t = count.astype(dt)
      cache[dt] = (1 - utils.cast(b1, dt) ** t, 1 - utils.cast(b2, dt) ** t)
    return cache[dt]

  return get


_RATIO_STATES: list[type] = []


def ratio_state(cls: type) -> type:
  """A class decorator: :func:`lars_optax.trust_ratios` reads the ratios of states of ``cls``.

  A state type declares itself here, in a bottom module, so that
  ``trust_ratios`` finds it without importing the module that defines it.
  """
  _RATIO_STATES.append(cls)
  return cls


def ratio_states() -> tuple[type, ...]:
  return tuple(_RATIO_STATES)
