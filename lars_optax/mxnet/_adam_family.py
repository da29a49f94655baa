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

They are built from the links of :mod:`lars_optax.mxnet._adam_links`
(:func:`scale_by_mxnet_adam`, :func:`scale_by_adam_moments`,
:func:`scale_by_bias_correction`, ...), where optax has no exact equivalent.

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


import optax

from lars_optax import _validation as v
from lars_optax import _assembly as assembly
from lars_optax import _mxnet_base as base
from lars_optax import _links
from lars_optax import _utils as utils
from lars_optax import _masks as masks
from lars_optax._transforms import unchecked_add_decayed_weights_per_leaf
from lars_optax.mxnet._adam_links import (
    unchecked_scale_by_adam_moments,
    unchecked_scale_by_bias_correction,
    unchecked_scale_by_ftml,
    unchecked_scale_by_mxnet_adam,
    unchecked_scale_by_mxnet_adamax,
    unchecked_scale_by_mxnet_belief,
    unchecked_scale_by_mxnet_nadam,
)

__all__ = ["adabelief", "adam", "adamax", "adamw", "ftml", "nadam"]


# --------------------------------------------------------------------------
# Optimizers
# --------------------------------------------------------------------------

@_links.optimizer(hints=v.MXNET_HINTS)
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
  common = base.Base.of(locals())
  parts = [*common.preprocess(),
           unchecked_scale_by_mxnet_adam(beta1, b2=beta2, eps=epsilon,
                                         initial_count=begin_num_update), *common.rate()]
  return assembly.finish(parts, "adam", multi_precision=multi_precision,
                         lazy=lazy_update, complex_params=clip_gradient is None)


@_links.optimizer(hints=v.MXNET_HINTS)
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
  common = base.Base.of(locals())
  parts = [*common.preprocess(decay=False),
           unchecked_scale_by_adam_moments(beta1, b2=beta2, eps=epsilon)]
  if not utils.is_const(wd, 0):
    parts.append(unchecked_add_decayed_weights_per_leaf(wd, multipliers=wd_mult,
                                                        arg_name="wd_mult"))
  if correct_bias:
    parts.append(unchecked_scale_by_bias_correction(beta1, b2=beta2,
                                                     initial_count=begin_num_update))
  return assembly.finish([*parts, *common.rate()], "adamw", multi_precision=multi_precision)


@_links.optimizer(hints=v.MXNET_HINTS)
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
  common = base.Base.of(locals())
  parts = [*common.preprocess(), unchecked_scale_by_mxnet_adamax(beta1, b2=beta2, eps=epsilon),
           unchecked_scale_by_bias_correction(beta1, b2=None, initial_count=begin_num_update),
           *common.rate()]
  return assembly.finish(parts, "adamax", multi_precision=multi_precision)


@_links.optimizer(hints=v.MXNET_HINTS)
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
  common = base.Base.of(locals())
  parts = [*common.preprocess(),
           unchecked_scale_by_mxnet_nadam(beta1, b2=beta2, eps=epsilon,
                                          schedule_decay=schedule_decay,
                                          initial_count=begin_num_update), *common.rate()]
  return assembly.finish(parts, "nadam", multi_precision=multi_precision)


@_links.optimizer(hints=v.MXNET_HINTS)
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
  common = base.Base.of(locals())
  # wd before clipping, unlike MXNet's other optimizers
  parts = [*common.preprocess(clip=False), *base.preprocess(1.0, clip_gradient, 0.0, None),
           unchecked_scale_by_mxnet_belief(beta1, b2=beta2, eps=epsilon)]
  if correct_bias:
    parts.append(unchecked_scale_by_bias_correction(beta1, b2=beta2,
                                                     initial_count=begin_num_update))
  return assembly.finish([*parts, *common.rate()], "adabelief", multi_precision=multi_precision)


@_links.optimizer(hints=v.MXNET_HINTS, declared={"learning_rate": _links.POSITIVE_RATE})
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
  common = base.Base.of(locals())
  parts = [*common.preprocess(),
           unchecked_scale_by_ftml(learning_rate, b1=beta1, b2=beta2, eps=epsilon,
                                   lr_mult=lr_mult, initial_count=begin_num_update)]
  return assembly.finish(parts, "ftml", multi_precision=multi_precision)
