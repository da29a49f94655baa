"""The optimizers users call: plain ``optax.chain``\\ s of public transformations.

* :func:`lars` -- MXNet's ``mx.optimizer.LARS`` (argument names and defaults).
* :func:`tf_lars` -- TensorFlow's ``tf.contrib.opt.LARSOptimizer``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import optax

from lars_optax import _validation as v
from lars_optax import masks
from lars_optax.transforms import mxnet_momentum, scale_by_lars_trust_ratio

__all__ = ["lars", "tf_lars"]


def lars(
    learning_rate: optax.ScalarOrSchedule = 0.1,
    momentum: float = 0.0,
    eta: float = 0.001,
    epsilon: float = 1e-8,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    skip: masks.MaskLike = "mxnet",
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
    m_t &= \mu\,m_{t-1} - \eta_t\,\rho\,u, \qquad w_t = w_{t-1} + m_t

  (with :math:`\mu = 0`: :math:`w_t = w_{t-1} - \eta_t\rho u`, no state). The
  ratio is taken from the rescaled, *unclipped* gradient; weight decay is
  added after clipping and also applies to skipped leaves. By default leaves
  whose name ends in ``gamma``, ``beta`` or ``bias`` are skipped, as in MXNet.

  The chain is ``scale_by_lars_trust_ratio(chain(clip, add_decayed_weights),
  rescale=rescale_grad)`` followed by :func:`mxnet_momentum`. The per-leaf
  ratios of the last step are in the state: :func:`lars_optax.trust_ratios`.

  Args:
    learning_rate: a scalar or an optax schedule (called with the number of
      updates done so far, 0 at the first update).
    momentum: :math:`\mu` in [0, 1).
    eta: LARS coefficient, >= 0.
    epsilon: added to the ratio's denominator, >= 0.
    wd: weight decay :math:`\lambda` >= 0 (in the ratio and in the update).
    rescale_grad: gradient multiplier :math:`s` > 0 (e.g. 1 / batch size).
    clip_gradient: element-wise clipping bound :math:`c` > 0, or None.
    skip: leaves that keep ratio 1: a preset name (default ``"mxnet"``, i.e.
      :data:`lars_optax.masks.MXNET_SKIP`; also ``"flax"``, ``"haiku"``), a
      :class:`~lars_optax.masks.Mask`, a callable returning a bool pytree, a
      bool pytree, or None (no leaf skipped). Pass a callable mask through
      ``static_args`` when wrapping with ``optax.inject_hyperparams``.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`.

  References:
    You, Gitman and Ginsburg, `Large Batch Training of Convolutional Networks
    <https://arxiv.org/abs/1708.03888>`_, 2017; Apache MXNet 2.0
    ``mxnet.optimizer.LARS``.
  """
  v.check_learning_rate("learning_rate", learning_rate)
  v.check_scalar("momentum", momentum, low=0.0, high=1.0, high_open=True)
  v.check_scalar("eta", eta, low=0.0)
  v.check_scalar("epsilon", epsilon, low=0.0)
  v.check_scalar("wd", wd, low=0.0)
  v.check_scalar("rescale_grad", rescale_grad, low=0.0, low_open=True)
  if clip_gradient is not None:
    v.check_scalar("clip_gradient", clip_gradient, low=0.0, low_open=True)

  inner = []
  if clip_gradient is not None:
    inner.append(optax.clip(clip_gradient))
  if not (isinstance(wd, (int, float)) and wd == 0):  # wd=0: w is not read
    inner.append(optax.add_decayed_weights(wd))
  return optax.chain(
      scale_by_lars_trust_ratio(
          optax.chain(*inner) if inner else None,
          eta=eta, weight_decay=wd, epsilon=epsilon, skip=skip,
          rescale=rescale_grad),
      mxnet_momentum(learning_rate, momentum),
  )


def tf_lars(
    learning_rate: optax.ScalarOrSchedule,
    momentum: float = 0.9,
    weight_decay: float = 0.0001,
    eeta: float = 0.001,
    epsilon: float = 0.0,
    skip_list: Sequence[str] | None = None,
    use_nesterov: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""LARS as TensorFlow implements it (``tf.contrib.opt.LARSOptimizer``).

  Per leaf :math:`w` with gradient :math:`g`, :math:`\lambda` =
  ``weight_decay``, :math:`\mu` = ``momentum``:

  .. math::

    \rho &= \frac{\eta\,\|w\|}{\|g\| + \lambda\|w\| + \epsilon}
      \quad (1 \text{ if a leaf's name contains a } \texttt{skip\_list}
      \text{ entry, or a norm is 0}) \\
    a_t &= \mu\,a_{t-1} + g \\
    w_t &= w_{t-1} - \eta_t\,\rho\,a_t
      \qquad \text{or, with Nesterov,} \qquad
    w_t = w_{t-1} - \eta_t\,\rho\,(g + \mu\,a_t).

  Weight decay enters only the ratio: it is not added to the gradient (as in
  the original and its test). The learning rate multiplies the accumulated
  momentum, not its inputs. The chain is
  ``scale_by_lars_trust_ratio(optax.trace(momentum, use_nesterov))`` followed
  by :func:`optax.scale_by_learning_rate`.

  Args:
    learning_rate: a scalar or an optax schedule (required, as in TF).
    momentum: :math:`\mu` in [0, 1).
    weight_decay: :math:`\lambda` >= 0, used in the trust ratio only.
    eeta: LARS coefficient :math:`\eta` >= 0.
    epsilon: added to the ratio's denominator, >= 0.
    skip_list: strings; a leaf whose name contains any of them keeps ratio 1.
    use_nesterov: Nesterov momentum.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`.

  Raises:
    ValueError: for ``momentum < 0`` or ``weight_decay < 0`` (as TF does), and
      for any other out-of-range or non-finite hyperparameter.

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
  if isinstance(skip_list, str):
    raise TypeError("skip_list: expected a list of strings, got the single "
                    f"string {skip_list!r}; write [{skip_list!r}].")
  if skip_list is not None:
    skip_list = list(skip_list)
    bad = [s for s in skip_list if not isinstance(s, str) or not s]
    if bad:
      raise TypeError(f"skip_list: expected non-empty strings, got {bad!r}.")
  skip = masks.by_substring(*skip_list) if skip_list else None
  return optax.chain(
      scale_by_lars_trust_ratio(
          optax.trace(decay=momentum, nesterov=use_nesterov),
          eta=eeta, weight_decay=weight_decay, epsilon=epsilon, skip=skip),
      optax.scale_by_learning_rate(learning_rate),
  )
