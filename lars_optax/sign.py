r"""The sign family: Signum and signSGD, as MXNet 2.0 implements them.

* :func:`signum` -- ``mx.optimizer.Signum``: the sign of a momentum (an
  exponential moving average of the gradient), with a coupled (``wd``) and a
  decoupled (``wd_lh``) weight decay;
* :func:`signsgd` -- Signum with ``momentum=0``: the sign of the gradient.

Each is a plain ``optax.chain`` of public parts: the sign is optax's
:func:`optax.scale_by_sign` and the momentum :func:`optax.ema` (without
debiasing); the decays are :func:`lars_optax.add_decayed_weights_per_leaf`.

>>> import lars_optax
>>> tx = lars_optax.signum(0.01, momentum=0.9, wd_lh=1e-4)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from lars_optax import _validation as v
from lars_optax import _assembly as assembly
from lars_optax import _links
from lars_optax import _mxnet_base as base
from lars_optax import _utils as utils
from lars_optax import _masks as masks
from lars_optax._transforms import unchecked_add_decayed_weights_per_leaf

__all__ = ["signsgd", "signum"]


@_links.optimizer(hints=v.MXNET_HINTS)
def signum(
    learning_rate: optax.ScalarOrSchedule = 0.01,
    *,
    momentum: float = 0.9,
    wd_lh: float = 0.0,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
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
  if utils.is_const(momentum, 0):
    return signsgd(learning_rate, wd_lh=wd_lh, wd=wd, rescale_grad=rescale_grad,
                   clip_gradient=clip_gradient, lr_mult=lr_mult, wd_mult=wd_mult,
                   multi_precision=multi_precision)
  common = base.Base.of(locals())
  if isinstance(momentum, jax.Array):
    # Possibly traced (optax.inject_hyperparams): 0 selects signSGD in the computation.
    parts = [*common.preprocess(decay=False), _sign_of_momentum_or_gradient(momentum, wd, wd_mult)]
  else:
    parts = [*common.preprocess(), utils.keep_dtypes(optax.ema(momentum, debias=False), momentum),
             optax.scale_by_sign()]
  parts += base.decoupled_decay_and_lr(wd_lh, learning_rate, lr_mult)
  return assembly.finish(parts, "signum", multi_precision=multi_precision)


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
           else unchecked_add_decayed_weights_per_leaf(wd, multipliers=wd_mult, arg_name="wd_mult"))

  def add_decay(updates, params):
    return updates if decay is None else decay.update(updates, optax.EmptyState(), params)[0]

  def update_fn(updates, state, params=None):
    e, state = ema.update(add_decay(updates, params), state, params)
    sign_sgd = add_decay(jax.tree.map(jnp.sign, updates), params)
    is_sgd = jnp.asarray(momentum) == 0
    return jax.tree.map(lambda a, b: jnp.where(is_sgd, a, jnp.sign(b)), sign_sgd, e), state

  return optax.GradientTransformation(ema.init, update_fn)


@_links.optimizer(hints=v.MXNET_HINTS)
def signsgd(
    learning_rate: optax.ScalarOrSchedule = 0.01,
    *,
    wd_lh: float = 0.0,
    wd: float = 0.0,
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
  common = base.Base.of(locals())
  parts = [optax.scale_by_sign()]
  if not utils.is_const(wd, 0):
    parts.append(unchecked_add_decayed_weights_per_leaf(wd, multipliers=wd_mult,
                                                        arg_name="wd_mult"))
  parts += base.decoupled_decay_and_lr(wd_lh, learning_rate, lr_mult)
  return assembly.finish(parts, "signsgd", multi_precision=multi_precision)
