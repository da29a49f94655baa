"""Private: MXNet's optimizer-base arguments as one object, :class:`Base` (the gradient
preprocessing and the rate's links), built from an optimizer's bound arguments. Every
optimizer is checked by :func:`lars_optax._links.optimizer` and assembled by
:mod:`lars_optax._assembly`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import optax

from lars_optax import _assembly as assembly
from lars_optax import _utils as utils
from lars_optax import _masks as masks
from lars_optax import _stacked as stacked_mod
from lars_optax._transforms import unchecked_add_decayed_weights_per_leaf



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
  return [*parts, assembly.learning_rate_part(learning_rate), *assembly.lr_mult_part(lr_mult)]


class Base(NamedTuple):
  """MXNet's optimizer-base arguments as one object: the learning rate and ``wd``, their
  per-leaf multipliers, the gradient's rescale and clip, and master weights.

  An optimizer checks them with its other arguments (:func:`lars_optax._links.optimizer`,
  which also checks the multipliers' names and the constants against the params at
  ``init``), then builds ``base.preprocess()``, its own links and ``base.rate()``, and
  :func:`lars_optax._assembly.finish` puts them together.
  """

  learning_rate: Any
  wd: Any = 0.0
  rescale_grad: Any = 1.0
  clip_gradient: Any = None
  lr_mult: masks.LeafValues = None
  wd_mult: masks.LeafValues = None
  multi_precision: bool = False

  @classmethod
  def of(cls, arguments: Mapping[str, Any]) -> Base:
    """The base arguments among an optimizer's bound ones (its ``locals()`` before its
    body binds a name), each missing one at its default (MXNet's GroupAdaGrad takes no
    ``wd``)."""
    return cls(**{k: arguments[k] for k in cls._fields if k in arguments})

  def preprocess(self, *, decay: bool = True, clip: bool = True,
                 stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA) -> list:
    """Rescale, clip (without ``clip=False``), then coupled ``wd`` (without ``decay=False``)."""
    return preprocess(self.rescale_grad, self.clip_gradient if clip else None,
                      self.wd if decay else 0.0, self.wd_mult if decay else None, stacked)

  def rate(self, stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA) -> list:
    """``-learning_rate``, then ``lr_mult``."""
    return [assembly.learning_rate_part(self.learning_rate),
            *assembly.lr_mult_part(self.lr_mult, stacked)]
