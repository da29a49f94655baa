"""The optimizers users call: plain ``optax.chain``\\ s of public transformations.

* :func:`lars` -- MXNet's ``mx.optimizer.LARS`` (argument names and defaults).
* :func:`tf_lars` -- TensorFlow's ``tf.contrib.opt.LARSOptimizer``.
* :func:`signum` and :func:`signsgd` -- MXNet's ``mx.optimizer.Signum``.
* :func:`adam` -- MXNet's ``mx.optimizer.Adam`` (epsilon outside the bias
  correction, optional lazy updates).
* :func:`sgd` -- MXNet's ``mx.optimizer.SGD`` (learning rate inside the
  momentum buffer).
* :func:`lamb` and :func:`lans` -- MXNet's ``mx.optimizer.LAMB`` and
  ``mx.optimizer.LANS`` (layer-wise trust ratio on Adam's update, with name
  masks and bounds on the weight norm).

The MXNet-flavoured ones share MXNet's optimizer-base arguments: ``wd``,
``rescale_grad``, ``clip_gradient``, per-leaf ``lr_mult`` and ``wd_mult``
(looked up by leaf name, see :data:`lars_optax.masks.LeafValues`) and
``multi_precision`` (float32 master weights for float16/bfloat16 params, see
:func:`lars_optax.multi_precision`). :func:`lars_optax.create` builds them by
name, MXNet style.

Every optimizer checks its inputs. Hyperparameters are checked when it is
built (a ValueError or TypeError that starts with the argument's name and
states the accepted range); Python, numpy and JAX scalars (bfloat16 ones too)
are accepted alike and never change the dtypes of updates and state. ``init``
rejects a constant hyperparameter that the params' dtype cannot hold
(``learning_rate=1e39`` for float32 params, ``1e5`` for float16), integer,
boolean and complex params, and names in
``skip``/``skip_list``/``lr_mult``/``wd_mult`` that match no parameter (see
:class:`lars_optax.masks.Mask`). ``update(grads, state, params)`` rejects
non-float gradients and gradients whose tree or shapes differ from the params
(naming the leaf), and casts a gradient of another float dtype to its
parameter's, so that state and updates keep the parameter dtypes. These
checks are the first link of every chain, :func:`lars_optax.check_inputs`.
As in optax, params that sit where the gradients hold None are ignored, so
Equinox's ``update(grads, state, model)`` works with the whole model.

Non-finite gradients: a NaN or an infinity never makes a LARS trust ratio NaN
(it falls back to 1), but it does reach the weights. To skip such steps, wrap
the optimizer:

>>> import lars_optax
>>> tx = lars_optax.skip_nonfinite(lars_optax.lars(0.1, momentum=0.9))

A skipped step leaves the params and every state buffer unchanged and is
counted in ``state.total_notfinite`` (:func:`lars_optax.skip_nonfinite`).
``optax.apply_if_finite(tx, max_consecutive_errors)`` does the same for the
optimizers without ``multi_precision``.

Recipe: the LARS of BYOL and SimCLR (and of :func:`optax.lars`). Their rule
differs from MXNet's and TF's: weight decay is added to the gradient first
(masked like the ratio), the ratio is taken from the decayed gradient,
:math:`\\rho = \\eta\\|w\\| / \\|g + \\lambda w\\|`, the momentum accumulates
:math:`\\rho(g + \\lambda w)`, and the learning rate multiplies the
momentum from outside (:math:`m_t = \\mu m_{t-1} + \\rho u_t`,
:math:`w_t = w_{t-1} - \\alpha_t m_t`). Biases and norm parameters get neither
decay nor a ratio. It is a chain of public transformations::

  import optax
  import lars_optax

  skip = lars_optax.by_ndim(1)  # biases and norm scales: no decay, ratio 1
  byol_lars = optax.chain(
      lars_optax.check_inputs("byol_lars"),
      lars_optax.add_decayed_weights_per_leaf(1e-6, [(skip, 0.0)]),  # u = g + wd * w
      lars_optax.scale_by_lars_trust_ratio(eta=0.001, skip=skip),    # rho from ||u||
      optax.trace(decay=0.9),                                         # m = mu * m + rho * u
      optax.scale_by_learning_rate(0.2),                              # w -= lr * m
  )

With a constant learning rate this equals ``optax.lars(0.2, weight_decay=1e-6,
weight_decay_mask=keep, trust_coefficient=0.001, trust_ratio_mask=keep,
momentum=0.9)`` with ``keep`` the complement of ``skip`` (optax.lars puts a
scheduled rate inside the momentum); :func:`lars` instead takes the ratio from
:math:`\\|g\\| + \\lambda\\|w\\|` and puts the rate inside the momentum
(MXNet). Use ``skip="flax"`` (or another preset) to select by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lars_optax import _mxnet_base as base
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import masks
from lars_optax import stacked as stacked_mod
from lars_optax.transforms import (
    add_decayed_weights_per_leaf,
    mxnet_momentum,
    normalize_per_leaf,
    scale_by_lamb_adam,
    scale_by_lamb_trust_ratio,
    scale_by_lans,
    scale_by_lars_trust_ratio,
    scale_by_mxnet_adam,
)

__all__ = ["adam", "lamb", "lans", "lars", "sgd", "signsgd", "signum", "tf_lars"]


@v.lars_names
def lars(
    learning_rate: optax.ScalarOrSchedule = 0.1,
    momentum: float = 0.0,
    eta: float = 0.001,
    epsilon: float = 1e-8,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    skip: masks.MaskLike = masks.MXNET_DEFAULT,
    *,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    wd_skip: masks.MaskLike = None,
    multi_precision: bool = False,
    axis_name: str | None = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
) -> optax.GradientTransformationExtraArgs:
  r"""LARS as Apache MXNet implements it (``mx.optimizer.LARS``).

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
    wd_skip: leaves that get no weight decay (in the update and in the
      ratio): anything ``skip`` takes, default None (every leaf decays, as in
      MXNet). It is ``wd_mult`` 0 on those leaves, a rule ``(wd_skip, 0.0)``
      put before ``wd_mult``'s, so it wins where both name a leaf. A mask
      built from names must match some leaf (``init`` raises a ValueError
      naming ``wd_skip``).
    multi_precision: keep float32 master weights and state for float16 and
      bfloat16 params (:func:`lars_optax.multi_precision`). The ratio's
      :math:`\|w\|` is then taken from the master (MXNet takes it from the
      float16 weight; the two differ by float16 rounding).
    axis_name: inside ``shard_map``/``pmap`` with params split over this mesh
      axis, sum the squared norms over it so each block gets its whole layer's
      trust ratio (see :func:`lars_optax.scale_by_lars_trust_ratio`).
    stacked: the leaves that hold a stack of layers, as scanned models keep
      their blocks (see :mod:`lars_optax.stacked`): a mask (one leading
      layer axis), ``{leaf name: k}`` or ``[(mask, k)]`` rules (k leading
      layer axes), None, or the default, read from Flax partition metadata
      (``"layers"``; nothing without it). Each layer then gets its own norms
      and trust ratio, exactly as the unrolled model; ``skip``, ``lr_mult``
      and ``wd_mult`` rules judge one layer, and ``lr_mult``/``wd_mult`` may
      give a stacked leaf one value per layer (a numpy array of length L).

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`.

  References:
    You, Gitman and Ginsburg, `Large Batch Training of Convolutional Networks
    <https://arxiv.org/abs/1708.03888>`_, 2017; Apache MXNet 2.0
    ``mxnet.optimizer.LARS``.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult)
  v.check_scalar("momentum", momentum, low=0.0, high=1.0, high_open=True)
  v.check_scalar("eta", eta, low=0.0)
  v.check_scalar("epsilon", epsilon, low=0.0)
  multi_precision = base.check_flag("multi_precision", multi_precision)
  stacked_mod.check_stacked(stacked)
  decay_mult = base.wd_mult_with_skip(wd_mult, wd_skip)

  # The ratio is taken from the rescaled gradient before clipping, so the
  # rescale is the ratio transformation's own and the rest runs inside it.
  inner = base.preprocess(1.0, clip_gradient, wd, decay_mult, stacked)
  return base.finish([
      scale_by_lars_trust_ratio(
          optax.chain(*inner) if inner else None,
          eta=eta, weight_decay=wd, epsilon=epsilon, skip=skip,
          rescale=rescale_grad, wd_mult=decay_mult, axis_name=axis_name, stacked=stacked),
      *base.lr_mult_part(lr_mult, stacked),
      mxnet_momentum(learning_rate, momentum),
  ], "lars", multi_precision=multi_precision, complex_params=clip_gradient is None,
      names=[("skip", skip, None), ("wd_skip", wd_skip, None)],
      leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
      hyperparams=[*base.hyperparams(learning_rate=learning_rate, wd=wd, rescale_grad=rescale_grad),
                   ("eta", eta, True), ("epsilon", epsilon, True)])


@v.tf_names
def tf_lars(
    learning_rate: optax.ScalarOrSchedule,
    momentum: float = 0.9,
    weight_decay: float = 0.0001,
    eeta: float = 0.001,
    epsilon: float = 0.0,
    skip_list: Sequence[str] | None = None,
    use_nesterov: bool = False,
    *,
    skip: masks.MaskLike = None,
    axis_name: str | None = None,
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
    axis_name: inside ``shard_map``/``pmap`` with params split over this mesh
      axis, sum the squared norms over it so each block gets its whole layer's
      trust ratio (see :func:`lars_optax.scale_by_lars_trust_ratio`).
    stacked: the leaves that hold a stack of layers, as scanned models keep
      their blocks (see :mod:`lars_optax.stacked`): a mask (one leading
      layer axis), ``{leaf name: k}`` or ``[(mask, k)]`` rules (k leading
      layer axes), None, or the default, read from Flax partition metadata
      (``"layers"``; nothing without it). Each layer then gets its own norms
      and trust ratio, exactly as the unrolled model; ``skip`` judges one
      layer.

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
                     "skip=lars_optax.FLAX_SKIP | lars_optax.by_substring('embedding').")
  if skip_list:
    skip = masks.by_substring(*skip_list)
    args = ", ".join(repr(s) for s in skip_list)
    hint = ("Fix the entry or leave it out; for an entry that may match nothing "
            "(e.g. 'bias' in a model without biases), pass "
            f"skip=lars_optax.by_substring({args}).optional() instead of skip_list.")
    names = [("skip_list", skip, hint)]
  return base.finish([
      scale_by_lars_trust_ratio(
          utils.keep_dtypes(optax.trace(decay=momentum, nesterov=use_nesterov), momentum),
          eta=eeta, weight_decay=weight_decay, epsilon=epsilon, skip=skip,
          axis_name=axis_name, stacked=stacked),
      base.learning_rate_part(learning_rate),
  ], "tf_lars", names=names, complex_params=True,
      hyperparams=[("learning_rate", learning_rate), ("eeta", eeta, True),
                   ("weight_decay", weight_decay, True), ("epsilon", epsilon, True)])


@v.mxnet_names
def signum(
    learning_rate: optax.ScalarOrSchedule = 0.01,
    momentum: float = 0.9,
    wd_lh: float = 0.0,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    *,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
) -> optax.GradientTransformation:
  r"""Signum (sign of momentum) as Apache MXNet implements it.

  With :math:`\mu` = ``momentum`` > 0, :math:`s` = ``rescale_grad``,
  :math:`c` = ``clip_gradient``, :math:`\lambda` = ``wd`` and
  :math:`\lambda_{lh}` = ``wd_lh``:

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) + \lambda w_{t-1} \\
    e_t &= \mu\,e_{t-1} + (1 - \mu)\,u_t \\
    w_t &= (1 - \alpha_t\lambda_{lh})\,w_{t-1} - \alpha_t\,\mathrm{sign}(e_t)

  (MXNet keeps :math:`m = -e`; the result is the same.) ``wd`` is coupled
  (it enters the momentum), ``wd_lh`` is decoupled (Loshchilov and Hutter).
  With ``momentum == 0`` this is :func:`signsgd`, as in MXNet, where both
  decays are decoupled.

  The chain is ``scale(s), clip(c), add_decayed_weights_per_leaf(wd),
  optax.ema(momentum, debias=False), optax.scale_by_sign(),
  add_decayed_weights_per_leaf(wd_lh), optax.scale_by_learning_rate(lr)``,
  then :func:`~lars_optax.scale_per_leaf` for ``lr_mult``.

  Args:
    learning_rate: a scalar or an optax schedule.
    momentum: :math:`\mu` in [0, 1); 0 selects signSGD, whatever its type
      (``0``, ``0.0``, ``np.float32(0)``, a JAX 0, also one traced by
      ``optax.inject_hyperparams``: there the choice is made in the
      computation).
    wd_lh: decoupled weight decay >= 0.
    wd: coupled weight decay >= 0 (multiplied per leaf by ``wd_mult``).
    rescale_grad: gradient multiplier > 0.
    clip_gradient: element-wise clipping bound > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd`` (not of ``wd_lh``, as in MXNet).
    multi_precision: float32 master weights and state for float16/bfloat16.

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    Bernstein, Wang, Azizzadenesheli and Anandkumar, `signSGD: Compressed
    Optimisation for Non-Convex Problems <https://arxiv.org/abs/1802.04434>`_,
    ICML 2018; Apache MXNet 2.0 ``mxnet.optimizer.Signum``.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult)
  v.check_scalar("momentum", momentum, low=0.0, high=1.0, high_open=True)
  v.check_scalar("wd_lh", wd_lh, low=0.0)
  multi_precision = base.check_flag("multi_precision", multi_precision)
  if utils.is_const(momentum, 0):
    return signsgd(learning_rate, wd_lh=wd_lh, wd=wd, rescale_grad=rescale_grad,
                   clip_gradient=clip_gradient, lr_mult=lr_mult, wd_mult=wd_mult,
                   multi_precision=multi_precision)
  if isinstance(momentum, jax.Array):
    # Possibly traced (optax.inject_hyperparams): 0 selects signSGD in the computation.
    parts = base.preprocess(rescale_grad, clip_gradient, 0.0, None)
    parts += [_sign_of_momentum_or_gradient(momentum, wd, wd_mult)]
  else:
    parts = base.preprocess(rescale_grad, clip_gradient, wd, wd_mult)
    parts += [utils.keep_dtypes(optax.ema(momentum, debias=False), momentum),
              optax.scale_by_sign()]
  parts += base.decoupled_decay_and_lr(wd_lh, learning_rate, lr_mult)
  return base.finish(parts, "signum", multi_precision=multi_precision,
                 leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                 hyperparams=base.hyperparams(learning_rate=learning_rate, wd=wd, wd_lh=wd_lh,
                                          rescale_grad=rescale_grad))


def _sign_of_momentum_or_gradient(momentum: jax.Array, wd: Any,
                                  wd_mult: masks.LeafValues) -> optax.GradientTransformation:
  """Signum's ``sign(e_t)`` (``wd`` coupled) for a JAX-array momentum, or signSGD's
  ``sign(g) + wd * w`` (``wd`` decoupled) where its value is 0.

  The choice is made in the computation, so a momentum that is traced (as under
  ``optax.inject_hyperparams`` and ``jit``) selects by value as a Python 0 does; the
  state (the momentum buffer) is the same either way.
  """
  ema = utils.keep_dtypes(optax.ema(momentum, debias=False), momentum)
  decay = (None if utils.is_const(wd, 0)
           else add_decayed_weights_per_leaf(wd, wd_mult, arg_name="wd_mult"))

  def add_decay(updates, params):
    return updates if decay is None else decay.update(updates, optax.EmptyState(), params)[0]

  def update_fn(updates, state, params=None):
    e, state = ema.update(add_decay(updates, params), state, params)
    sign_sgd = add_decay(jax.tree.map(jnp.sign, updates), params)
    is_sgd = jnp.asarray(momentum) == 0
    return jax.tree.map(lambda a, b: jnp.where(is_sgd, a, jnp.sign(b)), sign_sgd, e), state

  return optax.GradientTransformation(ema.init, update_fn)


@v.mxnet_names
def signsgd(
    learning_rate: optax.ScalarOrSchedule = 0.01,
    wd_lh: float = 0.0,
    wd: float = 0.0,
    *,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
) -> optax.GradientTransformation:
  r"""signSGD as Apache MXNet implements it (Signum with ``momentum=0``).

  .. math::

    w_t = (1 - \alpha_t(\lambda + \lambda_{lh}))\,w_{t-1} - \alpha_t\,\mathrm{sign}(g_t)

  with :math:`\mathrm{sign}(0) = 0`. Both decays are decoupled here (MXNet's
  ``signsgd_update``). ``rescale_grad`` (> 0) and ``clip_gradient`` cannot
  change a sign: they are accepted and checked, as MXNet accepts them, and have
  no effect.

  The chain is ``optax.scale_by_sign(), add_decayed_weights_per_leaf(wd,
  wd_mult), add_decayed_weights_per_leaf(wd_lh),
  optax.scale_by_learning_rate(lr)``, then ``lr_mult``.

  Args:
    learning_rate: a scalar or an optax schedule.
    wd_lh: decoupled weight decay >= 0.
    wd: weight decay >= 0 (multiplied per leaf by ``wd_mult``).
    rescale_grad: gradient multiplier > 0 (no effect on a sign).
    clip_gradient: clipping bound > 0 or None (no effect on a sign).
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights for float16/bfloat16.

  Returns:
    A stateless :class:`optax.GradientTransformation` (apart from the
    schedule's count).

  References:
    Bernstein et al., `signSGD <https://arxiv.org/abs/1802.04434>`_, 2018.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult)
  v.check_scalar("wd_lh", wd_lh, low=0.0)
  multi_precision = base.check_flag("multi_precision", multi_precision)
  parts = [optax.scale_by_sign()]
  if not utils.is_const(wd, 0):
    parts.append(add_decayed_weights_per_leaf(wd, wd_mult, arg_name="wd_mult"))
  parts += base.decoupled_decay_and_lr(wd_lh, learning_rate, lr_mult)
  return base.finish(parts, "signsgd", multi_precision=multi_precision,
                 leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                 hyperparams=base.hyperparams(learning_rate=learning_rate, wd=wd, wd_lh=wd_lh))


@v.mxnet_names
def adam(
    learning_rate: optax.ScalarOrSchedule = 0.001,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-8,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lazy_update: bool = False,
    *,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    begin_num_update: int = 0,
) -> optax.GradientTransformation:
  r"""Adam as Apache MXNet implements it (``mx.optimizer.Adam``).

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) + \lambda w_{t-1} \\
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1) u_t, \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2) u_t^2 \\
    w_t &= w_{t-1} - \alpha_t \frac{\sqrt{1 - \beta_2^t}}{1 - \beta_1^t}
      \cdot \frac{m_t}{\sqrt{v_t} + \epsilon}

  Epsilon is added to :math:`\sqrt{v_t}`, not to the bias-corrected
  :math:`\sqrt{\hat v_t}` as in :func:`optax.adam`, and ``wd`` is coupled (L2,
  as in MXNet; not AdamW). With ``lazy_update=True`` only the rows (axis 0)
  with a non-zero gradient entry update :math:`w`, :math:`m` and :math:`v`
  (:func:`lars_optax.lazy_update`); :math:`t` counts every step.

  The chain is ``scale(s), clip(c), add_decayed_weights_per_leaf(wd),
  scale_by_mxnet_adam(beta1, beta2, epsilon),
  optax.scale_by_learning_rate(lr)``, then ``lr_mult``.

  Args:
    learning_rate: a scalar or an optax schedule.
    beta1: in [0, 1).
    beta2: in [0, 1).
    epsilon: >= 0. With ``epsilon=0``, an entry whose gradient has been 0 at
      every step so far (:math:`v_t = 0`) gets a zero update rather than
      MXNet's 0/0 = NaN.
    wd: coupled weight decay >= 0.
    rescale_grad: gradient multiplier > 0.
    clip_gradient: element-wise clipping bound > 0, or None.
    lazy_update: update only the rows present in the gradient.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights and state for float16/bfloat16.
      Without it, ``init`` warns (:class:`lars_optax.LowPrecisionWarning`)
      for float16 params: :math:`v_t` underflows in float16 and the steps
      blow up (``optax.adam`` does the same).
    begin_num_update: updates done before the first (MXNet's argument): the
      bias correction's :math:`t` starts at ``begin_num_update + 1``. An int
      in [0, 2**31 - 2]: :math:`t` is an int32 count (it stops growing at
      2**31 - 1, as optax's counts do).

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    Kingma and Ba, `Adam: A Method for Stochastic Optimization
    <https://arxiv.org/abs/1412.6980>`_, 2014; Apache MXNet 2.0
    ``mxnet.optimizer.Adam``.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult)
  v.check_scalar("beta1", beta1, low=0.0, high=1.0, high_open=True)
  v.check_scalar("beta2", beta2, low=0.0, high=1.0, high_open=True)
  v.check_scalar("epsilon", epsilon, low=0.0)
  lazy_update = base.check_flag("lazy_update", lazy_update)
  multi_precision = base.check_flag("multi_precision", multi_precision)
  v.check_count("begin_num_update", begin_num_update, maximum=v.MAX_INITIAL_COUNT,
                why=v.COUNT_WHY)
  parts = base.preprocess(rescale_grad, clip_gradient, wd, wd_mult)
  parts += [scale_by_mxnet_adam(beta1, beta2, epsilon, initial_count=begin_num_update),
            base.learning_rate_part(learning_rate), *base.lr_mult_part(lr_mult)]
  return base.finish(parts, "adam", lazy=lazy_update, multi_precision=multi_precision,
                     complex_params=clip_gradient is None,
                 leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                 hyperparams=base.hyperparams(learning_rate=learning_rate, wd=wd,
                                          rescale_grad=rescale_grad))


@v.mxnet_names
def sgd(
    learning_rate: optax.ScalarOrSchedule = 0.1,
    momentum: float = 0.0,
    lazy_update: bool = False,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    *,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
) -> optax.GradientTransformation:
  r"""SGD with momentum as Apache MXNet implements it (``mx.optimizer.SGD``).

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) + \lambda w_{t-1} \\
    m_t &= \mu\,m_{t-1} - \alpha_t u_t, \qquad w_t = w_{t-1} + m_t

  (with :math:`\mu = 0`, :math:`w_t = w_{t-1} - \alpha_t u_t` and no state).
  The learning rate sits inside the buffer (:func:`lars_optax.mxnet_momentum`),
  unlike :func:`optax.sgd`, so a learning-rate change only affects new
  contributions. With ``lazy_update=True`` only the rows with a non-zero
  gradient entry update :math:`w` and :math:`m`.

  Args:
    learning_rate: a scalar or an optax schedule.
    momentum: :math:`\mu` in [0, 1).
    lazy_update: update only the rows present in the gradient.
    wd: coupled weight decay >= 0.
    rescale_grad: gradient multiplier > 0.
    clip_gradient: element-wise clipping bound > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights and state for float16/bfloat16.
      Not with ``lazy_update=True`` (a ValueError, as MXNet's SGD asserts).

  Returns:
    An :class:`optax.GradientTransformation`.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult)
  v.check_scalar("momentum", momentum, low=0.0, high=1.0, high_open=True)
  lazy_update = base.check_flag("lazy_update", lazy_update)
  multi_precision = base.check_flag("multi_precision", multi_precision)
  if lazy_update and multi_precision:
    raise ValueError(
        "lazy_update: sgd takes lazy_update=True or multi_precision=True, not both, as "
        "MXNet's SGD asserts. For row-sparse updates keep lazy_update=True with float32 "
        "or bfloat16 params; for float32 master weights pass lazy_update=False (adam "
        "takes both, on dense gradients).")
  parts = base.preprocess(rescale_grad, clip_gradient, wd, wd_mult)
  parts += [*base.lr_mult_part(lr_mult), mxnet_momentum(learning_rate, momentum)]
  return base.finish(parts, "sgd", lazy=lazy_update, multi_precision=multi_precision,
                     complex_params=clip_gradient is None,
                 leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                 hyperparams=base.hyperparams(learning_rate=learning_rate, wd=wd,
                                          rescale_grad=rescale_grad))


@v.mxnet_names
def lamb(
    learning_rate: optax.ScalarOrSchedule = 0.001,
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
    *,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    wd_skip: masks.MaskLike = None,
    multi_precision: bool = False,
    axis_name: str | None = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
) -> optax.GradientTransformation:
  r"""LAMB as Apache MXNet implements it (``mx.optimizer.LAMB``).

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

  The weight decay is decoupled (it is not in the moments) and enters the
  ratio's denominator. The bounds clip the weight norm :math:`r_1` (left out
  when None), not the ratio. :math:`\rho = 1` when :math:`r_1 = 0` or
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

  MXNet 2.0's LAMB disagrees with itself: its default multi-tensor path
  (``aggregate_num=4``: ``multi_lamb_update``, ``multi_mp_lamb_update``) and
  its single-tensor kernels (``aggregate_num`` 0 or 1:
  ``lamb_update_phase1``/``phase2``) give different weights. On the data of
  ``tests/reference/make_mxnet_schedules.py`` (``wd=0.01``, bias correction)
  the single-tensor weights differ from the default ones by up to 1.4e-4
  (relative) in float32 and 12% with float16 masters on ordinary leaves, and
  by 26% on a zero-initialised one. This function follows MXNet's default
  path, as does :func:`lars_optax.create` for every ``aggregate_num`` (which it
  accepts and ignores); ``tests/test_schedules.py`` pins that.

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
    wd: decoupled weight decay >= 0 (multiplied per leaf by ``wd_mult``).
    rescale_grad: gradient multiplier > 0.
    clip_gradient: element-wise clipping bound > 0, or None.
    skip: leaves whose ratio is 1 (default None: none, as in MXNet); a
      preset name, a :class:`~lars_optax.masks.Mask`, a callable returning a
      bool pytree, or a bool pytree.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    wd_skip: leaves that get no weight decay: anything ``skip`` takes,
      default None (every leaf decays, as in MXNet). It is ``wd_mult`` 0 on
      those leaves, a rule ``(wd_skip, 0.0)`` put before ``wd_mult``'s, so it
      wins where both name a leaf. A mask built from names must match some
      leaf (``init`` raises a ValueError naming ``wd_skip``).
    multi_precision: float32 master weights and state for float16/bfloat16
      (the ratio's :math:`\|w\|` is the master's, as in MXNet). Without it,
      ``init`` warns (:class:`lars_optax.LowPrecisionWarning`) for float16
      params: :math:`v_t` underflows in float16 (MXNet keeps float32 moments).
    axis_name: inside ``shard_map``/``pmap`` with params split over this mesh
      axis, sum the squared norms over it so each block gets its whole layer's
      ratio.
    stacked: the leaves that hold a stack of layers, as scanned models keep
      their blocks (see :mod:`lars_optax.stacked`): a mask (one leading
      layer axis), ``{leaf name: k}`` or ``[(mask, k)]`` rules (k leading
      layer axes), None, or the default, read from Flax partition metadata
      (``"layers"``; nothing without it). Each layer then gets its own norms
      and trust ratio, exactly as the unrolled model; ``skip``, ``lr_mult``
      and ``wd_mult`` rules judge one layer, and ``lr_mult``/``wd_mult`` may
      give a stacked leaf one value per layer (a numpy array of length L).

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
  bias_correction = base.check_flag("bias_correction", bias_correction)
  multi_precision = base.check_flag("multi_precision", multi_precision)
  stacked_mod.check_stacked(stacked)
  decay_mult = base.wd_mult_with_skip(wd_mult, wd_skip)
  parts = base.preprocess(rescale_grad, clip_gradient, 0.0, None)
  parts.append(scale_by_lamb_adam(beta1, beta2, epsilon, bias_correction=bias_correction))
  if not utils.is_const(wd, 0):
    parts.append(add_decayed_weights_per_leaf(wd, decay_mult, arg_name="wd_mult",
                                              stacked=stacked))
  parts += [scale_by_lamb_trust_ratio(lower_bound=lower_bound, upper_bound=upper_bound,
                                      skip=skip, axis_name=axis_name, stacked=stacked),
            base.learning_rate_part(learning_rate), *base.lr_mult_part(lr_mult, stacked)]
  return base.finish(parts, "lamb", multi_precision=multi_precision,
                     complex_params=clip_gradient is None,
                     names=[("skip", skip, None), ("wd_skip", wd_skip, None)],
                     leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                     hyperparams=base.hyperparams(learning_rate=learning_rate, wd=wd,
                                                  rescale_grad=rescale_grad, epsilon=epsilon))


@v.mxnet_names
def lans(
    learning_rate: optax.ScalarOrSchedule = 0.001,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-6,
    lower_bound: float | None = None,
    upper_bound: float | None = None,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    skip: masks.MaskLike = None,
    *,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    wd_skip: masks.MaskLike = None,
    multi_precision: bool = False,
    axis_name: str | None = None,
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
    wd_skip: leaves that get no weight decay: anything ``skip`` takes,
      default None. It is ``wd_mult`` 0 on those leaves, a rule
      ``(wd_skip, 0.0)`` put before ``wd_mult``'s, so it wins where both
      name a leaf. A mask built from names must match some leaf.
    multi_precision: float32 master weights and state for float16/bfloat16.
      Without it, ``init`` warns (:class:`lars_optax.LowPrecisionWarning`)
      for float16 params: :math:`v_t` underflows in float16.
    axis_name: inside ``shard_map``/``pmap`` with params split over this mesh
      axis, sum the squared norms (of the gradient, the weight and both
      parts) over it.
    stacked: the leaves that hold a stack of layers, as scanned models keep
      their blocks (see :mod:`lars_optax.stacked`): a mask (one leading
      layer axis), ``{leaf name: k}`` or ``[(mask, k)]`` rules (k leading
      layer axes), None, or the default, read from Flax partition metadata
      (``"layers"``; nothing without it). Each layer then gets its own norms
      and trust ratio, exactly as the unrolled model; ``skip``, ``lr_mult``
      and ``wd_mult`` rules judge one layer, and ``lr_mult``/``wd_mult`` may
      give a stacked leaf one value per layer (a numpy array of length L).

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
  multi_precision = base.check_flag("multi_precision", multi_precision)
  stacked_mod.check_stacked(stacked)
  decay_mult = base.wd_mult_with_skip(wd_mult, wd_skip)
  parts = [normalize_per_leaf(axis_name=axis_name, stacked=stacked),
           *base.preprocess(1.0, clip_gradient, 0.0, None),
           scale_by_lans(beta1, beta2, epsilon, weight_decay=wd, wd_mult=decay_mult,
                         lower_bound=lower_bound, upper_bound=upper_bound, skip=skip,
                         axis_name=axis_name, stacked=stacked),
           base.learning_rate_part(learning_rate), *base.lr_mult_part(lr_mult, stacked)]
  return base.finish(parts, "lans", multi_precision=multi_precision,
                     names=[("skip", skip, None), ("wd_skip", wd_skip, None)],
                     leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                     hyperparams=base.hyperparams(learning_rate=learning_rate, wd=wd,
                                                  rescale_grad=rescale_grad))
