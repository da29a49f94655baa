"""LANS as MXNet implements it: :func:`lans`, its links :func:`scale_by_lans` and
:func:`normalize_per_leaf`."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax import GradientTransformation

from lars_optax import _validation as v
from lars_optax import _mxnet_base as base
from lars_optax import _assembly as assembly
from lars_optax import _links, _ratios
from lars_optax import _masks as masks
from lars_optax import _utils as utils
from lars_optax import _stacked as stacked_mod

__all__ = ["NormalizePerLeafState", "ScaleByLansState", "lans", "normalize_per_leaf",
           "scale_by_lans"]


class NormalizePerLeafState(NamedTuple):
  """State of :func:`normalize_per_leaf` when some leaf is stacked.

  Attributes:
    layers: per leaf None (not stacked) or an int8 array of shape
      ``shape[:k]``: only its shape is read, to keep the layer axes found in
      ``init`` for ``update``. Without stacked leaves the state is
      :class:`optax.EmptyState`.
  """

  layers: tuple[Any, ...]


def unchecked_normalize_per_leaf(
    *,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
) -> GradientTransformation:
  r"""Divides each leaf's update by its own norm (LANS's gradient normalisation).

  .. math::

    u \leftarrow \frac{u}{\|u\|}, \qquad u \leftarrow 0 \text{ if } \|u\| = 0,

  the norm taken over the whole leaf (over each layer of a stacked leaf) in
  float32 (float64 for float64 leaves).
  MXNet's LANS divides by a zero norm and gets NaN, which then stays in its
  moments for good; here an all-zero gradient stays zero. A positive factor
  in front (``rescale_grad``) cancels out.

  Args:
    axis_name: the mesh axis the params are split over (``shard_map``/``pmap``), or
      per-leaf rules; see "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers, one ratio per layer; see
      "Common arguments" in docs/optimizers.md.

  Returns:
    A :class:`optax.GradientTransformation`; its state is
    :class:`optax.EmptyState`, or :class:`NormalizePerLeafState` when a leaf
    is stacked.

  References:
    Zheng et al., `Accelerated Large Batch Optimization of BERT Pretraining in
    54 minutes <https://arxiv.org/abs/2006.13484>`_, 2020 (LANS); Apache MXNet
    2.0 ``mxnet.optimizer.LANS``.
  """

  def init_fn(params):
    ks = stacked_mod.resolve(stacked, params)
    stacked_mod.resolve_axis_names(axis_name, params, ks)
    markers = stacked_mod.layer_markers(params, ks)
    return NormalizePerLeafState(markers) if markers else optax.EmptyState()

  def update_fn(updates, state, params=None):
    del params
    flat, treedef = jax.tree.flatten(updates)
    ks = stacked_mod.axes_from_markers(getattr(state, "layers", ()), len(flat))
    squares = stacked_mod.layer_sq_norms([(u,) for u in flat], ks,
                                         stacked_mod.resolve_axis_names(axis_name, updates, ks))
    out = []
    for u, (s,) in zip(flat, squares):
      n = stacked_mod.per_layer(jnp.sqrt(s), u)
      out.append(utils.safe_divide(u.astype(n.dtype), n).astype(u.dtype))
    return jax.tree.unflatten(treedef, out), state

  return GradientTransformation(init_fn, update_fn)


normalize_per_leaf = _links.public_link(unchecked_normalize_per_leaf)


@_ratios.ratio_state
class ScaleByLansState(NamedTuple):
  """State of :func:`scale_by_lans`.

  Attributes:
    count: number of updates done so far (int32).
    mu: Adam's first moment, like the params.
    nu: Adam's second moment, like the params.
    trust_ratio: per leaf, the ratio of the momentum part at the last step
      (as in :class:`ScaleByLarsTrustRatioState`; what :func:`trust_ratios`
      returns).
    grad_trust_ratio: per leaf, the ratio of the gradient part.
    layer_trust_ratio, layer_grad_trust_ratio: the per-layer ratios of
      stacked leaves, as in :class:`ScaleByLarsTrustRatioState`.
  """

  count: jax.Array  # type: ignore[assignment]
  mu: optax.Updates
  nu: optax.Updates
  trust_ratio: jax.Array
  grad_trust_ratio: jax.Array
  layer_trust_ratio: tuple[Any, ...] = ()
  layer_grad_trust_ratio: tuple[Any, ...] = ()


def unchecked_scale_by_lans(
    b1: float = 0.9,
    *,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.0,
    wd_mult: masks.LeafValues = None,
    lower_bound: float | None = None,
    upper_bound: float | None = None,
    skip: masks.MaskLike = None,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
) -> GradientTransformation:
  r"""LANS's scaling: Nesterov-style Adam with a trust ratio on each of its two parts.

  For every leaf :math:`w` with incoming (normalised) gradient :math:`\hat g`,
  at step :math:`t`:

  .. math::

    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\,\hat g, \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2)\,\hat g^2 \\
    d_t &= \sqrt{v_t / (1 - \beta_2^t)} + \epsilon \\
    c_m &= \frac{m_t / (1 - \beta_1^t)}{d_t} + \lambda w, \qquad
    c_g = \frac{\hat g}{d_t} + \lambda w \\
    r_1 &= \min(\max(\|w\|, l), h), \qquad
    \rho_m = \frac{r_1}{\|c_m\|}, \qquad \rho_g = \frac{r_1}{\|c_g\|} \\
    \text{update} &= \beta_1\,\rho_m\,c_m + (1 - \beta_1)\,\rho_g\,c_g

  with :math:`\lambda` = ``weight_decay`` times the leaf's ``wd_mult``, and
  each ratio 1 where its norms are 0 or not finite, or for skipped leaves
  (as in :func:`scale_by_lamb_trust_ratio`). This is MXNet's fused
  ``multi_lans_update`` (its default path; its plain-Python ``step`` adds
  :math:`\lambda w` to :math:`c_g` after the weight has already taken the
  momentum part, a different rule when :math:`\lambda > 0`). Precede it with
  :func:`normalize_per_leaf` (and a clip), follow it with the learning rate.

  Args:
    b1: :math:`\beta_1` in [0, 1).
    b2: :math:`\beta_2` in [0, 1).
    eps: :math:`\epsilon` >= 0.
    weight_decay: :math:`\lambda` >= 0, added to both parts (decoupled:
      not in the moments).
    wd_mult: per-leaf multipliers of ``weight_decay`` by leaf name.
    lower_bound: :math:`l` >= 0, or None.
    upper_bound: :math:`h` > 0, or None.
    skip: leaves whose two ratios are 1 (see :func:`scale_by_lamb_trust_ratio`).
    axis_name: the mesh axis the params are split over (``shard_map``/``pmap``), or
      per-leaf rules; see "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers, one ratio per layer; see
      "Common arguments" in docs/optimizers.md.

  Returns:
    A :class:`optax.GradientTransformation` with a :class:`ScaleByLansState`;
    ``update`` requires ``params``.

  References:
    Zheng, Lin, Zha and Li, `Accelerated Large Batch Optimization of BERT
    Pretraining in 54 minutes <https://arxiv.org/abs/2006.13484>`_, 2020;
    Apache MXNet 2.0 ``mxnet.optimizer.LANS``.
  """
  name = "scale_by_lans"

  def init_fn(params: optax.Params) -> ScaleByLansState:
    ks = _ratios.ratio_axes(params, skip, stacked)
    utils.warn_float16(params, name, utils.DEGRADES)
    masks.resolve_leaf_values(wd_mult, params, "wd_mult", check_names=True, layer_axes=ks)
    stacked_mod.resolve_axis_names(axis_name, params, ks)
    # (Separate buffers for the two ratios: a step that donates the state
    # cannot donate one buffer twice.)
    return ScaleByLansState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params),
                            jax.tree.map(jnp.zeros_like, params), _ratios.ratio_vector(params),
                            _ratios.ratio_vector(params), _ratios.layer_ratios(params, ks),
                            _ratios.layer_ratios(params, ks))

  def update_fn(updates, state, params=None):
    params, ks, skipped = _ratios.update_inputs(updates, state, params, skip, name)
    mults = masks.resolve_leaf_values(wd_mult, params, "wd_mult", layer_axes=ks)
    mu, nu = utils.moments(updates, state.mu, state.nu, b1, b2)
    count = optax.safe_int32_increment(state.count)
    flat_g, treedef = jax.tree.flatten(updates)
    flat_p, flat_m, flat_n = (treedef.flatten_up_to(x) for x in (params, mu, nu))
    correction = _ratios.bias_corrections(count, b1, b2)

    parts = []  # per leaf: (c_m, c_g) in float32 or wider
    for g, p, m, n, c in zip(flat_g, flat_p, flat_m, flat_n, mults):
      dt = utils.norm_dtype(m.dtype)
      c1, c2 = correction(dt)
      d = jnp.sqrt(n.astype(dt) / c2) + utils.cast(eps, dt)
      rate = utils.times(weight_decay, c)
      decay = 0 if utils.is_const(rate, 0) else (
          stacked_mod.per_layer(utils.cast(rate, dt), p) * p.astype(dt))
      parts.append((utils.divide_by(m.astype(dt) / c1, d, eps) + decay,
                    utils.divide_by(g.astype(dt), d, eps) + decay))
    squares = stacked_mod.layer_sq_norms(
        [None if s else (p, cm, cg) for p, (cm, cg), s in zip(flat_p, parts, skipped)],
        ks, stacked_mod.resolve_axis_names(axis_name, params, ks))
    pairs = _ratios.packed_map(
        lambda w2, m2, g2: (_ratios.bounded_ratio(w2, m2, lower_bound, upper_bound),
                            _ratios.bounded_ratio(w2, g2, lower_bound, upper_bound)),
        squares)
    ratios_m, ratios_g = pairs if isinstance(pairs, tuple) else (pairs, pairs)
    out = []
    for g, (cm, cg), rm, rg in zip(flat_g, parts, ratios_m, ratios_g):
      dt = cm.dtype
      wm = utils.cast(b1, dt) if rm is None else (
          utils.cast(b1, dt) * stacked_mod.per_layer(rm.astype(dt), cm))
      wg = utils.cast(1 - b1, dt) if rg is None else (
          utils.cast(1 - b1, dt) * stacked_mod.per_layer(rg.astype(dt), cg))
      out.append((wm * cm + wg * cg).astype(g.dtype))
    return jax.tree.unflatten(treedef, out), ScaleByLansState(
        count, mu, nu, _ratios.ratio_vector(params, ratios_m),
        _ratios.ratio_vector(params, ratios_g), _ratios.layer_ratios(params, ks, ratios_m),
        _ratios.layer_ratios(params, ks, ratios_g))

  return GradientTransformation(init_fn, update_fn)


scale_by_lans = _links.public_link(unchecked_scale_by_lans, relations=_ratios.bound_order,
                                   matches=("skip",), same_structure=True)


@_links.optimizer(hints=v.MXNET_HINTS, relations=_ratios.bound_order)
def lans(
    learning_rate: optax.ScalarOrSchedule = 0.001,
    *,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-6,
    lower_bound: float | None = None,
    upper_bound: float | None = None,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    skip: masks.MaskLike = None,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    wd_skip: masks.MaskLike = None,
    multi_precision: bool = False,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
    group_by_shape: bool = False,
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
    wd_skip: leaves that get no weight decay (True = exempt); see "Common
      arguments" in docs/optimizers.md.
    multi_precision: float32 master weights and state for float16/bfloat16.
      Without it, ``init`` warns (:class:`lars_optax.LowPrecisionWarning`)
      for float16 params: :math:`v_t` underflows in float16.
    axis_name: the mesh axis the params are split over (``shard_map``/``pmap``), or
      per-leaf rules; see "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers, one ratio per layer; see
      "Common arguments" in docs/optimizers.md.
    group_by_shape: run the step on the leaves stacked by shape, as
      :func:`lars_optax.lamb` does (see "Common arguments" in
      docs/optimizers.md). Not with ``axis_name``.

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    Zheng, Lin, Zha and Li, `Accelerated Large Batch Optimization of BERT
    Pretraining in 54 minutes <https://arxiv.org/abs/2006.13484>`_, 2020;
    Apache MXNet 2.0 ``mxnet.optimizer.LANS``.
  """
  decay_mult = base.wd_mult_with_skip(wd_mult, wd_skip)

  def layer_wise(skip, wd_mult, lr_mult, stacked):
    return [unchecked_normalize_per_leaf(axis_name=axis_name, stacked=stacked),
            *base.preprocess(1.0, clip_gradient, 0.0, None),
            unchecked_scale_by_lans(beta1, b2=beta2, eps=epsilon, weight_decay=wd, wd_mult=wd_mult,
                                    lower_bound=lower_bound, upper_bound=upper_bound, skip=skip,
                                    axis_name=axis_name, stacked=stacked),
            assembly.learning_rate_part(learning_rate), *assembly.lr_mult_part(lr_mult, stacked)]

  return assembly.finish(
      [], "lans", layer_wise=layer_wise, group_by_shape=group_by_shape,
      masks_by_arg={"skip": skip}, values_by_arg={"wd_mult": decay_mult, "lr_mult": lr_mult},
      stacked=stacked,
      multi_precision=multi_precision)
