r"""The SGD family: MXNet's momentum, Nesterov, delay-compensated SGD, Langevin dynamics.

Four of Apache MXNet 2.0's optimizers, with MXNet's argument names, defaults
and update rules, each a plain ``optax.chain`` of public transformations:

* :func:`sgd` -- ``mx.optimizer.SGD``: SGD with momentum, the learning rate
  inside the momentum buffer (:func:`mxnet_momentum`), optional lazy updates;
* :func:`nag` -- ``mx.optimizer.NAG``: Nesterov's accelerated gradient with the
  learning rate inside the momentum buffer
  (:func:`mxnet_momentum` with ``nesterov=True``);
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
input checks of :mod:`lars_optax.mxnet`. :func:`lars_optax.mxnet.create` builds
them by MXNet's names, ``"nag"``, ``"dcasgd"`` and ``"sgld"``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import GradientTransformation

from lars_optax import _assembly as assembly
from lars_optax import _mxnet_base as base
from lars_optax import _links
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax._momentum import unchecked_mxnet_momentum

__all__ = [
    "AddLangevinNoiseState",
    "DelayCompensationState",
    "add_delay_compensation",
    "add_langevin_noise",
    "dcasgd",
    "nag",
    "sgd",
    "sgld",
]

_SEED_MAX = 2**32 - 1


def _lazy_or_master_weights(*, lazy_update: bool, multi_precision: bool, **_: Any) -> None:
  if lazy_update and multi_precision:
    raise ValueError(
        "lazy_update: sgd takes lazy_update=True or multi_precision=True, not both, as "
        "MXNet's SGD asserts. For row-sparse updates keep lazy_update=True with float32 "
        "or bfloat16 params; for float32 master weights pass lazy_update=False (adam "
        "takes both, on dense gradients).")


@_links.optimizer(hints=v.MXNET_HINTS, relations=_lazy_or_master_weights)
def sgd(
    learning_rate: optax.ScalarOrSchedule = 0.1,
    *,
    momentum: float = 0.0,
    lazy_update: bool = False,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
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
  common = base.Base.of(locals())
  parts = [*common.preprocess(), *assembly.lr_mult_part(lr_mult),
           unchecked_mxnet_momentum(learning_rate, momentum=momentum)]
  return assembly.finish(parts, "sgd", multi_precision=multi_precision,
                         lazy=lazy_update, complex_params=clip_gradient is None)


@_links.optimizer(hints=v.MXNET_HINTS)
def nag(
    learning_rate: optax.ScalarOrSchedule = 0.1,
    *,
    momentum: float = 0.9,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
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
  common = base.Base.of(locals())
  parts = [*common.preprocess(), *assembly.lr_mult_part(lr_mult),
           unchecked_mxnet_momentum(learning_rate, momentum=momentum, nesterov=True)]
  return assembly.finish(parts, "nag", multi_precision=multi_precision,
                         complex_params=clip_gradient is None)


class DelayCompensationState(NamedTuple):
  """State of :func:`add_delay_compensation`.

  Attributes:
    previous_params: the params as they were at the previous update (at
      ``init``, a copy of the initial params), like the params.
  """

  previous_params: optax.Params


def unchecked_add_delay_compensation(variance_control: float = 0.04) -> GradientTransformation:
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
  name = "add_delay_compensation"

  def init_fn(params: optax.Params) -> DelayCompensationState:
    # A copy, so that donating the params to a jitted step leaves the state intact.
    return DelayCompensationState(jax.tree.map(lambda p: jnp.array(p, copy=True), params))

  def update_fn(updates, state, params=None):
    params = v.align_params(updates, params)
    v.require_params(params, name)

    def compensate(u, w, prev):
      if utils.is_const(variance_control, 0):
        return u
      # In float32 or wider: a float16 g * g overflows for |g| > 256, and
      # inf * 0 (an unchanged weight) would be NaN; the product itself is small.
      dt = utils.norm_dtype(u.dtype)
      lam = utils.cast(variance_control, dt)
      wide = u.astype(dt)
      return (jnp.square(wide) * (w - prev).astype(dt) * lam + wide).astype(u.dtype)

    updates = jax.tree.map(compensate, updates, params, state.previous_params)
    return updates, DelayCompensationState(params)

  return GradientTransformation(init_fn, update_fn)


add_delay_compensation = _links.public_link(unchecked_add_delay_compensation, same_structure=True)


@_links.optimizer(hints=v.MXNET_HINTS)
def dcasgd(
    learning_rate: optax.ScalarOrSchedule = 0.1,
    *,
    momentum: float = 0.0,
    lamda: float = 0.04,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
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
  common = base.Base.of(locals())
  parts = [*common.preprocess(), unchecked_add_delay_compensation(lamda),
           *assembly.lr_mult_part(lr_mult),
           unchecked_mxnet_momentum(learning_rate, momentum=momentum)]
  return assembly.finish(parts, "dcasgd", multi_precision=multi_precision)


class AddLangevinNoiseState(NamedTuple):
  """State of :func:`add_langevin_noise`.

  Attributes:
    count: number of updates done so far (int32); a scheduled learning rate
      is called with it.
    rng_key: the PRNG key the next step's noise is drawn from (split at every
      step). A ``uint32[2]`` array when the transformation was given an int
      seed or a raw key (``jax.random.PRNGKey``), a typed key when given one
      (``jax.random.key``).
  """

  count: jax.Array  # type: ignore[assignment]
  rng_key: jax.Array


def _check_key(name: str, key: Any) -> None:
  expected = (f"an int seed in [0, {_SEED_MAX}] or a JAX PRNG key (jax.random.key(seed) or "
              "jax.random.PRNGKey(seed))")
  if isinstance(key, (bool, np.bool_)):
    raise TypeError(f"{name}: expected {expected}, got {key!r}.")
  if isinstance(key, (int, np.integer)):
    if not 0 <= key <= _SEED_MAX:
      # Without x64, JAX keeps only the low 32 bits: 2**32 would repeat seed 0.
      raise ValueError(f"{name}: expected {expected}, got {key!r} (a larger or negative "
                       "seed would be folded onto one in that range).")
    return
  dtype = getattr(key, "dtype", None)
  shape = getattr(key, "shape", None)
  if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) and shape == ():
    return
  if dtype == jnp.uint32 and shape == (2,):  # a raw threefry key
    return
  if dtype is not None and jnp.issubdtype(dtype, jnp.integer) and shape == ():
    return  # an integer array: a seed from optax.inject_hyperparams (may be traced)
  raise TypeError(f"{name}: expected {expected}, got "
                  + (f"an array of dtype {dtype} and shape {shape}" if dtype is not None
                     else repr(key)) + ".")


def _initial_key(key: Any) -> jax.Array:
  if isinstance(key, (int, np.integer)) or (
      not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ()):
    return jax.random.PRNGKey(key)
  return jnp.asarray(key)


def unchecked_add_langevin_noise(
    learning_rate: optax.ScalarOrSchedule,
    *,
    key: Any = 0,
    multipliers: masks.LeafValues = None,
    arg_name: str = "multipliers",
) -> GradientTransformation:
  r"""Adds Gaussian noise whose variance is the learning rate (Langevin dynamics).

  .. math::

    u_i \leftarrow u_i + \sqrt{\alpha_t c_i}\;\xi, \qquad
    \xi \sim \mathcal{N}(0, I)

  with :math:`\alpha_t` = ``learning_rate`` (a schedule is called with the
  number of updates done before this one, as optax does) and :math:`c_i` the
  leaf's entry in ``multipliers`` (MXNet's ``lr_mult``: the noise of a leaf
  whose rate is ``lr * c`` has variance ``lr * c``; 1 for leaves it does
  not name). This is the noise of SGLD (:func:`sgld`); :func:`optax.add_noise`
  instead decays its variance as :math:`\eta / (1 + t)^\gamma`,
  independently of the learning rate.

  The noise is drawn from a JAX PRNG key kept in the state
  (:class:`AddLangevinNoiseState`), split at every step and once per leaf:
  the same ``key`` gives the same noise, step for step, with and without
  ``jit``, and ``update`` stays a pure function. It is drawn in float32
  (float64 for float64 leaves) and added in the leaf's dtype. Under
  ``pmap`` with the state replicated, every device draws the same noise, so
  replicated params stay identical; inside ``shard_map`` every device draws
  from the same key for its own block of a sharded leaf (fold the axis
  index into the key of a copy per device if the blocks need independent
  noise).

  Args:
    learning_rate: :math:`\alpha_t`, a scalar >= 0 or an optax schedule.
    key: a JAX PRNG key (``jax.random.key(seed)`` or
      ``jax.random.PRNGKey(seed)``) or an int seed in [0, 2**32 - 1].
    multipliers: per-leaf multipliers of the variance, by leaf name; see
      :data:`lars_optax.masks.LeafValues`. Values must be >= 0.
    arg_name: how error messages name ``multipliers`` (e.g. ``"lr_mult"``).

  Returns:
    A :class:`optax.GradientTransformation` with an
    :class:`AddLangevinNoiseState`.

  References:
    Welling and Teh, `Bayesian Learning via Stochastic Gradient Langevin
    Dynamics <https://www.stats.ox.ac.uk/~teh/research/compstats/WelTeh2011a.pdf>`_,
    ICML 2011.
  """

  def init_fn(params: optax.Params) -> AddLangevinNoiseState:
    if multipliers is not None:
      masks.check_unique_names(params)
    masks.resolve_leaf_values(multipliers, params, arg_name, check_names=True)
    return AddLangevinNoiseState(jnp.zeros([], jnp.int32), _initial_key(key))

  def update_fn(updates, state, params=None):
    del params
    lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
    flat, treedef = jax.tree.flatten(updates)
    mults = masks.resolve_leaf_values(multipliers, updates, arg_name)
    rng_key, sample_key = jax.random.split(state.rng_key)
    keys = jax.random.split(sample_key, max(len(flat), 1))
    out = []
    for u, c, k in zip(flat, mults, keys):
      dt = utils.norm_dtype(u.dtype)
      std = jnp.sqrt(jnp.asarray(lr, dt) * jnp.asarray(c, dt))
      out.append(u + (std * jax.random.normal(k, u.shape, dt)).astype(u.dtype))
    return (jax.tree.unflatten(treedef, out),
            AddLangevinNoiseState(optax.safe_int32_increment(state.count), rng_key))

  return GradientTransformation(init_fn, update_fn)


add_langevin_noise = _links.public_link(unchecked_add_langevin_noise,
                                        declared={"key": _links.Arg(_check_key)})


@_links.optimizer(hints=v.MXNET_HINTS, declared={"key": _links.Arg(_check_key)})
def sgld(
    learning_rate: optax.ScalarOrSchedule = 0.1,
    *,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    key: Any = 0,
) -> optax.GradientTransformation:
  r"""Stochastic gradient Langevin dynamics as Apache MXNet implements it (``mx.optimizer.SGLD``).

  With :math:`s` = ``rescale_grad``, :math:`c` = ``clip_gradient`` and
  :math:`\lambda` = ``wd``:

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) + \lambda w_{t-1} \\
    w_t &= w_{t-1} - \frac{\alpha_t}{2}\,u_t + \sqrt{\alpha_t}\;\xi_t,
    \qquad \xi_t \sim \mathcal{N}(0, I)

  (MXNet draws ``normal(0, sqrt(lr))``: standard deviation
  :math:`\sqrt{\alpha_t}`, variance :math:`\alpha_t`.) With ``lr_mult`` a
  leaf's rate is :math:`c_i \alpha_t` in both terms, so its noise variance
  is :math:`c_i \alpha_t`; a scheduled rate sets the variance of every
  step's noise. With a loss that is the negative log posterior summed over
  the data, the weights are (approximately) samples from the posterior once
  the rate is small.

  The noise comes from a JAX PRNG key kept in the state (``key``; see
  :func:`add_langevin_noise`): runs are reproducible, and the same key gives
  the same steps with and without ``jit``. MXNet draws from its global
  random state instead, so its numbers cannot be matched one for one; the
  tests check the distribution (MXNet's too).

  The chain is ``scale(s), clip(c), add_decayed_weights_per_leaf(wd,
  wd_mult), optax.scale(0.5), optax.scale_by_learning_rate(lr)``,
  :func:`~lars_optax.scale_per_leaf` for ``lr_mult``, then
  :func:`add_langevin_noise` (``lr``, ``key``, variance multipliers
  ``lr_mult``).

  Args:
    learning_rate: a scalar or an optax schedule: the step size and the
      noise variance.
    wd: coupled weight decay >= 0 (multiplied per leaf by ``wd_mult``).
    rescale_grad: gradient multiplier > 0.
    clip_gradient: element-wise clipping bound > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name (they scale the
      noise variance too).
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights for float16/bfloat16 (the noise
      is then added to the float32 master weights, as in MXNet).
    key: the noise's PRNG key (``jax.random.key(seed)`` or
      ``jax.random.PRNGKey(seed)``) or an int seed in [0, 2**32 - 1] (not an
      MXNet argument). The default 0 gives every run the same noise: pass a
      different key for independent chains.

  Returns:
    An :class:`optax.GradientTransformation`.

  Example:

  >>> import jax.numpy as jnp
  >>> import optax
  >>> import lars_optax
  >>> tx = lars_optax.mxnet.sgld(learning_rate=1e-3, key=42)
  >>> params = {"w": jnp.zeros(3)}
  >>> state = tx.init(params)
  >>> updates, state = tx.update({"w": jnp.ones(3)}, state, params)
  >>> params = optax.apply_updates(params, updates)

  References:
    Welling and Teh, `Bayesian Learning via Stochastic Gradient Langevin
    Dynamics <https://www.stats.ox.ac.uk/~teh/research/compstats/WelTeh2011a.pdf>`_,
    ICML 2011; Apache MXNet 2.0 ``mxnet.optimizer.SGLD``.
  """
  common = base.Base.of(locals())
  parts = [*common.preprocess(), optax.scale(0.5), *common.rate(),
           unchecked_add_langevin_noise(learning_rate, key=key, multipliers=lr_mult,
                                        arg_name="lr_mult")]
  return assembly.finish(parts, "sgld", multi_precision=multi_precision)
