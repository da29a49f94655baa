"""The ports' shared pieces: the library's options, the assembly, decay and momentum
tails, and the peers' masks and argument forms."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import optax
from optax import GradientTransformation, GradientTransformationExtraArgs

from lars_optax import _links
from lars_optax import _assembly as assembly
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax import _stacked as stacked_mod
from lars_optax._momentum import unchecked_dampened_trace
from lars_optax._transforms import unchecked_add_decayed_weights_per_leaf


Shared = dict[str, Any]


# --------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------


def options(lr_mult: masks.LeafValues, multi_precision: bool, axis_name: Any,
            stacked: Any, group_by_shape: bool = False) -> Shared:
  """The library's shared options (checked where they enter: by their declarations,
  :func:`lars_optax._links.optimizer`, or ``timm_optimizer``'s keywords)."""
  return {"lr_mult": lr_mult, "axis_name": axis_name, "stacked": stacked,
          "multi_precision": bool(multi_precision), "group_by_shape": bool(group_by_shape)}


def check_options(values: Mapping[str, Any]) -> None:
  """The shared options given by keyword (``timm_optimizer``'s), checked."""
  _links.check_declared(values)
  v.check_group_by_shape(values.get("group_by_shape", False), values.get("axis_name"))


def lr_mult_links(opts: Shared) -> list:
  return assembly.lr_mult_part(opts["lr_mult"], opts["stacked"])


def assembled(opts: Shared, layer_wise: Callable[[Shared, dict[str, Any]], list] | None = None,
              *, masks_by_arg: Mapping[str, Any] | None = None,
              exempt: Sequence[tuple[str, Any]] = (),
              with_lr_mult: bool = True) -> dict[str, Any]:
  """:func:`lars_optax._assembly.finish`'s keywords for a port: master weights, ``stacked``
  (its warning), and the exemptions built from the peer's arguments (``(argument,
  mask)``) checked against the params at ``init``. ``layer_wise(opts, masks)``: the
  port's layer-wise links (``masks_by_arg``: the peer's masks by argument name),
  ``lr_mult`` last unless ``with_lr_mult=False`` (``layer_wise`` placed it); with
  ``group_by_shape`` they run on the leaves stacked by shape, and the ``opts`` and
  masks they get are the stacks' (``stacked``, ``lr_mult``)."""
  keywords: dict[str, Any] = {"multi_precision": opts["multi_precision"],
                              "stacked": opts["stacked"],
                              "names": [(arg, mask, None) for arg, mask in exempt]}
  if layer_wise is None:
    return keywords

  def build(stacked: Any, lr_mult: Any = None, **chosen: Any) -> list:
    o = {**opts, "stacked": stacked, "lr_mult": lr_mult}
    return [*layer_wise(o, chosen), *(lr_mult_links(o) if with_lr_mult else [])]

  return {**keywords, "layer_wise": build, "group_by_shape": opts["group_by_shape"],
          "masks_by_arg": dict(masks_by_arg or {}), "values_by_arg": {"lr_mult": opts["lr_mult"]}}


def warning_at_init(tx: Any, message: Callable[[Any], str | None]) -> Any:
  """``tx`` whose ``init`` warns (``UserWarning``) with ``message(params)``, unless None: a
  peer's argument it accepts silently that here would quietly change the numbers."""
  def init_fn(params: Any) -> Any:
    text = message(params)
    if text is not None:
      warnings.warn(text, UserWarning, stacklevel=2)
    return tx.init(params)

  return tx._replace(init=init_fn)


def decay_links(weight_decay: Any, exempt: masks.MaskLike, opts: Shared, arg_name: str, *,
                keep_zero: bool = False) -> list:
  """``u + weight_decay * w``, none on the ``exempt`` leaves (the peer's argument
  ``arg_name``, named in errors); nothing for 0, or with ``keep_zero`` a link that
  does nothing and keeps the decay's empty state (optax's chains keep the link, so
  that the state's structure is the same whatever the value: under
  ``optax.inject_hyperparams`` it is an array). A schedule (optax's drop-ins take
  one) is called with its own count, from 0 at the first update, as
  :func:`optax.add_decayed_weights` calls it."""
  if utils.is_const(weight_decay, 0):
    return [optax.identity()] if keep_zero else []
  if callable(weight_decay):
    def applies(params: Any) -> Any:  # optax's polarity: True = decayed
      # (A stacked leaf is judged as one layer, as the constant's per-leaf link judges it.)
      flat = masks.resolve_mask(exempt, params, arg_name,
                                stacked_mod.resolve(opts["stacked"], params))
      return jax.tree.unflatten(jax.tree.structure(params), [not e for e in flat])

    return [optax.add_decayed_weights(weight_decay, mask=None if exempt is None else applies)]
  rules = None if exempt is None else [(exempt, 0.0)]
  return [unchecked_add_decayed_weights_per_leaf(weight_decay, multipliers=rules, arg_name=arg_name,
                                                 stacked=opts["stacked"])]


def torch_momentum(lr: Any, momentum: Any, dampening: Any,
                   nesterov: bool) -> list[GradientTransformation]:
  """PyTorch's SGD tail: a buffer of the steps (first step undamped), then the rate."""
  if utils.is_const(momentum, 0):
    trace: list[GradientTransformation] = []
  elif utils.is_const(dampening, 0):
    trace = [utils.keep_dtypes(optax.trace(decay=momentum, nesterov=nesterov), momentum)]
  else:
    trace = [unchecked_dampened_trace(momentum, dampening=dampening, nesterov=nesterov)]
  return [*trace, assembly.learning_rate_part(lr)]


def optax_mask(mask: Any, arg_name: str) -> masks.MaskLike:
  """An optax mask (True = apply) as the leaves to exempt (True = exempt)."""
  if mask is None or mask is True:
    return None
  if mask is False:
    return lambda params: jax.tree.map(lambda _: True, params)
  if callable(mask):
    return lambda params: jax.tree.map(lambda m: not bool(m), mask(params))
  masks.check_mask_like(mask, arg_name)
  return jax.tree.map(lambda m: not bool(m), mask)


def regexes(arg_name: str, patterns: Iterable[str] | None) -> masks.Mask | None:
  """TF's exclude lists: leaves whose name any pattern is found in (``re.search``)."""
  if not patterns:
    return None
  if isinstance(patterns, str):
    raise TypeError(f"{arg_name}: expected a list of regular expressions, got the string "
                    f"{patterns!r}; pass [{patterns!r}].")
  patterns = list(patterns)
  for p in patterns:
    if not isinstance(p, str):
      raise TypeError(f"{arg_name}: expected strings, got {p!r}.")
    try:
      re.compile(p)
    except re.error as e:
      raise ValueError(f"{arg_name}: not a valid regular expression: {p!r} ({e})") from e
  return masks.by_regex("|".join(f"(?:{p})" for p in patterns)).optional()


def as_optax_stacks(tx: GradientTransformationExtraArgs, stacked: Any, name: str,
                    peer: str) -> GradientTransformationExtraArgs:
  """``tx``; with ``stacked=None`` (optax's one ratio per stack, the drop-ins' default),
  one whose ``init`` warns on leaves with Flax ``"layers"`` metadata."""
  if stacked is not None:
    return tx
  return stacked_mod.warn_one_ratio_per_stack(tx, name, peer)
