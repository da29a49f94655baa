"""Trust ratios as links: LARS's and LAMB's, the ratio of one leaf, and the logged ratios.

* :func:`scale_by_lars_trust_ratio` -- the LARS layer-wise trust ratio, taken
  from the incoming gradient and the params and applied to the output of an
  inner transformation, with name-based skipping (and LARC's clip);
* :func:`lars_trust_ratio` -- the ratio of one leaf, for building variants;
* :func:`scale_by_lamb_trust_ratio` -- LAMB's ratio (bounded weight norm over
  the norm of the outgoing update), with the same skipping and logging;
* :func:`trust_ratios` -- reads the last step's per-leaf (per-layer) ratios
  from a state.

Every one of them takes ``stacked=`` (:mod:`lars_optax.stacked`): a leaf that
holds a stack of layers gets one norm and one ratio per layer, as the
unrolled model would, and all take their norms in one place (the private
``layer_sq_norms``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import GradientTransformation, GradientTransformationExtraArgs

from lars_optax import _links, _ratios
from lars_optax import _masks as masks
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _stacked as stacked_mod

# The names the LARS links took before they took optax's (docs/from_optax.md).
_LINK_NAMES = {
    "eta": "the links take optax's name, trust_coefficient= (MXNet's eta, TF's eeta).",
    "epsilon": "the links take optax's name, eps=.",
    "rescale": "the gradient factor is grad_scale= (MXNet's rescale_grad).",
    "rescale_grad": "the gradient factor is grad_scale= in the links (rescale_grad in "
                    "lars_optax.lars and lars_optax.mxnet).",
    "weight_decay": "the ratio's lambda is ratio_weight_decay= (it enters the ratio only; "
                    "add the decay itself with optax.add_decayed_weights).",
}

__all__ = [
    "ScaleByLambTrustRatioState",
    "ScaleByLarsTrustRatioState",
    "TrustClipState",
    "lars_trust_ratio",
    "scale_by_lamb_trust_ratio",
    "scale_by_lars_trust_ratio",
    "trust_ratios",
]


@v.keyword_hints(_LINK_NAMES)
def lars_trust_ratio(
    param: jax.Array,
    grad: jax.Array,
    *,
    trust_coefficient: float = 0.001,
    ratio_weight_decay: float = 0.0,
    eps: float = 0.0,
    grad_scale: float = 1.0,
    axis_name: str | None = None,
    layer_axes: int = 0,
) -> jax.Array:
  r"""The LARS trust ratio of one leaf (of each layer of a stacked leaf).

  .. math::

    \rho = \frac{\eta \, \|w\|}{\|s g\| + \lambda \|w\| + \epsilon},
    \qquad \rho = 1 \text{ if } \|w\| = 0,\ \|s g\| = 0
    \text{ or any of them is not finite,}

  with :math:`\eta` = ``trust_coefficient``, :math:`s` = ``grad_scale``,
  :math:`\lambda` = ``ratio_weight_decay`` and :math:`\epsilon` = ``eps``.
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
    ValueError: for a ``trust_coefficient``, ``ratio_weight_decay`` or ``eps``
      that is not a finite number >= 0, or a ``grad_scale`` that is not a finite number
      > 0 (as :func:`scale_by_lars_trust_ratio` and the optimizers check them; the message
      starts with the argument's name).
    TypeError: for a hyperparameter that is not a real number, or a
      ``param``/``grad`` that is not a real floating point array.

  References:
    You, Gitman and Ginsburg, `Large Batch Training of Convolutional Networks
    <https://arxiv.org/abs/1708.03888>`_, 2017.
  """
  scalars = {"trust_coefficient": trust_coefficient, "ratio_weight_decay": ratio_weight_decay,
             "eps": eps, "grad_scale": grad_scale}
  _links.check_declared(scalars)
  v.check_axis_name(axis_name)
  for arg, x in (("param", param), ("grad", grad)):
    dtype = getattr(x, "dtype", None)
    dtype = np.asarray(x).dtype if dtype is None else dtype
    if not jnp.issubdtype(dtype, jnp.floating):
      raise TypeError(f"{arg}: expected a real floating point array, got dtype {dtype}.")
  _links.check_constants(scalars.items(), param)
  if not stacked_mod.is_int(layer_axes) or not 0 <= layer_axes < max(np.ndim(param), 1):
    raise ValueError(f"layer_axes: expected an int in [0, param.ndim), got {layer_axes!r} "
                     f"for a param of shape {np.shape(param)}.")
  [(w2, g2)] = stacked_mod.layer_sq_norms([(param, grad)], [int(layer_axes)], axis_name)
  return _ratios.ratio_from_squares(w2, g2, trust_coefficient, ratio_weight_decay, eps,
                                    grad_scale)


@_ratios.ratio_state
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
    inner_state: the state of the inner transformation; with ``larc_learning_rate``,
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


def unchecked_scale_by_lars_trust_ratio(
    inner: GradientTransformation | None = None,
    *,
    trust_coefficient: float = 0.001,
    ratio_weight_decay: float = 0.0,
    eps: float = 0.0,
    skip: masks.MaskLike = None,
    grad_scale: float = 1.0,
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

  (:math:`\eta` = ``trust_coefficient``, :math:`s` = ``grad_scale``,
  :math:`\lambda` = ``ratio_weight_decay``, :math:`\epsilon` = ``eps``; see
  :func:`lars_trust_ratio` for the fallback to 1). The ratio is taken from the
  gradient as it enters this transformation, whatever ``inner`` does to it
  afterwards, so

  * MXNet's LARS (ratio from the rescaled, unclipped gradient, applied after
    clipping and weight decay) is
    ``scale_by_lars_trust_ratio(chain(clip(c), add_decayed_weights(wd)),
    grad_scale=s, ...)`` followed by :func:`mxnet_momentum`;
  * TensorFlow's (ratio from the raw gradient, applied after the momentum
    accumulation) is ``scale_by_lars_trust_ratio(trace(momentum), ...)``
    followed by :func:`optax.scale_by_learning_rate`.

  ``grad_scale`` does what chaining ``optax.scale(s)`` in front would do, but the
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
    trust_coefficient: the LARS coefficient :math:`\eta` (optax's name; MXNet's
      ``eta``, TF's ``eeta``).
    ratio_weight_decay: :math:`\lambda` in the ratio's denominator. It only
      enters the ratio (hence its name); add the decay itself with
      ``optax.add_decayed_weights`` or inside ``inner``.
    eps: :math:`\epsilon`, added to the denominator.
    skip: leaves whose ratio is 1 (a :class:`~lars_optax.masks.Mask`, a
      callable returning a bool pytree, or a bool pytree). Skipped leaves cost
      no norm computation.
    grad_scale: the factor :math:`s` applied to the incoming gradient first
      (MXNet's ``rescale_grad``).
    wd_mult: per-leaf multipliers of ``ratio_weight_decay`` (MXNet's ``wd_mult``): a
      dict ``{leaf name: multiplier}`` or ``(mask, multiplier)`` rules; see
      :data:`lars_optax.masks.LeafValues`.
    axis_name: the mesh axis the params are split over (``shard_map``/``pmap``), or
      per-leaf rules; see "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers, one ratio per layer; see
      "Common arguments" in docs/optimizers.md.
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
  inner_tx = optax.with_extra_args_support(inner or optax.identity())
  name = "scale_by_lars_trust_ratio"

  def init_fn(params: optax.Params) -> ScaleByLarsTrustRatioState:
    if skip is masks.MXNET_DEFAULT:
      masks.warn_foreign_names(params)
    ks = stacked_mod.resolve(stacked, params)
    masks.resolve_mask(skip, params, "skip", ks)  # a bad mask fails here already
    masks.resolve_leaf_values(wd_mult, params, "wd_mult", check_names=True, layer_axes=ks)
    stacked_mod.resolve_axis_names(axis_name, params, ks)  # a bad name fails here already
    inner_state = inner_tx.init(params)
    if larc_learning_rate is not None:
      inner_state = TrustClipState(jnp.zeros([], jnp.int32), inner_state)
    return ScaleByLarsTrustRatioState(_ratios.ratio_vector(params), inner_state,
                                      _ratios.layer_ratios(params, ks))

  def update_fn(updates, state, params=None, **extra_args):
    params, ks, skipped = _ratios.update_inputs(updates, state, params, skip, name)
    flat_g, treedef = jax.tree.flatten(updates)
    flat_p = treedef.flatten_up_to(params)
    mults = masks.resolve_leaf_values(wd_mult, params, "wd_mult", layer_axes=ks)
    inner_state = state.inner_state
    bound = None
    if larc_learning_rate is not None:
      count, inner_state = inner_state
      rate = larc_learning_rate
      bound = rate(count) if callable(rate) else rate
    ratios = _ratios.leaf_ratios(flat_p, flat_g, skipped, trust_coefficient,
                          [utils.times(ratio_weight_decay, m) for m in mults], eps, grad_scale,
                          stacked_mod.resolve_axis_names(axis_name, params, ks), ks,
                          larc_bound=bound)
    if not utils.is_const(grad_scale, 1):
      updates = jax.tree.map(lambda g: g * utils.cast(grad_scale, g.dtype), updates)
    inner_updates, inner_state = inner_tx.update(updates, inner_state, params, **extra_args)
    if larc_learning_rate is not None:
      inner_state = TrustClipState(optax.safe_int32_increment(count), inner_state)
    scaled = _ratios.apply_ratios(treedef.flatten_up_to(inner_updates), ratios)
    return (jax.tree.unflatten(treedef, scaled),
            ScaleByLarsTrustRatioState(_ratios.ratio_vector(params, ratios), inner_state,
                                       _ratios.layer_ratios(params, ks, ratios)))

  return GradientTransformationExtraArgs(init_fn, update_fn)


scale_by_lars_trust_ratio = _links.public_link(
    unchecked_scale_by_lars_trust_ratio, params="complex", matches=("skip",),
    same_structure=True, hints=_LINK_NAMES)


@_ratios.ratio_state
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


def unchecked_scale_by_lamb_trust_ratio(
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
    axis_name: the mesh axis the params are split over (``shard_map``/``pmap``), or
      per-leaf rules; see "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers, one ratio per layer; see
      "Common arguments" in docs/optimizers.md.
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
  name = "scale_by_lamb_trust_ratio"

  def init_fn(params: optax.Params) -> ScaleByLambTrustRatioState:
    ks = _ratios.ratio_axes(params, skip, stacked)
    stacked_mod.resolve_axis_names(axis_name, params, ks)
    return ScaleByLambTrustRatioState(_ratios.ratio_vector(params),
                                      _ratios.layer_ratios(params, ks))

  def update_fn(updates, state, params=None):
    params, ks, skipped = _ratios.update_inputs(updates, state, params, skip, name)
    flat_u, treedef = jax.tree.flatten(updates)
    flat_p = treedef.flatten_up_to(params)
    squares = stacked_mod.layer_sq_norms(
        [None if s else (p, u) for p, u, s in zip(flat_p, flat_u, skipped)], ks,
        stacked_mod.resolve_axis_names(axis_name, params, ks))
    ratios = _ratios.packed_map(
        lambda w2, u2: _ratios.bounded_ratio(w2, u2, lower_bound, upper_bound, max_trust_ratio),
        squares)
    return (jax.tree.unflatten(treedef, _ratios.apply_ratios(flat_u, ratios)),
            ScaleByLambTrustRatioState(_ratios.ratio_vector(params, ratios),
                                       _ratios.layer_ratios(params, ks, ratios)))

  return GradientTransformation(init_fn, update_fn)


scale_by_lamb_trust_ratio = _links.public_link(
    unchecked_scale_by_lamb_trust_ratio, relations=_ratios.bound_order, params="complex",
    matches=("skip",), same_structure=True)


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
    blocks' entries grouped by leaf; inside ``shard_map`` it is each device's
    own vector, over the blocks it holds (its layers of a stack split by
    layers), as docs/distributed.md shows;
  * ``params`` a pytree: a ``{leaf name: ratio}`` dict, e.g.
    ``{"Dense_0/kernel": 0.012, ...}``, ready for a logger; a stacked leaf's
    value is an array of shape ``shape[:k]``, one ratio per layer.

  Through ``optax.partition``, ``optax.multi_transform`` or ``optax.masked``,
  where LARS covers only some leaves, the ratios of the leaves it covers are
  returned: the dict leaves out the others, and the vector holds -1 for them.
  Several LARS sub-states (e.g. two labels with different ``trust_coefficient``) are
  merged. Which leaves are covered is read from the vector's values, so under
  ``jit`` (where they are unknown) the dict keeps every leaf, -1 for those
  routed elsewhere.

  Raises:
    ValueError: when ``state`` holds no trust-ratio state, or ``params``
      has a different number of leaves.
  """
  found = utils.find_states(state, _ratios.ratio_states())
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
    return jnp.concatenate([vec[i:i + 1] if x is None
                            else jnp.ravel(utils.replicated(x)).astype(vec.dtype)
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
