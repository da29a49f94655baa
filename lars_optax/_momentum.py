r"""Momentum buffers: MXNet's, with the learning rate inside, and PyTorch's, after it.

Two links that keep a params-shaped momentum buffer, shared by LARS, SGD, NAG
and the AdaGrad family:

* :func:`mxnet_momentum` -- MXNet's ``mom = momentum * mom - lr * g`` (the
  learning rate inside the buffer), with Nesterov's look-ahead and PyTorch's
  dampening as options;
* :func:`dampened_trace` -- PyTorch's ``buf = momentum * buf + (1 - dampening) * g``
  (the first step undamped), for chains that apply the rate after the buffer.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax import GradientTransformation

from lars_optax import _links
from lars_optax import _row_wise
from lars_optax import _utils as utils
from lars_optax import _validation as v

__all__ = ["DampenedTraceState", "MXNetMomentumState", "dampened_trace", "mxnet_momentum"]


@_row_wise.row_wise("momentum")
class MXNetMomentumState(NamedTuple):
  """State of :func:`mxnet_momentum`.

  Attributes:
    count: number of updates done so far (int32); schedules are called with it.
    momentum: the momentum buffer, like the params; ``None`` when
      ``momentum == 0`` (MXNet keeps no state then).
  """

  # A NamedTuple field called ``count`` shadows ``tuple.count``; optax's own
  # states use the same name, which is what schedules and tools look for.
  count: jax.Array  # type: ignore[assignment]
  momentum: optax.Updates | None


def unchecked_mxnet_momentum(
    learning_rate: optax.ScalarOrSchedule,
    *,
    momentum: float = 0.0,
    nesterov: bool = False,
    dampening: float = 0.0,
) -> GradientTransformation:
  r"""SGD with the learning rate inside the momentum buffer (MXNet's rule).

  .. math::

    m_t = \mu \, m_{t-1} - \alpha_t \, u_t, \qquad \text{update} = m_t
    \qquad (m_0 = 0),

  and with :math:`\mu = 0` simply :math:`\text{update} = -\alpha_t u_t` with no
  buffer. Because :math:`\alpha_t` multiplies the incoming update before it is
  accumulated, a change of learning rate affects only new contributions
  (unlike :func:`optax.trace` followed by a learning rate, TensorFlow's
  convention). The update already carries the minus sign: apply it with
  :func:`optax.apply_updates`.

  With ``nesterov=True`` the same buffer is kept and the update looks one
  momentum step ahead, :math:`\text{update} = \mu\,m_t - \alpha_t u_t`
  (MXNet's ``nag_mom_update``; :func:`lars_optax.mxnet.nag`).

  With ``dampening`` :math:`d` (PyTorch's), each step after the first adds
  :math:`(1 - d)` of its contribution, :math:`m_t = \mu\,m_{t-1} - (1 - d)\,
  \alpha_t u_t`, and the first fills the buffer undamped (``lars(...,
  dampening=)`` with the rate inside the buffer).

  Args:
    learning_rate: :math:`\alpha_t`, a scalar or an optax schedule, called with
      the number of updates done before this one (0 at the first update, optax's
      convention).
    momentum: :math:`\mu` in [0, 1).
    nesterov: Nesterov's look-ahead update (no effect when ``momentum == 0``).
    dampening: :math:`d` in [0, 1), 0 by default (MXNet's rule); not with
      ``nesterov``, as in PyTorch.

  Returns:
    A :class:`optax.GradientTransformation` with :class:`MXNetMomentumState`.
  """
  use_buffer = not utils.is_const(momentum, 0)
  damped = use_buffer and not utils.is_const(dampening, 0)

  def init_fn(params: optax.Params) -> MXNetMomentumState:
    buf = jax.tree.map(jnp.zeros_like, params) if use_buffer else None
    return MXNetMomentumState(jnp.zeros([], jnp.int32), buf)

  def update_fn(updates, state, params=None):
    del params
    lr = learning_rate(state.count) if callable(learning_rate) else learning_rate

    def step(u):
      return utils.cast(lr, u.dtype) * u  # keep the update in the param dtype

    if damped:  # PyTorch's dampening: the first step fills the buffer undamped
      keep = jnp.where(state.count == 0, 1.0, 1.0 - jnp.asarray(dampening, jnp.float32))
      new_m = jax.tree.map(
          lambda m, u: utils.cast(momentum, m.dtype) * m - keep.astype(m.dtype) * step(u),
          state.momentum, updates)
    elif use_buffer:
      new_m = jax.tree.map(lambda m, u: utils.cast(momentum, m.dtype) * m - step(u),
                           state.momentum, updates)
    if use_buffer:
      if nesterov:
        updates = jax.tree.map(lambda m, u: utils.cast(momentum, m.dtype) * m - step(u),
                               new_m, updates)
      else:
        updates = new_m
    else:
      new_m = None
      updates = jax.tree.map(lambda u: -step(u), updates)
    return updates, MXNetMomentumState(optax.safe_int32_increment(state.count),
                                       new_m)

  return GradientTransformation(init_fn, update_fn)


def _nesterov_undamped(*, nesterov: Any, dampening: Any, **_: Any) -> None:
  if nesterov and v.known_value(dampening) not in (None, 0.0):
    raise ValueError("nesterov: Nesterov momentum needs dampening = 0 (as in PyTorch), got "
                     f"dampening={dampening!r}.")


mxnet_momentum = _links.public_link(unchecked_mxnet_momentum, relations=_nesterov_undamped,
                                    params="complex")


class DampenedTraceState(NamedTuple):
  """State of :func:`dampened_trace`.

  Attributes:
    count: number of updates done so far (int32); the first update fills the
      buffer undamped.
    trace: the momentum buffer, like the params.
  """

  count: jax.Array  # type: ignore[assignment]
  trace: optax.Updates


def unchecked_dampened_trace(
    momentum: float,
    *,
    dampening: float = 0.0,
    nesterov: bool = False,
) -> GradientTransformation:
  r"""PyTorch's momentum buffer: :func:`optax.trace` with ``dampening``.

  .. math::

    b_1 = u_1, \qquad b_t = \mu\,b_{t-1} + (1 - d)\,u_t \quad (t > 1), \qquad
    \text{update} = b_t \quad\text{or, with Nesterov,}\quad u_t + \mu\,b_t,

  with :math:`\mu` = ``momentum`` and :math:`d` = ``dampening``: the rule of
  ``torch.optim.SGD`` (and of timm's ``Lars``), whose buffer starts as the
  first update, undamped. With :math:`d = 0` it equals
  ``optax.trace(momentum, nesterov)``, which the optimizers use then.
  The learning rate is not in it: follow it with
  :func:`optax.scale_by_learning_rate` for PyTorch's rule, or put the rate in
  front of it to accumulate rate-scaled steps.

  Args:
    momentum: :math:`\mu` in [0, 1).
    dampening: :math:`d` in [0, 1).
    nesterov: Nesterov's look-ahead (PyTorch's ``nesterov``); needs
      ``momentum > 0`` and ``dampening == 0``, as PyTorch does.

  Returns:
    A :class:`optax.GradientTransformation` with :class:`DampenedTraceState`.

  References:
    Sutskever, Martens, Dahl and Hinton, `On the importance of initialization
    and momentum in deep learning <https://proceedings.mlr.press/v28/sutskever13.html>`_,
    ICML 2013; PyTorch ``torch.optim.SGD``.
  """

  def init_fn(params: optax.Params) -> DampenedTraceState:
    return DampenedTraceState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    del params
    first = state.count == 0

    def step(b, u):
      u = u.astype(b.dtype)
      later = utils.cast(momentum, b.dtype) * b + utils.cast(1 - dampening, b.dtype) * u
      return jnp.where(first, u, later)

    trace = jax.tree.map(step, state.trace, updates)
    if nesterov:
      out = jax.tree.map(lambda b, u: (u + utils.cast(momentum, b.dtype) * b).astype(u.dtype),
                         trace, updates)
    else:
      out = jax.tree.map(lambda b, u: b.astype(u.dtype), trace, updates)
    return out, DampenedTraceState(optax.safe_int32_increment(state.count), trace)

  return GradientTransformation(init_fn, update_fn)


def torch_nesterov(*, momentum: Any, dampening: Any, nesterov: Any, **_: Any) -> None:
  """PyTorch's Nesterov needs momentum > 0 and no dampening (each checked already)."""
  # Concrete arrays (optax.inject_hyperparams' defaults) are judged by their value.
  if nesterov and (v.known_value(momentum) == 0.0
                   or v.known_value(dampening) not in (None, 0.0)):
    raise ValueError("nesterov: Nesterov momentum needs momentum > 0 and dampening = 0 "
                     f"(as in PyTorch), got momentum={momentum!r}, dampening={dampening!r}.")


dampened_trace = _links.public_link(unchecked_dampened_trace, relations=torch_nesterov,
                                    params="complex")
