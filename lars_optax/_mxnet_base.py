"""Private: MXNet's optimizer-base arguments (checks and gradient preprocessing, the
learning rate and ``lr_mult`` links). Every optimizer is assembled by
:mod:`lars_optax._assembly`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optax

from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax import _stacked as stacked_mod
from lars_optax._transforms import unchecked_scale_per_leaf
from lars_optax._transforms import unchecked_add_decayed_weights_per_leaf


def check_base(learning_rate, wd, rescale_grad, clip_gradient, lr_mult, wd_mult, *,
               positive_lr: bool = False):
  """The checks of MXNet's optimizer-base arguments (``positive_lr``: a constant
  rate must be > 0)."""
  v.check_learning_rate("learning_rate", learning_rate, positive=positive_lr)
  v.check_scalar("wd", wd, low=0.0)
  v.check_scalar("rescale_grad", rescale_grad, low=0.0, low_open=True)
  if clip_gradient is not None:
    v.check_scalar("clip_gradient", clip_gradient, low=0.0, low_open=True)
  masks.check_leaf_values(lr_mult, "lr_mult")
  masks.check_leaf_values(wd_mult, "wd_mult")


def _exact_name(key: str) -> masks.Mask:
  """The leaf named exactly ``key`` (a dict key of ``lr_mult``/``wd_mult``)."""
  return masks.by_predicate(lambda name, _: name == key, description=f"name == {key!r}")


def wd_mult_with_skip(wd_mult: masks.LeafValues,
                      wd_skip: masks.MaskLike) -> masks.LeafValues:
  """``wd_mult`` with a first rule ``(wd_skip, 0.0)``: ``wd_skip`` wins.

  A dict ``wd_mult`` becomes rules that match its keys as whole leaf names
  (its keys are still checked against the params as given, in ``init``).
  """
  masks.check_mask_like(wd_skip, "wd_skip")
  if wd_skip is None:
    return wd_mult
  if wd_mult is None:
    rules: list[tuple[masks.MaskLike, Any]] = []
  elif isinstance(wd_mult, Mapping):
    rules = [(_exact_name(key), value) for key, value in wd_mult.items()]
  else:
    rules = list(wd_mult)
  return [(wd_skip, 0.0), *rules]


def preprocess(rescale_grad, clip_gradient, wd, wd_mult,
               stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA) -> list:
  """MXNet's gradient preprocessing: rescale, clip, then add ``wd * w``."""
  parts = []
  if not utils.is_const(rescale_grad, 1):
    parts.append(utils.keep_dtypes(optax.scale(rescale_grad), rescale_grad))
  if clip_gradient is not None:
    parts.append(utils.keep_dtypes(optax.clip(clip_gradient), clip_gradient))
  if not utils.is_const(wd, 0):  # wd=0: the params are not read
    parts.append(unchecked_add_decayed_weights_per_leaf(wd, multipliers=wd_mult, arg_name="wd_mult",
                                                        stacked=stacked))
  return parts


def decoupled_decay_and_lr(wd_lh, learning_rate, lr_mult) -> list:
  """The sign optimizers' tail: ``+ wd_lh * w`` after the sign, then ``-lr``."""
  parts = [] if utils.is_const(wd_lh, 0) else [unchecked_add_decayed_weights_per_leaf(wd_lh)]
  return [*parts, learning_rate_part(learning_rate), *lr_mult_part(lr_mult)]


def learning_rate_part(learning_rate) -> optax.GradientTransformation:
  return utils.keep_dtypes(optax.scale_by_learning_rate(learning_rate), learning_rate)


def hyperparams(**values: Any) -> list[tuple[str, Any]]:
  """The scalars to check against the params' dtypes at ``init`` (see check_inputs;
  the dtype each is used in comes from its name, v.COMPUTED_ARGUMENTS)."""
  return [(k, x) for k, x in values.items() if x is not None]


def lr_mult_part(lr_mult, stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA) -> list:
  return [] if lr_mult is None else [unchecked_scale_per_leaf(lr_mult, arg_name="lr_mult",
                                                              stacked=stacked)]
