"""LAMB as MXNet implements it: :func:`lamb`, and Adam's direction :func:`scale_by_lamb_adam`.

The LAMB of timm, Keras, optax and ALBERT are in :mod:`lars_optax.porting`.
"""

from __future__ import annotations


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
from lars_optax._transforms import unchecked_add_decayed_weights_per_leaf
from lars_optax._trust_ratio import unchecked_scale_by_lamb_trust_ratio

__all__ = ["lamb", "scale_by_lamb_adam"]


def unchecked_scale_by_lamb_adam(
    b1: float = 0.9,
    *,
    b2: float = 0.999,
    eps: float = 1e-6,
    bias_correction: bool = True,
    grad_averaging: bool = True,
    eps_root: float = 0.0,
) -> GradientTransformation:
  r"""Adam's direction as LAMB takes it, with or without bias correction.

  .. math::

    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, u_t, \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, u_t^2 \\
    \text{update} &= \frac{m_t / (1 - \beta_1^t)}
      {\sqrt{v_t / (1 - \beta_2^t) + \epsilon_r} + \epsilon}
    \qquad \text{or, without bias correction,} \qquad
    \frac{m_t}{\sqrt{v_t + \epsilon_r} + \epsilon},

  with :math:`\epsilon_r` = ``eps_root`` (optax's, default 0). With
  ``grad_averaging=False`` (NVIDIA's and timm's option) the first moment adds
  the whole update, :math:`m_t = \beta_1 m_{t-1} + u_t`; the bias correction
  is unchanged.

  With bias correction this is :func:`optax.scale_by_adam` (epsilon outside
  the square root, after the correction), except where the denominator is 0
  (``eps=0`` and :math:`v_t = 0`: every gradient of that entry so far was 0):
  the update is 0 there, where optax and MXNet's LAMB divide 0 by 0 and put
  NaN into the weight. ``m`` and ``v`` keep the parameter dtype; the division
  is done in float32 or wider. ``init`` warns
  (:class:`LowPrecisionWarning`) for float16 params, where :math:`v_t`
  underflows.

  Args:
    b1: :math:`\beta_1` in [0, 1).
    b2: :math:`\beta_2` in [0, 1).
    eps: :math:`\epsilon` >= 0.
    bias_correction: divide the moments by :math:`1 - \beta^t` (MXNet's
      ``bias_correction``).
    grad_averaging: weigh the update by :math:`1 - \beta_1` in the first
      moment (default, as in Adam); False adds it whole (timm's and NVIDIA
      apex's ``grad_averaging``).
    eps_root: :math:`\epsilon_r` >= 0, added inside the square root
      (:func:`optax.scale_by_adam`'s ``eps_root``).

  Returns:
    A :class:`optax.GradientTransformation` with an
    :class:`optax.ScaleByAdamState`.

  References:
    Kingma and Ba, `Adam: A Method for Stochastic Optimization
    <https://arxiv.org/abs/1412.6980>`_, 2014; Apache MXNet 2.0
    ``mxnet.optimizer.LAMB``.
  """
  name = "scale_by_lamb_adam"

  def init_fn(params: optax.Params) -> optax.ScaleByAdamState:
    utils.warn_float16(params, name, utils.DEGRADES)
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32),
                                  mu=jax.tree.map(jnp.zeros_like, params),
                                  nu=jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    del params
    mu, nu = utils.moments(updates, state.mu, state.nu, b1, b2, grad_averaging=grad_averaging)
    count = optax.safe_int32_increment(state.count)
    corrections = _ratios.bias_corrections(count, b1, b2)

    def step(m, n):
      dt = utils.norm_dtype(m.dtype)
      rt = utils.real_dtype(dt)  # v holds |u|^2: real also for complex params
      m, n_ = m.astype(dt), jnp.real(n).astype(rt)
      if bias_correction:
        c1, c2 = corrections(rt)
        m, n_ = m / c1, n_ / c2
      if not utils.is_const(eps_root, 0):
        n_ = n_ + utils.cast(eps_root, rt)
      return utils.divide_by(m, jnp.sqrt(n_) + utils.cast(eps, rt), eps).astype(n.dtype)

    return jax.tree.map(step, mu, nu), optax.ScaleByAdamState(count, mu, nu)

  return GradientTransformation(init_fn, update_fn)


scale_by_lamb_adam = _links.public_link(unchecked_scale_by_lamb_adam, params="complex")


@_links.optimizer(hints=v.MXNET_HINTS, relations=_ratios.bound_order)
def lamb(
    learning_rate: optax.ScalarOrSchedule = 0.001,
    *,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-6,
    lower_bound: float | None = None,
    upper_bound: float | None = None,
    bias_correction: bool = True,
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
  r"""LAMB as Apache MXNet implements it (``mx.optimizer.LAMB``); with its defaults, optax.lamb's.

  Per leaf :math:`w` with gradient :math:`g_t`, :math:`s` = ``rescale_grad``,
  :math:`c` = ``clip_gradient``, :math:`\lambda` = ``wd`` (times the leaf's
  ``wd_mult``), :math:`l` = ``lower_bound``, :math:`h` = ``upper_bound``:

  .. math::

    u_t &= \mathrm{clip}(s\,g_t, -c, c) \\
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\,u_t, \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2)\,u_t^2 \\
    \Delta_t &= \frac{m_t / (1 - \beta_1^t)}{\sqrt{v_t / (1 - \beta_2^t)} + \epsilon}
      + \lambda w_{t-1}
      \qquad \left(\text{without bias correction: }
      \frac{m_t}{\sqrt{v_t} + \epsilon} + \lambda w_{t-1}\right) \\
    r_1 &= \min(\max(\|w_{t-1}\|, l), h), \qquad \rho = \frac{r_1}{\|\Delta_t\|} \\
    w_t &= w_{t-1} - \alpha_t\,\rho\,\Delta_t

  The weight decay is not in the moments: it is added to Adam's direction
  and so enters the ratio's denominator (as in :func:`optax.lamb`). The
  bounds clip the weight norm :math:`r_1` (left out when None), not the
  ratio. :math:`\rho = 1` when :math:`r_1 = 0` or
  :math:`\|\Delta_t\| = 0` (MXNet's rule; a zero-initialised layer without
  ``lower_bound`` takes a plain Adam step), when either norm is not finite
  (MXNet would give NaN), and for skipped leaves.

  MXNet applies the ratio to every parameter, and so does the default
  ``skip=None``. To exclude biases and normalisation parameters, pass a
  preset (``skip="flax"``, ``"haiku"``, ``"equinox"`` or ``"mxnet"``) or a
  mask (``skip=lars_optax.by_ndim(1)``). ``skip`` covers the trust ratio
  only: skipped leaves still get Adam's step and the weight decay.
  ``wd_skip`` (the same kinds of mask) covers the weight decay: its leaves
  get :math:`\lambda = 0`. BERT recipes exempt biases and norms from both:

  >>> import lars_optax
  >>> tx = lars_optax.lamb(1e-3, wd=0.01, skip="flax", wd_skip="flax")

  The chain is ``scale(s), clip(c)``,
  :func:`~lars_optax.scale_by_lamb_adam` ``(beta1, beta2, epsilon,
  bias_correction)``, :func:`~lars_optax.add_decayed_weights_per_leaf`
  ``(wd, wd_mult)``, :func:`~lars_optax.scale_by_lamb_trust_ratio`
  ``(lower_bound, upper_bound, skip)``, ``optax.scale_by_learning_rate(lr)``,
  then ``lr_mult``. The per-leaf ratios of the last step:
  :func:`lars_optax.trust_ratios`. Without bounds and masks, with bias
  correction and ``clip_gradient=None``, this is :func:`optax.lamb` (whose
  ``weight_decay`` is ``wd``), apart from the zero denominator below.

  MXNet's two LAMB kernels disagree with each other; this follows its
  default multi-tensor path (docs/verified.md says by how much they differ).
  The LAMB of timm, Keras, optax and ALBERT have their constructors in
  :mod:`lars_optax.porting`, in their own words.

  Args:
    learning_rate: :math:`\alpha_t`, a scalar or an optax schedule.
    beta1: :math:`\beta_1` in [0, 1).
    beta2: :math:`\beta_2` in [0, 1).
    epsilon: :math:`\epsilon` >= 0. With ``epsilon=0``, an entry whose
      gradient has been 0 at every step so far (:math:`v_t = 0`) gets a zero
      step rather than MXNet's (and optax's) 0/0 = NaN.
    lower_bound: :math:`l` >= 0 or None: the smallest weight norm the ratio uses.
    upper_bound: :math:`h` > 0 or None: the largest; ``lower_bound <=
      upper_bound``.
    bias_correction: divide the moments by :math:`1 - \beta^t`.
    wd: weight decay >= 0, added to Adam's direction (multiplied per leaf by
      ``wd_mult``).
    rescale_grad: gradient multiplier > 0.
    clip_gradient: element-wise clipping bound > 0, or None.
    skip: leaves whose ratio is 1 (default None: none, as in MXNet); a
      preset name, a :class:`~lars_optax.masks.Mask`, a callable returning a
      bool pytree, or a bool pytree.
    lr_mult: per-leaf learning-rate multipliers by leaf name.
    wd_mult: per-leaf multipliers of ``wd``.
    wd_skip: leaves that get no weight decay (True = exempt); see "Common
      arguments" in docs/optimizers.md.
    multi_precision: float32 master weights and state for float16/bfloat16
      (the ratio's :math:`\|w\|` is the master's, as in MXNet). Without it,
      ``init`` warns (:class:`lars_optax.LowPrecisionWarning`) for float16
      params: :math:`v_t` underflows in float16 (MXNet keeps float32 moments).
    axis_name: the mesh axis the params are split over (``shard_map``/``pmap``), or
      per-leaf rules; see "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers, one ratio per layer; see
      "Common arguments" in docs/optimizers.md.
    group_by_shape: run the step on the leaves stacked by shape (see
      "Common arguments" in docs/optimizers.md): the same numbers, with a
      few kernels and operations per group of leaves instead of per leaf, for
      unrolled models with many leaves. The state holds the moments of each
      group as one array. Not with ``axis_name``.

  Returns:
    An :class:`optax.GradientTransformation`.

  References:
    You et al., `Large Batch Optimization for Deep Learning: Training BERT in
    76 minutes <https://arxiv.org/abs/1904.00962>`_, ICLR 2020; Apache MXNet
    2.0 ``mxnet.optimizer.LAMB``.
  """
  common = base.Base.of(locals())
  decay_mult = base.wd_mult_with_skip(wd_mult, wd_skip)

  def layer_wise(skip, wd_mult, lr_mult, stacked):
    decay = ([] if utils.is_const(wd, 0) else
             [unchecked_add_decayed_weights_per_leaf(wd, multipliers=wd_mult, arg_name="wd_mult",
                                                     stacked=stacked)])
    return [unchecked_scale_by_lamb_adam(beta1, b2=beta2, eps=epsilon,
                                         bias_correction=bias_correction),
            *decay,
            unchecked_scale_by_lamb_trust_ratio(lower_bound=lower_bound, upper_bound=upper_bound,
                                                skip=skip, axis_name=axis_name, stacked=stacked),
            assembly.learning_rate_part(learning_rate), *assembly.lr_mult_part(lr_mult, stacked)]

  return assembly.finish(
      common.preprocess(decay=False), "lamb", layer_wise=layer_wise,
      group_by_shape=group_by_shape, masks_by_arg={"skip": skip},
      values_by_arg={"wd_mult": decay_mult, "lr_mult": lr_mult}, stacked=stacked,
      multi_precision=multi_precision, complex_params=clip_gradient is None)
