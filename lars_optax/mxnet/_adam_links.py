r"""The Adam family's links, MXNet 2.0's rules where optax has no exact equivalent.

MXNet places epsilon outside the bias correction, so :func:`optax.scale_by_adam`,
:func:`optax.scale_by_adamax` and :func:`optax.scale_by_belief` compute other numbers:

* :func:`scale_by_mxnet_adam` -- Adam's scaling with MXNet's placement of
  epsilon (outside the bias correction);
* :func:`scale_by_adam_moments` -- :math:`m_t / (\sqrt{v_t} + \epsilon)`,
  without bias correction;
* :func:`scale_by_bias_correction` -- the factor
  :math:`\sqrt{1 - \beta_2^t} / (1 - \beta_1^t)`, with MXNet's
  ``begin_num_update``;
* :func:`scale_by_mxnet_adamax`, :func:`scale_by_mxnet_belief`,
  :func:`scale_by_mxnet_nadam` and :func:`scale_by_ftml`.

Private: the names are :mod:`lars_optax.mxnet`'s; the optimizers built from them are
in :mod:`lars_optax.mxnet._adam_family`.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax import GradientTransformation

from lars_optax import _links
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks

# --------------------------------------------------------------------------
# Transformations
# --------------------------------------------------------------------------

def unchecked_scale_by_mxnet_adam(
    b1: float = 0.9,
    *,
    b2: float = 0.999,
    eps: float = 1e-8,
    initial_count: int = 0,
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

  def init_fn(params: optax.Params) -> optax.ScaleByAdamState:
    utils.warn_float16(params, "scale_by_mxnet_adam")
    return optax.ScaleByAdamState(
        count=jnp.zeros([], jnp.int32),
        mu=jax.tree.map(jnp.zeros_like, params),
        nu=jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    del params
    mu, nu = utils.moments(updates, state.mu, state.nu, b1, b2)
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


scale_by_mxnet_adam = _links.public_link(unchecked_scale_by_mxnet_adam, params="complex")


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

  def second(n, u, m):
    del m
    return utils.cast(b2, n.dtype) * n + utils.cast(1 - b2, n.dtype) * jnp.square(u)

  return _ratio_of_moments(b1, eps, second, jnp.sqrt, "scale_by_adam_moments")


scale_by_adam_moments = _links.public_link(unchecked_scale_by_adam_moments)


def _ratio_of_moments(b1: Any, eps: Any, second: Any, root: Any, where: str, *,
                      squares: bool = True) -> GradientTransformation:
  """``mu = b1 mu + (1 - b1) u``, ``nu = second(nu, u, mu)``, update ``mu / (root(nu) + eps)``."""

  def init_fn(params):
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

  def second(n, u, m):
    del m
    return jnp.maximum(utils.cast(b2, n.dtype) * n, jnp.abs(u))

  return _ratio_of_moments(b1, eps, second, lambda n: n, "scale_by_mxnet_adamax", squares=False)


scale_by_mxnet_adamax = _links.public_link(unchecked_scale_by_mxnet_adamax)


def unchecked_scale_by_mxnet_belief(
    b1: float = 0.9,
    *,
    b2: float = 0.999,
    eps: float = 1e-6,
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

  def second(n, u, m):
    dt = n.dtype
    return (utils.cast(b2, dt) * n + utils.cast(1 - b2, dt) * jnp.square(u - m)
            + utils.cast(eps, dt))

  return _ratio_of_moments(b1, eps, second, jnp.sqrt, "scale_by_mxnet_belief")


scale_by_mxnet_belief = _links.public_link(unchecked_scale_by_mxnet_belief)


def unchecked_scale_by_bias_correction(
    b1: float = 0.9,
    *,
    b2: float | None = 0.999,
    initial_count: int = 0,
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


scale_by_bias_correction = _links.public_link(
    unchecked_scale_by_bias_correction, declared={"b2": _links.optional(_links.UNIT)},
    params=None)


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
  log_096 = math.log(0.96)

  def init_fn(params):
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
    mu, nu = utils.moments(updates, state.mu, state.nu, b1, b2, square=jnp.square)

    def step(u, m, n):
      ldt = utils.norm_dtype(u.dtype)
      num = (mom_coef.astype(ldt) * m.astype(ldt) + grad_coef.astype(ldt) * u.astype(ldt))
      den = jnp.sqrt(n.astype(ldt) / debias2.astype(ldt)) + utils.cast(eps, ldt)
      return utils.safe_divide(num, den).astype(u.dtype)

    return (jax.tree.map(step, updates, mu, nu),
            ScaleByNadamState(count, m_schedule, mu, nu))

  return GradientTransformation(init_fn, update_fn)


scale_by_mxnet_nadam = _links.public_link(unchecked_scale_by_mxnet_nadam)


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

  def init_fn(params):
    masks.resolve_leaf_values(lr_mult, params, "lr_mult", check_names=True)
    utils.warn_float16(params, "scale_by_ftml")
    zeros = functools.partial(jax.tree.map, jnp.zeros_like, params)
    return ScaleByFTMLState(count=jnp.zeros([], jnp.int32), d=zeros(), v=zeros(), z=zeros())

  def update_fn(updates, state, params=None):
    v.require_params(params, "scale_by_ftml")  # the rule sets w_t = -z_t / d_t
    params = v.align_params(updates, params)
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


scale_by_ftml = _links.public_link(
    unchecked_scale_by_ftml, declared={"learning_rate": _links.POSITIVE_RATE}, same_structure=True)
