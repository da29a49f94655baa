"""The small gradient transformations that several families share.

Rescaling, element-wise clipping and decoupled weight decay are optax's own
(:func:`optax.scale`, :func:`optax.clip`, :func:`optax.add_decayed_weights`):
they compute exactly what MXNet and TensorFlow compute. This module adds the
links that optax lacks and that optimizers of several families use:

* :func:`scale_per_leaf` and :func:`add_decayed_weights_per_leaf` -- a factor
  and a weight decay that differ per leaf (or per layer of a stacked leaf),
  looked up by leaf name (MXNet's ``lr_mult`` and ``wd_mult``);
* :func:`scale_by_caution` -- the Cautious Optimizers' mask on any inner
  transformation's output (timm's ``caution=True``);
* :func:`add_decoupled_weight_decay` -- weight decay applied to the weights
  before the step, the step computed from the decayed weights (Keras 3's
  ``weight_decay``, timm's ``decoupled_decay``);
* :func:`check_inputs` -- the first link of every optimizer.

Each family's own transformations live beside its optimizers:
:mod:`lars_optax._trust_ratio` (the LARS and LAMB trust ratios),
:mod:`lars_optax._lans` (LANS's ratios, per-leaf normalisation),
:mod:`lars_optax._momentum` (:func:`~lars_optax.mxnet_momentum`, SGD momentum
with the learning rate inside the accumulator, and PyTorch's
:func:`~lars_optax.dampened_trace`), :mod:`lars_optax.mxnet._adam_links`
(:func:`~lars_optax.mxnet.scale_by_mxnet_adam` and Adam's relatives) and
:mod:`lars_optax.mxnet._adagrad_family`. The sign of Signum/signSGD is optax's
:func:`optax.scale_by_sign`, and its momentum is :func:`optax.ema` (without
debiasing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import GradientTransformation, GradientTransformationExtraArgs

from lars_optax import _links
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax import _stacked as stacked_mod
from lars_optax._utils import LowPrecisionWarning
from lars_optax.sparse import _checks

__all__ = [
  "AddDecoupledWeightDecayState",
  "LowPrecisionWarning",
  "PerLeafState",
  "ScaleByCautionState",
  "add_decayed_weights_per_leaf",
  "add_decoupled_weight_decay",
  "check_inputs",
  "scale_by_caution",
  "scale_per_leaf",
]



class PerLeafState(NamedTuple):
  """State of :func:`scale_per_leaf` and :func:`add_decayed_weights_per_leaf` when a
  leaf is stacked (otherwise :class:`optax.EmptyState`).

  Attributes:
    layers: per leaf None (not stacked) or an int8 array of shape
      ``shape[:k]``: only its shape is read, to keep the layer axes found in
      ``init`` (from Flax metadata, say) for ``update``, where nnx passes bare
      arrays.
  """

  layers: tuple[Any, ...]


def _per_leaf_init(params: Any, multipliers: masks.LeafValues, arg_name: str,
                   stacked: stacked_mod.StackedLike) -> tuple[list[int], Any]:
  """``init`` of the per-leaf links: the layer axes, checked multipliers and the state."""
  if multipliers is not None:
    masks.check_unique_names(params)
  ks = stacked_mod.resolve(stacked, params)
  mults = masks.resolve_leaf_values(multipliers, params, arg_name, check_names=True,
                                    layer_axes=ks)
  markers = stacked_mod.layer_markers(params, ks)
  return mults, (PerLeafState(markers) if markers else optax.EmptyState())


def _per_leaf_axes(state: Any, tree: Any) -> list[int]:
  return stacked_mod.axes_from_markers(getattr(state, "layers", ()), len(jax.tree.leaves(tree)))


def unchecked_scale_per_leaf(multipliers: masks.LeafValues, *,
                             arg_name: str = "multipliers",
                             stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
                             ) -> GradientTransformation:
  r"""Multiplies each leaf's update by its own constant (MXNet's ``lr_mult``).

  .. math:: u_i \leftarrow c_i \, u_i

  where :math:`c_i` is looked up by the leaf's name in ``multipliers`` (1 for
  leaves it does not name). Placed after the learning rate (or before a
  transformation that is linear in its input, such as :func:`mxnet_momentum`)
  it gives each parameter the learning rate ``lr * lr_mult``. For a stacked
  leaf (see ``stacked``) :math:`c_i` may be an array with one multiplier per
  layer (layer-wise learning-rate decay on a scanned model): the same as
  giving each layer of the unrolled model its own.

  Args:
    multipliers: a dict ``{leaf name: c}`` or a sequence of ``(mask, c)``
      rules (the first rule that selects a leaf wins); see
      :data:`lars_optax.masks.LeafValues`. Values must be >= 0; a stacked
      leaf's value may be a numpy array of shape ``shape[:k]`` (``(L,)``).
    arg_name: how error messages name ``multipliers`` (e.g. ``"lr_mult"``).
    stacked: the leaves that hold a stack of layers (see
      :mod:`lars_optax.stacked`); rules judge one layer of them.

  Returns:
    A :class:`optax.GradientTransformation`; its state is
    :class:`optax.EmptyState`, or :class:`PerLeafState` when a leaf is stacked.
  """

  def init_fn(params):
    mults, state = _per_leaf_init(params, multipliers, arg_name, stacked)
    for (leaf, p), c in zip(masks.named_leaves(params), mults):
      v.check_representable(arg_name, np.max(c) if isinstance(c, np.ndarray) else c, {leaf: p})
    return state

  def update_fn(updates, state, params=None):
    del params
    flat, treedef = jax.tree.flatten(updates)
    mults = masks.resolve_leaf_values(multipliers, updates, arg_name,
                                      layer_axes=_per_leaf_axes(state, updates))
    flat = [u if utils.is_const(c, 1) else u * stacked_mod.per_layer(jnp.asarray(c, u.dtype), u)
            for u, c in zip(flat, mults)]
    return jax.tree.unflatten(treedef, flat), state

  return GradientTransformation(init_fn, update_fn)


scale_per_leaf = _links.public_link(unchecked_scale_per_leaf, params=None)


def unchecked_add_decayed_weights_per_leaf(
    weight_decay: float,
    *,
    multipliers: masks.LeafValues = None,
    arg_name: str = "multipliers",
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
) -> GradientTransformation:
  r"""Adds :math:`\lambda_i w` to each leaf's update, with a per-leaf rate.

  .. math:: u_i \leftarrow u_i + \lambda \, c_i \, w_i

  where :math:`c_i` is the leaf's entry in ``multipliers`` (MXNet's
  ``wd_mult``; 1 for leaves it does not name; for a stacked leaf it may be an
  array with one multiplier per layer). Where it sits in a chain
  decides the kind of decay: before a preconditioner (momentum, Adam, sign)
  it is L2 regularisation (MXNet's ``wd``); after it and before the learning
  rate it is decoupled weight decay (Loshchilov and Hutter,
  `Decoupled Weight Decay Regularization <https://arxiv.org/abs/1711.05101>`_;
  Signum's ``wd_lh``). Leaves whose rate is a Python 0 are left untouched and
  do not read the params.

  Args:
    weight_decay: :math:`\lambda` >= 0.
    multipliers: per-leaf multipliers of ``weight_decay``; see
      :data:`lars_optax.masks.LeafValues`.
    arg_name: how error messages name ``multipliers`` (e.g. ``"wd_mult"``).
    stacked: the leaves that hold a stack of layers (see
      :mod:`lars_optax.stacked`); rules judge one layer of them.

  Returns:
    A :class:`optax.GradientTransformation` (state as for
    :func:`scale_per_leaf`); ``update`` needs ``params``.
  """
  name = "add_decayed_weights_per_leaf"

  def init_fn(params):
    return _per_leaf_init(params, multipliers, arg_name, stacked)[1]

  def update_fn(updates, state, params=None):
    params = v.align_params(updates, params)
    v.require_params(params, name)
    flat_u, treedef = jax.tree.flatten(updates)
    flat_p = treedef.flatten_up_to(params)
    mults = masks.resolve_leaf_values(multipliers, params, arg_name,
                                      layer_axes=_per_leaf_axes(state, params))
    out = []
    for u, p, c in zip(flat_u, flat_p, mults):
      rate = utils.times(weight_decay, c)
      if utils.is_const(rate, 0):
        out.append(u)
      else:
        out.append(u + stacked_mod.per_layer(jnp.asarray(rate, u.dtype), u) * p.astype(u.dtype))
    return jax.tree.unflatten(treedef, out), state

  return GradientTransformation(init_fn, update_fn)


add_decayed_weights_per_leaf = _links.public_link(unchecked_add_decayed_weights_per_leaf,
                                                  params="complex", same_structure=True)


class ScaleByCautionState(NamedTuple):
  """State of :func:`scale_by_caution`.

  Attributes:
    inner_state: the state of the inner transformation.
    layers: the layer markers of stacked leaves (as :class:`PerLeafState`
      keeps them), ``()`` when no leaf is stacked.
  """

  inner_state: optax.OptState
  layers: tuple[Any, ...] = ()


def unchecked_scale_by_caution(
    inner: GradientTransformation,
    *,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
    axis_name: stacked_mod.AxisNameLike = None,
) -> GradientTransformationExtraArgs:
  r"""Masks the output of ``inner`` where it disagrees in sign with its input.

  For every leaf with incoming gradient :math:`g` and :math:`u = \mathrm{inner}(g)`:

  .. math::

    \phi = \mathbb{1}[u \odot g > 0], \qquad
    u \leftarrow \frac{u \odot \phi}{\max(\mathrm{mean}(\phi), 10^{-3})},

  the mean taken over the leaf (over each layer of a stacked leaf). Entries
  whose step would move against the current gradient are left out, and the
  rest is scaled up so that the leaf's average step size is kept: the
  Cautious Optimizers of Liang et al. as timm implements them
  (``caution=True``). ``inner`` must output a *direction* (before the
  learning rate, whose minus sign would flip every comparison): wrap
  ``scale_by_lamb_adam`` or ``optax.scale_by_adam``, not a whole optimizer.
  For complex leaves the test is :math:`\mathrm{Re}(u\,\bar g) > 0`.

  >>> import optax
  >>> import lars_optax
  >>> cautious_adamw = optax.chain(
  ...     lars_optax.scale_by_caution(optax.scale_by_adam()),
  ...     optax.add_decayed_weights(1e-2),
  ...     optax.scale_by_learning_rate(1e-3))

  Args:
    inner: the transformation whose output is masked (an Adam direction).
    stacked: the leaves that hold a stack of layers (see
      :mod:`lars_optax.stacked`): each layer gets its own mean, as in the
      unrolled model.
    axis_name: inside ``shard_map``/``pmap`` with params split over this mesh
      axis, the kept share is counted over the whole leaf (summed over the
      axis), as the unsplit leaf counts it; per leaf, ``{leaf name: axis}`` or
      ``[(mask, axis)]`` rules, as the trust ratios take it.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs` with
    :class:`ScaleByCautionState`.

  References:
    Liang, Chen, Liu and Liu, `Cautious Optimizers: Improving Training with
    One Line of Code <https://arxiv.org/abs/2411.16085>`_, 2024; timm
    ``timm.optim``'s ``caution``.
  """
  inner_tx = optax.with_extra_args_support(inner)

  def init_fn(params):
    ks = stacked_mod.resolve(stacked, params)
    stacked_mod.resolve_axis_names(axis_name, params, ks)  # a bad name fails here already
    return ScaleByCautionState(inner_tx.init(params), stacked_mod.layer_markers(params, ks))

  def update_fn(updates, state, params=None, **extra_args):
    new, inner_state = inner_tx.update(updates, state.inner_state, params, **extra_args)
    flat_g, treedef = jax.tree.flatten(updates)
    flat_u = treedef.flatten_up_to(new)
    ks = stacked_mod.axes_from_markers(state.layers, len(flat_g))
    axes = stacked_mod.resolve_axis_names(axis_name, params, ks)
    axes = [axes] * len(flat_g) if axes is None or isinstance(axes, str) else axes

    def mask(u, g, k, axis):
      g = g.astype(u.dtype)
      agree = (jnp.real(u * jnp.conj(g)) if jnp.iscomplexobj(u) else u * g) > 0
      dt = utils.norm_dtype(utils.real_dtype(u.dtype))
      # The share of entries kept, counted in float32 (a float16 count saturates),
      # over the whole leaf when its blocks are split over a mesh axis.
      reduced = tuple(range(k, u.ndim))
      if axis is None:
        kept = jnp.mean(agree, axis=reduced, dtype=dt)
      else:
        count = jnp.asarray(np.prod([u.shape[i] for i in reduced]), dt)
        kept = (utils.collective(jax.lax.psum, jnp.sum(agree, axis=reduced, dtype=dt), axis)
                / utils.collective(jax.lax.psum, count, axis))
      scale = (1 / jnp.maximum(kept, 1e-3)).astype(utils.real_dtype(u.dtype))
      # A product, not a select (as timm does it): a NaN or inf direction stays
      # visible in the update (NaN * 0 is NaN) instead of becoming a zero step.
      phi = agree.astype(scale.dtype) * stacked_mod.per_layer(scale, u)
      return (u * phi).astype(u.dtype)

    out = [mask(u, g, k, a) for u, g, k, a in zip(flat_u, flat_g, ks, axes)]
    return jax.tree.unflatten(treedef, out), ScaleByCautionState(inner_state, state.layers)

  return GradientTransformationExtraArgs(init_fn, update_fn)


scale_by_caution = _links.public_link(unchecked_scale_by_caution, params=None)


class AddDecoupledWeightDecayState(NamedTuple):
  """State of :func:`add_decoupled_weight_decay`.

  Attributes:
    count: number of updates done so far (int32), with which a
      learning-rate schedule is called.
    inner_state: the state of the inner transformation.
    layers: the layer markers of stacked leaves, ``()`` when none is stacked.
  """

  count: jax.Array  # type: ignore[assignment]
  inner_state: optax.OptState
  layers: tuple[Any, ...] = ()


def unchecked_add_decoupled_weight_decay(
    inner: GradientTransformation,
    *,
    learning_rate: optax.ScalarOrSchedule,
    weight_decay: float,
    wd_mult: masks.LeafValues = None,
    lr_mult: masks.LeafValues = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
) -> GradientTransformationExtraArgs:
  r"""Decays the weights first, then runs ``inner`` on the decayed weights.

  For every leaf :math:`w` with gradient :math:`g`, at step :math:`t`:

  .. math::

    w' = w - \alpha_t \lambda_i w, \qquad
    \text{update} = (w' - w) + \mathrm{inner}(g;\ w'),

  with :math:`\lambda_i = \lambda \cdot` ``wd_mult`` :math:`\cdot` ``lr_mult``
  of the leaf, so that applying the update gives
  :math:`w' + \mathrm{inner}(g; w')`: the decay is a separate step that the
  inner rule does not see, except through the weights it reads. That is how
  Keras 3 applies ``weight_decay`` to every optimizer (``variable -= variable
  * wd * lr`` before ``update_step``) and how timm's ``Lamb(decoupled_decay=
  True)`` ("lambw") does it: LAMB's trust ratio is then taken from the
  decayed weight, and the decay is outside the ratio. ``inner`` must already
  contain the learning rate (it is the whole step). Leaves whose rate is 0
  are left alone.

  Args:
    inner: the step taken from the decayed weights (e.g. LAMB's chain up to
      and including its learning rate).
    learning_rate: :math:`\alpha_t`, a scalar or an optax schedule (called with
      the number of updates done so far): the optimizer's own.
    weight_decay: :math:`\lambda` >= 0.
    wd_mult: per-leaf multipliers of ``weight_decay`` (a dict ``{leaf name:
      value}`` or ``(mask, value)`` rules, :data:`lars_optax.masks.LeafValues`).
    lr_mult: per-leaf learning-rate multipliers, so that a leaf with its own
      learning rate (timm's parameter groups) decays with it.
    stacked: the leaves that hold a stack of layers (see
      :mod:`lars_optax.stacked`): rules judge one layer, and a stacked leaf
      may get one multiplier per layer.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs` with
    :class:`AddDecoupledWeightDecayState`; ``update`` requires ``params``.

  References:
    Loshchilov and Hutter, `Decoupled Weight Decay Regularization
    <https://arxiv.org/abs/1711.05101>`_, ICLR 2019; Keras 3
    ``keras.optimizers.Optimizer(weight_decay=...)``; timm ``Lamb``.
  """
  inner_tx = optax.with_extra_args_support(inner)
  name = "add_decoupled_weight_decay"

  def rates(params, ks):
    wd = masks.resolve_leaf_values(wd_mult, params, "wd_mult", layer_axes=ks)
    lr = masks.resolve_leaf_values(lr_mult, params, "lr_mult", layer_axes=ks)
    return [utils.times(utils.times(weight_decay, a), b) for a, b in zip(wd, lr)]

  def init_fn(params):
    if wd_mult is not None or lr_mult is not None:
      masks.check_unique_names(params)
    ks = stacked_mod.resolve(stacked, params)
    masks.resolve_leaf_values(wd_mult, params, "wd_mult", check_names=True, layer_axes=ks)
    masks.resolve_leaf_values(lr_mult, params, "lr_mult", check_names=True, layer_axes=ks)
    return AddDecoupledWeightDecayState(jnp.zeros([], jnp.int32), inner_tx.init(params),
                                        stacked_mod.layer_markers(params, ks))

  def update_fn(updates, state, params=None, **extra_args):
    if params is None:
      raise ValueError(f"params: {name} needs the params (update(grads, state, params)).")
    params = v.align_params(updates, params)
    flat_p, treedef = jax.tree.flatten(params)
    ks = stacked_mod.axes_from_markers(state.layers, len(flat_p))
    lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
    decays = []
    for p, r in zip(flat_p, rates(params, ks)):
      if utils.is_const(r, 0):
        decays.append(None)
      else:
        rate = jnp.asarray(lr, p.dtype) * stacked_mod.per_layer(jnp.asarray(r, p.dtype), p)
        decays.append(p * rate)
    decayed = jax.tree.unflatten(treedef, [p if d is None else p - d
                                           for p, d in zip(flat_p, decays)])
    new, inner_state = inner_tx.update(updates, state.inner_state, decayed, **extra_args)
    flat_u = treedef.flatten_up_to(new)
    out = [u if d is None else (u - d.astype(u.dtype)).astype(u.dtype)
           for u, d in zip(flat_u, decays)]
    return (jax.tree.unflatten(treedef, out),
            AddDecoupledWeightDecayState(optax.safe_int32_increment(state.count), inner_state,
                                         state.layers))

  return GradientTransformationExtraArgs(init_fn, update_fn)


add_decoupled_weight_decay = _links.public_link(unchecked_add_decoupled_weight_decay,
                                                params="complex", same_structure=True)


def _check_tuples(arg: str, value: Any, *sizes: int) -> tuple:
  items = tuple(value) if isinstance(value, (list, tuple)) else None
  if items is None or any(not isinstance(t, (tuple, list)) or len(t) not in sizes
                          or not isinstance(t[0], str) for t in items):
    raise TypeError(f"{arg}: expected a sequence of {' or '.join(map(str, sizes))}-tuples "
                    f"starting with an argument name, got {value!r}.")
  return items


def unchecked_check_inputs(
    name: str = "optimizer",
    *,
    names: Sequence[tuple[str, masks.MaskLike, str | None]] = (),
    leaf_values: Sequence[tuple[str, masks.LeafValues]] = (),
    hyperparams: Sequence[tuple[Any, ...]] = (),
    complex_params: bool = False,
) -> GradientTransformationExtraArgs:
  """Checks params and gradients; casts each gradient to its param's dtype.

  The first link of every optimizer in this library (stateless):

  * ``init``: every parameter is real floating point, and every name given in
    ``names`` (``(argument, mask, hint)``: e.g. ``("skip", skip, None)``) and
    in ``leaf_values`` (``(argument, lr_mult-style spec)``) matches a leaf
    (as :class:`lars_optax.masks.Mask` says), and every constant in
    ``hyperparams`` (``(argument, value)``) is finite in every parameter's
    dtype (``learning_rate=1e39`` overflows float32, ``1e5`` float16);
  * ``update``: no gradient is a row-sparse BCOO (those are taken by
    :func:`lars_optax.sparse.lazy_update`, which gathers their rows before this
    check: a BCOO reaching it gets an error naming the leaf, after the
    checks of its layout, index dtype and shape); every gradient is real
    floating point; when params are
    given, the gradients have their tree structure and shapes (errors name
    the leaf), and a gradient of another float dtype is cast to its param's,
    so state and updates keep the parameter dtypes.

  Args:
    name: how error messages name the optimizer.
    names: masks whose given names must match a leaf.
    leaf_values: per-leaf value specs whose names must match a leaf.
    hyperparams: ``(argument, value)`` for the optimizer's scalars; each is
      checked in the dtype its name's declaration says it is used in (the
      parameter dtype, or the float32-or-wider dtype of the norms for a LARS
      coefficient or LAMB's bounds).
    complex_params: accept complex params and gradients too (for the
      optimizers whose rule is defined on them, see
      :data:`lars_optax._validation.COMPLEX_OPTIMIZERS`); a complex gradient
      of a real parameter is still rejected.

  Returns:
    A stateless :class:`optax.GradientTransformationExtraArgs`.
  """
  names, leaf_values, hyperparams = tuple(names), tuple(leaf_values), tuple(hyperparams)

  def init_fn(params):
    v.check_float_params(params, name, allow_complex=complex_params)
    _links.check_constants(hyperparams, params)
    _links.check_names(params, names, leaf_values)
    return optax.EmptyState()

  def cast(g, p):
    dtype = getattr(p, "dtype", None)
    if dtype is None or getattr(g, "dtype", None) == dtype:
      return g
    return jnp.asarray(g, dtype)

  def update_fn(updates, state, params=None, **extra_args):
    del extra_args
    _checks.reject_row_sparse(updates, params, name)
    v.check_float_params(updates, name, "gradient", allow_complex=complex_params)
    if params is not None:
      params = v.align_params(updates, params)
      v.check_same_structure(updates, params, name)
      v.check_float_params(params, name, allow_complex=complex_params)
      if complex_params:
        v.check_complex_gradients(updates, params, name)
      updates = jax.tree.map(cast, updates, params)
    return updates, state

  return GradientTransformationExtraArgs(init_fn, update_fn)


def _check_names(arg: str, value: Any) -> None:
  for name, mask, _ in _check_tuples(arg, value, 3):
    masks.check_mask_like(mask, name)


def _check_leaf_values(arg: str, value: Any) -> None:
  for name, spec in _check_tuples(arg, value, 2):
    masks.check_leaf_values(spec, name)


check_inputs = _links.public_link(unchecked_check_inputs, params=None, declared={
    "name": _links.TEXT,
    "names": _links.Arg(_check_names),
    "leaf_values": _links.Arg(_check_leaf_values),
    "hyperparams": _links.Arg(lambda arg, value: _check_tuples(arg, value, 2)),
    "complex_params": _links.FLAG,
})


