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

import optax

from lars_optax import _mxnet_base as base
from lars_optax import _validation as v
from lars_optax import masks
from lars_optax.transforms import mxnet_momentum

__all__ = ["nag"]


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
