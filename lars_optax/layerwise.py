"""The layer-wise family: LARS, LAMB and LANS, their trust ratios and per-leaf normalisation.

The optimizers:

* :func:`lars` -- MXNet's ``mx.optimizer.LARS``;
* :func:`tf_lars` -- TensorFlow's ``tf.contrib.opt.LARSOptimizer``;
* :func:`lamb` and :func:`lans` -- MXNet's ``mx.optimizer.LAMB`` and
  ``mx.optimizer.LANS``.

The transformations they are chained from:

* :func:`scale_by_lars_trust_ratio` -- the LARS layer-wise trust ratio, taken
  from the incoming gradient and the params and applied to the output of an
  inner transformation, with name-based skipping;
* :func:`lars_trust_ratio` -- the ratio of one leaf, for building variants;
* :func:`trust_ratios` -- reads the last step's per-leaf (per-layer) ratios
  from a state;
* :func:`scale_by_lamb_trust_ratio` -- LAMB's ratio (bounded weight norm over
  the norm of the outgoing update), with the same skipping and logging;
  :func:`scale_by_lans` -- LANS's two-part update with a ratio on each part,
  after :func:`normalize_per_leaf`; :func:`scale_by_lamb_adam` -- Adam's
  direction with optional bias correction.

Every one of them takes ``stacked=`` (:mod:`lars_optax.stacked`): a leaf that
holds a stack of layers gets one norm and one ratio per layer, as the
unrolled model would. All of them take their norms through
:func:`lars_optax.stacked.layer_sq_norms`. The LARS and LAMB of timm, optax,
Keras, BYOL, SimCLR and ALBERT are chains of these parts: see
:mod:`lars_optax.porting`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import GradientTransformation, GradientTransformationExtraArgs

from lars_optax import _mxnet_base as base
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import masks
from lars_optax import stacked as stacked_mod
from lars_optax.momentum import mxnet_momentum
from lars_optax.transforms import (
    add_decayed_weights_per_leaf,
)

__all__ = [
  "NormalizePerLeafState",
  "ScaleByLambTrustRatioState",
  "ScaleByLansState",
  "ScaleByLarsTrustRatioState",
  "TrustClipState",
  "lamb",
  "lans",
  "lars",
  "lars_trust_ratio",
  "normalize_per_leaf",
  "scale_by_lamb_adam",
  "scale_by_lamb_trust_ratio",
  "scale_by_lans",
  "scale_by_lars_trust_ratio",
  "tf_lars",
  "trust_ratios",
]


def _ratio_from_norms(w_norm, g_norm, eta, weight_decay, epsilon):
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


def lars_trust_ratio(
    param: jax.Array,
    grad: jax.Array,
    *,
    eta: float = 0.001,
    weight_decay: float = 0.0,
    epsilon: float = 0.0,
    grad_scale: float = 1.0,
    axis_name: str | None = None,
    layer_axes: int = 0,
) -> jax.Array:
  r"""The LARS trust ratio of one leaf (of each layer of a stacked leaf).

  .. math::

    \rho = \frac{\eta \, \|w\|}{\|s g\| + \lambda \|w\| + \epsilon},
    \qquad \rho = 1 \text{ if } \|w\| = 0,\ \|s g\| = 0
    \text{ or any of them is not finite,}

  with :math:`s` = ``grad_scale`` and :math:`\lambda` = ``weight_decay``.
  Norms are taken over the whole leaf in float32 (float64 for float64
  leaves). :math:`\|s g\|` is computed as :math:`|s| \, \|g\|`, so the scaled
  gradient is never materialised. The fallback is MXNet's (ratio 1 when a
  norm is zero, NaN or infinite); TensorFlow's ``LARSOptimizer`` agrees
  wherever its result is finite.

  ``axis_name``: inside ``shard_map``/``pmap``, where ``param`` and ``grad``
  are one device's block of a leaf split over that mesh axis, the squared
  norms are summed over it (``lax.psum``), giving the whole leaf's ratio.

  ``layer_axes``: for a stacked leaf (L layers along its first axis, or
  ``k`` leading layer axes), the number of leading axes that index layers:
  each layer gets its own ratio, from its own norms.

  Returns:
    A scalar in float32 (float64 for float64 leaves), or for ``layer_axes=k``
    an array of shape ``param.shape[:k]``, one ratio per layer.

  Raises:
    ValueError: for an ``eta``, ``weight_decay`` or ``epsilon`` that is not
      a finite number >= 0, or a ``grad_scale`` that is not finite (as the
      optimizers do; the message starts with the argument's name).
    TypeError: for a hyperparameter that is not a real number, or a
      ``param``/``grad`` that is not a real floating point array.

  References:
    You, Gitman and Ginsburg, `Large Batch Training of Convolutional Networks
    <https://arxiv.org/abs/1708.03888>`_, 2017.
  """
  v.check_scalar("eta", eta, low=0.0)
  v.check_scalar("weight_decay", weight_decay, low=0.0)
  v.check_scalar("epsilon", epsilon, low=0.0)
  v.check_scalar("grad_scale", grad_scale)
  v.check_axis_name(axis_name)
  for arg, x in (("param", param), ("grad", grad)):
    dtype = getattr(x, "dtype", None)
    dtype = np.asarray(x).dtype if dtype is None else dtype
    if not jnp.issubdtype(dtype, jnp.floating):
      raise TypeError(f"{arg}: expected a real floating point array, got dtype {dtype}.")
  for arg, value in (("eta", eta), ("weight_decay", weight_decay), ("epsilon", epsilon)):
    v.check_representable(arg, value, param, compute=True)
  if not stacked_mod.is_int(layer_axes) or not 0 <= layer_axes < max(np.ndim(param), 1):
    raise ValueError(f"layer_axes: expected an int in [0, param.ndim), got {layer_axes!r} "
                     f"for a param of shape {np.shape(param)}.")
  [(w2, g2)] = stacked_mod.layer_sq_norms([(param, grad)], [int(layer_axes)], axis_name)
  return _ratio_from_squares(w2, g2, eta, weight_decay, epsilon, grad_scale)


def _ratio_from_squares(w2, g2, eta, weight_decay, epsilon, grad_scale):
  w_norm, g_norm = jnp.sqrt(w2), jnp.sqrt(g2)
  if not utils.is_const(grad_scale, 1):
    g_norm = g_norm * jnp.abs(utils.cast(grad_scale, g_norm.dtype))
  return _ratio_from_norms(w_norm, g_norm, eta, weight_decay, epsilon)


def _leaf_ratios(flat_p, flat_g, skipped, eta, weight_decays, epsilon, grad_scale,
                 axis_name, ks):
  """Per-leaf (per-layer for stacked leaves) trust ratios, None for skipped leaves
  (which cost nothing).

  With ``axis_name`` the squared norms of all leaves are summed over the axis
  in one collective.
  """
  squares = stacked_mod.layer_sq_norms(
      [None if s else (p, g) for p, g, s in zip(flat_p, flat_g, skipped)], ks, axis_name)
  return [None if sq is None else _ratio_from_squares(*sq, eta, wd, epsilon, grad_scale)
          for sq, wd in zip(squares, weight_decays)]


def _ratio_dtype(params: Any) -> jnp.dtype:
  """float32, or float64 when a leaf is float64: the dtype of the ratio vector."""
  return functools.reduce(jnp.promote_types,
                          (utils.real_dtype(utils.norm_dtype(p.dtype))
                           for p in jax.tree.leaves(params)),
                          jnp.dtype(jnp.float32))


def _slots(params: Any) -> list[bool]:
  """Per leaf of the whole tree: True for a leaf, False for a MaskedNode placeholder."""
  return [not isinstance(x, optax.MaskedNode) for x in jax.tree.leaves(
      params, is_leaf=lambda x: isinstance(x, optax.MaskedNode))]


def _ratio_vector(params: Any, ratios: Sequence[Any] | None = None) -> jax.Array:
  """A state's ratio vector: the leaves' ratios (1 where None or not given; the mean
  over the layers of a stacked leaf), -1 for MaskedNode placeholders."""
  dt = _ratio_dtype(params)
  it = iter(ratios if ratios is not None else [None] * len(jax.tree.leaves(params)))
  entries = [(jnp.ones((), dt) if (r := next(it)) is None else jnp.mean(r).astype(dt))
             if real else jnp.full((), -1, dt) for real in _slots(params)]
  return jnp.stack(entries) if entries else jnp.ones((0,), dt)


def _layer_ratios(params: Any, ks: Sequence[int], ratios: Sequence[Any] | None = None
                  ) -> tuple[Any, ...]:
  """A state's per-layer ratios: ``()`` when no leaf is stacked, else per leaf None
  (not stacked) or its ratios, shape ``shape[:k]`` (1 where None or not given).

  Their shapes also keep the layer axes for ``update``: nnx passes ``init``
  Variables with their metadata, but ``update`` bare arrays."""
  if not any(ks):
    return ()
  dt = _ratio_dtype(params)
  it = iter(zip(jax.tree.leaves(params), ks, ratios if ratios is not None else [None] * len(ks)))
  out: list[Any] = []
  for real in _slots(params):  # one entry per slot, MaskedNode placeholders included
    if not real:
      out.append(None)
      continue
    p, k, r = next(it)
    out.append(None if not k else jnp.ones(np.shape(p)[:k], dt) if r is None else r.astype(dt))
  return tuple(out)


def _layer_axes(state_layers: Sequence[Any], params: Any) -> list[int]:
  """The layer axes of each leaf (placeholders left out), as kept by :func:`_layer_ratios`."""
  slots = _slots(params)
  if not state_layers:
    return [0] * sum(slots)
  return [0 if m is None else jnp.ndim(m) for m, real in zip(state_layers, slots) if real]


def _clip_ratios(ratios: Sequence[Any], bound: Any) -> list[Any]:
  """LARC's clip: each ratio becomes min(ratio / bound, 1) (None stays None).

  A bound of 0 (a warm-up from 0) gives 1, as in timm: rho / 0 is infinite."""
  return [None if r is None else jnp.minimum(r / utils.cast(bound, r.dtype), 1).astype(r.dtype)
          for r in ratios]


def _apply_ratios(flat_u: Sequence[jax.Array], ratios: Sequence[Any]) -> list[jax.Array]:
  """Each update times its ratio (None: unchanged; per layer for a stacked leaf).

  The product is taken in the ratio's dtype (float32 or wider) and rounded
  once: a float16 ratio would overflow above 65504 (w = 10, g = 1e-7).
  """
  return [u if r is None else (u.astype(jnp.promote_types(u.dtype, r.dtype))
                               * stacked_mod.per_layer(r, u)).astype(u.dtype)
          for u, r in zip(flat_u, ratios)]


class ScaleByLarsTrustRatioState(NamedTuple):
  """State of :func:`scale_by_lars_trust_ratio`.

  Attributes:
    trust_ratio: a vector with one entry per parameter leaf, in
      ``jax.tree.leaves(params)`` order: each leaf's trust ratio at the last
      step (1 for skipped leaves and before the first step). Float32, or
      float64 when a leaf is float64. :func:`trust_ratios` turns it into a
      pytree or a ``{name: ratio}`` dict for logging. (One vector rather than
      one scalar per leaf: a single output buffer per step.) Inside
      ``optax.masked``, ``optax.partition`` or ``optax.multi_transform`` the
      leaves routed elsewhere (``optax.MaskedNode`` placeholders) have an
      entry too, -1 (a ratio is never negative), so the vector still has
      one entry per leaf of the whole params tree. A stacked leaf's entry
      is the mean of its layers' ratios.
    inner_state: the state of the inner transformation; with ``trust_clip``,
      a :class:`TrustClipState` holding it and the step count.
    layer_trust_ratio: ``()`` when no leaf is stacked; else per leaf None
      (not stacked) or the ratios of its layers, an array of shape
      ``shape[:k]``. :func:`trust_ratios` returns these for stacked leaves.
  """

  trust_ratio: jax.Array
  inner_state: optax.OptState
  layer_trust_ratio: tuple[Any, ...] = ()


class TrustClipState(NamedTuple):
  """The ``inner_state`` of :func:`scale_by_lars_trust_ratio` with ``larc_learning_rate``.

  (The count lives here, not in :class:`ScaleByLarsTrustRatioState`, so that
  the optimizers without LARC's clip carry no count.)

  Attributes:
    count: the number of updates done so far (int32), with which a
      learning-rate schedule given as ``larc_learning_rate`` is called.
    inner_state: the state of the inner transformation.
  """

  count: jax.Array  # type: ignore[assignment]
  inner_state: optax.OptState


def scale_by_lars_trust_ratio(
    inner: GradientTransformation | None = None,
    *,
    eta: float = 0.001,
    ratio_weight_decay: float = 0.0,
    epsilon: float = 0.0,
    skip: masks.MaskLike = None,
    rescale: float = 1.0,
    wd_mult: masks.LeafValues = None,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
    larc_learning_rate: optax.ScalarOrSchedule | None = None,
) -> GradientTransformationExtraArgs:
  r"""Scales the output of ``inner`` by the LARS trust ratio of each leaf.

  For every leaf :math:`w` with incoming gradient :math:`g`:

  .. math::

    g_r = s\,g, \qquad
    \rho = \frac{\eta \, \|w\|}{\|g_r\| + \lambda \|w\| + \epsilon}, \qquad
    u = \rho \cdot \mathrm{inner}(g_r)

  (:math:`s` = ``rescale``, :math:`\lambda` = ``ratio_weight_decay``; see
  :func:`lars_trust_ratio` for the fallback to 1). The ratio is taken from the
  gradient as it enters this transformation, whatever ``inner`` does to it
  afterwards, so

  * MXNet's LARS (ratio from the rescaled, unclipped gradient, applied after
    clipping and weight decay) is
    ``scale_by_lars_trust_ratio(chain(clip(c), add_decayed_weights(wd)),
    rescale=s, ...)`` followed by :func:`mxnet_momentum`;
  * TensorFlow's (ratio from the raw gradient, applied after the momentum
    accumulation) is ``scale_by_lars_trust_ratio(trace(momentum), ...)``
    followed by :func:`optax.scale_by_learning_rate`.

  ``rescale`` does what chaining ``optax.scale(s)`` in front would do, but the
  gradient norm is computed as :math:`|s|\,\|g\|`, so XLA never has to write
  the rescaled gradient to memory: one pass over the gradients less per step.

  With ``ratio_weight_decay=0`` and no ``inner`` this is the ratio of
  :func:`optax.lars` (``scale_by_trust_ratio``):
  :math:`\rho = \eta\|w\|/(\|u\| + \epsilon)` of the update it receives, so
  placed after ``add_decayed_weights`` it divides by the decayed update's
  norm (optax, BYOL, SimCLR), and placed after a momentum trace by the
  buffer's (SimCLR's ``classic_momentum=False``).

  ``larc_learning_rate`` turns on LARC's clipping (You, Gitman and Ginsburg's
  ratio as NVIDIA's apex ``LARC(clip=True)`` and timm's ``trust_clip`` bound it):
  :math:`\rho \leftarrow \min(\rho / \alpha_t, 1)`, with :math:`\alpha_t` the
  learning rate of the step, so that :math:`\alpha_t\rho` never exceeds
  :math:`\alpha_t`. Skipped leaves keep 1.

  Args:
    inner: the transformation whose output is scaled (default: identity).
    eta: the LARS coefficient :math:`\eta` (MXNet ``eta``, TF ``eeta``).
    ratio_weight_decay: :math:`\lambda` in the ratio's denominator. It only
      enters the ratio (hence its name); add the decay itself with
      ``optax.add_decayed_weights`` or inside ``inner``.
    epsilon: added to the denominator.
    skip: leaves whose ratio is 1 (a :class:`~lars_optax.masks.Mask`, a
      callable returning a bool pytree, or a bool pytree). Skipped leaves cost
      no norm computation.
    rescale: the factor :math:`s` applied to the incoming gradient first
      (MXNet's ``rescale_grad``).
    wd_mult: per-leaf multipliers of ``ratio_weight_decay`` (MXNet's ``wd_mult``): a
      dict ``{leaf name: multiplier}`` or ``(mask, multiplier)`` rules; see
      :data:`lars_optax.masks.LeafValues`.
    axis_name: for params split over this mesh axis under ``shard_map``/``pmap``:
      the squared norms are summed over it, so each block gets its whole
      layer's ratio; per leaf, ``{leaf name: axis}`` or ``[(mask, axis)]``
      rules. See "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers (scanned models), each layer
      then getting its own norms and ratio, as in the unrolled model; by
      default read from Flax partition metadata (``"layers"``). See
      "Common arguments" in docs/optimizers.md and :mod:`lars_optax.stacked`.
    larc_learning_rate: None (no clip), or the learning rate :math:`\alpha_t`
      (a scalar or an optax schedule, called with the number of updates done
      so far) of LARC's clip: :math:`\rho \leftarrow \min(\rho/\alpha_t, 1)`.
      Pass the optimizer's own learning rate.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`; its state is a
    :class:`ScaleByLarsTrustRatioState`. ``update`` requires ``params``.

  References:
    You, Gitman and Ginsburg, `Large Batch Training of Convolutional Networks
    <https://arxiv.org/abs/1708.03888>`_, 2017.
  """
  v.check_scalar("eta", eta, low=0.0)
  v.check_scalar("ratio_weight_decay", ratio_weight_decay, low=0.0)
  v.check_scalar("epsilon", epsilon, low=0.0)
  v.check_scalar("rescale", rescale, low=0.0, low_open=True)
  if inner is not None and not isinstance(inner, GradientTransformation):
    raise TypeError("inner: expected an optax.GradientTransformation, got "
                    f"{type(inner).__name__}.")
  masks.check_mask_like(skip, "skip")
  masks.check_leaf_values(wd_mult, "wd_mult")
  stacked_mod.check_axis_names(axis_name)
  stacked_mod.check_stacked(stacked)
  if larc_learning_rate is not None:
    v.check_learning_rate("larc_learning_rate", larc_learning_rate)
  inner_tx = optax.with_extra_args_support(inner or optax.identity())
  name = "scale_by_lars_trust_ratio"

  def init_fn(params: optax.Params) -> ScaleByLarsTrustRatioState:
    v.check_float_params(params, name, allow_complex=True)
    for arg, value in (("eta", eta), ("ratio_weight_decay", ratio_weight_decay),
                       ("epsilon", epsilon)):
      v.check_representable(arg, value, params, compute=True)
    v.check_representable("rescale", rescale, params)
    masks.check_unique_names(params)
    if skip is masks.MXNET_DEFAULT:
      masks.warn_foreign_names(params)
    ks = stacked_mod.resolve(stacked, params)
    masks.check_matches(skip, params, "skip")
    masks.resolve_mask(skip, params, "skip", ks)  # a bad mask fails here already
    masks.resolve_leaf_values(wd_mult, params, "wd_mult", check_names=True, layer_axes=ks)
    stacked_mod.resolve_axis_names(axis_name, params, ks)  # a bad name fails here already
    inner_state = inner_tx.init(params)
    if larc_learning_rate is not None:
      inner_state = TrustClipState(jnp.zeros([], jnp.int32), inner_state)
    return ScaleByLarsTrustRatioState(_ratio_vector(params), inner_state,
                                      _layer_ratios(params, ks))

  def update_fn(updates, state, params=None, **extra_args):
    params = v.align_params(updates, params)
    v.check_same_structure(updates, params, name)
    v.check_float_params(params, name, allow_complex=True)
    ks = _layer_axes(state.layer_trust_ratio, params)
    skipped = masks.resolve_mask(skip, params, "skip", ks)
    flat_g, treedef = jax.tree.flatten(updates)
    flat_p = treedef.flatten_up_to(params)
    mults = masks.resolve_leaf_values(wd_mult, params, "wd_mult", layer_axes=ks)
    ratios = _leaf_ratios(flat_p, flat_g, skipped, eta,
                          [utils.times(ratio_weight_decay, m) for m in mults], epsilon, rescale,
                          stacked_mod.resolve_axis_names(axis_name, params, ks), ks)
    inner_state = state.inner_state
    if larc_learning_rate is not None:
      count, inner_state = inner_state
      rate = larc_learning_rate
      ratios = _clip_ratios(ratios, rate(count) if callable(rate) else rate)
    if not utils.is_const(rescale, 1):
      updates = jax.tree.map(lambda g: g * utils.cast(rescale, g.dtype), updates)
    inner_updates, inner_state = inner_tx.update(updates, inner_state, params, **extra_args)
    if larc_learning_rate is not None:
      inner_state = TrustClipState(optax.safe_int32_increment(count), inner_state)
    scaled = _apply_ratios(treedef.flatten_up_to(inner_updates), ratios)
    return (jax.tree.unflatten(treedef, scaled),
            ScaleByLarsTrustRatioState(_ratio_vector(params, ratios), inner_state,
                                       _layer_ratios(params, ks, ratios)))

  return GradientTransformationExtraArgs(init_fn, update_fn)


def trust_ratios(state: optax.OptState, params: Any = None) -> Any:
  """The per-leaf trust ratios of the last step, from an optimizer state.

  Finds the :class:`ScaleByLarsTrustRatioState` in ``state`` (the state of
  :func:`lars_optax.lars`, :func:`lars_optax.tf_lars`, a chain or a wrapper
  holding one), or the :class:`ScaleByLambTrustRatioState` of
  :func:`lars_optax.lamb`, or the :class:`ScaleByLansState` of
  :func:`lars_optax.lans` (the ratio of its momentum part), and returns its
  ratios (1 for skipped leaves):

  * ``params=None``: the vector, one entry per leaf in ``jax.tree.leaves``
    order (works under ``jit``); a stacked leaf (see ``stacked=``)
    contributes one entry per layer, its ratios in row-major order, so the
    vector of a stacked model is the vector of its unrolled model with the
    blocks' entries grouped by leaf;
  * ``params`` a pytree: a ``{leaf name: ratio}`` dict, e.g.
    ``{"Dense_0/kernel": 0.012, ...}``, ready for a logger; a stacked leaf's
    value is an array of shape ``shape[:k]``, one ratio per layer.

  Through ``optax.partition``, ``optax.multi_transform`` or ``optax.masked``,
  where LARS covers only some leaves, the ratios of the leaves it covers are
  returned: the dict leaves out the others, and the vector holds -1 for them.
  Several LARS sub-states (e.g. two labels with different ``eta``) are
  merged. Which leaves are covered is read from the vector's values, so under
  ``jit`` (where they are unknown) the dict keeps every leaf, -1 for those
  routed elsewhere.

  Raises:
    ValueError: when ``state`` holds no trust-ratio state, or ``params``
      has a different number of leaves.
  """
  found = utils.find_states(state, _RATIO_STATES)
  if not found:
    raise ValueError("state: no ScaleByLarsTrustRatioState found (nor a "
                     "ScaleByLambTrustRatioState or ScaleByLansState); pass the state of an "
                     "optimizer that uses scale_by_lars_trust_ratio, "
                     "scale_by_lamb_trust_ratio or scale_by_lans.")
  # (jax.tree.leaves unwraps an nnx Variable holding the vector, as in nnx.Optimizer's state.)
  vecs = [jax.tree.leaves(f.trust_ratio)[0] for f in found]
  sizes = {v.shape[0] for v in vecs}
  if len(sizes) > 1:
    raise ValueError(f"state: holds LARS states of different sizes {sorted(sizes)}; "
                     "pass each sub-state to trust_ratios on its own.")
  vec = vecs[0]
  for other in vecs[1:]:  # each covers its own leaves; -1 elsewhere
    vec = jnp.where(vec < 0, other.astype(vec.dtype), vec)
  # Per-layer ratios of stacked leaves: per slot, from the sub-state that has them.
  per_state = [[None if x is None else jax.tree.leaves(x)[0] for x in f.layer_trust_ratio]
               for f in found]
  layers = [next((ls[i] for ls in per_state if ls and ls[i] is not None), None)
            for i in range(vec.shape[0])]
  if params is None:
    if not any(x is not None for x in layers):
      return vec
    return jnp.concatenate([vec[i:i + 1] if x is None else jnp.ravel(x).astype(vec.dtype)
                            for i, x in enumerate(layers)])
  masks.check_unique_names(params)
  named = masks.named_leaves(params)
  if len(named) != vec.shape[0]:
    raise ValueError(f"params: has {len(named)} leaves but the state holds "
                     f"{vec.shape[0]} trust ratios.")
  out = {n: vec[i] if layers[i] is None else layers[i] for i, (n, _) in enumerate(named)}
  if isinstance(vec, jax.core.Tracer):
    return out
  covered = [bool(c) for c in jax.device_get(vec >= 0)]
  return {n: r for (n, r), c in zip(out.items(), covered) if c}


@v.lars_names
def lars(
    learning_rate: optax.ScalarOrSchedule = 0.1,
    *,
    momentum: float = 0.0,
    eta: float = 0.001,
    epsilon: float = 1e-8,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    skip: masks.MaskLike = masks.MXNET_DEFAULT,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    wd_skip: masks.MaskLike = None,
    multi_precision: bool = False,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
) -> optax.GradientTransformationExtraArgs:
  r"""MXNet's LARS, not :func:`optax.lars`: its ratio divides by ‖g‖ + wd‖w‖ + ε.

  LARS as Apache MXNet implements it (``mx.optimizer.LARS``). It differs
  from :func:`optax.lars` in rule and defaults: the trust ratio divides by
  ``‖g‖ + wd‖w‖ + ε`` where optax divides by the norm of the decayed update
  ``‖g + wd·w‖`` (with ``eps=0``), biases and norm parameters are left out
  of the ratio by name by default (optax: every leaf), and ``momentum``
  defaults to 0 (optax: 0.9). :func:`lars_optax.porting.optax_lars` is
  optax's rule with optax's arguments; docs/porting.md lists the other
  libraries' LARS.

  Per leaf :math:`w` with gradient :math:`g`, :math:`s` = ``rescale_grad``,
  :math:`c` = ``clip_gradient``, :math:`\lambda` = ``wd``,
  :math:`\mu` = ``momentum``:

  .. math::

    g_r &= s\,g \\
    \rho &= \frac{\eta\,\|w\|}{\|g_r\| + \lambda\|w\| + \epsilon}
      \quad (1 \text{ for skipped leaves, or when a norm is 0 or not finite}) \\
    u &= \mathrm{clip}(g_r, -c, c) + \lambda w \\
    m_t &= \mu\,m_{t-1} - \alpha_t\,\rho\,u, \qquad w_t = w_{t-1} + m_t

  (with :math:`\mu = 0`: :math:`w_t = w_{t-1} - \alpha_t\rho u`, no state). The
  ratio is taken from the rescaled, *unclipped* gradient; weight decay is
  added after clipping. By default leaves whose name ends in ``gamma``,
  ``beta`` or ``bias`` are skipped, as in MXNet.

  ``skip`` covers the trust ratio only: a skipped leaf keeps
  :math:`\rho = 1` but still gets the weight decay :math:`\lambda w` (as in
  MXNet). ``wd_skip`` covers the weight decay: its leaves get
  :math:`\lambda = 0`, in the update and in the ratio. The usual recipe
  exempts biases and norm parameters from both:

  >>> import lars_optax
  >>> tx = lars_optax.lars(1.0, momentum=0.9, wd=1e-4, skip="flax", wd_skip="flax")

  The chain is ``scale_by_lars_trust_ratio(chain(clip, add_decayed_weights_per_leaf),
  rescale=rescale_grad)`` followed by :func:`mxnet_momentum`. The per-leaf
  ratios of the last step are in the state: :func:`lars_optax.trust_ratios`.

  The LARS of timm, optax, BYOL and SimCLR differ in where the rate meets
  the buffer, which norm the ratio divides by and LARC's clip: each has its
  constructor in :mod:`lars_optax.porting`, in its own words.

  Args:
    learning_rate: :math:`\alpha_t`, a scalar or an optax schedule (called with
      the number of updates done so far, 0 at the first update).
    momentum: :math:`\mu` in [0, 1).
    eta: LARS coefficient :math:`\eta` >= 0.
    epsilon: added to the ratio's denominator, >= 0.
    wd: weight decay :math:`\lambda` >= 0 (in the ratio and in the update).
    rescale_grad: gradient multiplier :math:`s` > 0 (e.g. 1 / batch size).
    clip_gradient: element-wise clipping bound :math:`c` > 0, or None.
    skip: leaves that keep ratio 1: a preset name (default ``"mxnet"``, i.e.
      :data:`lars_optax.masks.MXNET_SKIP`; also ``"flax"``, ``"haiku"``), a
      :class:`~lars_optax.masks.Mask`, a callable returning a bool pytree, a
      bool pytree, or None (no leaf skipped). A mask built from names
      (``by_suffix("bias")``, ...) must match: ``init`` raises a ValueError
      when one of its names matches no parameter (presets and
      ``mask.optional()`` may match nothing). Pass a callable mask through
      ``static_args`` when wrapping with ``optax.inject_hyperparams``. When
      the default is in force and the names look like a Flax, Haiku or
      Equinox model's (norm ``scale``/``offset``/1-d ``weight``, Haiku's
      ``b``), ``init`` warns and names the preset to use; MXNet's rule still
      applies, and ``skip="mxnet"`` given explicitly does not warn.
    lr_mult: per-leaf learning-rate multipliers, by leaf name (a dict, or
      ``(mask, value)`` rules; :data:`lars_optax.masks.LeafValues`).
    wd_mult: per-leaf multipliers of ``wd``, in the update and in the ratio.
    wd_skip: leaves that get no weight decay (in the update and in the ratio):
      anything ``skip`` takes; default None (every leaf decays, as in MXNet).
      See "Common arguments" in docs/optimizers.md.
    multi_precision: keep float32 master weights and state for float16 and
      bfloat16 params (:func:`lars_optax.multi_precision`). The ratio's
      :math:`\|w\|` is then taken from the master (MXNet takes it from the
      float16 weight; the two differ by float16 rounding).
    axis_name: for params split over this mesh axis under ``shard_map``/``pmap``:
      the squared norms are summed over it, so each block gets its whole
      layer's ratio; per leaf, ``{leaf name: axis}`` or ``[(mask, axis)]``
      rules. See "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers (scanned models), each layer
      then getting its own norms and ratio, as in the unrolled model; by
      default read from Flax partition metadata (``"layers"``). See
      "Common arguments" in docs/optimizers.md and :mod:`lars_optax.stacked`.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`.

  Raises:
    ValueError: for a hyperparameter out of its range (named).

  References:
    You, Gitman and Ginsburg, `Large Batch Training of Convolutional Networks
    <https://arxiv.org/abs/1708.03888>`_, 2017; Apache MXNet 2.0
    ``mxnet.optimizer.LARS``.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult)
  v.check_scalar("momentum", momentum, low=0.0, high=1.0, high_open=True)
  v.check_scalar("eta", eta, low=0.0)
  v.check_scalar("epsilon", epsilon, low=0.0)
  multi_precision = v.check_flag("multi_precision", multi_precision)
  stacked_mod.check_stacked(stacked)
  decay_mult = base.wd_mult_with_skip(wd_mult, wd_skip)
  # The ratio is taken from the rescaled gradient before clipping, so the
  # rescale is the ratio transformation's own and the rest runs inside it.
  inner = base.preprocess(1.0, clip_gradient, wd, decay_mult, stacked)
  ratio = scale_by_lars_trust_ratio(
      optax.chain(*inner) if inner else None, eta=eta, ratio_weight_decay=wd,
      epsilon=epsilon, skip=skip, rescale=rescale_grad, wd_mult=decay_mult,
      axis_name=axis_name, stacked=stacked)
  tx = base.finish([
      ratio,
      *base.lr_mult_part(lr_mult, stacked),
      mxnet_momentum(learning_rate, momentum=momentum),
  ], "lars", multi_precision=multi_precision, complex_params=clip_gradient is None,
      names=[("skip", skip, None), ("wd_skip", wd_skip, None)],
      leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
      hyperparams=[*base.hyperparams(learning_rate=learning_rate, wd=wd, rescale_grad=rescale_grad),
                   ("eta", eta, True), ("epsilon", epsilon, True)])
  return stacked_mod.warn_unstacked(tx, stacked, "lars")


@v.tf_names
def tf_lars(
    learning_rate: optax.ScalarOrSchedule,
    *,
    momentum: float = 0.9,
    weight_decay: float = 0.0001,
    eeta: float = 0.001,
    epsilon: float = 0.0,
    skip_list: Sequence[str] | None = None,
    use_nesterov: bool = False,
    skip: masks.MaskLike = None,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
) -> optax.GradientTransformationExtraArgs:
  r"""LARS as TensorFlow implements it (``tf.contrib.opt.LARSOptimizer``).

  Per leaf :math:`w` with gradient :math:`g`, :math:`\lambda` =
  ``weight_decay``, :math:`\mu` = ``momentum``:

  .. math::

    \rho &= \frac{\eta\,\|w\|}{\|g\| + \lambda\|w\| + \epsilon}
      \quad (1 \text{ for skipped leaves, or when a norm is 0}) \\
    a_t &= \mu\,a_{t-1} + g \\
    w_t &= w_{t-1} - \alpha_t\,\rho\,a_t
      \qquad \text{or, with Nesterov,} \qquad
    w_t = w_{t-1} - \alpha_t\,\rho\,(g + \mu\,a_t).

  Weight decay enters only the ratio: it is not added to the gradient (as in
  the original and its test). So ``skip`` (or ``skip_list``) covers both the
  ratio and the weight decay: a skipped leaf gets :math:`\rho = 1`, and with
  it :math:`\lambda` has no effect on that leaf, which takes plain momentum
  steps :math:`w_t = w_{t-1} - \alpha_t a_t`. There is no ``wd_skip``, as
  there is no decay term outside the ratio. The learning rate multiplies the
  accumulated momentum, not its inputs. The chain is
  ``scale_by_lars_trust_ratio(optax.trace(momentum, use_nesterov))`` followed
  by :func:`optax.scale_by_learning_rate`.

  Args:
    learning_rate: :math:`\alpha_t`, a scalar or an optax schedule (required, as
      in TF).
    momentum: :math:`\mu` in [0, 1).
    weight_decay: :math:`\lambda` >= 0, used in the trust ratio only.
    eeta: LARS coefficient :math:`\eta` >= 0.
    epsilon: added to the ratio's denominator, >= 0.
    skip_list: strings; a leaf whose name contains any of them keeps ratio 1
      (TF's argument). Each must be contained in some parameter's name:
      ``init`` raises a ValueError naming the entry otherwise (a typo would
      skip nothing). For an entry that may match nothing (``"bias"`` for a
      model without biases, such as Gemma), pass
      ``skip=lars_optax.by_substring("bias").optional()`` instead.
    use_nesterov: Nesterov momentum.
    skip: leaves that keep ratio 1, as :func:`lars` takes it: a preset name
      (``"flax"``, ``"haiku"``, ``"equinox"``, ``"mxnet"``), a
      :class:`~lars_optax.masks.Mask`, a callable returning a bool pytree or a
      bool pytree. ``skip_list=[...]`` is ``skip=by_substring(...)``; give one
      of the two, not both (a ValueError; combine masks with ``|`` instead).
      Default: no leaf skipped, as in TF.
    axis_name: for params split over this mesh axis under ``shard_map``/``pmap``:
      the squared norms are summed over it, so each block gets its whole
      layer's ratio; per leaf, ``{leaf name: axis}`` or ``[(mask, axis)]``
      rules. See "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers (scanned models), each layer
      then getting its own norms and ratio, as in the unrolled model; by
      default read from Flax partition metadata (``"layers"``). See
      "Common arguments" in docs/optimizers.md and :mod:`lars_optax.stacked`.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`.

  Raises:
    ValueError: for ``momentum < 0`` or ``weight_decay < 0`` (as TF does), and
      for any other out-of-range or non-finite hyperparameter; for both
      ``skip_list`` and ``skip``; in ``init``, for a ``skip_list`` entry that
      no parameter name contains.

  References:
    You, Gitman and Ginsburg, `Large Batch Training of Convolutional Networks
    <https://arxiv.org/abs/1708.03888>`_, 2017; TensorFlow
    ``tf.contrib.opt.LARSOptimizer``.
  """
  v.check_learning_rate("learning_rate", learning_rate)
  v.check_scalar("momentum", momentum, low=0.0, high=1.0, high_open=True)
  v.check_scalar("weight_decay", weight_decay, low=0.0)
  v.check_scalar("eeta", eeta, low=0.0)
  v.check_scalar("epsilon", epsilon, low=0.0)
  if not isinstance(use_nesterov, (bool, np.bool_)):
    raise TypeError(f"use_nesterov: expected a bool, got {use_nesterov!r}.")
  use_nesterov = bool(use_nesterov)
  if isinstance(skip_list, (str, bytes)):
    raise TypeError("skip_list: expected a list of strings, got the single "
                    f"string {skip_list!r}; write [{skip_list!r}].")
  if skip_list is not None and not isinstance(skip_list, Iterable):
    raise TypeError(f"skip_list: expected a list of strings, got {skip_list!r}.")
  if skip_list is not None:
    skip_list = list(skip_list)
    bad = [s for s in skip_list if not isinstance(s, str) or not s]
    if bad:
      raise TypeError(f"skip_list: expected non-empty strings, got {bad!r}.")
  masks.check_mask_like(skip, "skip")
  stacked_mod.check_stacked(stacked)
  names: list[tuple[str, masks.MaskLike, str | None]] = [("skip", skip, None)]
  if skip_list is not None and skip is not None:
    raise ValueError("skip_list: give skip_list or skip, not both; to skip the leaves "
                     "of both, pass one mask combined with |, e.g. "
                     "skip=lars_optax.masks.FLAX_SKIP | lars_optax.by_substring('embedding').")
  if skip_list:
    skip = masks.by_substring(*skip_list)
    args = ", ".join(repr(s) for s in skip_list)
    hint = ("Fix the entry or leave it out; for an entry that may match nothing "
            "(e.g. 'bias' in a model without biases), pass "
            f"skip=lars_optax.by_substring({args}).optional() instead of skip_list.")
    names = [("skip_list", skip, hint)]
  tx = base.finish([
      scale_by_lars_trust_ratio(
          utils.keep_dtypes(optax.trace(decay=momentum, nesterov=use_nesterov), momentum),
          eta=eeta, ratio_weight_decay=weight_decay, epsilon=epsilon, skip=skip,
          axis_name=axis_name, stacked=stacked),
      base.learning_rate_part(learning_rate),
  ], "tf_lars", names=names, complex_params=True,
      hyperparams=[("learning_rate", learning_rate), ("eeta", eeta, True),
                   ("weight_decay", weight_decay, True), ("epsilon", epsilon, True)])
  return stacked_mod.warn_unstacked(tx, stacked, "tf_lars")


# --------------------------------------------------------------------------
# LAMB and LANS: the trust ratio taken from the outgoing (Adam) update
# --------------------------------------------------------------------------


def _check_bounds(lower_bound: Any, upper_bound: Any) -> None:
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


def _bounded_ratio(w2: jax.Array, u2: jax.Array, lower_bound: Any,
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


def _check_ratio_params(params: Any, name: str, skip: masks.MaskLike, lower_bound: Any,
                        upper_bound: Any, stacked: stacked_mod.StackedLike,
                        *,
                        allow_complex: bool = False) -> list[int]:
  """The ``init`` checks of LAMB's and LANS's ratios; returns the layer axes."""
  v.check_float_params(params, name, allow_complex=allow_complex)
  for arg, value in (("lower_bound", lower_bound), ("upper_bound", upper_bound)):
    if value is not None:
      v.check_representable(arg, value, params, compute=True)
  masks.check_unique_names(params)
  ks = stacked_mod.resolve(stacked, params)
  masks.check_matches(skip, params, "skip")
  masks.resolve_mask(skip, params, "skip", ks)  # a bad mask fails here already
  return ks


class ScaleByLambTrustRatioState(NamedTuple):
  """State of :func:`scale_by_lamb_trust_ratio`.

  Attributes:
    trust_ratio: one entry per parameter leaf, in ``jax.tree.leaves(params)``
      order: the leaf's ratio at the last step (1 for skipped leaves and
      before the first step; -1 for ``optax.MaskedNode`` placeholders), as in
      :class:`ScaleByLarsTrustRatioState`. Read it with :func:`trust_ratios`.
    layer_trust_ratio: the per-layer ratios of stacked leaves, as in
      :class:`ScaleByLarsTrustRatioState`.
  """

  trust_ratio: jax.Array
  layer_trust_ratio: tuple[Any, ...] = ()


def scale_by_lamb_trust_ratio(
    *,
    lower_bound: float | None = None,
    upper_bound: float | None = None,
    skip: masks.MaskLike = None,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
    max_trust_ratio: float | None = None,
) -> GradientTransformation:
  r"""Scales each leaf's update by the LAMB trust ratio (MXNet's rule).

  For every leaf :math:`w` with incoming update :math:`u`:

  .. math::

    r_1 = \min(\max(\|w\|, l), h), \qquad
    \rho = \frac{r_1}{\|u\|}, \qquad u \leftarrow \rho\,u,
    \qquad \rho = 1 \text{ if } r_1 = 0,\ \|u\| = 0
    \text{ or either is not finite,}

  with :math:`l` = ``lower_bound`` and :math:`h` = ``upper_bound`` (left out
  when None). Unlike :func:`scale_by_lars_trust_ratio`, the ratio is taken
  from the update *this* transformation receives (Adam's direction plus the
  weight decay, in LAMB), so it goes after them in a chain. The bounds clip
  the weight norm :math:`r_1`, not the ratio: a zero-initialised leaf gets
  :math:`\rho = l / \|u\|` when :math:`l > 0` (MXNet's
  ``lamb_update_phase2`` and ``multi_lamb_update``). Norms are taken over
  the whole leaf in float32 (float64 for float64 leaves).

  Without bounds and masks this is :func:`optax.scale_by_trust_ratio` with
  its defaults, plus the logged ratios, the name masks and ``axis_name``.
  ``max_trust_ratio`` bounds the ratio itself, :math:`\rho \leftarrow
  \min(\rho, \rho_{max})`; with 1 (timm's ``Lamb(trust_clip=True)``,
  "LAMBC") a layer's step is never longer than Adam's.

  Args:
    lower_bound: :math:`l` >= 0, or None.
    upper_bound: :math:`h` > 0, or None; ``lower_bound <= upper_bound``.
    skip: leaves whose ratio is 1 (a preset name such as ``"flax"``, a
      :class:`~lars_optax.masks.Mask`, a callable returning a bool pytree, or
      a bool pytree); see :func:`scale_by_lars_trust_ratio`. Skipped leaves
      cost no norm computation.
    axis_name: for params split over this mesh axis under ``shard_map``/``pmap``:
      the squared norms are summed over it, so each block gets its whole
      layer's ratio; per leaf, ``{leaf name: axis}`` or ``[(mask, axis)]``
      rules. See "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers (scanned models), each layer
      then getting its own norms and ratio, as in the unrolled model; by
      default read from Flax partition metadata (``"layers"``). See
      "Common arguments" in docs/optimizers.md and :mod:`lars_optax.stacked`.
    max_trust_ratio: :math:`\rho_{max}` > 0 bounding the ratio, or None
      (timm's LAMBC: 1).

  Returns:
    A :class:`optax.GradientTransformation` with a
    :class:`ScaleByLambTrustRatioState`; ``update`` requires ``params``.

  References:
    You et al., `Large Batch Optimization for Deep Learning: Training BERT in
    76 minutes <https://arxiv.org/abs/1904.00962>`_, ICLR 2020; Apache MXNet
    2.0 ``mxnet.optimizer.LAMB``.
  """
  _check_bounds(lower_bound, upper_bound)
  masks.check_mask_like(skip, "skip")
  stacked_mod.check_axis_names(axis_name)
  stacked_mod.check_stacked(stacked)
  if max_trust_ratio is not None:
    v.check_scalar("max_trust_ratio", max_trust_ratio, low=0.0, low_open=True)
  name = "scale_by_lamb_trust_ratio"

  def init_fn(params: optax.Params) -> ScaleByLambTrustRatioState:
    ks = _check_ratio_params(params, name, skip, lower_bound, upper_bound, stacked,
                             allow_complex=True)
    stacked_mod.resolve_axis_names(axis_name, params, ks)
    return ScaleByLambTrustRatioState(_ratio_vector(params), _layer_ratios(params, ks))

  def update_fn(updates, state, params=None):
    params = v.align_params(updates, params)
    v.check_same_structure(updates, params, name)
    ks = _layer_axes(state.layer_trust_ratio, params)
    skipped = masks.resolve_mask(skip, params, "skip", ks)
    flat_u, treedef = jax.tree.flatten(updates)
    flat_p = treedef.flatten_up_to(params)
    squares = stacked_mod.layer_sq_norms(
        [None if s else (p, u) for p, u, s in zip(flat_p, flat_u, skipped)], ks,
        stacked_mod.resolve_axis_names(axis_name, params, ks))
    ratios = [None if sq is None else _bounded_ratio(*sq, lower_bound, upper_bound,
                                                        max_trust_ratio)
              for sq in squares]
    return (jax.tree.unflatten(treedef, _apply_ratios(flat_u, ratios)),
            ScaleByLambTrustRatioState(_ratio_vector(params, ratios),
                                       _layer_ratios(params, ks, ratios)))

  return GradientTransformation(init_fn, update_fn)


def _moments(updates, mu, nu, b1, b2, grad_averaging=True):
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


def _bias_corrections(count: jax.Array, b1: Any, b2: Any) -> Any:
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


def scale_by_lamb_adam(
    b1: float = 0.9,
    *,
    b2: float = 0.999,
    eps: float = 1e-6,
    bias_correction: bool = True,
    grad_averaging: bool = True,
    eps_root: float = 0.0,
) -> GradientTransformation:
  r"""Adam's direction as LAMB takes it, with or without bias correction.

  .. math::

    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, u_t, \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, u_t^2 \\
    \text{update} &= \frac{m_t / (1 - \beta_1^t)}
      {\sqrt{v_t / (1 - \beta_2^t) + \epsilon_r} + \epsilon}
    \qquad \text{or, without bias correction,} \qquad
    \frac{m_t}{\sqrt{v_t + \epsilon_r} + \epsilon},

  with :math:`\epsilon_r` = ``eps_root`` (optax's, default 0). With
  ``grad_averaging=False`` (NVIDIA's and timm's option) the first moment adds
  the whole update, :math:`m_t = \beta_1 m_{t-1} + u_t`; the bias correction
  is unchanged.

  With bias correction this is :func:`optax.scale_by_adam` (epsilon outside
  the square root, after the correction), except where the denominator is 0
  (``eps=0`` and :math:`v_t = 0`: every gradient of that entry so far was 0):
  the update is 0 there, where optax and MXNet's LAMB divide 0 by 0 and put
  NaN into the weight. ``m`` and ``v`` keep the parameter dtype; the division
  is done in float32 or wider. ``init`` warns
  (:class:`LowPrecisionWarning`) for float16 params, where :math:`v_t`
  underflows.

  Args:
    b1: :math:`\beta_1` in [0, 1).
    b2: :math:`\beta_2` in [0, 1).
    eps: :math:`\epsilon` >= 0.
    bias_correction: divide the moments by :math:`1 - \beta^t` (MXNet's
      ``bias_correction``).
    grad_averaging: weigh the update by :math:`1 - \beta_1` in the first
      moment (default, as in Adam); False adds it whole (timm's and NVIDIA
      apex's ``grad_averaging``).
    eps_root: :math:`\epsilon_r` >= 0, added inside the square root
      (:func:`optax.scale_by_adam`'s ``eps_root``).

  Returns:
    A :class:`optax.GradientTransformation` with an
    :class:`optax.ScaleByAdamState`.

  References:
    Kingma and Ba, `Adam: A Method for Stochastic Optimization
    <https://arxiv.org/abs/1412.6980>`_, 2014; Apache MXNet 2.0
    ``mxnet.optimizer.LAMB``.
  """
  v.check_scalar("b1", b1, low=0.0, high=1.0, high_open=True)
  v.check_scalar("b2", b2, low=0.0, high=1.0, high_open=True)
  v.check_scalar("eps", eps, low=0.0)
  v.check_scalar("eps_root", eps_root, low=0.0)
  bias_correction = v.check_flag("bias_correction", bias_correction)
  grad_averaging = v.check_flag("grad_averaging", grad_averaging)
  name = "scale_by_lamb_adam"

  def init_fn(params: optax.Params) -> optax.ScaleByAdamState:
    v.check_float_params(params, name, allow_complex=True)
    v.check_representable("eps", eps, params, compute=True)
    v.check_representable("eps_root", eps_root, params, compute=True)
    utils.warn_float16(params, name, utils.DEGRADES)
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32),
                                  mu=jax.tree.map(jnp.zeros_like, params),
                                  nu=jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    del params
    mu, nu = _moments(updates, state.mu, state.nu, b1, b2, grad_averaging)
    count = optax.safe_int32_increment(state.count)
    corrections = _bias_corrections(count, b1, b2)

    def step(m, n):
      dt = utils.norm_dtype(m.dtype)
      rt = utils.real_dtype(dt)  # v holds |u|^2: real also for complex params
      m, n_ = m.astype(dt), jnp.real(n).astype(rt)
      if bias_correction:
        c1, c2 = corrections(rt)
        m, n_ = m / c1, n_ / c2
      if not utils.is_const(eps_root, 0):
        n_ = n_ + utils.cast(eps_root, rt)
      return utils.safe_divide(m, jnp.sqrt(n_) + utils.cast(eps, rt)).astype(n.dtype)

    return jax.tree.map(step, mu, nu), optax.ScaleByAdamState(count, mu, nu)

  return GradientTransformation(init_fn, update_fn)


class NormalizePerLeafState(NamedTuple):
  """State of :func:`normalize_per_leaf` when some leaf is stacked.

  Attributes:
    layers: per leaf None (not stacked) or an int8 array of shape
      ``shape[:k]``: only its shape is read, to keep the layer axes found in
      ``init`` for ``update``. Without stacked leaves the state is
      :class:`optax.EmptyState`.
  """

  layers: tuple[Any, ...]


def normalize_per_leaf(
    *,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
) -> GradientTransformation:
  r"""Divides each leaf's update by its own norm (LANS's gradient normalisation).

  .. math::

    u \leftarrow \frac{u}{\|u\|}, \qquad u \leftarrow 0 \text{ if } \|u\| = 0,

  the norm taken over the whole leaf (over each layer of a stacked leaf) in
  float32 (float64 for float64 leaves).
  MXNet's LANS divides by a zero norm and gets NaN, which then stays in its
  moments for good; here an all-zero gradient stays zero. A positive factor
  in front (``rescale_grad``) cancels out.

  Args:
    axis_name: for params split over this mesh axis under ``shard_map``/``pmap``:
      the squared norms are summed over it, so each block gets its whole
      layer's ratio; per leaf, ``{leaf name: axis}`` or ``[(mask, axis)]``
      rules. See "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers (scanned models), each layer
      then getting its own norms and ratio, as in the unrolled model; by
      default read from Flax partition metadata (``"layers"``). See
      "Common arguments" in docs/optimizers.md and :mod:`lars_optax.stacked`.

  Returns:
    A :class:`optax.GradientTransformation`; its state is
    :class:`optax.EmptyState`, or :class:`NormalizePerLeafState` when a leaf
    is stacked.

  References:
    Zheng et al., `Accelerated Large Batch Optimization of BERT Pretraining in
    54 minutes <https://arxiv.org/abs/2006.13484>`_, 2020 (LANS); Apache MXNet
    2.0 ``mxnet.optimizer.LANS``.
  """
  stacked_mod.check_axis_names(axis_name)
  stacked_mod.check_stacked(stacked)

  def init_fn(params):
    v.check_float_params(params, "normalize_per_leaf")
    ks = stacked_mod.resolve(stacked, params)
    stacked_mod.resolve_axis_names(axis_name, params, ks)
    markers = stacked_mod.layer_markers(params, ks)
    return NormalizePerLeafState(markers) if markers else optax.EmptyState()

  def update_fn(updates, state, params=None):
    del params
    flat, treedef = jax.tree.flatten(updates)
    ks = stacked_mod.axes_from_markers(getattr(state, "layers", ()), len(flat))
    squares = stacked_mod.layer_sq_norms([(u,) for u in flat], ks,
                                         stacked_mod.resolve_axis_names(axis_name, updates, ks))
    out = []
    for u, (s,) in zip(flat, squares):
      n = stacked_mod.per_layer(jnp.sqrt(s), u)
      out.append(utils.safe_divide(u.astype(n.dtype), n).astype(u.dtype))
    return jax.tree.unflatten(treedef, out), state

  return GradientTransformation(init_fn, update_fn)


class ScaleByLansState(NamedTuple):
  """State of :func:`scale_by_lans`.

  Attributes:
    count: number of updates done so far (int32).
    mu: Adam's first moment, like the params.
    nu: Adam's second moment, like the params.
    trust_ratio: per leaf, the ratio of the momentum part at the last step
      (as in :class:`ScaleByLarsTrustRatioState`; what :func:`trust_ratios`
      returns).
    grad_trust_ratio: per leaf, the ratio of the gradient part.
    layer_trust_ratio, layer_grad_trust_ratio: the per-layer ratios of
      stacked leaves, as in :class:`ScaleByLarsTrustRatioState`.
  """

  count: jax.Array  # type: ignore[assignment]
  mu: optax.Updates
  nu: optax.Updates
  trust_ratio: jax.Array
  grad_trust_ratio: jax.Array
  layer_trust_ratio: tuple[Any, ...] = ()
  layer_grad_trust_ratio: tuple[Any, ...] = ()


def scale_by_lans(
    b1: float = 0.9,
    *,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.0,
    wd_mult: masks.LeafValues = None,
    lower_bound: float | None = None,
    upper_bound: float | None = None,
    skip: masks.MaskLike = None,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
) -> GradientTransformation:
  r"""LANS's scaling: Nesterov-style Adam with a trust ratio on each of its two parts.

  For every leaf :math:`w` with incoming (normalised) gradient :math:`\hat g`,
  at step :math:`t`:

  .. math::

    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\,\hat g, \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2)\,\hat g^2 \\
    d_t &= \sqrt{v_t / (1 - \beta_2^t)} + \epsilon \\
    c_m &= \frac{m_t / (1 - \beta_1^t)}{d_t} + \lambda w, \qquad
    c_g = \frac{\hat g}{d_t} + \lambda w \\
    r_1 &= \min(\max(\|w\|, l), h), \qquad
    \rho_m = \frac{r_1}{\|c_m\|}, \qquad \rho_g = \frac{r_1}{\|c_g\|} \\
    \text{update} &= \beta_1\,\rho_m\,c_m + (1 - \beta_1)\,\rho_g\,c_g

  with :math:`\lambda` = ``weight_decay`` times the leaf's ``wd_mult``, and
  each ratio 1 where its norms are 0 or not finite, or for skipped leaves
  (as in :func:`scale_by_lamb_trust_ratio`). This is MXNet's fused
  ``multi_lans_update`` (its default path; its plain-Python ``step`` adds
  :math:`\lambda w` to :math:`c_g` after the weight has already taken the
  momentum part, a different rule when :math:`\lambda > 0`). Precede it with
  :func:`normalize_per_leaf` (and a clip), follow it with the learning rate.

  Args:
    b1: :math:`\beta_1` in [0, 1).
    b2: :math:`\beta_2` in [0, 1).
    eps: :math:`\epsilon` >= 0.
    weight_decay: :math:`\lambda` >= 0, added to both parts (decoupled:
      not in the moments).
    wd_mult: per-leaf multipliers of ``weight_decay`` by leaf name.
    lower_bound: :math:`l` >= 0, or None.
    upper_bound: :math:`h` > 0, or None.
    skip: leaves whose two ratios are 1 (see :func:`scale_by_lamb_trust_ratio`).
    axis_name: for params split over this mesh axis under ``shard_map``/``pmap``:
      the squared norms are summed over it, so each block gets its whole
      layer's ratio; per leaf, ``{leaf name: axis}`` or ``[(mask, axis)]``
      rules. See "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers (scanned models), each layer
      then getting its own norms and ratio, as in the unrolled model; by
      default read from Flax partition metadata (``"layers"``). See
      "Common arguments" in docs/optimizers.md and :mod:`lars_optax.stacked`.

  Returns:
    A :class:`optax.GradientTransformation` with a :class:`ScaleByLansState`;
    ``update`` requires ``params``.

  References:
    Zheng, Lin, Zha and Li, `Accelerated Large Batch Optimization of BERT
    Pretraining in 54 minutes <https://arxiv.org/abs/2006.13484>`_, 2020;
    Apache MXNet 2.0 ``mxnet.optimizer.LANS``.
  """
  v.check_scalar("b1", b1, low=0.0, high=1.0, high_open=True)
  v.check_scalar("b2", b2, low=0.0, high=1.0, high_open=True)
  v.check_scalar("eps", eps, low=0.0)
  v.check_scalar("weight_decay", weight_decay, low=0.0)
  masks.check_leaf_values(wd_mult, "wd_mult")
  _check_bounds(lower_bound, upper_bound)
  masks.check_mask_like(skip, "skip")
  stacked_mod.check_axis_names(axis_name)
  stacked_mod.check_stacked(stacked)
  name = "scale_by_lans"

  def init_fn(params: optax.Params) -> ScaleByLansState:
    ks = _check_ratio_params(params, name, skip, lower_bound, upper_bound, stacked)
    v.check_representable("eps", eps, params, compute=True)
    utils.warn_float16(params, name, utils.DEGRADES)
    v.check_representable("weight_decay", weight_decay, params, compute=True)
    masks.resolve_leaf_values(wd_mult, params, "wd_mult", check_names=True, layer_axes=ks)
    stacked_mod.resolve_axis_names(axis_name, params, ks)
    # (Separate buffers for the two ratios: a step that donates the state
    # cannot donate one buffer twice.)
    return ScaleByLansState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params),
                            jax.tree.map(jnp.zeros_like, params), _ratio_vector(params),
                            _ratio_vector(params), _layer_ratios(params, ks),
                            _layer_ratios(params, ks))

  def update_fn(updates, state, params=None):
    params = v.align_params(updates, params)
    v.check_same_structure(updates, params, name)
    ks = _layer_axes(state.layer_trust_ratio, params)
    skipped = masks.resolve_mask(skip, params, "skip", ks)
    mults = masks.resolve_leaf_values(wd_mult, params, "wd_mult", layer_axes=ks)
    mu, nu = _moments(updates, state.mu, state.nu, b1, b2)
    count = optax.safe_int32_increment(state.count)
    flat_g, treedef = jax.tree.flatten(updates)
    flat_p, flat_m, flat_n = (treedef.flatten_up_to(x) for x in (params, mu, nu))
    correction = _bias_corrections(count, b1, b2)

    parts = []  # per leaf: (c_m, c_g) in float32 or wider
    for g, p, m, n, c in zip(flat_g, flat_p, flat_m, flat_n, mults):
      dt = utils.norm_dtype(m.dtype)
      c1, c2 = correction(dt)
      d = jnp.sqrt(n.astype(dt) / c2) + utils.cast(eps, dt)
      rate = utils.times(weight_decay, c)
      decay = 0 if utils.is_const(rate, 0) else (
          stacked_mod.per_layer(utils.cast(rate, dt), p) * p.astype(dt))
      parts.append((utils.safe_divide(m.astype(dt) / c1, d) + decay,
                    utils.safe_divide(g.astype(dt), d) + decay))
    squares = stacked_mod.layer_sq_norms(
        [None if s else (p, cm, cg) for p, (cm, cg), s in zip(flat_p, parts, skipped)],
        ks, stacked_mod.resolve_axis_names(axis_name, params, ks))
    ratios_m, ratios_g, out = [], [], []
    for g, (cm, cg), sq in zip(flat_g, parts, squares):
      rm = rg = None
      if sq is not None:
        rm = _bounded_ratio(sq[0], sq[1], lower_bound, upper_bound)
        rg = _bounded_ratio(sq[0], sq[2], lower_bound, upper_bound)
      ratios_m.append(rm)
      ratios_g.append(rg)
      dt = cm.dtype
      wm = utils.cast(b1, dt) if rm is None else (
          utils.cast(b1, dt) * stacked_mod.per_layer(rm.astype(dt), cm))
      wg = utils.cast(1 - b1, dt) if rg is None else (
          utils.cast(1 - b1, dt) * stacked_mod.per_layer(rg.astype(dt), cg))
      out.append((wm * cm + wg * cg).astype(g.dtype))
    return jax.tree.unflatten(treedef, out), ScaleByLansState(
        count, mu, nu, _ratio_vector(params, ratios_m), _ratio_vector(params, ratios_g),
        _layer_ratios(params, ks, ratios_m), _layer_ratios(params, ks, ratios_g))

  return GradientTransformation(init_fn, update_fn)


@v.mxnet_names
def lamb(
    learning_rate: optax.ScalarOrSchedule = 0.001,
    *,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-6,
    lower_bound: float | None = None,
    upper_bound: float | None = None,
    bias_correction: bool = True,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    skip: masks.MaskLike = None,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    wd_skip: masks.MaskLike = None,
    multi_precision: bool = False,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
) -> optax.GradientTransformation:
  r"""LAMB as Apache MXNet implements it (``mx.optimizer.LAMB``); with its defaults, optax.lamb's.

  Per leaf :math:`w` with gradient :math:`g_t`, :math:`s` = ``rescale_grad``,
  :math:`c` = ``clip_gradient``, :math:`\lambda` = ``wd`` (times the leaf's
  ``wd_mult``), :math:`l` = ``lower_bound``, :math:`h` = ``upper_bound``:

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) \\
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\,u_t, \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2)\,u_t^2 \\
    \Delta_t &= \frac{m_t / (1 - \beta_1^t)}{\sqrt{v_t / (1 - \beta_2^t)} + \epsilon}
      + \lambda w_{t-1}
      \qquad \left(\text{without bias correction: }
      \frac{m_t}{\sqrt{v_t} + \epsilon} + \lambda w_{t-1}\right) \\
    r_1 &= \min(\max(\|w_{t-1}\|, l), h), \qquad \rho = \frac{r_1}{\|\Delta_t\|} \\
    w_t &= w_{t-1} - \alpha_t\,\rho\,\Delta_t

  The weight decay is not in the moments: it is added to Adam's direction
  and so enters the ratio's denominator (as in :func:`optax.lamb`). The
  bounds clip the weight norm :math:`r_1` (left out when None), not the
  ratio. :math:`\rho = 1` when :math:`r_1 = 0` or
  :math:`\|\Delta_t\| = 0` (MXNet's rule; a zero-initialised layer without
  ``lower_bound`` takes a plain Adam step), when either norm is not finite
  (MXNet would give NaN), and for skipped leaves.

  MXNet applies the ratio to every parameter, and so does the default
  ``skip=None``. To exclude biases and normalisation parameters, pass a
  preset (``skip="flax"``, ``"haiku"``, ``"equinox"`` or ``"mxnet"``) or a
  mask (``skip=lars_optax.by_ndim(1)``). ``skip`` covers the trust ratio
  only: skipped leaves still get Adam's step and the weight decay.
  ``wd_skip`` (the same kinds of mask) covers the weight decay: its leaves
  get :math:`\lambda = 0`. BERT recipes exempt biases and norms from both:

  >>> import lars_optax
  >>> tx = lars_optax.lamb(1e-3, wd=0.01, skip="flax", wd_skip="flax")

  The chain is ``scale(s), clip(c)``,
  :func:`~lars_optax.scale_by_lamb_adam` ``(beta1, beta2, epsilon,
  bias_correction)``, :func:`~lars_optax.add_decayed_weights_per_leaf`
  ``(wd, wd_mult)``, :func:`~lars_optax.scale_by_lamb_trust_ratio`
  ``(lower_bound, upper_bound, skip)``, ``optax.scale_by_learning_rate(lr)``,
  then ``lr_mult``. The per-leaf ratios of the last step:
  :func:`lars_optax.trust_ratios`. Without bounds and masks, with bias
  correction and ``clip_gradient=None``, this is :func:`optax.lamb` (whose
  ``weight_decay`` is ``wd``), apart from the zero denominator below.

  MXNet's two LAMB kernels disagree with each other; this follows its
  default multi-tensor path (docs/verified.md says by how much they differ).
  The LAMB of timm, Keras, optax and ALBERT have their constructors in
  :mod:`lars_optax.porting`, in their own words.

  Args:
    learning_rate: :math:`\alpha_t`, a scalar or an optax schedule.
    beta1: :math:`\beta_1` in [0, 1).
    beta2: :math:`\beta_2` in [0, 1).
    epsilon: :math:`\epsilon` >= 0. With ``epsilon=0``, an entry whose
      gradient has been 0 at every step so far (:math:`v_t = 0`) gets a zero
      step rather than MXNet's (and optax's) 0/0 = NaN.
    lower_bound: :math:`l` >= 0 or None: the smallest weight norm the ratio uses.
    upper_bound: :math:`h` > 0 or None: the largest; ``lower_bound <=
      upper_bound``.
    bias_correction: divide the moments by :math:`1 - \beta^t`.
    wd: weight decay >= 0, added to Adam's direction (multiplied per leaf by
      ``wd_mult``).
    rescale_grad: gradient multiplier > 0.
    clip_gradient: element-wise clipping bound > 0, or None.
    skip: leaves whose ratio is 1 (default None: none, as in MXNet); a
      preset name, a :class:`~lars_optax.masks.Mask`, a callable returning a
      bool pytree, or a bool pytree.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    wd_skip: leaves that get no weight decay (in the update and in the ratio):
      anything ``skip`` takes; default None (every leaf decays, as in MXNet).
      See "Common arguments" in docs/optimizers.md.
    multi_precision: float32 master weights and state for float16/bfloat16
      (the ratio's :math:`\|w\|` is the master's, as in MXNet). Without it,
      ``init`` warns (:class:`lars_optax.LowPrecisionWarning`) for float16
      params: :math:`v_t` underflows in float16 (MXNet keeps float32 moments).
    axis_name: for params split over this mesh axis under ``shard_map``/``pmap``:
      the squared norms are summed over it, so each block gets its whole
      layer's ratio; per leaf, ``{leaf name: axis}`` or ``[(mask, axis)]``
      rules. See "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers (scanned models), each layer
      then getting its own norms and ratio, as in the unrolled model; by
      default read from Flax partition metadata (``"layers"``). See
      "Common arguments" in docs/optimizers.md and :mod:`lars_optax.stacked`.

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    You et al., `Large Batch Optimization for Deep Learning: Training BERT in
    76 minutes <https://arxiv.org/abs/1904.00962>`_, ICLR 2020; Apache MXNet
    2.0 ``mxnet.optimizer.LAMB``.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult)
  v.check_scalar("beta1", beta1, low=0.0, high=1.0, high_open=True)
  v.check_scalar("beta2", beta2, low=0.0, high=1.0, high_open=True)
  v.check_scalar("epsilon", epsilon, low=0.0)
  bias_correction = v.check_flag("bias_correction", bias_correction)
  multi_precision = v.check_flag("multi_precision", multi_precision)
  stacked_mod.check_stacked(stacked)
  decay_mult = base.wd_mult_with_skip(wd_mult, wd_skip)
  decay = ([] if utils.is_const(wd, 0) else
           [add_decayed_weights_per_leaf(wd, multipliers=decay_mult, arg_name="wd_mult",
                                         stacked=stacked)])
  parts = [*base.preprocess(rescale_grad, clip_gradient, 0.0, None),
           scale_by_lamb_adam(beta1, b2=beta2, eps=epsilon, bias_correction=bias_correction),
           *decay,
           scale_by_lamb_trust_ratio(lower_bound=lower_bound, upper_bound=upper_bound,
                                     skip=skip, axis_name=axis_name, stacked=stacked),
           base.learning_rate_part(learning_rate), *base.lr_mult_part(lr_mult, stacked)]
  tx = base.finish(parts, "lamb", multi_precision=multi_precision,
                   complex_params=clip_gradient is None,
                   names=[("skip", skip, None), ("wd_skip", wd_skip, None)],
                   leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                   hyperparams=base.hyperparams(learning_rate=learning_rate, wd=wd,
                                                rescale_grad=rescale_grad, epsilon=epsilon))
  return stacked_mod.warn_unstacked(tx, stacked, "lamb")


@v.mxnet_names
def lans(
    learning_rate: optax.ScalarOrSchedule = 0.001,
    *,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-6,
    lower_bound: float | None = None,
    upper_bound: float | None = None,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    skip: masks.MaskLike = None,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    wd_skip: masks.MaskLike = None,
    multi_precision: bool = False,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
) -> optax.GradientTransformation:
  r"""LANS as Apache MXNet implements it (``mx.optimizer.LANS``).

  Per leaf :math:`w` with gradient :math:`g_t`, :math:`c` = ``clip_gradient``,
  :math:`\lambda` = ``wd`` (times the leaf's ``wd_mult``), :math:`l` =
  ``lower_bound``, :math:`h` = ``upper_bound``:

  .. math::

    \hat g_t &= \mathrm{clip}\left(\frac{g_t}{\|g_t\|}, -c, c\right)
      \qquad (\hat g_t = 0 \text{ if } \|g_t\| = 0) \\
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\,\hat g_t, \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2)\,\hat g_t^2 \\
    d_t &= \sqrt{v_t / (1 - \beta_2^t)} + \epsilon, \qquad
    c_m = \frac{m_t / (1 - \beta_1^t)}{d_t} + \lambda w_{t-1}, \qquad
    c_g = \frac{\hat g_t}{d_t} + \lambda w_{t-1} \\
    r_1 &= \min(\max(\|w_{t-1}\|, l), h), \qquad
    \rho_m = \frac{r_1}{\|c_m\|}, \qquad \rho_g = \frac{r_1}{\|c_g\|} \\
    w_t &= w_{t-1} - \alpha_t \left(\beta_1\,\rho_m\,c_m
      + (1 - \beta_1)\,\rho_g\,c_g\right)

  Each ratio is 1 where its norms are 0 or not finite, and for skipped
  leaves (default: none, as in MXNet; see :func:`lamb` for the presets).
  ``skip`` covers the two ratios only: a skipped leaf still gets
  :math:`\lambda w_{t-1}` in :math:`c_m` and :math:`c_g`. ``wd_skip`` covers
  the weight decay (:math:`\lambda = 0` on its leaves); pass the same mask
  to both to exempt biases and norms from each.
  ``rescale_grad`` (> 0) cancels in :math:`g_t / \|g_t\|`: it is accepted
  and checked, and has no effect (as in MXNet). Bias correction is always on.

  Where MXNet breaks down: a leaf whose gradient is all zeros (a frozen or
  unused layer, or a step with a zero loss) makes MXNet divide 0 by 0; its
  weight and both moments become NaN, for good. Here :math:`\hat g_t = 0`
  instead: the moments decay and the step continues from :math:`m_t`. This
  follows MXNet's default fused kernel (``multi_lans_update``); MXNet's
  plain-Python ``step`` (``use_fused_step=False``) differs when ``wd > 0``.

  The chain is :func:`~lars_optax.normalize_per_leaf`, ``clip(c)``,
  :func:`~lars_optax.scale_by_lans` ``(beta1, beta2, epsilon, wd, ...)``,
  ``optax.scale_by_learning_rate(lr)``, then ``lr_mult``.
  :func:`lars_optax.trust_ratios` reads :math:`\rho_m` (the state's
  ``grad_trust_ratio`` holds :math:`\rho_g`).

  Args:
    learning_rate: :math:`\alpha_t`, a scalar or an optax schedule.
    beta1: :math:`\beta_1` in [0, 1).
    beta2: :math:`\beta_2` in [0, 1).
    epsilon: :math:`\epsilon` >= 0.
    lower_bound: :math:`l` >= 0 or None.
    upper_bound: :math:`h` > 0 or None; ``lower_bound <= upper_bound``.
    wd: decoupled weight decay >= 0 (multiplied per leaf by ``wd_mult``).
    rescale_grad: gradient multiplier > 0 (no effect, see above).
    clip_gradient: element-wise bound > 0 on the normalised gradient, or None.
    skip: leaves whose ratios are 1 (default None: none).
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    wd_skip: leaves that get no weight decay (in the update and in the ratio):
      anything ``skip`` takes; default None (every leaf decays, as in MXNet).
      See "Common arguments" in docs/optimizers.md.
    multi_precision: float32 master weights and state for float16/bfloat16.
      Without it, ``init`` warns (:class:`lars_optax.LowPrecisionWarning`)
      for float16 params: :math:`v_t` underflows in float16.
    axis_name: for params split over this mesh axis under ``shard_map``/``pmap``:
      the squared norms are summed over it, so each block gets its whole
      layer's ratio; per leaf, ``{leaf name: axis}`` or ``[(mask, axis)]``
      rules. See "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers (scanned models), each layer
      then getting its own norms and ratio, as in the unrolled model; by
      default read from Flax partition metadata (``"layers"``). See
      "Common arguments" in docs/optimizers.md and :mod:`lars_optax.stacked`.

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    Zheng, Lin, Zha and Li, `Accelerated Large Batch Optimization of BERT
    Pretraining in 54 minutes <https://arxiv.org/abs/2006.13484>`_, 2020;
    Apache MXNet 2.0 ``mxnet.optimizer.LANS``.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult)
  v.check_scalar("beta1", beta1, low=0.0, high=1.0, high_open=True)
  v.check_scalar("beta2", beta2, low=0.0, high=1.0, high_open=True)
  v.check_scalar("epsilon", epsilon, low=0.0)
  multi_precision = v.check_flag("multi_precision", multi_precision)
  stacked_mod.check_stacked(stacked)
  decay_mult = base.wd_mult_with_skip(wd_mult, wd_skip)
  parts = [normalize_per_leaf(axis_name=axis_name, stacked=stacked),
           *base.preprocess(1.0, clip_gradient, 0.0, None),
           scale_by_lans(beta1, b2=beta2, eps=epsilon, weight_decay=wd, wd_mult=decay_mult,
                         lower_bound=lower_bound, upper_bound=upper_bound, skip=skip,
                         axis_name=axis_name, stacked=stacked),
           base.learning_rate_part(learning_rate), *base.lr_mult_part(lr_mult, stacked)]
  tx = base.finish(parts, "lans", multi_precision=multi_precision,
                   names=[("skip", skip, None), ("wd_skip", wd_skip, None)],
                   leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                   hyperparams=base.hyperparams(learning_rate=learning_rate, wd=wd,
                                                rescale_grad=rescale_grad))
  return stacked_mod.warn_unstacked(tx, stacked, "lans")


_RATIO_STATES = (ScaleByLarsTrustRatioState, ScaleByLambTrustRatioState, ScaleByLansState)
