r"""The Adam family of MXNet 2.0, as ``optax.chain``\ s of small transformations.

* :func:`adam` -- ``mx.optimizer.Adam``: epsilon outside the bias correction,
  optional lazy updates;
* :func:`adamw` -- ``mx.optimizer.AdamW``: decoupled weight decay, multiplied
  by the bias-corrected learning rate; optional bias correction.
* :func:`adamax` -- ``mx.optimizer.Adamax``: Adam with the infinity norm.
* :func:`nadam` -- ``mx.optimizer.Nadam``: Adam with Nesterov momentum and
  a warming momentum schedule (``schedule_decay``).
* :func:`adabelief` -- ``mx.optimizer.AdaBelief``: the second moment of the
  gradient's deviation from its mean; optional bias correction.
* :func:`ftml` -- ``mx.optimizer.FTML``: Follow the Moving Leader.

The transformations they are built from, where optax has no exact
equivalent (MXNet places epsilon outside the bias correction, so
:func:`optax.scale_by_adam`, :func:`optax.scale_by_adamax` and
:func:`optax.scale_by_belief` compute other numbers):

* :func:`scale_by_mxnet_adam` -- Adam's scaling with MXNet's placement of
  epsilon (outside the bias correction);
* :func:`scale_by_adam_moments` -- :math:`m_t / (\sqrt{v_t} + \epsilon)`,
  without bias correction;
* :func:`scale_by_bias_correction` -- the factor
  :math:`\sqrt{1 - \beta_2^t} / (1 - \beta_1^t)`, with MXNet's
  ``begin_num_update``;
* :func:`scale_by_mxnet_adamax`, :func:`scale_by_mxnet_belief`,
  :func:`scale_by_mxnet_nadam` and :func:`scale_by_ftml`.

Each optimizer takes MXNet's argument names and defaults and the MXNet
optimizer-base arguments (``wd``, ``rescale_grad``, ``clip_gradient``, per-leaf
``lr_mult`` and ``wd_mult``, ``multi_precision``, ``begin_num_update``), as
:func:`lars_optax.mxnet.adam` does, and :func:`lars_optax.mxnet.create` builds each by its
MXNet name:

>>> import jax.numpy as jnp
>>> import optax
>>> import lars_optax
>>> tx = lars_optax.mxnet.create("adamw", learning_rate=1e-3, wd=0.01)
>>> params = {"w": jnp.ones(3)}
>>> state = tx.init(params)
>>> updates, state = tx.update({"w": jnp.ones(3)}, state, params)
>>> params = optax.apply_updates(params, updates)
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax import GradientTransformation

from lars_optax import _mxnet_base as base
from lars_optax import _assembly as assembly
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax._transforms import unchecked_add_decayed_weights_per_leaf

__all__ = [
    "ScaleByAdamMomentsState",
    "ScaleByBiasCorrectionState",
    "ScaleByFTMLState",
    "ScaleByNadamState",
    "adabelief",
    "adam",
    "adamax",
    "adamw",
    "ftml",
    "nadam",
    "scale_by_adam_moments",
    "scale_by_bias_correction",
    "scale_by_ftml",
    "scale_by_mxnet_adam",
    "scale_by_mxnet_adamax",
    "scale_by_mxnet_belief",
    "scale_by_mxnet_nadam",
]


# --------------------------------------------------------------------------
# Transformations
# --------------------------------------------------------------------------

def unchecked_scale_by_mxnet_adam(
    b1: float = 0.9,
    *,
    b2: float = 0.999,
    eps: float = 1e-8,
    initial_count: int = 0,
    checked: bool = False,
) -> GradientTransformation:
  r"""Adam's scaling with epsilon outside the bias correction (MXNet's rule).

  .. math::

    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, u_t, \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, u_t^2 \\
    \text{update} &= \frac{\sqrt{1 - \beta_2^t}}{1 - \beta_1^t} \cdot
      \frac{m_t}{\sqrt{v_t} + \epsilon}

  Follow it with :func:`optax.scale_by_learning_rate`. This is
  :func:`optax.scale_by_adam` except for where :math:`\epsilon` sits: optax
  divides by :math:`\sqrt{\hat v_t} + \epsilon`, i.e. MXNet's formula with
  :math:`\epsilon` replaced by :math:`\epsilon \sqrt{1-\beta_2^t}`. The
  two differ while :math:`\sqrt{v_t}` is comparable to :math:`\epsilon`
  (small gradients, early steps).

  ``m`` and ``v`` are kept in the parameter dtype; the division is done in
  float32 or wider, so float16 states with ``eps=1e-8`` (which is 0 in
  float16) do not divide 0 by 0. Where the denominator is 0 (``eps=0`` and
  :math:`v_t = 0`: every gradient of that entry so far was 0, or its square
  underflowed) the update is 0, not NaN.

  float16 without master weights: :math:`v_t` holds squared gradients, which
  underflow to 0 in float16 below about 2.4e-4 (and 6e-8 for subnormals), so
  the step :math:`m_t / \sqrt{v_t}` blows up on ordinary data (so does
  :func:`optax.adam`'s). ``init`` warns (:class:`LowPrecisionWarning`) when a
  parameter is float16; run it under :func:`lars_optax.multi_precision`
  (``adam(..., multi_precision=True)``), or use bfloat16.

  Args:
    b1: :math:`\beta_1` in [0, 1).
    b2: :math:`\beta_2` in [0, 1).
    eps: :math:`\epsilon` >= 0.
    initial_count: updates already done before the first one (MXNet's
      ``begin_num_update``): :math:`t` is ``initial_count + 1`` at the first
      update. At most ``2**31 - 2``: :math:`t` is an int32 count (it stops
      growing at ``2**31 - 1``, as optax's counts do).

  Returns:
    A :class:`optax.GradientTransformation` with an
    :class:`optax.ScaleByAdamState`.

  References:
    Kingma and Ba, `Adam: A Method for Stochastic Optimization
    <https://arxiv.org/abs/1412.6980>`_, 2014; Apache MXNet 2.0
    ``mxnet.optimizer.Adam``.
  """
  checks = checked
  if checks:
    v.check_betas(b1, b2, eps)
    # (an integer array passes: inject_hyperparams)
    v.check_count("initial_count", initial_count, maximum=v.MAX_INITIAL_COUNT, why=v.COUNT_WHY)

  def init_fn(params: optax.Params) -> optax.ScaleByAdamState:
    if checks:
      v.check_float_params(params, "scale_by_mxnet_adam", allow_complex=True)
      v.check_representable("eps", eps, params)
    utils.warn_float16(params, "scale_by_mxnet_adam")
    return optax.ScaleByAdamState(
        count=jnp.zeros([], jnp.int32),
        mu=jax.tree.map(jnp.zeros_like, params),
        nu=jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, u: utils.cast(b1, m.dtype) * m + utils.cast(1 - b1, m.dtype) * u,
                      state.mu, updates)
    nu = jax.tree.map(
        lambda n, u: utils.cast(b2, n.dtype) * n + utils.cast(1 - b2, n.dtype) * utils.abs_sq(u),
        state.nu, updates)
    count = optax.safe_int32_increment(state.count)
    scales = {}  # dtype -> bias-correction factor

    def bias_correction(dt):  # float32, or float64 for float64 leaves
      if dt not in scales:
        t = utils.saturating_add(count, initial_count).astype(dt)
        scales[dt] = jnp.sqrt(utils.one_minus_pow(b2, t)) / utils.one_minus_pow(b1, t)
      return scales[dt]

    def step(m, n):
      dt = utils.norm_dtype(m.dtype)
      rt = utils.real_dtype(dt)  # v holds |u|^2: real also for complex params
      denom = jnp.sqrt(jnp.real(n).astype(rt)) + utils.cast(eps, rt)
      out = bias_correction(rt) * utils.safe_divide(m.astype(dt), denom)
      return out.astype(m.dtype)

    return jax.tree.map(step, mu, nu), optax.ScaleByAdamState(count, mu, nu)

  return GradientTransformation(init_fn, update_fn)


scale_by_mxnet_adam = v.public_link(unchecked_scale_by_mxnet_adam)


class ScaleByAdamMomentsState(NamedTuple):
  """State of :func:`scale_by_adam_moments`, :func:`scale_by_mxnet_adamax` and
  :func:`scale_by_mxnet_belief`: the first moment ``mu`` and the second-moment
  buffer ``nu`` (each a tree like the params, in the params' dtypes)."""

  mu: optax.Updates
  nu: optax.Updates


class ScaleByBiasCorrectionState(NamedTuple):
  """State of :func:`scale_by_bias_correction`.

  Attributes:
    count: the updates done (int32); :math:`t` is ``initial_count + count``.
  """

  count: jax.Array  # type: ignore[assignment]  # optax's name; shadows tuple.count


def unchecked_scale_by_adam_moments(
    b1: float = 0.9,
    *,
    b2: float = 0.999,
    eps: float = 1e-8,
    checked: bool = False,
) -> GradientTransformation:
  r"""Adam's moments and their ratio, without bias correction (MXNet's epsilon).

  .. math::

    m_t = \beta_1 m_{t-1} + (1 - \beta_1)\, u_t, \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, u_t^2, \qquad
    \text{update} = \frac{m_t}{\sqrt{v_t} + \epsilon}

  Followed by :func:`scale_by_bias_correction` it is
  :func:`lars_optax.mxnet.scale_by_mxnet_adam`; :func:`adamw` puts the decoupled
  weight decay between the two, as MXNet's ``adamw_update`` does. ``m`` and
  ``v`` keep the params' dtypes; the division is done in float32 or wider,
  and a zero denominator gives a zero update.

  Args:
    b1: :math:`\beta_1` in [0, 1).
    b2: :math:`\beta_2` in [0, 1).
    eps: :math:`\epsilon` >= 0.

  Returns:
    A :class:`optax.GradientTransformation` with a
    :class:`ScaleByAdamMomentsState`.

  References:
    Kingma and Ba, `Adam: A Method for Stochastic Optimization
    <https://arxiv.org/abs/1412.6980>`_, 2014; Apache MXNet 2.0
    ``mxnet.optimizer.AdamW``.
  """
  checks = checked
  if checks:
    v.check_betas(b1, b2, eps)

  def second(n, u, m):
    del m
    return utils.cast(b2, n.dtype) * n + utils.cast(1 - b2, n.dtype) * jnp.square(u)

  return _ratio_of_moments(b1, eps, second, jnp.sqrt, "scale_by_adam_moments",
                           checks=checks)


scale_by_adam_moments = v.public_link(unchecked_scale_by_adam_moments)


def _ratio_of_moments(b1: Any, eps: Any, second: Any, root: Any, where: str, *,
                      checks: bool, squares: bool = True) -> GradientTransformation:
  """``mu = b1 mu + (1 - b1) u``, ``nu = second(nu, u, mu)``, update ``mu / (root(nu) + eps)``."""

  def init_fn(params):
    if checks:
      v.check_float_params(params, where)
      v.check_representable("eps", eps, params)
    if squares:  # squared gradients underflow in float16
      utils.warn_float16(params, where)
    return ScaleByAdamMomentsState(mu=jax.tree.map(jnp.zeros_like, params),
                                   nu=jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, u: utils.cast(b1, m.dtype) * m + utils.cast(1 - b1, m.dtype) * u,
                      state.mu, updates)
    nu = jax.tree.map(second, state.nu, updates, mu)

    def step(m, n):
      dt = utils.norm_dtype(m.dtype)
      denom = root(n.astype(dt)) + utils.cast(eps, dt)
      return utils.safe_divide(m.astype(dt), denom).astype(m.dtype)

    return jax.tree.map(step, mu, nu), ScaleByAdamMomentsState(mu, nu)

  return GradientTransformation(init_fn, update_fn)


def unchecked_scale_by_mxnet_adamax(
    b1: float = 0.9,
    *,
    b2: float = 0.999,
    eps: float = 1e-8,
    checked: bool = False,
) -> GradientTransformation:
  r"""AdaMax's moments and their ratio, as MXNet computes them (no bias correction).

  .. math::

    m_t = \beta_1 m_{t-1} + (1 - \beta_1)\, u_t, \qquad
    v_t = \max(\beta_2 v_{t-1}, |u_t|), \qquad
    \text{update} = \frac{m_t}{v_t + \epsilon}

  :func:`optax.scale_by_adamax` puts :math:`\epsilon` inside the maximum
  (:math:`\max(\beta_2 v_{t-1}, |u_t| + \epsilon)`), so its numbers differ.
  Follow it with ``scale_by_bias_correction(b1, None)`` for MXNet's
  :math:`1 / (1 - \beta_1^t)`.

  Args:
    b1: :math:`\beta_1` in [0, 1).
    b2: :math:`\beta_2` in [0, 1).
    eps: :math:`\epsilon` >= 0.

  Returns:
    A :class:`optax.GradientTransformation` with a
    :class:`ScaleByAdamMomentsState` (``nu`` holds :math:`v_t`).

  References:
    Kingma and Ba, `Adam: A Method for Stochastic Optimization
    <https://arxiv.org/abs/1412.6980>`_, 2014 (section 7.1, AdaMax); Apache
    MXNet 2.0 ``mxnet.optimizer.Adamax``.
  """
  checks = checked
  if checks:
    v.check_betas(b1, b2, eps)

  def second(n, u, m):
    del m
    return jnp.maximum(utils.cast(b2, n.dtype) * n, jnp.abs(u))

  return _ratio_of_moments(b1, eps, second, lambda n: n, "scale_by_mxnet_adamax",
                           checks=checks, squares=False)


scale_by_mxnet_adamax = v.public_link(unchecked_scale_by_mxnet_adamax)


def unchecked_scale_by_mxnet_belief(
    b1: float = 0.9,
    *,
    b2: float = 0.999,
    eps: float = 1e-6,
    checked: bool = False,
) -> GradientTransformation:
  r"""AdaBelief's moments and their ratio, as MXNet computes them (no bias correction).

  .. math::

    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, u_t \\
    s_t &= \beta_2 s_{t-1} + (1 - \beta_2)\,(u_t - m_t)^2 + \epsilon \\
    \text{update} &= \frac{m_t}{\sqrt{s_t} + \epsilon}

  The deviation is taken from the *new* mean :math:`m_t`, as in the paper
  and MXNet; :func:`optax.scale_by_belief` takes it from :math:`m_{t-1}`
  and places epsilon inside the bias correction. Follow it with
  :func:`scale_by_bias_correction` for the bias-corrected rule.

  Args:
    b1: :math:`\beta_1` in [0, 1).
    b2: :math:`\beta_2` in [0, 1).
    eps: :math:`\epsilon` >= 0 (added to :math:`s_t` and to its root).

  Returns:
    A :class:`optax.GradientTransformation` with a
    :class:`ScaleByAdamMomentsState` (``nu`` holds :math:`s_t`).

  References:
    Zhuang et al., `AdaBelief Optimizer: Adapting Stepsizes by the Belief in
    Observed Gradients <https://arxiv.org/abs/2010.07468>`_, NeurIPS 2020;
    Apache MXNet 2.0 ``mxnet.optimizer.AdaBelief``.
  """
  checks = checked
  if checks:
    v.check_betas(b1, b2, eps)

  def second(n, u, m):
    dt = n.dtype
    return (utils.cast(b2, dt) * n + utils.cast(1 - b2, dt) * jnp.square(u - m)
            + utils.cast(eps, dt))

  return _ratio_of_moments(b1, eps, second, jnp.sqrt, "scale_by_mxnet_belief",
                           checks=checks)


scale_by_mxnet_belief = v.public_link(unchecked_scale_by_mxnet_belief)


def _check_count(name: str, value: Any) -> None:
  v.check_count(name, value, maximum=v.MAX_INITIAL_COUNT, why=v.COUNT_WHY)


def unchecked_scale_by_bias_correction(
    b1: float = 0.9,
    *,
    b2: float | None = 0.999,
    initial_count: int = 0,
    checked: bool = False,
) -> GradientTransformation:
  r"""Multiplies the updates by Adam's bias correction, as MXNet applies it.

  .. math::

    \text{update} = \frac{\sqrt{1 - \beta_2^t}}{1 - \beta_1^t}\, u_t
    \qquad \Bigl(\frac{1}{1 - \beta_1^t}\, u_t \text{ with } b_2 = \text{None}\Bigr)

  with :math:`t = ` ``initial_count`` + the number of updates, 1 at the first.
  MXNet folds this factor into the learning rate, outside the epsilon of
  :math:`m_t / (\sqrt{v_t} + \epsilon)`; where it sits in a chain decides what
  it multiplies (:func:`adamw`'s decoupled weight decay too). The factor is
  computed in float32 or wider, without the cancellation of
  :math:`1 - \beta^t` for small :math:`t`.

  Args:
    b1: :math:`\beta_1` in [0, 1).
    b2: :math:`\beta_2` in [0, 1), or None for no second-moment factor.
    initial_count: updates done before the first (MXNet's
      ``begin_num_update``), an int in [0, 2**31 - 2].

  Returns:
    A :class:`optax.GradientTransformation` with a
    :class:`ScaleByBiasCorrectionState`.

  References:
    Kingma and Ba, `Adam: A Method for Stochastic Optimization
    <https://arxiv.org/abs/1412.6980>`_, 2014 (section 3); Apache MXNet 2.0
    ``mxnet.optimizer.AdamW`` and ``mxnet.optimizer.AdaBelief``.
  """
  checks = checked
  if checks:
    v.check_scalar("b1", b1, low=0.0, high=1.0, high_open=True)
    if b2 is not None:
      v.check_scalar("b2", b2, low=0.0, high=1.0, high_open=True)
    _check_count("initial_count", initial_count)

  def init_fn(params):
    del params
    return ScaleByBiasCorrectionState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    del params
    count = optax.safe_int32_increment(state.count)
    factors: dict[Any, jax.Array] = {}

    def factor(dt):
      if dt not in factors:
        t = utils.saturating_add(count, initial_count).astype(dt)
        f = 1 / utils.one_minus_pow(b1, t)
        factors[dt] = f if b2 is None else jnp.sqrt(utils.one_minus_pow(b2, t)) * f
      return factors[dt]

    def scale(u):
      dt = utils.norm_dtype(u.dtype)
      return (factor(dt) * u.astype(dt)).astype(u.dtype)

    return jax.tree.map(scale, updates), ScaleByBiasCorrectionState(count)

  return GradientTransformation(init_fn, update_fn)


scale_by_bias_correction = v.public_link(unchecked_scale_by_bias_correction)


class ScaleByNadamState(NamedTuple):
  """State of :func:`scale_by_mxnet_nadam`.

  Attributes:
    count: updates done (int32).
    m_schedule: :math:`M_t`, the product of the momentum schedule so far
      (a float32 scalar, float64 with float64 params; 1 before the first update).
    mu: the first moment, like the params.
    nu: the second moment, like the params.
  """

  count: jax.Array  # type: ignore[assignment]  # optax's name; shadows tuple.count
  m_schedule: jax.Array
  mu: optax.Updates
  nu: optax.Updates


def _scalar_dtype(params: Any) -> Any:
  leaves = jax.tree.leaves(params)
  return functools.reduce(jnp.promote_types,
                          [utils.norm_dtype(p.dtype) for p in leaves], jnp.dtype(jnp.float32))


def unchecked_scale_by_mxnet_nadam(
    b1: float = 0.9,
    *,
    b2: float = 0.999,
    eps: float = 1e-8,
    schedule_decay: float = 0.004,
    initial_count: int = 0,
    checked: bool = False,
) -> GradientTransformation:
  r"""Nadam's scaling as MXNet computes it, with the warming momentum schedule.

  With :math:`t = ` ``initial_count`` + the number of updates and
  :math:`\psi` = ``schedule_decay``:

  .. math::

    \mu_t &= \beta_1 \bigl(1 - \tfrac12\, 0.96^{t\psi}\bigr), \qquad
    M_t = M_{t-1}\,\mu_t \quad (M = 1 \text{ before the first update}) \\
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, u_t, \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, u_t^2 \\
    \text{update} &= \frac{\mu_{t+1}\, m_t / (1 - M_t\mu_{t+1})
      + (1 - \mu_t)\, u_t / (1 - M_t)}{\sqrt{v_t / (1 - \beta_2^t)} + \epsilon}

  (Dozat's rule, with Keras' schedule). :math:`M_t` is kept in the state.
  MXNet 2.0 keeps it on the optimizer object and multiplies it once per
  *parameter* per step, so there its value depends on how many parameters
  the model has; here it is the product over this tree's steps, which is
  MXNet's number for a model with one parameter. :func:`optax.scale_by_adam`
  with ``nesterov=True`` has no schedule and puts epsilon elsewhere.

  Args:
    b1: :math:`\beta_1` in [0, 1).
    b2: :math:`\beta_2` in [0, 1).
    eps: :math:`\epsilon` >= 0.
    schedule_decay: :math:`\psi` >= 0 (0: a constant momentum
      :math:`\beta_1 / 2`).
    initial_count: updates done before the first (MXNet's
      ``begin_num_update``), an int in [0, 2**31 - 2]; :math:`M` still
      starts at 1, as in MXNet.

  Returns:
    A :class:`optax.GradientTransformation` with a :class:`ScaleByNadamState`.

  References:
    Dozat, `Incorporating Nesterov Momentum into Adam
    <https://openreview.net/forum?id=OM0jvwB8jIp57ZJjtNEZ>`_, ICLR 2016
    workshop.
  """
  checks = checked
  if checks:
    v.check_betas(b1, b2, eps)
    v.check_scalar("schedule_decay", schedule_decay, low=0.0)
    _check_count("initial_count", initial_count)
  log_096 = math.log(0.96)

  def init_fn(params):
    if checks:
      v.check_float_params(params, "scale_by_mxnet_nadam")
      v.check_representable("eps", eps, params)
    utils.warn_float16(params, "scale_by_mxnet_nadam")
    return ScaleByNadamState(count=jnp.zeros([], jnp.int32),
                             m_schedule=jnp.ones([], _scalar_dtype(params)),
                             mu=jax.tree.map(jnp.zeros_like, params),
                             nu=jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    del params
    count = optax.safe_int32_increment(state.count)
    dt = state.m_schedule.dtype
    t = utils.saturating_add(count, initial_count).astype(dt)
    decay = utils.cast(schedule_decay, dt) * utils.cast(log_096, dt)
    beta1 = utils.cast(b1, dt)
    mu_t = beta1 * (1 - 0.5 * jnp.exp(t * decay))
    mu_next = beta1 * (1 - 0.5 * jnp.exp((t + 1) * decay))
    m_schedule = state.m_schedule * mu_t
    grad_coef = (1 - mu_t) / (1 - m_schedule)
    mom_coef = mu_next / (1 - m_schedule * mu_next)
    debias2 = utils.one_minus_pow(b2, t)
    mu = jax.tree.map(lambda m, u: utils.cast(b1, m.dtype) * m + utils.cast(1 - b1, m.dtype) * u,
                      state.mu, updates)
    nu = jax.tree.map(
        lambda n, u: utils.cast(b2, n.dtype) * n + utils.cast(1 - b2, n.dtype) * jnp.square(u),
        state.nu, updates)

    def step(u, m, n):
      ldt = utils.norm_dtype(u.dtype)
      num = (mom_coef.astype(ldt) * m.astype(ldt) + grad_coef.astype(ldt) * u.astype(ldt))
      den = jnp.sqrt(n.astype(ldt) / debias2.astype(ldt)) + utils.cast(eps, ldt)
      return utils.safe_divide(num, den).astype(u.dtype)

    return (jax.tree.map(step, updates, mu, nu),
            ScaleByNadamState(count, m_schedule, mu, nu))

  return GradientTransformation(init_fn, update_fn)


scale_by_mxnet_nadam = v.public_link(unchecked_scale_by_mxnet_nadam)


class ScaleByFTMLState(NamedTuple):
  """State of :func:`scale_by_ftml`, MXNet's three buffers (like the params) and a count.

  Attributes:
    count: updates done (int32).
    d: :math:`d_t`.
    v: :math:`v_t`, the second moment.
    z: :math:`z_t`.
  """

  count: jax.Array  # type: ignore[assignment]  # optax's name; shadows tuple.count
  d: optax.Updates
  v: optax.Updates
  z: optax.Updates


def unchecked_scale_by_ftml(
    learning_rate: optax.ScalarOrSchedule = 0.0025,
    *,
    b1: float = 0.6,
    b2: float = 0.999,
    eps: float = 1e-8,
    lr_mult: masks.LeafValues = None,
    initial_count: int = 0,
    checked: bool = False,
) -> GradientTransformation:
  r"""FTML (Follow the Moving Leader), as MXNet's ``ftml_update`` computes it.

  With :math:`\alpha_t` the learning rate (times the leaf's ``lr_mult``) and
  :math:`t = ` ``initial_count`` + the number of updates:

  .. math::

    v_t &= \beta_2 v_{t-1} + (1 - \beta_2)\, u_t^2 \\
    d_t &= \frac{1 - \beta_1^t}{\alpha_t}
      \Bigl(\sqrt{\frac{v_t}{1 - \beta_2^t}} + \epsilon\Bigr) \\
    z_t &= \beta_1 z_{t-1} + (1 - \beta_1)\, u_t - (d_t - \beta_1 d_{t-1})\, w_{t-1} \\
    w_t &= -z_t / d_t, \qquad \text{update} = w_t - w_{t-1}

  The learning rate is part of the state (:math:`d_t`), so this
  transformation takes it (and ``lr_mult``) itself; it ends the chain, and
  ``update`` needs ``params``. Where :math:`d_t = 0` (``eps=0`` and no
  gradient yet) the weight is left as it is. The learning rate must be > 0.

  Args:
    learning_rate: :math:`\alpha_t` > 0, a scalar or an optax schedule
      (called with the number of updates done, 0 at the first).
    b1: :math:`\beta_1` in [0, 1).
    b2: :math:`\beta_2` in [0, 1).
    eps: :math:`\epsilon` >= 0.
    lr_mult: per-leaf learning-rate multipliers by leaf name
      (:data:`lars_optax.masks.LeafValues`).
    initial_count: updates done before the first (MXNet's
      ``begin_num_update``), an int in [0, 2**31 - 2].

  Returns:
    A :class:`optax.GradientTransformation` with a :class:`ScaleByFTMLState`.

  References:
    Zheng and Kwok, `Follow the Moving Leader in Deep Learning
    <http://proceedings.mlr.press/v70/zheng17a.html>`_, ICML 2017.
  """
  checks = checked
  if checks:
    v.check_learning_rate("learning_rate", learning_rate, positive=True)
    v.check_betas(b1, b2, eps)
    masks.check_leaf_values(lr_mult, "lr_mult")
    _check_count("initial_count", initial_count)

  def init_fn(params):
    if checks:
      v.check_float_params(params, "scale_by_ftml")
      v.check_representable("eps", eps, params)
    masks.resolve_leaf_values(lr_mult, params, "lr_mult", check_names=True)
    utils.warn_float16(params, "scale_by_ftml")
    zeros = functools.partial(jax.tree.map, jnp.zeros_like, params)
    return ScaleByFTMLState(count=jnp.zeros([], jnp.int32), d=zeros(), v=zeros(), z=zeros())

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("scale_by_ftml: update needs params (the rule sets w_t = -z_t / d_t).")
    params = v.align_params(updates, params)
    v.require_params(params, "scale_by_ftml")
    if checks:
      v.check_same_structure(updates, params, "scale_by_ftml")
    lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
    count = optax.safe_int32_increment(state.count)
    flat_u, treedef = jax.tree.flatten(updates)
    flat = [treedef.flatten_up_to(x) for x in (params, state.d, state.v, state.z)]
    mults = masks.resolve_leaf_values(lr_mult, params, "lr_mult")
    debias: dict[Any, tuple[jax.Array, jax.Array]] = {}
    out, ds, vs, zs = [], [], [], []
    for u, w, d, vv, z, c in zip(flat_u, *flat, mults):
      dt = utils.norm_dtype(u.dtype)
      if dt not in debias:
        t = utils.saturating_add(count, initial_count).astype(dt)
        debias[dt] = (utils.one_minus_pow(b1, t), utils.one_minus_pow(b2, t))
      c1, c2 = debias[dt]
      alpha = utils.cast(lr, dt) * utils.cast(c, dt)
      u32, w32 = u.astype(dt), w.astype(dt)
      vv = utils.cast(b2, vv.dtype) * vv + utils.cast(1 - b2, vv.dtype) * jnp.square(u)
      d_new = c1 / alpha * (jnp.sqrt(vv.astype(dt) / c2) + utils.cast(eps, dt))
      sigma = d_new - utils.cast(b1, dt) * d.astype(dt)
      z_new = (utils.cast(b1, dt) * z.astype(dt) + utils.cast(1 - b1, dt) * u32 - sigma * w32)
      # d = 0 only when eps = 0 and every gradient so far was 0: keep the weight.
      # (A NaN d divides, so a NaN gradient shows in the update.)
      w_new = jnp.where(d_new == 0, w32, -utils.safe_divide(z_new, d_new))
      out.append((w_new - w32).astype(u.dtype))
      ds.append(d_new.astype(d.dtype))
      vs.append(vv)
      zs.append(z_new.astype(z.dtype))
    unflat = functools.partial(jax.tree.unflatten, treedef)
    return unflat(out), ScaleByFTMLState(count, unflat(ds), unflat(vs), unflat(zs))

  return GradientTransformation(init_fn, update_fn)


scale_by_ftml = v.public_link(unchecked_scale_by_ftml)


# --------------------------------------------------------------------------
# Optimizers
# --------------------------------------------------------------------------

def _check_betas(beta1: Any, beta2: Any, epsilon: Any) -> None:
  v.check_betas(beta1, beta2, epsilon, names=("beta1", "beta2", "epsilon"))


def _hyperparams(learning_rate, wd, rescale_grad, **others):
  return base.hyperparams(learning_rate=learning_rate, wd=wd, rescale_grad=rescale_grad,
                          **others)


@v.mxnet_names
def adam(
    learning_rate: optax.ScalarOrSchedule = 0.001,
    *,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-8,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lazy_update: bool = False,
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
  (:func:`lars_optax.sparse.lazy_update`); :math:`t` counts every step.

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
    multi_precision: float32 master weights and state for float16/bfloat16
      (with ``lazy_update``, also for row-sparse gradients, as in MXNet 2.0).
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
  _check_betas(beta1, beta2, epsilon)
  lazy_update = v.check_flag("lazy_update", lazy_update)
  multi_precision = v.check_flag("multi_precision", multi_precision)
  v.check_count("begin_num_update", begin_num_update, maximum=v.MAX_INITIAL_COUNT,
                why=v.COUNT_WHY)
  parts = base.preprocess(rescale_grad, clip_gradient, wd, wd_mult)
  parts += [unchecked_scale_by_mxnet_adam(beta1, b2=beta2, eps=epsilon,
                                           initial_count=begin_num_update),
            base.learning_rate_part(learning_rate), *base.lr_mult_part(lr_mult)]
  return assembly.finish(parts, "adam", lazy=lazy_update, multi_precision=multi_precision,
                         complex_params=clip_gradient is None,
                         leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                         hyperparams=_hyperparams(learning_rate, wd, rescale_grad,
                                                  epsilon=epsilon))


@v.mxnet_names
def adamw(
    learning_rate: optax.ScalarOrSchedule = 0.001,
    *,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-6,
    correct_bias: bool = True,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    begin_num_update: int = 0,
) -> optax.GradientTransformation:
  r"""AdamW as Apache MXNet 2.0 implements it (``mx.optimizer.AdamW``).

  With :math:`s` = ``rescale_grad``, :math:`c` = ``clip_gradient``,
  :math:`\lambda` = ``wd`` (times the leaf's ``wd_mult``) and
  :math:`\alpha_t` the learning rate (times the leaf's ``lr_mult``):

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) \\
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1) u_t, \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2) u_t^2 \\
    \eta_t &= \alpha_t \frac{\sqrt{1 - \beta_2^t}}{1 - \beta_1^t}
      \quad (\alpha_t \text{ with } \texttt{correct\_bias=False}) \\
    w_t &= w_{t-1} - \eta_t \Bigl(\frac{m_t}{\sqrt{v_t} + \epsilon}
      + \lambda\, w_{t-1}\Bigr)

  The weight decay is decoupled (it never enters the moments) and, as in
  MXNet's ``adamw_update``, multiplied by the *bias-corrected* learning rate
  :math:`\eta_t`; :func:`optax.adamw` multiplies it by :math:`\alpha_t`
  and puts epsilon inside the bias correction. Epsilon's default is 1e-6.
  (MXNet's docstring also adds :math:`\lambda w` to the gradient when
  ``correct_bias=False``; its kernel and its Python ``step`` do not, and
  neither does this.)

  The chain is ``scale(s), clip(c), scale_by_adam_moments(beta1, beta2,
  epsilon), add_decayed_weights_per_leaf(wd, wd_mult),
  scale_by_bias_correction(beta1, beta2)`` (with ``correct_bias``),
  ``optax.scale_by_learning_rate(lr)``, then ``lr_mult``.

  Args:
    learning_rate: a scalar or an optax schedule.
    beta1: in [0, 1).
    beta2: in [0, 1).
    epsilon: >= 0.
    correct_bias: multiply the step by the bias correction (MXNet's default);
      False for BERT's TF rule.
    wd: decoupled weight decay >= 0.
    rescale_grad: gradient multiplier > 0.
    clip_gradient: element-wise clipping bound > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights and state for float16/bfloat16.
    begin_num_update: updates done before the first: the bias correction's
      :math:`t` starts at ``begin_num_update + 1``; an int in [0, 2**31 - 2].

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    Loshchilov and Hutter, `Decoupled Weight Decay Regularization
    <https://arxiv.org/abs/1711.05101>`_, ICLR 2019; Apache MXNet 2.0
    ``mxnet.optimizer.AdamW``.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult)
  _check_betas(beta1, beta2, epsilon)
  correct_bias = v.check_flag("correct_bias", correct_bias)
  multi_precision = v.check_flag("multi_precision", multi_precision)
  _check_count("begin_num_update", begin_num_update)
  parts = base.preprocess(rescale_grad, clip_gradient, 0.0, None)
  parts.append(unchecked_scale_by_adam_moments(beta1, b2=beta2, eps=epsilon))
  if not utils.is_const(wd, 0):
    parts.append(unchecked_add_decayed_weights_per_leaf(wd, multipliers=wd_mult,
                                                        arg_name="wd_mult"))
  if correct_bias:
    parts.append(unchecked_scale_by_bias_correction(beta1, b2=beta2,
                                                     initial_count=begin_num_update))
  parts += [base.learning_rate_part(learning_rate), *base.lr_mult_part(lr_mult)]
  return assembly.finish(parts, "adamw", multi_precision=multi_precision,
                         leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                         hyperparams=_hyperparams(learning_rate, wd, rescale_grad,
                                                  epsilon=epsilon))


@v.mxnet_names
def adamax(
    learning_rate: optax.ScalarOrSchedule = 0.002,
    *,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-8,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    begin_num_update: int = 0,
) -> optax.GradientTransformation:
  r"""AdaMax as Apache MXNet 2.0 implements it (``mx.optimizer.Adamax``).

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) + \lambda w_{t-1} \\
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1) u_t, \qquad
    v_t = \max(\beta_2 v_{t-1}, |u_t|) \\
    w_t &= w_{t-1} - \frac{\alpha_t}{1 - \beta_1^t} \cdot \frac{m_t}{v_t + \epsilon}

  ``wd`` is coupled (L2). Epsilon is added to :math:`v_t` after the maximum;
  :func:`optax.adamax` adds it to :math:`|u_t|` inside the maximum.

  The chain is ``scale(s), clip(c), add_decayed_weights_per_leaf(wd),
  scale_by_mxnet_adamax(beta1, beta2, epsilon),
  scale_by_bias_correction(beta1, None), optax.scale_by_learning_rate(lr)``,
  then ``lr_mult``.

  Args:
    learning_rate: a scalar or an optax schedule.
    beta1: in [0, 1).
    beta2: in [0, 1).
    epsilon: >= 0.
    wd: coupled weight decay >= 0.
    rescale_grad: gradient multiplier > 0.
    clip_gradient: element-wise clipping bound > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights and state for float16/bfloat16.
    begin_num_update: updates done before the first (the :math:`t` of the
      bias correction starts at ``begin_num_update + 1``).

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    Kingma and Ba, `Adam: A Method for Stochastic Optimization
    <https://arxiv.org/abs/1412.6980>`_ (section 7), 2014; Apache MXNet 2.0
    ``mxnet.optimizer.Adamax``.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult)
  _check_betas(beta1, beta2, epsilon)
  multi_precision = v.check_flag("multi_precision", multi_precision)
  _check_count("begin_num_update", begin_num_update)
  parts = base.preprocess(rescale_grad, clip_gradient, wd, wd_mult)
  parts += [unchecked_scale_by_mxnet_adamax(beta1, b2=beta2, eps=epsilon),
            unchecked_scale_by_bias_correction(beta1, b2=None, initial_count=begin_num_update),
            base.learning_rate_part(learning_rate), *base.lr_mult_part(lr_mult)]
  return assembly.finish(parts, "adamax", multi_precision=multi_precision,
                         leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                         hyperparams=_hyperparams(learning_rate, wd, rescale_grad,
                                                  epsilon=epsilon))


@v.mxnet_names
def nadam(
    learning_rate: optax.ScalarOrSchedule = 0.001,
    *,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-8,
    schedule_decay: float = 0.004,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    begin_num_update: int = 0,
) -> optax.GradientTransformation:
  r"""Nadam as Apache MXNet 2.0 implements it (``mx.optimizer.Nadam``), per parameter tree.

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) + \lambda w_{t-1} \\
    w_t &= w_{t-1} - \alpha_t\,\text{update}_t

  with :math:`\text{update}_t` the Nesterov-momentum Adam step of
  :func:`scale_by_mxnet_nadam` (momentum schedule
  :math:`\mu_t = \beta_1(1 - \frac12 0.96^{t\psi})`, :math:`\psi` =
  ``schedule_decay``; epsilon added to :math:`\sqrt{v_t / (1 - \beta_2^t)}`).
  ``wd`` is coupled (L2).

  One difference from MXNet, on purpose: MXNet keeps the schedule's product
  :math:`M_t` on the optimizer object and multiplies it in once for every
  parameter at every step, so with :math:`n` parameters it decays like
  :math:`M^n` and the result depends on the model's number and order of
  parameters. Here :math:`M_t` is kept in the state and multiplied once per
  step (Dozat's rule, and MXNet's for a model with one parameter).

  The chain is ``scale(s), clip(c), add_decayed_weights_per_leaf(wd),
  scale_by_mxnet_nadam(beta1, beta2, epsilon, schedule_decay),
  optax.scale_by_learning_rate(lr)``, then ``lr_mult``.

  Args:
    learning_rate: a scalar or an optax schedule.
    beta1: in [0, 1).
    beta2: in [0, 1).
    epsilon: >= 0.
    schedule_decay: :math:`\psi` >= 0.
    wd: coupled weight decay >= 0.
    rescale_grad: gradient multiplier > 0.
    clip_gradient: element-wise clipping bound > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights and state for float16/bfloat16.
    begin_num_update: updates done before the first (:math:`t` starts at
      ``begin_num_update + 1``).

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    Dozat, `Incorporating Nesterov Momentum into Adam
    <https://openreview.net/forum?id=OM0jvwB8jIp57ZJjtNEZ>`_, ICLR 2016
    workshop; Apache MXNet 2.0 ``mxnet.optimizer.Nadam``.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult)
  _check_betas(beta1, beta2, epsilon)
  v.check_scalar("schedule_decay", schedule_decay, low=0.0)
  multi_precision = v.check_flag("multi_precision", multi_precision)
  _check_count("begin_num_update", begin_num_update)
  parts = base.preprocess(rescale_grad, clip_gradient, wd, wd_mult)
  parts += [unchecked_scale_by_mxnet_nadam(beta1, b2=beta2, eps=epsilon,
                                            schedule_decay=schedule_decay,
                                            initial_count=begin_num_update),
            base.learning_rate_part(learning_rate), *base.lr_mult_part(lr_mult)]
  return assembly.finish(parts, "nadam", multi_precision=multi_precision,
                         leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                         hyperparams=_hyperparams(learning_rate, wd, rescale_grad, epsilon=epsilon,
                                                  schedule_decay=schedule_decay))


@v.mxnet_names
def adabelief(
    learning_rate: optax.ScalarOrSchedule = 0.001,
    *,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-6,
    correct_bias: bool = True,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    begin_num_update: int = 0,
) -> optax.GradientTransformation:
  r"""AdaBelief as Apache MXNet 2.0 implements it (``mx.optimizer.AdaBelief``).

  .. math::

    u_t &= \mathrm{clip}(s\,g_t + \lambda w_{t-1}, -c, c) \\
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1) u_t, \qquad
    s_t = \beta_2 s_{t-1} + (1 - \beta_2)(u_t - m_t)^2 + \epsilon \\
    w_t &= w_{t-1} - \alpha_t \frac{\sqrt{1 - \beta_2^t}}{1 - \beta_1^t}
      \cdot \frac{m_t}{\sqrt{s_t} + \epsilon}

  (without the bias-correction factor with ``correct_bias=False``). ``wd``
  is coupled and, unlike MXNet's other optimizers, added *before* clipping
  (MXNet's ``adabelief_update`` and its Python ``step`` agree on this).

  The chain is ``scale(s), add_decayed_weights_per_leaf(wd), clip(c),
  scale_by_mxnet_belief(beta1, beta2, epsilon),
  scale_by_bias_correction(beta1, beta2)`` (with ``correct_bias``),
  ``optax.scale_by_learning_rate(lr)``, then ``lr_mult``.

  Args:
    learning_rate: a scalar or an optax schedule.
    beta1: in [0, 1).
    beta2: in [0, 1).
    epsilon: >= 0.
    correct_bias: multiply the step by the bias correction (MXNet's default).
    wd: coupled weight decay >= 0.
    rescale_grad: gradient multiplier > 0.
    clip_gradient: element-wise clipping bound > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights and state for float16/bfloat16.
    begin_num_update: updates done before the first (the :math:`t` of the
      bias correction starts at ``begin_num_update + 1``).

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    Zhuang et al., `AdaBelief Optimizer: Adapting Stepsizes by the Belief in
    Observed Gradients <https://arxiv.org/abs/2010.07468>`_, NeurIPS 2020;
    Apache MXNet 2.0 ``mxnet.optimizer.AdaBelief``.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult)
  _check_betas(beta1, beta2, epsilon)
  correct_bias = v.check_flag("correct_bias", correct_bias)
  multi_precision = v.check_flag("multi_precision", multi_precision)
  _check_count("begin_num_update", begin_num_update)
  parts = base.preprocess(rescale_grad, None, wd, wd_mult)
  parts += base.preprocess(1.0, clip_gradient, 0.0, None)
  parts.append(unchecked_scale_by_mxnet_belief(beta1, b2=beta2, eps=epsilon))
  if correct_bias:
    parts.append(unchecked_scale_by_bias_correction(beta1, b2=beta2,
                                                     initial_count=begin_num_update))
  parts += [base.learning_rate_part(learning_rate), *base.lr_mult_part(lr_mult)]
  return assembly.finish(parts, "adabelief", multi_precision=multi_precision,
                         leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                         hyperparams=_hyperparams(learning_rate, wd, rescale_grad,
                                                  epsilon=epsilon))


@v.mxnet_names
def ftml(
    learning_rate: optax.ScalarOrSchedule = 0.0025,
    *,
    beta1: float = 0.6,
    beta2: float = 0.999,
    epsilon: float = 1e-8,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    begin_num_update: int = 0,
) -> optax.GradientTransformation:
  r"""FTML as Apache MXNet 2.0 implements it (``mx.optimizer.FTML``).

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) + \lambda w_{t-1} \\
    v_t &= \beta_2 v_{t-1} + (1 - \beta_2)\, u_t^2, \qquad
    d_t = \frac{1 - \beta_1^t}{\alpha_t}
      \Bigl(\sqrt{\frac{v_t}{1 - \beta_2^t}} + \epsilon\Bigr) \\
    z_t &= \beta_1 z_{t-1} + (1 - \beta_1)\, u_t - (d_t - \beta_1 d_{t-1})\, w_{t-1},
    \qquad w_t = -z_t / d_t

  ``wd`` is coupled (L2). The learning rate (with ``lr_mult``) sits inside
  :math:`d_t`, so it is :func:`scale_by_ftml`'s own argument rather than a
  last ``scale_by_learning_rate``. The learning rate must be > 0. (The
  docstring of MXNet's ``ftml_update`` writes :math:`(1 - \beta_1^t)\,u_t`
  in :math:`z_t`; the kernel and the Python ``step`` both use
  :math:`(1 - \beta_1)\,u_t`, as here.)

  The chain is ``scale(s), clip(c), add_decayed_weights_per_leaf(wd),
  scale_by_ftml(lr, beta1, beta2, epsilon, lr_mult=lr_mult)``.

  Args:
    learning_rate: a scalar > 0 or an optax schedule.
    beta1: in [0, 1).
    beta2: in [0, 1).
    epsilon: >= 0.
    wd: coupled weight decay >= 0.
    rescale_grad: gradient multiplier > 0.
    clip_gradient: element-wise clipping bound > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name (> 0 where given).
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights and state for float16/bfloat16.
    begin_num_update: updates done before the first (:math:`t` starts at
      ``begin_num_update + 1``).

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    Zheng and Kwok, `Follow the Moving Leader in Deep Learning
    <http://proceedings.mlr.press/v70/zheng17a.html>`_, ICML 2017; Apache
    MXNet 2.0 ``mxnet.optimizer.FTML``.
  """
  base.check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult,
                  positive_lr=True)
  _check_betas(beta1, beta2, epsilon)
  multi_precision = v.check_flag("multi_precision", multi_precision)
  _check_count("begin_num_update", begin_num_update)
  parts = base.preprocess(rescale_grad, clip_gradient, wd, wd_mult)
  parts.append(unchecked_scale_by_ftml(learning_rate, b1=beta1, b2=beta2, eps=epsilon,
                                        lr_mult=lr_mult, initial_count=begin_num_update))
  return assembly.finish(parts, "ftml", multi_precision=multi_precision,
                         leaf_values=[("lr_mult", lr_mult), ("wd_mult", wd_mult)],
                         hyperparams=_hyperparams(learning_rate, wd, rescale_grad,
                                                  epsilon=epsilon))
