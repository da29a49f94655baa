r"""SGD variants: Nesterov momentum, delay-compensated SGD, Langevin dynamics.

Three of Apache MXNet 2.0's optimizers, with MXNet's argument names, defaults
and update rules, each a plain ``optax.chain`` of public transformations:

* :func:`nag` -- ``mx.optimizer.NAG``: Nesterov's accelerated gradient with the
  learning rate inside the momentum buffer
  (:func:`lars_optax.mxnet_momentum` with ``nesterov=True``);
* :func:`dcasgd` -- ``mx.optimizer.DCASGD``: SGD whose gradient is corrected
  for the change of the weights since the previous step
  (:func:`add_delay_compensation`);
* :func:`sgld` -- ``mx.optimizer.SGLD``: stochastic gradient Langevin
  dynamics, half a gradient step plus Gaussian noise whose variance is the
  learning rate (:func:`add_langevin_noise`). Its noise comes from a JAX PRNG
  key kept in the optimizer state, so a run is reproducible from its
  ``seed`` and the update stays a pure function (``jit``, ``pmap`` and
  checkpoints see the key like any other state).

They share MXNet's optimizer-base arguments (``wd``, ``rescale_grad``,
``clip_gradient``, ``lr_mult``, ``wd_mult``, ``multi_precision``) and the
input checks of :mod:`lars_optax.optimizers`. :func:`lars_optax.create` builds
them by MXNet's names, ``"nag"``, ``"dcasgd"`` and ``"sgld"``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax import GradientTransformation

from lars_optax import _mxnet_base as base
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import masks
from lars_optax.transforms import mxnet_momentum

__all__ = [
    "DelayCompensationState",
    "add_delay_compensation",
    "dcasgd",
    "nag",
]


def nag(
    learning_rate: optax.ScalarOrSchedule = 0.1,
    momentum: float = 0.9,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    *,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
) -> optax.GradientTransformation:
  r"""Nesterov's accelerated gradient as Apache MXNet implements it (``mx.optimizer.NAG``).

  With :math:`\mu` = ``momentum``, :math:`s` = ``rescale_grad``,
  :math:`c` = ``clip_gradient`` and :math:`\lambda` = ``wd``:

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) + \lambda w_{t-1} \\
    m_t &= \mu\,m_{t-1} - \alpha_t u_t \\
    w_t &= w_{t-1} + \mu\,m_t - \alpha_t u_t

  (:math:`m_0 = 0`; with :math:`\mu = 0` this is plain SGD,
  :math:`w_t = w_{t-1} - \alpha_t u_t`, and no buffer is kept, as in MXNet).
  The learning rate sits inside the buffer (MXNet's ``nag_mom_update``), so
  a scheduled rate changes only new contributions. With a constant rate it
  equals ``optax.sgd(lr, momentum, nesterov=True)`` (whose buffer is
  :math:`-m_t/\alpha`).

  The chain is ``scale(s), clip(c), add_decayed_weights_per_leaf(wd,
  wd_mult)``, :func:`~lars_optax.scale_per_leaf` for ``lr_mult``, then
  ``mxnet_momentum(lr, momentum, nesterov=True)``.

  Args:
    learning_rate: a scalar or an optax schedule.
    momentum: :math:`\mu` in [0, 1).
    wd: coupled weight decay >= 0 (multiplied per leaf by ``wd_mult``).
    rescale_grad: gradient multiplier > 0.
    clip_gradient: element-wise clipping bound > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights and state for float16/bfloat16.

  Returns:
    An :class:`optax.GradientTransformation` (its momentum buffer is the
    ``momentum`` field of a :class:`lars_optax.MXNetMomentumState`).

  References:
    Nesterov, A method of solving a convex programming problem with
    convergence rate :math:`O(1/k^2)`, Soviet Mathematics Doklady 27, 1983;
    Sutskever, Martens, Dahl and Hinton, `On the importance of initialization
    and momentum in deep learning
    <https://proceedings.mlr.press/v28/sutskever13.html>`_, ICML 2013;
    Apache MXNet 2.0 ``mxnet.optimizer.NAG``.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult)
  v.check_scalar("momentum", momentum, low=0.0, high=1.0, high_open=True)
  multi_precision = base.check_flag("multi_precision", multi_precision)
  parts = base.preprocess(rescale_grad, clip_gradient, wd, wd_mult)
  parts += [*base.lr_mult_part(lr_mult), mxnet_momentum(learning_rate, momentum, nesterov=True)]
  return base.finish(parts, "nag", multi_precision=multi_precision,
                     leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                     hyperparams=base.hyperparams(learning_rate=learning_rate, wd=wd,
                                                  rescale_grad=rescale_grad))


class DelayCompensationState(NamedTuple):
  """State of :func:`add_delay_compensation`.

  Attributes:
    previous_params: the params as they were at the previous update (at
      ``init``, a copy of the initial params), like the params.
  """

  previous_params: optax.Params


def add_delay_compensation(variance_control: float = 0.04) -> GradientTransformation:
  r"""Adds DC-ASGD's delay compensation to the update (needs ``params``).

  .. math::

    u_t \leftarrow u_t + \lambda\, u_t \odot u_t \odot (w_{t-1} - w_{t-2})

  with :math:`\lambda` = ``variance_control`` and :math:`w_{t-2}` the params
  of the previous call (at the first call the initial params, so the term is
  0). The element-wise square of the gradient is the paper's cheap
  approximation of the Hessian: the term corrects a gradient computed at
  stale weights (in asynchronous training, at the weights a worker last
  read) for the move since. MXNet computes it from the weights it saw at its
  previous update, which this reproduces; put the transformation after the
  gradient preprocessing and before the momentum, as :func:`dcasgd` does.

  Args:
    variance_control: :math:`\lambda` >= 0 (MXNet's ``lamda``).

  Returns:
    A :class:`optax.GradientTransformation` with a
    :class:`DelayCompensationState`; ``update`` needs ``params``.

  References:
    Zheng, Meng, Wang, Chen, Yu, Ma and Liu, `Asynchronous Stochastic
    Gradient Descent with Delay Compensation
    <https://arxiv.org/abs/1609.08326>`_, ICML 2017.
  """
  v.check_scalar("variance_control", variance_control, low=0.0)
  name = "add_delay_compensation"

  def init_fn(params: optax.Params) -> DelayCompensationState:
    v.check_float_params(params, name)
    v.check_representable("variance_control", variance_control, params)
    # A copy, so that donating the params to a jitted step leaves the state intact.
    return DelayCompensationState(jax.tree.map(lambda p: jnp.array(p, copy=True), params))

  def update_fn(updates, state, params=None):
    params = v.align_params(updates, params)
    v.check_same_structure(updates, params, name)

    def compensate(u, w, prev):
      if utils.is_const(variance_control, 0):
        return u
      lam = utils.cast(variance_control, u.dtype)
      return jnp.square(u) * (w - prev).astype(u.dtype) * lam + u  # MXNet's order

    updates = jax.tree.map(compensate, updates, params, state.previous_params)
    return updates, DelayCompensationState(params)

  return GradientTransformation(init_fn, update_fn)


def dcasgd(
    learning_rate: optax.ScalarOrSchedule = 0.1,
    momentum: float = 0.0,
    lamda: float = 0.04,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    *,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
) -> optax.GradientTransformation:
  r"""Delay-compensated SGD as Apache MXNet implements it (``mx.optimizer.DCASGD``).

  With :math:`\mu` = ``momentum``, :math:`\lambda` = ``lamda``,
  :math:`s` = ``rescale_grad``, :math:`c` = ``clip_gradient`` and
  :math:`\lambda_w` = ``wd``:

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) + \lambda_w w_{t-1} \\
    d_t &= u_t + \lambda\, u_t \odot u_t \odot (w_{t-1} - w_{t-2}) \\
    m_t &= \mu\,m_{t-1} - \alpha_t d_t, \qquad w_t = w_{t-1} + m_t

  where :math:`w_{t-2}` is the weight at the previous update (:math:`w_{-1} =
  w_0`, so the first step is plain SGD) and :math:`m_0 = 0`; with
  :math:`\mu = 0`, :math:`w_t = w_{t-1} - \alpha_t d_t` and no momentum
  buffer is kept, as in MXNet. The previous weights are always kept (they
  double the state: one copy of the params).

  The chain is ``scale(s), clip(c), add_decayed_weights_per_leaf(wd,
  wd_mult)``, :func:`add_delay_compensation` (``lamda``),
  :func:`~lars_optax.scale_per_leaf` for ``lr_mult``, then
  :func:`lars_optax.mxnet_momentum` (the learning rate inside the buffer).

  Args:
    learning_rate: a scalar or an optax schedule.
    momentum: :math:`\mu` in [0, 1).
    lamda: the delay compensation's variance control :math:`\lambda` >= 0
      (MXNet's spelling); 0 gives MXNet's SGD.
    wd: coupled weight decay >= 0 (multiplied per leaf by ``wd_mult``).
    rescale_grad: gradient multiplier > 0.
    clip_gradient: element-wise clipping bound > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights and state for float16/bfloat16
      (the previous weights are then float32 master weights too).

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    Zheng, Meng, Wang, Chen, Yu, Ma and Liu, `Asynchronous Stochastic
    Gradient Descent with Delay Compensation
    <https://arxiv.org/abs/1609.08326>`_, ICML 2017; Apache MXNet 2.0
    ``mxnet.optimizer.DCASGD``.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult)
  v.check_scalar("momentum", momentum, low=0.0, high=1.0, high_open=True)
  v.check_scalar("lamda", lamda, low=0.0)
  multi_precision = base.check_flag("multi_precision", multi_precision)
  parts = base.preprocess(rescale_grad, clip_gradient, wd, wd_mult)
  parts += [add_delay_compensation(lamda), *base.lr_mult_part(lr_mult),
            mxnet_momentum(learning_rate, momentum)]
  return base.finish(parts, "dcasgd", multi_precision=multi_precision,
                     leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                     hyperparams=base.hyperparams(learning_rate=learning_rate, wd=wd,
                                                  lamda=lamda, rescale_grad=rescale_grad))
