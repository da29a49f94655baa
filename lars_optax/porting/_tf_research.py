"""The TF research codebases' optimizers: BYOL's ``lars``, SimCLR's ``LARSOptimizer``,
ALBERT's ``LAMBOptimizer``, in their words."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import optax
from optax import GradientTransformationExtraArgs

from lars_optax import _assembly as assembly
from lars_optax import _links
from lars_optax import _utils as utils
from lars_optax import _masks as masks
from lars_optax import _stacked as stacked_mod
from lars_optax._lamb import unchecked_scale_by_lamb_adam
from lars_optax._momentum import unchecked_mxnet_momentum
from lars_optax._trust_ratio import unchecked_scale_by_lars_trust_ratio
from lars_optax._trust_ratio import unchecked_scale_by_lamb_trust_ratio
from lars_optax.porting import _shared as shared


# --------------------------------------------------------------------------
# BYOL, SimCLR, ALBERT
# --------------------------------------------------------------------------


def _key(entry: Any) -> Any:
  """A key path entry as dm-tree's paths give it: the dict key, attribute or index."""
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return getattr(entry, attr)
  return entry


def _byol_exempt(arg_name: str, filter_fn: Callable[..., Any] | None) -> masks.MaskLike:
  """BYOL's filter (``fn(path, value)``, True = apply) as the leaves to exempt."""
  if filter_fn is None:
    return None
  if not callable(filter_fn):
    raise TypeError(f"{arg_name}: expected a function (path, value) -> bool, got "
                    f"{filter_fn!r}.")

  def exempt(params):
    return jax.tree_util.tree_map_with_path(
        lambda path, x: not bool(filter_fn(tuple(_key(k) for k in path), x)),
        params)

  return exempt


_FILTERS = dict.fromkeys(("weight_decay_filter", "lars_adaptation_filter",
                          "exclude_from_weight_decay", "exclude_from_layer_adaptation"),
                         _links.IN_BODY)
"""The peers' filters and name patterns, checked as they are turned into masks."""


@_links.optimizer(declared=_FILTERS)
def byol_lars(
    learning_rate: optax.ScalarOrSchedule,
    *,
    weight_decay: float = 0.0,
    momentum: float = 0.9,
    eta: float = 1e-3,
    weight_decay_filter: Callable[..., Any] | None = None,
    lars_adaptation_filter: Callable[..., Any] | None = None,
    lr_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
    group_by_shape: bool = False,
) -> GradientTransformationExtraArgs:
  r"""BYOL's ``lars(learning_rate, weight_decay, momentum, eta, *_filter)``.

  :math:`u = g + \lambda w` where ``weight_decay_filter(path, w)`` is True;
  :math:`u \leftarrow \rho u`, :math:`\rho = \eta\|w\| / \|u\|` (1 when a norm
  is 0) where ``lars_adaptation_filter`` is True; :math:`b_t = \mu b_{t-1} + u`,
  :math:`w_t = w_{t-1} - \alpha_t b_t`: the rate multiplies the buffer from
  outside (BYOL's loop rebuilds the optimizer with each step's rate). A
  filter takes BYOL's arguments, the leaf's path as a tuple of keys and its
  value; None applies to every leaf, as BYOL's code does.

  References:
    Grill et al., `Bootstrap Your Own Latent
    <https://arxiv.org/abs/2006.07733>`_, 2020 (``byol/utils/optimizers.py``).
  """
  opts = shared.options(lr_mult, multi_precision, axis_name, stacked, group_by_shape)

  def layer_wise(o: shared.Shared, m: dict[str, Any]) -> list:
    return [*shared.decay_links(weight_decay, m["weight_decay_filter"], o, "weight_decay_filter"),
            unchecked_scale_by_lars_trust_ratio(trust_coefficient=eta, eps=0.0,
                                                axis_name=o["axis_name"], stacked=o["stacked"],
                                                skip=m["lars_adaptation_filter"]),
            *shared.torch_momentum(learning_rate, momentum, 0.0, False)]

  return assembly.finish([], "byol_lars", **shared.assembled(
      opts, layer_wise,
      masks_by_arg={
          "weight_decay_filter": _byol_exempt("weight_decay_filter", weight_decay_filter),
          "lars_adaptation_filter": _byol_exempt("lars_adaptation_filter",
                                                 lars_adaptation_filter)}))


@_links.optimizer(declared=_FILTERS)
def simclr_lars(
    learning_rate: optax.ScalarOrSchedule,
    *,
    momentum: float = 0.9,
    use_nesterov: bool = False,
    weight_decay: float = 0.0,
    exclude_from_weight_decay: Iterable[str] | None = None,
    exclude_from_layer_adaptation: Iterable[str] | None = None,
    classic_momentum: bool = True,
    eeta: float = 0.001,
    lr_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
    group_by_shape: bool = False,
) -> GradientTransformationExtraArgs:
  r"""SimCLR's ``LARSOptimizer(learning_rate, momentum, ...)``, its TF 2 code.

  :math:`u = g + \lambda w` (but on the leaves whose name a regex of
  ``exclude_from_weight_decay`` is found in, ``re.search``). With
  ``classic_momentum`` (the default): :math:`\rho = \eta\|w\| / \|u\|` (1 when
  a norm is 0; 1 on ``exclude_from_layer_adaptation``'s leaves, which default
  to ``exclude_from_weight_decay``'s), :math:`m_t = \mu m_{t-1} -
  \alpha_t\rho u`, :math:`w_t = w_{t-1} + m_t` (the rate inside the buffer).
  Without: :math:`b_t = \mu b_{t-1} + u`, then the ratio of the buffer's step,
  :math:`w_t = w_{t-1} - \alpha_t\rho_b b_t`. ``use_nesterov`` looks ahead in
  either. The regexes are searched in the leaf names
  (:func:`lars_optax.leaf_names`), not TF's variable names.

  References:
    Chen et al., `A Simple Framework for Contrastive Learning of Visual
    Representations <https://arxiv.org/abs/2002.05709>`_, 2020
    (``simclr/tf2/lars_optimizer.py``).
  """
  opts = shared.options(lr_mult, multi_precision, axis_name, stacked, group_by_shape)
  no_decay = shared.regexes("exclude_from_weight_decay", exclude_from_weight_decay)
  no_ratio = shared.regexes("exclude_from_layer_adaptation", exclude_from_layer_adaptation)
  no_ratio = no_decay if no_ratio is None else no_ratio

  def layer_wise(o: shared.Shared, m: dict[str, Any]) -> list:
    ratio = unchecked_scale_by_lars_trust_ratio(trust_coefficient=eeta, eps=0.0,
                                                skip=m["exclude_from_layer_adaptation"],
                                                axis_name=o["axis_name"], stacked=o["stacked"])
    if classic_momentum:
      tail = [ratio, unchecked_mxnet_momentum(learning_rate, momentum=momentum,
                                              nesterov=use_nesterov)]
    else:
      tail = [utils.keep_dtypes(optax.trace(decay=momentum, nesterov=use_nesterov), momentum),
              ratio, assembly.learning_rate_part(learning_rate)]
    return [*shared.decay_links(weight_decay, m["exclude_from_weight_decay"], o,
                                "exclude_from_weight_decay"), *tail]

  return assembly.finish([], "simclr_lars", **shared.assembled(
      opts, layer_wise, masks_by_arg={"exclude_from_weight_decay": no_decay,
                                      "exclude_from_layer_adaptation": no_ratio}))


@_links.optimizer(declared=_FILTERS)
def albert_lamb(
    learning_rate: optax.ScalarOrSchedule,
    *,
    weight_decay_rate: float = 0.0,
    beta_1: float = 0.9,
    beta_2: float = 0.999,
    epsilon: float = 1e-6,
    exclude_from_weight_decay: Iterable[str] | None = None,
    exclude_from_layer_adaptation: Iterable[str] | None = None,
    lr_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
    group_by_shape: bool = False,
) -> GradientTransformationExtraArgs:
  r"""ALBERT's ``LAMBOptimizer(learning_rate, weight_decay_rate, ...)``.

  Adam's direction without bias correction, :math:`d = m_t / (\sqrt{v_t} +
  \epsilon)`; :math:`u = d + \lambda w` (but on the leaves whose name a regex
  of ``exclude_from_weight_decay`` is found in); :math:`\rho = \|w\| / \|u\|`
  (1 when a norm is 0; 1 on ``exclude_from_layer_adaptation``'s leaves, which
  default to ``exclude_from_weight_decay``'s); :math:`w \leftarrow w -
  \alpha_t\rho u`.

  References:
    Lan et al., `ALBERT <https://arxiv.org/abs/1909.11942>`_, 2019
    (``albert/lamb_optimizer.py``).
  """
  opts = shared.options(lr_mult, multi_precision, axis_name, stacked, group_by_shape)
  no_decay = shared.regexes("exclude_from_weight_decay", exclude_from_weight_decay)
  no_ratio = shared.regexes("exclude_from_layer_adaptation", exclude_from_layer_adaptation)
  no_ratio = no_decay if no_ratio is None else no_ratio

  def layer_wise(o: shared.Shared, m: dict[str, Any]) -> list:
    return [unchecked_scale_by_lamb_adam(beta_1, b2=beta_2, eps=epsilon, bias_correction=False),
            *shared.decay_links(weight_decay_rate, m["exclude_from_weight_decay"], o,
                                "exclude_from_weight_decay"),
            unchecked_scale_by_lamb_trust_ratio(skip=m["exclude_from_layer_adaptation"],
                                                axis_name=o["axis_name"], stacked=o["stacked"]),
            assembly.learning_rate_part(learning_rate)]

  return assembly.finish([], "albert_lamb", **shared.assembled(
      opts, layer_wise, masks_by_arg={"exclude_from_weight_decay": no_decay,
                                      "exclude_from_layer_adaptation": no_ratio}))
