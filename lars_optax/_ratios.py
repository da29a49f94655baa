"""The maths the layer-wise rules share: ratios from norms, their state layout, Adam's moments.

Private: :mod:`lars_optax.trust_ratio`, :mod:`lars_optax.lamb` and
:mod:`lars_optax.lans` build on these.
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
from lars_optax import masks
from lars_optax import stacked as stacked_mod


def ratio_from_norms(w_norm, g_norm, eta, weight_decay, epsilon):
  """The LARS ratio from the two norms, with MXNet's fallback to 1."""
  # A finite norm is the square root of a finite sum, so it is far below the
  # dtype's maximum and wn + gn cannot overflow: the sum is finite exactly when
  # both norms are. With both finite and > 0, the ratio is finite too.
  ok = (w_norm > 0) & (g_norm > 0) & jnp.isfinite(w_norm + g_norm)
  # Where the fallback applies, divide 1 by 1 instead: the masked-out 0/0 of a
  # zero layer would still trip jax_debug_nans.
  w_norm = jnp.where(ok, w_norm, jnp.ones_like(w_norm))
  g_norm = jnp.where(ok, g_norm, jnp.ones_like(g_norm))
  dt = w_norm.dtype  # float32 or wider, whatever the hyperparameters' types
  ratio = utils.cast(eta, dt) * w_norm / (
      g_norm + utils.cast(weight_decay, dt) * w_norm + utils.cast(epsilon, dt))
  return jnp.where(ok, ratio, jnp.ones_like(ratio))


def ratio_from_squares(w2, g2, eta, weight_decay, epsilon, grad_scale):
  w_norm, g_norm = jnp.sqrt(w2), jnp.sqrt(g2)
  if not utils.is_const(grad_scale, 1):
    g_norm = g_norm * jnp.abs(utils.cast(grad_scale, g_norm.dtype))
  return ratio_from_norms(w_norm, g_norm, eta, weight_decay, epsilon)


def leaf_ratios(flat_p, flat_g, skipped, eta, weight_decays, epsilon, grad_scale,
                 axis_name, ks):
  """Per-leaf (per-layer for stacked leaves) trust ratios, None for skipped leaves
  (which cost nothing).

  With ``axis_name`` the squared norms of all leaves are summed over the axis
  in one collective.
  """
  squares = stacked_mod.layer_sq_norms(
      [None if s else (p, g) for p, g, s in zip(flat_p, flat_g, skipped)], ks, axis_name)
  return [None if sq is None else ratio_from_squares(*sq, eta, wd, epsilon, grad_scale)
          for sq, wd in zip(squares, weight_decays)]


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


def ratio_vector(params: Any, ratios: Sequence[Any] | None = None) -> jax.Array:
  """A state's ratio vector: the leaves' ratios (1 where None or not given; the mean
  over the layers of a stacked leaf), -1 for MaskedNode placeholders."""
  dt = ratio_dtype(params)
  it = iter(ratios if ratios is not None else [None] * len(jax.tree.leaves(params)))
  entries = [(jnp.ones((), dt) if (r := next(it)) is None else jnp.mean(r).astype(dt))
             if real else jnp.full((), -1, dt) for real in leaf_slots(params)]
  return jnp.stack(entries) if entries else jnp.ones((0,), dt)


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


def clip_ratios(ratios: Sequence[Any], bound: Any) -> list[Any]:
  """LARC's clip: each ratio becomes min(ratio / bound, 1) (None stays None).

  A bound of 0 (a warm-up from 0) gives 1, as in timm where rho / 0 is
  infinite, also for a ratio of 0 (``eta=0``), where 0 / 0 would be NaN; the
  step is then 0 either way (the rate is 0). 1 is divided there, not 0, so that
  ``jax_debug_nans`` stays quiet."""
  out: list[Any] = []
  for r in ratios:
    if r is None:
      out.append(None)
      continue
    b = utils.cast(bound, r.dtype)
    positive = b > 0
    clipped = jnp.minimum(r / jnp.where(positive, b, 1), 1)
    out.append(jnp.where(positive, clipped, 1).astype(r.dtype))
  return out


def apply_ratios(flat_u: Sequence[jax.Array], ratios: Sequence[Any]) -> list[jax.Array]:
  """Each update times its ratio (None: unchanged; per layer for a stacked leaf).

  The product is taken in the ratio's dtype (float32 or wider) and rounded
  once: a float16 ratio would overflow above 65504 (w = 10, g = 1e-7).
  """
  return [u if r is None else (u.astype(jnp.promote_types(u.dtype, r.dtype))
                               * stacked_mod.per_layer(r, u)).astype(u.dtype)
          for u, r in zip(flat_u, ratios)]


def check_bounds(lower_bound: Any, upper_bound: Any) -> None:
  """LAMB's bounds on the weight norm: None, or ``0 <= lower_bound <= upper_bound``."""
  if lower_bound is not None:
    v.check_scalar("lower_bound", lower_bound, low=0.0, alternative=" or None")
  if upper_bound is not None:
    # (0 is refused: MXNet's fused kernels read upper_bound=0 as "no bound", its
    # plain step as a norm of 0.)
    v.check_scalar("upper_bound", upper_bound, low=0.0, low_open=True, alternative=" or None")
  if v.is_constant(lower_bound) and v.is_constant(upper_bound) and (
      float(np.asarray(lower_bound)) > float(np.asarray(upper_bound))):
    raise ValueError(
        f"lower_bound: must be <= upper_bound (the weight norm is clipped to "
        f"[lower_bound, upper_bound]), got lower_bound={float(np.asarray(lower_bound)):g} "
        f"and upper_bound={float(np.asarray(upper_bound)):g}.")


def bounded_ratio(w2: jax.Array, u2: jax.Array, lower_bound: Any,
                   upper_bound: Any, max_ratio: Any = None) -> jax.Array:
  """LAMB's ratio from squared norms: the bounded weight norm over the update norm."""
  w_norm, u_norm = jnp.sqrt(w2), jnp.sqrt(u2)
  dt = w_norm.dtype  # float32 or wider
  if lower_bound is not None:
    w_norm = jnp.maximum(w_norm, utils.cast(lower_bound, dt))
  if upper_bound is not None:
    w_norm = jnp.minimum(w_norm, utils.cast(upper_bound, dt))
  # MXNet's fallback to 1 for a zero norm (after the bounds), extended to
  # non-finite norms as for LARS; 1 / 1 is divided there (jax_debug_nans).
  ok = (w_norm > 0) & (u_norm > 0) & jnp.isfinite(w_norm + u_norm)
  ratio = jnp.where(ok, w_norm, 1) / jnp.where(ok, u_norm, 1)
  if max_ratio is not None:
    ratio = jnp.minimum(ratio, utils.cast(max_ratio, ratio.dtype))
  return jnp.where(ok, ratio, jnp.ones_like(ratio))


def ratio_axes(params: Any, name: str, skip: masks.MaskLike, lower_bound: Any,
               upper_bound: Any, stacked: stacked_mod.StackedLike,
               *, checks: bool, allow_complex: bool = False) -> list[int]:
  """The layer axes at ``init`` of LAMB's and LANS's ratios, after their checks
  (with ``checks``: see :func:`lars_optax._validation.link_checks`)."""
  if checks:
    v.check_float_params(params, name, allow_complex=allow_complex)
    for arg, value in (("lower_bound", lower_bound), ("upper_bound", upper_bound)):
      if value is not None:
        v.check_representable(arg, value, params, compute=True)
    masks.check_unique_names(params)
    masks.check_matches(skip, params, "skip")
  ks = stacked_mod.resolve(stacked, params)
  masks.resolve_mask(skip, params, "skip", ks)  # a bad mask fails here already
  return ks


def moments(updates, mu, nu, b1, b2, grad_averaging=True):
  """Adam's running moments, in the buffers' dtypes (without grad averaging,
  the first moment adds the whole update: m = b1 m + u)."""
  if grad_averaging:
    mu = jax.tree.map(
        lambda m, u: utils.cast(b1, m.dtype) * m + utils.cast(1 - b1, m.dtype) * u, mu, updates)
  else:
    mu = jax.tree.map(lambda m, u: utils.cast(b1, m.dtype) * m + u.astype(m.dtype), mu, updates)
  nu = jax.tree.map(
      lambda n, u: utils.cast(b2, n.dtype) * n + utils.cast(1 - b2, n.dtype) * utils.abs_sq(u),
      nu, updates)
  return mu, nu


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
