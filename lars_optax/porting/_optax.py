"""``optax.lars`` and ``optax.lamb`` with the library's options, in optax's words."""

from __future__ import annotations

from typing import Any

import optax
from optax import GradientTransformationExtraArgs

from lars_optax import _assembly as assembly
from lars_optax import _links
from lars_optax import _masks as masks
from lars_optax import _stacked as stacked_mod
from lars_optax._lamb import unchecked_scale_by_lamb_adam
from lars_optax._momentum import unchecked_mxnet_momentum
from lars_optax._trust_ratio import unchecked_scale_by_lars_trust_ratio
from lars_optax._trust_ratio import unchecked_scale_by_lamb_trust_ratio
from lars_optax.porting import _shared as shared


# --------------------------------------------------------------------------
# optax
# --------------------------------------------------------------------------


_OPTAX = {"weight_decay": _links.NON_NEGATIVE_OR_SCHEDULE, "weight_decay_mask": _links.IN_BODY,
          "trust_ratio_mask": _links.IN_BODY, "mask": _links.IN_BODY}
"""optax's: a weight decay may be a schedule; a mask (True = apply) is checked as it is
turned into the leaves left out (shared.optax_mask)."""


@_links.optimizer(declared=_OPTAX)
def optax_lars(
    learning_rate: optax.ScalarOrSchedule,
    *,
    weight_decay: optax.ScalarOrSchedule = 0.0,
    weight_decay_mask: Any = True,
    trust_coefficient: float = 0.001,
    eps: float = 0.0,
    trust_ratio_mask: Any = True,
    momentum: float = 0.9,
    nesterov: bool = False,
    lr_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = None,
    group_by_shape: bool = False,
) -> GradientTransformationExtraArgs:
  r""":func:`optax.lars`, with optax's arguments, defaults and masks (True = apply).

  :math:`u = g + \lambda w` on ``weight_decay_mask``'s leaves;
  :math:`u \leftarrow \rho u` with :math:`\rho = \eta\|w\| / (\|u\| + \epsilon)`
  (1 when a norm is 0) on ``trust_ratio_mask``'s leaves; then the rate inside
  the momentum buffer, :math:`m_t = \mu m_{t-1} - \alpha_t u`,
  :math:`w_t = w_{t-1} + m_t` (Nesterov: :math:`\mu m_t - \alpha_t u`).
  The same numbers as optax's chain on every tree, scanned models included,
  plus ``stacked``, ``axis_name``, ``lr_mult`` and
  :func:`lars_optax.trust_ratios`. As optax does, it takes one trust ratio per
  leaf, and so one per stack of a scanned model (``stacked=None``, the
  default; ``init`` warns when leaves carry Flax ``"layers"`` partition
  metadata). ``stacked=lars_optax.stacked.FROM_METADATA`` gives one per layer,
  as the unrolled model has (the default of :func:`lars_optax.lars`).

  References:
    optax ``optax.lars``; You, Gitman and Ginsburg, `Large Batch Training of
    Convolutional Networks <https://arxiv.org/abs/1708.03888>`_, 2017.
  """
  opts = shared.options(lr_mult, multi_precision, axis_name, stacked, group_by_shape)
  no_decay = shared.optax_mask(weight_decay_mask, "weight_decay_mask")
  no_ratio = shared.optax_mask(trust_ratio_mask, "trust_ratio_mask")

  def layer_wise(o: shared.Shared, m: dict[str, Any]) -> list:
    return [*shared.decay_links(weight_decay, m["weight_decay_mask"], o, "weight_decay_mask",
                                keep_zero=True),
            unchecked_scale_by_lars_trust_ratio(trust_coefficient=trust_coefficient, eps=eps,
                                                skip=m["trust_ratio_mask"],
                                                axis_name=o["axis_name"], stacked=o["stacked"]),
            unchecked_mxnet_momentum(learning_rate, momentum=momentum, nesterov=nesterov)]

  tx = assembly.finish([], "optax_lars", **shared.assembled(
      opts, layer_wise, masks_by_arg={"weight_decay_mask": no_decay,
                                      "trust_ratio_mask": no_ratio}))
  return shared.as_optax_stacks(tx, stacked, "optax_lars", "optax.lars")


@_links.optimizer(declared=_OPTAX)
def optax_lamb(
    learning_rate: optax.ScalarOrSchedule,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    eps_root: float = 0.0,
    weight_decay: optax.ScalarOrSchedule = 0.0,
    mask: Any = None,
    lr_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = None,
    group_by_shape: bool = False,
) -> GradientTransformationExtraArgs:
  r""":func:`optax.lamb`, with optax's arguments, defaults and mask (True = decay).

  Adam's direction :math:`d = \hat m / (\sqrt{\hat v + \epsilon_{root}} + \epsilon)`,
  :math:`u = d + \lambda w` on ``mask``'s leaves, :math:`u \leftarrow \rho u`
  with :math:`\rho = \|w\| / \|u\|` (1 when a norm is 0) on every leaf,
  :math:`w \leftarrow w - \alpha_t u`. As optax does, it takes one trust
  ratio per leaf, and so one per stack of a scanned model (``stacked=None``,
  the default; ``init`` warns when leaves carry Flax ``"layers"`` partition
  metadata). ``stacked=lars_optax.stacked.FROM_METADATA`` gives one per layer,
  as the unrolled model has (the default of :func:`lars_optax.lamb`).

  References:
    optax ``optax.lamb``; You et al., `Large Batch Optimization for Deep
    Learning: Training BERT in 76 minutes <https://arxiv.org/abs/1904.00962>`_,
    2019.
  """
  opts = shared.options(lr_mult, multi_precision, axis_name, stacked, group_by_shape)

  def layer_wise(o: shared.Shared, m: dict[str, Any]) -> list:
    return [unchecked_scale_by_lamb_adam(b1, b2=b2, eps=eps, eps_root=eps_root),
            *shared.decay_links(weight_decay, m["mask"], o, "mask", keep_zero=True),
            unchecked_scale_by_lamb_trust_ratio(axis_name=o["axis_name"], stacked=o["stacked"]),
            assembly.learning_rate_part(learning_rate)]

  tx = assembly.finish([], "optax_lamb", **shared.assembled(
      opts, layer_wise, masks_by_arg={"mask": shared.optax_mask(mask, "mask")}))
  return shared.as_optax_stacks(tx, stacked, "optax_lamb", "optax.lamb")
