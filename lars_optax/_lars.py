"""LARS as MXNet and TensorFlow implement it: :func:`lars` and :func:`tf_lars`.

The LARS of timm, optax, BYOL and SimCLR are in :mod:`lars_optax.porting`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import optax

from lars_optax import _links
from lars_optax import _mxnet_base as base
from lars_optax import _assembly as assembly
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax import _stacked as stacked_mod
from lars_optax._momentum import unchecked_mxnet_momentum
from lars_optax._trust_ratio import unchecked_scale_by_lars_trust_ratio

__all__ = ["lars", "tf_lars"]


@_links.optimizer(hints=v.LARS_HINTS)
def lars(
    learning_rate: optax.ScalarOrSchedule = 0.1,
    *,
    momentum: float = 0.0,
    eta: float = 0.001,
    epsilon: float = 1e-8,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    skip: masks.MaskLike = masks.MXNET_DEFAULT,
    lr_mult: masks.LeafValues = None,
    wd_mult: masks.LeafValues = None,
    wd_skip: masks.MaskLike = None,
    multi_precision: bool = False,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
    group_by_shape: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""MXNet's LARS, not :func:`optax.lars`: its ratio divides by ‖g‖ + wd‖w‖ + ε.

  LARS as Apache MXNet implements it (``mx.optimizer.LARS``). It differs
  from :func:`optax.lars` in rule and defaults: the trust ratio divides by
  ``‖g‖ + wd‖w‖ + ε`` where optax divides by the norm of the decayed update
  ``‖g + wd·w‖`` (with ``eps=0``), biases and norm parameters are left out
  of the ratio by name by default (optax: every leaf), and ``momentum``
  defaults to 0 (optax: 0.9). :func:`lars_optax.porting.optax_lars` is
  optax's rule with optax's arguments; docs/porting.md lists the other
  libraries' LARS.

  Per leaf :math:`w` with gradient :math:`g`, :math:`s` = ``rescale_grad``,
  :math:`c` = ``clip_gradient``, :math:`\lambda` = ``wd``,
  :math:`\mu` = ``momentum``:

  .. math::

    g_r &= s\,g \\
    \rho &= \frac{\eta\,\|w\|}{\|g_r\| + \lambda\|w\| + \epsilon}
      \quad (1 \text{ for skipped leaves, or when a norm is 0 or not finite}) \\
    u &= \mathrm{clip}(g_r, -c, c) + \lambda w \\
    m_t &= \mu\,m_{t-1} - \alpha_t\,\rho\,u, \qquad w_t = w_{t-1} + m_t

  (with :math:`\mu = 0`: :math:`w_t = w_{t-1} - \alpha_t\rho u`, no state). The
  ratio is taken from the rescaled, *unclipped* gradient; weight decay is
  added after clipping. By default leaves whose name ends in ``gamma``,
  ``beta`` or ``bias`` are skipped, as in MXNet.

  ``skip`` covers the trust ratio only: a skipped leaf keeps
  :math:`\rho = 1` but still gets the weight decay :math:`\lambda w` (as in
  MXNet). ``wd_skip`` covers the weight decay: its leaves get
  :math:`\lambda = 0`, in the update and in the ratio. The usual recipe
  exempts biases and norm parameters from both:

  >>> import lars_optax
  >>> tx = lars_optax.lars(1.0, momentum=0.9, wd=1e-4, skip="flax", wd_skip="flax")

  The chain is ``scale_by_lars_trust_ratio(chain(clip, add_decayed_weights_per_leaf),
  grad_scale=rescale_grad)`` followed by :func:`mxnet_momentum`. The per-leaf
  ratios of the last step are in the state: :func:`lars_optax.trust_ratios`.

  The LARS of timm, optax, BYOL and SimCLR differ in where the rate meets
  the buffer, which norm the ratio divides by and LARC's clip: each has its
  constructor in :mod:`lars_optax.porting`, in its own words.

  Args:
    learning_rate: :math:`\alpha_t`, a scalar or an optax schedule (called with
      the number of updates done so far, 0 at the first update).
    momentum: :math:`\mu` in [0, 1).
    eta: LARS coefficient :math:`\eta` >= 0.
    epsilon: added to the ratio's denominator, >= 0.
    wd: weight decay :math:`\lambda` >= 0 (in the ratio and in the update).
    rescale_grad: gradient multiplier :math:`s` > 0 (e.g. 1 / batch size).
    clip_gradient: element-wise clipping bound :math:`c` > 0, or None.
    skip: leaves that keep ratio 1: a preset name (default ``"mxnet"``, i.e.
      :data:`lars_optax.masks.MXNET_SKIP`; also ``"flax"``, ``"haiku"``), a
      :class:`~lars_optax.masks.Mask`, a callable returning a bool pytree, a
      bool pytree, or None (no leaf skipped). A mask built from names
      (``by_suffix("bias")``, ...) must match: ``init`` raises a ValueError
      when one of its names matches no parameter (presets and
      ``mask.optional()`` may match nothing). Pass a callable mask through
      ``static_args`` when wrapping with ``optax.inject_hyperparams``. When
      the default is in force and the names look like a Flax, Haiku or
      Equinox model's (norm ``scale``/``offset``/1-d ``weight``, Haiku's
      ``b``), ``init`` warns and names the preset to use; MXNet's rule still
      applies, and ``skip="mxnet"`` given explicitly does not warn.
    lr_mult: per-leaf learning-rate multipliers, by leaf name (a dict, or
      ``(mask, value)`` rules; :data:`lars_optax.masks.LeafValues`).
    wd_mult: per-leaf multipliers of ``wd``, in the update and in the ratio.
    wd_skip: leaves that get no weight decay (True = exempt); see "Common
      arguments" in docs/optimizers.md.
    multi_precision: keep float32 master weights and state for float16 and
      bfloat16 params (:func:`lars_optax.multi_precision`). The ratio's
      :math:`\|w\|` is then taken from the master (MXNet takes it from the
      float16 weight; the two differ by float16 rounding).
    axis_name: the mesh axis the params are split over (``shard_map``/``pmap``), or
      per-leaf rules; see "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers, one ratio per layer; see
      "Common arguments" in docs/optimizers.md.
    group_by_shape: run the step on the leaves stacked by shape (see
      "Common arguments" in docs/optimizers.md): the same numbers with fewer
      kernels, a win on a GPU; on a CPU the stacking costs more than it
      saves. Not with ``axis_name``.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`.

  Raises:
    ValueError: for a hyperparameter out of its range (named).

  References:
    You, Gitman and Ginsburg, `Large Batch Training of Convolutional Networks
    <https://arxiv.org/abs/1708.03888>`_, 2017; Apache MXNet 2.0
    ``mxnet.optimizer.LARS``.
  """
  decay_mult = base.wd_mult_with_skip(wd_mult, wd_skip)

  def layer_wise(skip, wd_mult, lr_mult, stacked):
    # The ratio is taken from the rescaled gradient before clipping, so the
    # rescale is the ratio transformation's own and the rest runs inside it.
    inner = base.preprocess(1.0, clip_gradient, wd, wd_mult, stacked)
    ratio = unchecked_scale_by_lars_trust_ratio(
        optax.chain(*inner) if inner else None, trust_coefficient=eta, ratio_weight_decay=wd,
        eps=epsilon, skip=skip, grad_scale=rescale_grad, wd_mult=wd_mult,
        axis_name=axis_name, stacked=stacked)
    return [ratio, *assembly.lr_mult_part(lr_mult, stacked),
            unchecked_mxnet_momentum(learning_rate, momentum=momentum)]

  return assembly.finish(
      [], "lars", layer_wise=layer_wise, group_by_shape=group_by_shape,
      masks_by_arg={"skip": skip}, values_by_arg={"wd_mult": decay_mult, "lr_mult": lr_mult},
      stacked=stacked,
      multi_precision=multi_precision, complex_params=clip_gradient is None)


def _skip_list(name: str, skip_list: Any) -> None:
  if isinstance(skip_list, (str, bytes)):
    raise TypeError(f"{name}: expected a list of strings, got the single "
                    f"string {skip_list!r}; write [{skip_list!r}].")
  if not isinstance(skip_list, Iterable) or isinstance(skip_list, Iterator):
    # (an iterator would be used up by this check)
    raise TypeError(f"{name}: expected a list of strings, got {skip_list!r}.")
  bad = [s for s in skip_list if not isinstance(s, str) or not s]
  if bad:
    raise TypeError(f"{name}: expected non-empty strings, got {bad!r}.")


def _tf_relations(*, skip_list: Any, skip: Any, **_: Any) -> None:
  if skip_list is not None and skip is not None:
    raise ValueError("skip_list: give skip_list or skip, not both; to skip the leaves "
                     "of both, pass one mask combined with |, e.g. "
                     "skip=lars_optax.masks.FLAX_SKIP | lars_optax.by_substring('embedding').")


@_links.optimizer(hints=v.TF_HINTS, declared={"skip_list": _links.Arg(_skip_list)},
                relations=_tf_relations)
def tf_lars(
    learning_rate: optax.ScalarOrSchedule,
    *,
    momentum: float = 0.9,
    weight_decay: float = 0.0001,
    eeta: float = 0.001,
    epsilon: float = 0.0,
    skip_list: Sequence[str] | None = None,
    use_nesterov: bool = False,
    skip: masks.MaskLike = None,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
    group_by_shape: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""LARS as TensorFlow implements it (``tf.contrib.opt.LARSOptimizer``).

  Per leaf :math:`w` with gradient :math:`g`, :math:`\lambda` =
  ``weight_decay``, :math:`\mu` = ``momentum``:

  .. math::

    \rho &= \frac{\eta\,\|w\|}{\|g\| + \lambda\|w\| + \epsilon}
      \quad (1 \text{ for skipped leaves, or when a norm is 0}) \\
    a_t &= \mu\,a_{t-1} + g \\
    w_t &= w_{t-1} - \alpha_t\,\rho\,a_t
      \qquad \text{or, with Nesterov,} \qquad
    w_t = w_{t-1} - \alpha_t\,\rho\,(g + \mu\,a_t).

  Weight decay enters only the ratio: it is not added to the gradient (as in
  the original and its test). So ``skip`` (or ``skip_list``) covers both the
  ratio and the weight decay: a skipped leaf gets :math:`\rho = 1`, and with
  it :math:`\lambda` has no effect on that leaf, which takes plain momentum
  steps :math:`w_t = w_{t-1} - \alpha_t a_t`. There is no ``wd_skip``, as
  there is no decay term outside the ratio. The learning rate multiplies the
  accumulated momentum, not its inputs. The chain is
  ``scale_by_lars_trust_ratio(optax.trace(momentum, use_nesterov))`` followed
  by :func:`optax.scale_by_learning_rate`.

  Args:
    learning_rate: :math:`\alpha_t`, a scalar or an optax schedule (required, as
      in TF).
    momentum: :math:`\mu` in [0, 1).
    weight_decay: :math:`\lambda` >= 0, used in the trust ratio only.
    eeta: LARS coefficient :math:`\eta` >= 0.
    epsilon: added to the ratio's denominator, >= 0.
    skip_list: strings; a leaf whose name contains any of them keeps ratio 1
      (TF's argument). Each must be contained in some parameter's name:
      ``init`` raises a ValueError naming the entry otherwise (a typo would
      skip nothing). For an entry that may match nothing (``"bias"`` for a
      model without biases, such as Gemma), pass
      ``skip=lars_optax.by_substring("bias").optional()`` instead.
    use_nesterov: Nesterov momentum.
    skip: leaves that keep ratio 1, as :func:`lars` takes it: a preset name
      (``"flax"``, ``"haiku"``, ``"equinox"``, ``"mxnet"``), a
      :class:`~lars_optax.masks.Mask`, a callable returning a bool pytree or a
      bool pytree. ``skip_list=[...]`` is ``skip=by_substring(...)``; give one
      of the two, not both (a ValueError; combine masks with ``|`` instead).
      Default: no leaf skipped, as in TF.
    axis_name: the mesh axis the params are split over (``shard_map``/``pmap``), or
      per-leaf rules; see "Common arguments" in docs/optimizers.md.
    stacked: the leaves that hold a stack of layers, one ratio per layer; see
      "Common arguments" in docs/optimizers.md.
    group_by_shape: run the step on the leaves stacked by shape, as
      :func:`lars_optax.lars` does. Not with ``axis_name``.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`.

  Raises:
    ValueError: for ``momentum < 0`` or ``weight_decay < 0`` (as TF does), and
      for any other out-of-range or non-finite hyperparameter; for both
      ``skip_list`` and ``skip``; in ``init``, for a ``skip_list`` entry that
      no parameter name contains.

  References:
    You, Gitman and Ginsburg, `Large Batch Training of Convolutional Networks
    <https://arxiv.org/abs/1708.03888>`_, 2017; TensorFlow
    ``tf.contrib.opt.LARSOptimizer``.
  """
  use_nesterov = bool(use_nesterov)
  names: list[tuple[str, masks.MaskLike, str | None]] = []  # (skip's: its declaration's)
  if skip_list is not None:
    skip_list = list(skip_list)
  if skip_list:
    skip = masks.by_substring(*skip_list)
    args = ", ".join(repr(s) for s in skip_list)
    hint = ("Fix the entry or leave it out; for an entry that may match nothing "
            "(e.g. 'bias' in a model without biases), pass "
            f"skip=lars_optax.by_substring({args}).optional() instead of skip_list.")
    names = [("skip_list", skip, hint)]

  def layer_wise(skip, stacked):
    return [unchecked_scale_by_lars_trust_ratio(
                utils.keep_dtypes(optax.trace(decay=momentum, nesterov=use_nesterov), momentum),
                trust_coefficient=eeta, ratio_weight_decay=weight_decay, eps=epsilon, skip=skip,
                axis_name=axis_name, stacked=stacked),
            assembly.learning_rate_part(learning_rate)]

  return assembly.finish(
      [], "tf_lars", layer_wise=layer_wise, group_by_shape=group_by_shape,
      masks_by_arg={"skip": skip}, stacked=stacked, names=names, complex_params=True)
