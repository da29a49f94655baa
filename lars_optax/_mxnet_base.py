"""Private: MXNet's optimizer-base arguments as one object, :class:`Base` (the gradient
preprocessing, the learning rate and ``lr_mult`` links, what ``init`` checks of them), and
:func:`optimizer`, the decorators of the optimizers that take them (their arguments checked
by their declarations in :mod:`lars_optax._links`). Every optimizer is assembled by
:mod:`lars_optax._assembly`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar, cast

import optax

from lars_optax import _assembly as assembly
from lars_optax import _links
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax import _stacked as stacked_mod
from lars_optax._transforms import unchecked_scale_per_leaf
from lars_optax._transforms import unchecked_add_decayed_weights_per_leaf

_F = TypeVar("_F", bound=Callable[..., Any])


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


def lr_mult_part(lr_mult, stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA) -> list:
  return [] if lr_mult is None else [unchecked_scale_per_leaf(lr_mult, arg_name="lr_mult",
                                                              stacked=stacked)]


class Base(NamedTuple):
  """MXNet's optimizer-base arguments as one object: the learning rate and ``wd``, their
  per-leaf multipliers, the gradient's rescale and clip, and master weights.

  An optimizer checks them with its other arguments (:func:`optimizer`, which also
  checks the multipliers' names and the constants against the params at ``init``),
  then builds ``base.preprocess()``, its own links and ``base.rate()``, and
  ``base.finish`` puts them together (:func:`lars_optax._assembly.finish`).
  """

  learning_rate: Any
  wd: Any = 0.0
  rescale_grad: Any = 1.0
  clip_gradient: Any = None
  lr_mult: masks.LeafValues = None
  wd_mult: masks.LeafValues = None
  multi_precision: bool = False

  def preprocess(self, *, decay: bool = True, clip: bool = True,
                 stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA) -> list:
    """Rescale, clip (without ``clip=False``), then coupled ``wd`` (without ``decay=False``)."""
    return preprocess(self.rescale_grad, self.clip_gradient if clip else None,
                      self.wd if decay else 0.0, self.wd_mult if decay else None, stacked)

  def rate(self, stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA) -> list:
    """``-learning_rate``, then ``lr_mult``."""
    return [learning_rate_part(self.learning_rate), *lr_mult_part(self.lr_mult, stacked)]

  def finish(self, parts: list, name: str, **kwargs: Any) -> optax.GradientTransformationExtraArgs:
    """:func:`lars_optax._assembly.finish` of ``parts``, with master weights."""
    return assembly.finish(parts, name, multi_precision=self.multi_precision, **kwargs)


def optimizer(hints: Callable[[Any], Any] = v.mxnet_names, *,
              declared: Mapping[str, Any] | None = None,
              relations: Callable[..., None] | None = None) -> Callable[[_F], _F]:
  """The decorators of an optimizer taking MXNet's base arguments: its arguments are
  checked by their declarations, when it is built and against the params at ``init``
  (:func:`lars_optax._links.checked_arguments`), and a wrong keyword gets ``hints``."""

  def decorate(fn: _F) -> _F:
    return cast(_F, hints(_links.checked_arguments(declared=declared, relations=relations)(fn)))

  return decorate
