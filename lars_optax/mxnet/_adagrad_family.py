r"""Adagrad and the optimizers built on a running sum or average of squared gradients.

Apache MXNet 2.0's ``adagrad``, ``groupadagrad``, ``rmsprop``, ``adadelta``
and ``ftrl``, with MXNet's argument names and defaults, each a plain
``optax.chain``:

* :func:`adagrad` -- the sum of squared gradients, :math:`\epsilon` outside
  the square root (:func:`scale_by_mxnet_adagrad`);
* :func:`groupadagrad` -- one accumulator per row (axis 0) of a leaf
  (:func:`scale_by_group_adagrad`);
* :func:`rmsprop` -- Tieleman and Hinton's (:func:`optax.scale_by_rms`) or,
  with ``centered=True``, Graves's (:func:`optax.scale_by_stddev` and
  :func:`lars_optax.mxnet_momentum`), with optional weight clipping
  (:func:`clip_params`);
* :func:`adadelta` -- :func:`optax.scale_by_adadelta` times the learning rate;
* :func:`ftrl` -- FTRL-proximal, whose weights are computed from its state
  (:func:`ftrl_proximal`; the update is the new weight minus the old).

They share MXNet's optimizer-base arguments (``wd``, ``rescale_grad``,
``clip_gradient``, ``lr_mult``, ``wd_mult``, ``multi_precision``) and take
Python, numpy and JAX scalars alike (the updates and state keep the
parameter dtypes). :func:`lars_optax.mxnet.create` builds them by their MXNet names:

>>> import jax.numpy as jnp
>>> import optax
>>> import lars_optax
>>> tx = lars_optax.mxnet.create("rmsprop", learning_rate=0.01, centered=True, clip_weights=1.0)
>>> params = {"w": jnp.ones(3)}
>>> updates, state = tx.update({"w": jnp.ones(3)}, tx.init(params), params)
>>> params = optax.apply_updates(params, updates)

float16 params: the accumulators hold squared gradients, which underflow in
float16 (and an :math:`\epsilon` of 1e-8 is 0 there); pass
``multi_precision=True`` (float32 master weights and state) or use bfloat16.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from lars_optax import _assembly as assembly
from lars_optax import _mxnet_base as base
from lars_optax import _links
from lars_optax import _row_wise
from lars_optax import _masks as masks
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax._momentum import unchecked_mxnet_momentum

__all__ = [
    "FtrlProximalState",
    "ScaleByGroupAdagradState",
    "adadelta",
    "adagrad",
    "clip_params",
    "ftrl",
    "ftrl_proximal",
    "groupadagrad",
    "rmsprop",
    "scale_by_group_adagrad",
    "scale_by_mxnet_adagrad",
]


# --------------------------------------------------------------------------
# Transformations
# --------------------------------------------------------------------------

def _divide(u: jax.Array, h: jax.Array, eps: Any) -> jax.Array:
  """``u / (sqrt(h) + eps)`` in float32 or wider; 0 where the denominator is 0."""
  dt = utils.norm_dtype(u.dtype)
  denom = jnp.sqrt(h.astype(dt)) + utils.cast(eps, dt)
  # A zero denominator means every gradient so far was 0 (with eps = 0): a zero step.
  return utils.safe_divide(u.astype(dt), denom).astype(u.dtype)


def unchecked_scale_by_mxnet_adagrad(eps: float = 1e-6) -> optax.GradientTransformation:
  r"""Adagrad's scaling with :math:`\epsilon` outside the square root (MXNet's rule).

  .. math::

    h_t = h_{t-1} + u_t^2, \qquad \text{update} = \frac{u_t}{\sqrt{h_t} + \epsilon}
    \qquad (h_0 = 0).

  Follow it with :func:`optax.scale_by_learning_rate`. :func:`optax.scale_by_rss`
  differs in two places: it divides by :math:`\sqrt{h_t + \epsilon}` and
  starts from :math:`h_0` = ``initial_accumulator_value`` (0.1 by default).
  The division is done in float32 or wider; where the denominator is 0
  (``eps=0`` and every gradient so far 0) the update is 0 rather than NaN.

  Args:
    eps: :math:`\epsilon` >= 0.

  Returns:
    A :class:`optax.GradientTransformation` with an :class:`optax.ScaleByRssState`
    (``sum_of_squares``: :math:`h`, like the params).

  References:
    Duchi, Hazan and Singer, `Adaptive Subgradient Methods for Online Learning
    and Stochastic Optimization <https://jmlr.org/papers/v12/duchi11a.html>`_,
    JMLR 2011; Apache MXNet 2.0 ``mxnet.optimizer.AdaGrad``.
  """

  def init_fn(params: optax.Params) -> optax.ScaleByRssState:
    return optax.ScaleByRssState(sum_of_squares=jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    del params
    h = jax.tree.map(lambda u, s: s + jnp.square(u), updates, state.sum_of_squares)
    updates = jax.tree.map(lambda u, s: _divide(u, s, eps), updates, h)
    return updates, optax.ScaleByRssState(sum_of_squares=h)

  return optax.GradientTransformation(init_fn, update_fn)


scale_by_mxnet_adagrad = _links.public_link(unchecked_scale_by_mxnet_adagrad)


@_row_wise.row_wise("row_sum_of_squares")
class ScaleByGroupAdagradState(NamedTuple):
  """State of :func:`scale_by_group_adagrad`.

  Attributes:
    row_sum_of_squares: per leaf, the running sum of the rows' mean squared
      gradients, of shape ``(rows, 1, ..., 1)`` (a leaf of 0 or 1 dimension:
      its own shape, each entry a row).
  """

  row_sum_of_squares: optax.Updates


def _row_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
  return shape if len(shape) <= 1 else (shape[0],) + (1,) * (len(shape) - 1)


def _row_mean_square(u: jax.Array) -> jax.Array:
  if u.ndim <= 1:
    return jnp.square(u)
  wide = u.astype(utils.norm_dtype(u.dtype))  # the row's sum in float32 or wider
  return jnp.mean(jnp.square(wide), axis=tuple(range(1, u.ndim)), keepdims=True).astype(u.dtype)


def unchecked_scale_by_group_adagrad(eps: float = 1e-6) -> optax.GradientTransformation:
  r"""Adagrad with one accumulator per row (axis 0) of each leaf (MXNet's GroupAdaGrad).

  For row :math:`i` of a leaf with :math:`d` entries per row:

  .. math::

    h_{t,i} = h_{t-1,i} + \frac{1}{d}\sum_j u_{t,ij}^2, \qquad
    \text{update}_{ij} = \frac{u_{t,ij}}{\sqrt{h_{t,i}} + \epsilon}
    \qquad (h_0 = 0).

  An embedding table gets one step size per row (per token) instead of one
  per entry: the state is ``1/d`` of Adagrad's. MXNet takes 2-d weights only;
  here a leaf of more dimensions averages over all axes but the first, and a
  leaf of 0 or 1 dimension has one row per entry (plain Adagrad). Follow it
  with :func:`optax.scale_by_learning_rate`. The division is done in float32
  or wider (0 where the denominator is 0, as in :func:`scale_by_mxnet_adagrad`).

  Args:
    eps: :math:`\epsilon` >= 0.

  Returns:
    A :class:`optax.GradientTransformation` with a :class:`ScaleByGroupAdagradState`.

  References:
    Duchi, Hazan and Singer, `Adaptive Subgradient Methods
    <https://jmlr.org/papers/v12/duchi11a.html>`_, JMLR 2011; Apache MXNet 2.0
    ``mxnet.optimizer.contrib.GroupAdaGrad``.
  """

  def init_fn(params: optax.Params) -> ScaleByGroupAdagradState:
    return ScaleByGroupAdagradState(jax.tree.map(
        lambda p: jnp.zeros(_row_shape(jnp.shape(p)), p.dtype), params))

  def update_fn(updates, state, params=None):
    del params
    h = jax.tree.map(lambda u, s: s + _row_mean_square(u).astype(s.dtype), updates,
                     state.row_sum_of_squares)
    updates = jax.tree.map(lambda u, s: _divide(u, s, eps), updates, h)
    return updates, ScaleByGroupAdagradState(h)

  return optax.GradientTransformation(init_fn, update_fn)


scale_by_group_adagrad = _links.public_link(unchecked_scale_by_group_adagrad)


def unchecked_clip_params(max_abs: float) -> optax.GradientTransformation:
  r"""Updates that keep the params in :math:`[-c, c]` (MXNet's ``clip_weights``).

  .. math:: \text{update} = \mathrm{clip}(w + u, -c, c) - w

  so that ``optax.apply_updates`` gives the clipped weight (to the rounding of
  one addition). Put it last in a chain, after the learning rate; it is
  :func:`optax.keep_params_nonnegative`'s counterpart for a symmetric box.

  Args:
    max_abs: the bound :math:`c` > 0.

  Returns:
    A stateless :class:`optax.GradientTransformation`; ``update`` needs ``params``.

  References:
    Apache MXNet 2.0 ``mxnet.optimizer.RMSProp`` (``clip_weights``).
  """

  def init_fn(params: optax.Params) -> optax.EmptyState:
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    params = v.align_params(updates, params)
    v.require_params(params, "clip_params")

    def clip(u, w):
      c = utils.cast(max_abs, u.dtype)
      w = w.astype(u.dtype)
      return jnp.clip(w + u, -c, c) - w

    return jax.tree.map(clip, updates, params), state

  return optax.GradientTransformation(init_fn, update_fn)


clip_params = _links.public_link(unchecked_clip_params, params=None, same_structure=True)


@_row_wise.row_wise("z", "n")
class FtrlProximalState(NamedTuple):
  """State of :func:`ftrl_proximal`.

  Attributes:
    count: number of updates done so far (int32); schedules are called with it.
    z: the accumulated linear term :math:`z`, like the params.
    n: the sum of squared gradients :math:`n`, like the params.
  """

  count: jax.Array  # type: ignore[assignment]  # (shadows tuple.count, as in optax)
  z: optax.Updates
  n: optax.Updates


def unchecked_ftrl_proximal(
    learning_rate: optax.ScalarOrSchedule,
    *,
    lamda1: float = 0.01,
    beta: float = 1.0,
    weight_decay: float = 0.0,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
) -> optax.GradientTransformation:
  r"""FTRL-proximal (McMahan et al.), as MXNet computes it: new weights from the state.

  With gradient :math:`g`, learning rate :math:`\alpha` (times the leaf's
  ``lr_mult``), :math:`\lambda_1` = ``lamda1`` and :math:`\lambda_2` =
  ``weight_decay`` (times the leaf's ``wd_mult``):

  .. math::

    n_t &= n_{t-1} + g_t^2, \qquad
    z_t = z_{t-1} + g_t - \frac{\sqrt{n_t} - \sqrt{n_{t-1}}}{\alpha}\,w_{t-1} \\
    w_t &= -\frac{\mathrm{sign}(z_t)\max(|z_t| - \lambda_1, 0)}
               {(\beta + \sqrt{n_t})/\alpha + \lambda_2},
    \qquad \text{update} = w_t - w_{t-1}

  (:math:`z_0 = n_0 = 0`). The weights are a function of the state, not a sum
  of steps: the first update already replaces the initial weights (by 0 where
  :math:`|z_1| \le \lambda_1`). :math:`\lambda_1` is an L1 penalty (it makes
  weights exactly 0), :math:`\lambda_2` an L2 one. The learning rate enters
  the state and the weight, so it is this transformation's own argument, not
  a separate :func:`optax.scale_by_learning_rate`. A leaf whose learning rate
  is 0 is left as it is (state too), and a zero denominator
  (:math:`\beta = \lambda_2 = 0` with no gradient yet) gives weight 0.

  Args:
    learning_rate: :math:`\alpha_t` > 0, a scalar or an optax schedule (called
      with the number of updates done so far).
    lamda1: :math:`\lambda_1` >= 0 (MXNet's spelling).
    beta: :math:`\beta` >= 0.
    weight_decay: :math:`\lambda_2` >= 0.
    lr_mult: per-leaf multipliers of the learning rate, by leaf name
      (:data:`lars_optax.masks.LeafValues`).
    wd_mult: per-leaf multipliers of ``weight_decay``.

  Returns:
    A :class:`optax.GradientTransformation` with a :class:`FtrlProximalState`;
    ``update`` needs ``params``.

  References:
    McMahan et al., `Ad Click Prediction: a View from the Trenches
    <https://doi.org/10.1145/2487575.2488200>`_, KDD 2013; Apache MXNet 2.0
    ``mxnet.optimizer.Ftrl``.
  """
  name = "ftrl_proximal"

  def init_fn(params: optax.Params) -> FtrlProximalState:
    if lr_mult is not None or wd_mult is not None:
      masks.check_unique_names(params)
    masks.resolve_leaf_values(lr_mult, params, "lr_mult", check_names=True)
    masks.resolve_leaf_values(wd_mult, params, "wd_mult", check_names=True)
    # (two trees of their own: one array in two places cannot be donated)
    return FtrlProximalState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params),
                             jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    params = v.align_params(updates, params)
    v.require_params(params, name)
    lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
    flat_g, treedef = jax.tree.flatten(updates)
    flat_w = treedef.flatten_up_to(params)
    flat_z = treedef.flatten_up_to(state.z)
    flat_n = treedef.flatten_up_to(state.n)
    lr_mults = masks.resolve_leaf_values(lr_mult, params, "lr_mult")
    wd_mults = masks.resolve_leaf_values(wd_mult, params, "wd_mult")
    out_u, out_z, out_n = [], [], []
    for g, w, z, n, lm, wm in zip(flat_g, flat_w, flat_z, flat_n, lr_mults, wd_mults):
      dt = g.dtype
      w = w.astype(dt)
      a = jnp.asarray(lr if lm == 1 else lr * lm, dt)
      live = a > 0
      a = jnp.where(live, a, 1)  # (a leaf with rate 0 keeps its weight and state)
      new_n = n + jnp.square(g)
      sqrt_n = jnp.sqrt(new_n)
      new_z = z + g - (sqrt_n - jnp.sqrt(n)) / a * w
      l2 = utils.cast(weight_decay if wm == 1 else weight_decay * wm, dt)
      denom = (utils.cast(beta, dt) + sqrt_n) / a + l2
      shrunk = jnp.sign(new_z) * jnp.maximum(jnp.abs(new_z) - utils.cast(lamda1, dt), 0)
      new_w = -utils.safe_divide(shrunk, denom).astype(dt)  # (NaN shows; only 0 is guarded)
      out_u.append(jnp.where(live, new_w - w, 0).astype(dt))
      out_z.append(jnp.where(live, new_z, z).astype(z.dtype))
      out_n.append(jnp.where(live, new_n, n).astype(n.dtype))
    return jax.tree.unflatten(treedef, out_u), FtrlProximalState(
        optax.safe_int32_increment(state.count), jax.tree.unflatten(treedef, out_z),
        jax.tree.unflatten(treedef, out_n))

  return optax.GradientTransformation(init_fn, update_fn)


ftrl_proximal = _links.public_link(
    unchecked_ftrl_proximal, declared={"learning_rate": _links.POSITIVE_RATE},
    same_structure=True)


# --------------------------------------------------------------------------
# Optimizers
# --------------------------------------------------------------------------

def _no_decay_on_sparse(wd: float, wd_mult: masks.LeafValues):
  """A check that no row-sparse gradient leaf has weight decay (AdaGrad's ``wd``)."""

  def check(sparse_names: list[str], params: Any) -> None:
    if params is None or utils.is_const(wd, 0):
      return
    mults = dict(zip([n for n, _ in masks.named_leaves(params)],
                     masks.resolve_leaf_values(wd_mult, params, "wd_mult")))
    for name in sparse_names:
      decay = wd * mults.get(name, 1.0)
      if decay != 0:
        raise ValueError(
            f"wd: gradient {name!r} is row-sparse (a BCOO), but its weight decay is "
            f"{decay:g} (wd x wd_mult). Weight decay moves every row, so a step on the "
            "rows in the gradient only would differ from the dense step (MXNet's "
            "row-sparse AdaGrad rejects wd too). Exclude the leaf from weight decay "
            f"(wd_mult={{{name!r}: 0.0}}) or pass the dense gradient (grad.todense()).")

  return check


@_links.optimizer(hints=v.MXNET_HINTS)
def adagrad(
    learning_rate: optax.ScalarOrSchedule = 0.01,
    *,
    epsilon: float = 1e-6,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
) -> optax.GradientTransformation:
  r"""Adagrad as Apache MXNet implements it (``mx.optimizer.AdaGrad``).

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) + \lambda w_{t-1} \\
    h_t &= h_{t-1} + u_t^2, \qquad
    w_t = w_{t-1} - \alpha_t \frac{u_t}{\sqrt{h_t} + \epsilon}

  with :math:`h_0 = 0`. :func:`optax.adagrad` puts :math:`\epsilon` inside the
  square root and starts from :math:`h_0 = 0.1`; ``wd`` is coupled (L2).

  The chain is ``scale(s), clip(c), add_decayed_weights_per_leaf(wd),
  scale_by_mxnet_adagrad(epsilon), optax.scale_by_learning_rate(lr)``, then
  ``lr_mult``.

  A gradient leaf may be a row-sparse :class:`~jax.experimental.sparse.BCOO`
  (see :mod:`lars_optax.sparse`), as MXNet's AdaGrad takes ``row_sparse``
  gradients: only its rows of the weight and of :math:`h` are read and
  written, in O(rows), and the update comes back row-sparse. An absent row's
  step is 0 anyway, so this equals the dense step. As in MXNet, such a leaf
  must have no weight decay (``wd`` times its ``wd_mult`` is 0; otherwise a
  ValueError names it).

  Args:
    learning_rate: :math:`\alpha_t`, a scalar or an optax schedule.
    epsilon: :math:`\epsilon` >= 0 (with 0, an entry whose gradients have all
      been 0 gets a zero update rather than MXNet's NaN).
    wd: coupled weight decay :math:`\lambda` >= 0.
    rescale_grad: gradient multiplier :math:`s` > 0.
    clip_gradient: element-wise clipping bound :math:`c` > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights and state for float16/bfloat16.

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    Duchi, Hazan and Singer, `Adaptive Subgradient Methods for Online Learning
    and Stochastic Optimization <https://jmlr.org/papers/v12/duchi11a.html>`_,
    JMLR 2011; Apache MXNet 2.0 ``mxnet.optimizer.AdaGrad``.
  """
  common = base.Base.of(locals())
  parts = [*common.preprocess(), unchecked_scale_by_mxnet_adagrad(epsilon), *common.rate()]
  return assembly.finish(parts, "adagrad", multi_precision=multi_precision, squares=True,
                         row_sparse=True, row_sparse_check=_no_decay_on_sparse(wd, wd_mult))


@_links.optimizer(hints=v.MXNET_HINTS)
def groupadagrad(
    learning_rate: optax.ScalarOrSchedule = 0.01,
    *,
    epsilon: float = 1e-6,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lr_mult: masks.LeafValues = None,
    multi_precision: bool = False,
) -> optax.GradientTransformation:
  r"""Adagrad with one step size per row, as MXNet's ``GroupAdaGrad``.

  For row :math:`i` (axis 0) of a leaf with :math:`d` entries per row:

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) \\
    h_{t,i} &= h_{t-1,i} + \frac{1}{d}\sum_j u_{t,ij}^2, \qquad
    w_{t,ij} = w_{t-1,ij} - \alpha_t \frac{u_{t,ij}}{\sqrt{h_{t,i}} + \epsilon}

  with :math:`h_0 = 0`: one accumulator per row (for embedding tables; MXNet
  takes 2-d weights only, see :func:`scale_by_group_adagrad` for other
  shapes). There is no weight decay, as in MXNet (``create("groupadagrad",
  wd=...)`` with ``wd != 0`` is an error).

  The chain is ``scale(s), clip(c), scale_by_group_adagrad(epsilon),
  optax.scale_by_learning_rate(lr)``, then ``lr_mult``.

  A gradient leaf may be a row-sparse :class:`~jax.experimental.sparse.BCOO`
  (see :mod:`lars_optax.sparse`), as in MXNet: only its rows of the weight
  and of :math:`h` are read and written, in O(rows), and the update comes
  back row-sparse. An absent row's step is 0 anyway, so this equals the dense
  step.

  Args:
    learning_rate: :math:`\alpha_t`, a scalar or an optax schedule.
    epsilon: :math:`\epsilon` >= 0.
    rescale_grad: gradient multiplier :math:`s` > 0.
    clip_gradient: element-wise clipping bound :math:`c` > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    multi_precision: float32 master weights and state for float16/bfloat16.

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    Duchi, Hazan and Singer, `Adaptive Subgradient Methods
    <https://jmlr.org/papers/v12/duchi11a.html>`_, JMLR 2011; Apache MXNet 2.0
    ``mxnet.optimizer.contrib.GroupAdaGrad``.
  """
  common = base.Base.of(locals())
  parts = [*common.preprocess(), unchecked_scale_by_group_adagrad(epsilon), *common.rate()]
  return assembly.finish(parts, "groupadagrad", multi_precision=multi_precision,
                         squares=True, row_sparse=True)


@_links.optimizer(hints=v.MXNET_HINTS, declared=_links.POSITIVE_EPSILON)
def rmsprop(
    learning_rate: optax.ScalarOrSchedule = 0.001,
    *,
    rho: float = 0.9,
    momentum: float = 0.9,
    epsilon: float = 1e-8,
    centered: bool = False,
    clip_weights: float | None = None,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
) -> optax.GradientTransformation:
  r"""RMSProp as Apache MXNet implements it (``mx.optimizer.RMSProp``).

  With :math:`u_t = \mathrm{clip}(s\,g_t, -c, c) + \lambda w_{t-1}` and
  :math:`\rho` = ``rho``; Tieleman and Hinton's (``centered=False``):

  .. math::

    v_t &= \rho\,v_{t-1} + (1 - \rho)\,u_t^2, \qquad
    w_t = w_{t-1} - \alpha_t \frac{u_t}{\sqrt{v_t} + \epsilon}

  and Graves's (``centered=True``), with :math:`\mu` = ``momentum``:

  .. math::

    m_t &= \rho\,m_{t-1} + (1 - \rho)\,u_t, \qquad
    v_t = \rho\,v_{t-1} + (1 - \rho)\,u_t^2 \\
    \Delta_t &= \mu\,\Delta_{t-1} - \alpha_t \frac{u_t}{\sqrt{v_t - m_t^2 + \epsilon}},
    \qquad w_t = w_{t-1} + \Delta_t

  (all buffers start at 0; note :math:`\epsilon` outside the square root in
  the first, inside in the second, as in MXNet). ``momentum`` is used only
  when ``centered``. With ``clip_weights`` = :math:`b`, each new weight is
  clipped to :math:`[-b, b]`.

  The chain is ``scale(s), clip(c), add_decayed_weights_per_leaf(wd)``, then
  ``optax.scale_by_rms(rho, epsilon, eps_in_sqrt=False),
  optax.scale_by_learning_rate(lr)`` and ``lr_mult``, or (centered)
  ``optax.scale_by_stddev(rho, epsilon)``, ``lr_mult`` and
  :func:`~lars_optax.mxnet_momentum` ``(lr, momentum)``; then
  :func:`clip_params` ``(clip_weights)``.

  Args:
    learning_rate: :math:`\alpha_t`, a scalar or an optax schedule.
    rho: :math:`\rho` in [0, 1), the decay of the moving averages.
    momentum: :math:`\mu` in [0, 1) (centered only).
    epsilon: :math:`\epsilon` > 0 (with 0, an entry whose gradients have all
      been 0 would divide 0 by 0).
    centered: Graves's centered version.
    clip_weights: the bound :math:`b` > 0 of the weights, or None.
    wd: coupled weight decay :math:`\lambda` >= 0.
    rescale_grad: gradient multiplier :math:`s` > 0.
    clip_gradient: element-wise clipping bound :math:`c` > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights and state for float16/bfloat16
      (the clipping then applies to the master weights).

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    Tieleman and Hinton, `Lecture 6.5, rmsprop
    <https://www.cs.toronto.edu/~tijmen/csc321/slides/lecture_slides_lec6.pdf>`_,
    2012; Graves, `Generating Sequences With Recurrent Neural Networks
    <https://arxiv.org/abs/1308.0850>`_, 2013, eqs. (38)-(45); Apache MXNet 2.0
    ``mxnet.optimizer.RMSProp``.
  """
  common = base.Base.of(locals())
  parts = common.preprocess()
  if centered:
    parts += [utils.keep_dtypes(optax.scale_by_stddev(rho, epsilon, eps_in_sqrt=True),
                                rho, epsilon),
              *assembly.lr_mult_part(lr_mult),
              unchecked_mxnet_momentum(learning_rate, momentum=momentum)]
  else:
    parts += [utils.keep_dtypes(optax.scale_by_rms(rho, epsilon, eps_in_sqrt=False),
                                rho, epsilon), *common.rate()]
  if clip_weights is not None:
    parts.append(unchecked_clip_params(clip_weights))
  return assembly.finish(parts, "rmsprop", multi_precision=multi_precision,
                         squares=True)


@_links.optimizer(hints=v.MXNET_HINTS, declared=_links.POSITIVE_EPSILON)
def adadelta(
    learning_rate: optax.ScalarOrSchedule = 1.0,
    *,
    rho: float = 0.9,
    epsilon: float = 1e-6,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
) -> optax.GradientTransformation:
  r"""AdaDelta as Apache MXNet implements it (``mx.optimizer.AdaDelta``).

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) + \lambda w_{t-1} \\
    a_t &= \rho\,a_{t-1} + (1 - \rho)\,u_t^2, \qquad
    \delta_t = \frac{\sqrt{d_{t-1} + \epsilon}}{\sqrt{a_t + \epsilon}}\,u_t \\
    d_t &= \rho\,d_{t-1} + (1 - \rho)\,\delta_t^2, \qquad
    w_t = w_{t-1} - \alpha_t\,\delta_t

  with :math:`a_0 = d_0 = 0`. The learning rate multiplies the step (1 by
  default, Zeiler's rule). This is :func:`optax.adadelta` with MXNet's base
  arguments in front.

  The chain is ``scale(s), clip(c), add_decayed_weights_per_leaf(wd),
  optax.scale_by_adadelta(rho, epsilon), optax.scale_by_learning_rate(lr)``,
  then ``lr_mult``.

  Args:
    learning_rate: :math:`\alpha_t`, a scalar or an optax schedule.
    rho: :math:`\rho` in [0, 1), the decay of both moving averages.
    epsilon: :math:`\epsilon` > 0 (with 0 the step is 0 for ever).
    wd: coupled weight decay :math:`\lambda` >= 0.
    rescale_grad: gradient multiplier :math:`s` > 0.
    clip_gradient: element-wise clipping bound :math:`c` > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights and state for float16/bfloat16.

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    Zeiler, `ADADELTA: An Adaptive Learning Rate Method
    <https://arxiv.org/abs/1212.5701>`_, 2012; Apache MXNet 2.0
    ``mxnet.optimizer.AdaDelta``.
  """
  common = base.Base.of(locals())
  parts = [*common.preprocess(),
           utils.keep_dtypes(optax.scale_by_adadelta(rho, epsilon), rho, epsilon),
           *common.rate()]
  return assembly.finish(parts, "adadelta", multi_precision=multi_precision,
                         squares=True)


@_links.optimizer(hints=v.MXNET_HINTS, declared={"learning_rate": _links.POSITIVE_RATE})
def ftrl(
    learning_rate: optax.ScalarOrSchedule = 0.1,
    *,
    lamda1: float = 0.01,
    beta: float = 1.0,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    multi_precision: bool = False,
) -> optax.GradientTransformation:
  r"""FTRL-proximal as Apache MXNet implements it (``mx.optimizer.Ftrl``).

  With :math:`u_t = \mathrm{clip}(s\,g_t, -c, c)` (no weight decay added to the
  gradient: ``wd`` is the L2 term of the weight formula):

  .. math::

    n_t &= n_{t-1} + u_t^2, \qquad
    z_t = z_{t-1} + u_t - \frac{\sqrt{n_t} - \sqrt{n_{t-1}}}{\alpha_t}\,w_{t-1} \\
    w_t &= -\frac{\mathrm{sign}(z_t)\max(|z_t| - \lambda_1, 0)}
               {(\beta + \sqrt{n_t})/\alpha_t + \lambda}

  with :math:`z_0 = n_0 = 0`, :math:`\lambda_1` = ``lamda1`` and
  :math:`\lambda` = ``wd``. The weights are computed from the state, so the
  first update replaces the initial weights; the returned update is
  :math:`w_t - w_{t-1}`.

  The chain is ``scale(s), clip(c)`` then :func:`ftrl_proximal` ``(lr, lamda1,
  beta, wd, lr_mult=..., wd_mult=...)``: the learning rate (with ``lr_mult``)
  and ``wd`` (with ``wd_mult``) enter the rule itself.

  A gradient leaf may be a row-sparse :class:`~jax.experimental.sparse.BCOO`
  (see :mod:`lars_optax.sparse`), as MXNet's row-sparse FTRL kernel takes
  it: only the rows in the gradient are updated (weight, :math:`z` and
  :math:`n`), in O(rows), and the update comes back row-sparse. This is not
  the dense step, which rewrites every weight from its state: an absent row
  keeps its weight here, as in MXNet.

  Args:
    learning_rate: :math:`\alpha_t` > 0, a scalar or an optax schedule.
    lamda1: L1 coefficient :math:`\lambda_1` >= 0 (MXNet's spelling).
    beta: :math:`\beta` >= 0.
    wd: L2 coefficient :math:`\lambda` >= 0.
    rescale_grad: gradient multiplier :math:`s` > 0.
    clip_gradient: element-wise clipping bound :math:`c` > 0, or None.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    multi_precision: float32 master weights and state for float16/bfloat16.

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    McMahan et al., `Ad Click Prediction: a View from the Trenches
    <https://doi.org/10.1145/2487575.2488200>`_, KDD 2013; Apache MXNet 2.0
    ``mxnet.optimizer.Ftrl``.
  """
  common = base.Base.of(locals())
  parts = [*common.preprocess(decay=False),
           unchecked_ftrl_proximal(learning_rate, lamda1=lamda1, beta=beta, weight_decay=wd,
                                   lr_mult=lr_mult, wd_mult=wd_mult)]
  return assembly.finish(parts, "ftrl", multi_precision=multi_precision,
                         squares=True, row_sparse=True)
