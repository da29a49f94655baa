r"""Ports from other libraries: one constructor per peer, in the peer's own words.

Each constructor takes the peer's own argument names and defaults, so a port
is the peer's call with its prefix changed, and each is a short
``optax.chain`` of the library's public links. Every one is checked against
the peer's own code (``tests/reference/make_peers.py`` and
``make_peers_tf.py`` ran the peers; docs/porting.md lists the measured error
of each, with a constant rate and with a warm-up schedule):

* :func:`timm_lars`, :func:`timm_lamb` -- timm's ``Lars`` and ``Lamb``
  classes (one parameter group); :func:`timm_optimizer` --
  ``create_optimizer_v2``, with timm's no-decay group, for ``"lars"``,
  ``"larc"``, ``"nlars"``, ``"nlarc"``, ``"lamb"``, ``"lambc"``, ``"lambw"``,
  ``"clamb"`` and ``"cadamw"``;
* :func:`torch_sparse_adam` -- ``torch.optim.SparseAdam``;
* :func:`keras_lamb` -- ``keras.optimizers.Lamb`` (Keras 3);
* :func:`optax_lars`, :func:`optax_lamb` -- ``optax.lars`` and ``optax.lamb``
  (the same numbers, with ``stacked``, ``axis_name``, ``lr_mult`` and the
  ratio logging of :func:`lars_optax.trust_ratios`);
* :func:`byol_lars` -- BYOL's ``lars``; :func:`simclr_lars` -- SimCLR's
  ``LARSOptimizer``; :func:`albert_lamb` -- ALBERT's ``LAMBOptimizer``.

Besides the peer's arguments each takes the library's shared keyword-only
options (``lr_mult``, ``multi_precision``, ``axis_name``, ``stacked``, and
``group_by_shape`` for the LARS and LAMB ports; see docs/optimizers.md's
common arguments).

>>> import lars_optax
>>> tx = lars_optax.porting.timm_optimizer("lars", lr=0.1, weight_decay=1e-4, momentum=0.9)
>>> tx = lars_optax.porting.optax_lars(0.1, weight_decay=1e-4, momentum=0.9)
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import GradientTransformation, GradientTransformationExtraArgs

from lars_optax import _grouping
from lars_optax import _mxnet_base as base
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax import _stacked as stacked_mod
from lars_optax._lamb import unchecked_scale_by_lamb_adam
from lars_optax._momentum import check_torch_momentum
from lars_optax._momentum import unchecked_mxnet_momentum
from lars_optax._momentum import unchecked_dampened_trace
from lars_optax.mxnet._adam_family import unchecked_scale_by_mxnet_adam
from lars_optax.sparse.lazy import lazy_update
from lars_optax.sparse.optax_compat import clip_by_global_norm
from lars_optax._transforms import unchecked_scale_by_caution
from lars_optax._transforms import unchecked_add_decoupled_weight_decay
from lars_optax._transforms import unchecked_add_decayed_weights_per_leaf
from lars_optax._trust_ratio import unchecked_scale_by_lars_trust_ratio
from lars_optax._trust_ratio import unchecked_scale_by_lamb_trust_ratio

__all__ = [
    "albert_lamb",
    "byol_lars",
    "keras_lamb",
    "optax_lamb",
    "optax_lars",
    "simclr_lars",
    "timm_lamb",
    "timm_lars",
    "timm_optimizer",
    "torch_sparse_adam",
]

Shared = dict[str, Any]


# --------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------


def _shared(lr_mult: masks.LeafValues, multi_precision: bool, axis_name: Any,
            stacked: Any, group_by_shape: bool = False) -> Shared:
  """The library's shared options, checked where they enter."""
  masks.check_leaf_values(lr_mult, "lr_mult")
  stacked_mod.check_axis_names(axis_name)
  stacked_mod.check_stacked(stacked)
  return {"lr_mult": lr_mult, "axis_name": axis_name, "stacked": stacked,
          "multi_precision": v.check_flag("multi_precision", multi_precision),
          "group_by_shape": _grouping.check_group_by_shape(group_by_shape, axis_name)}


def _lr_mult(opts: Shared) -> list:
  return base.lr_mult_part(opts["lr_mult"], opts["stacked"])


def _finish(parts: list, name: str, opts: Shared, *, exempt: Sequence[tuple[str, Any]] = (),
            hyperparams: Sequence[tuple[Any, ...]], lr_mult: bool = True,
            ) -> GradientTransformationExtraArgs:
  """The input checks first, ``lr_mult`` last (unless ``parts`` placed it), master weights
  around; warn for stacks. ``hyperparams``: ``(peer's name, value[, compute])`` of the
  constants to check against the params' dtypes at ``init`` (``compute``: used in
  float32 or wider), as :func:`lars_optax.check_inputs` takes them."""
  tx = base.finish([*parts, *(_lr_mult(opts) if lr_mult else [])], name,
                   multi_precision=opts["multi_precision"],
                   names=[(arg, mask, None) for arg, mask in exempt],
                   leaf_values=[("lr_mult", opts["lr_mult"])],
                   hyperparams=[h for h in hyperparams if h[1] is not None])
  return stacked_mod.warn_unstacked(tx, opts["stacked"], name)


def _finish_layer_wise(layer_wise: Callable[[Shared, dict[str, Any]], list], name: str,
                       opts: Shared, *, masks_by_arg: Mapping[str, Any] | None = None,
                       exempt: Sequence[tuple[str, Any]] = (),
                       hyperparams: Sequence[tuple[Any, ...]], with_lr_mult: bool = True,
                       pre: Sequence[Any] = (),
                       ) -> GradientTransformationExtraArgs:
  """:func:`_finish` of ``layer_wise(opts, masks)``'s links (``masks_by_arg``: the
  peer's masks by argument name), ``lr_mult`` last unless ``layer_wise`` placed it.
  With ``group_by_shape`` they run on the leaves stacked by shape, and the
  ``opts`` and masks they get are the stacks' (``stacked``, ``lr_mult``). ``pre``:
  links on the whole tree before them (a global-norm clip)."""
  def build(stacked: Any, lr_mult: Any = None, **chosen: Any) -> list:
    o = {**opts, "stacked": stacked, "lr_mult": lr_mult}
    return [*layer_wise(o, chosen), *(_lr_mult(o) if with_lr_mult else [])]

  given = dict(masks_by_arg or {})
  parts = _grouping.maybe_by_shape(opts["group_by_shape"], build, masks_by_arg=given,
                                   values_by_arg={"lr_mult": opts["lr_mult"]},
                                   stacked=opts["stacked"])
  return _finish([*pre, *parts], name, opts, exempt=exempt, hyperparams=hyperparams,
                 lr_mult=False)


def _decay(weight_decay: Any, exempt: masks.MaskLike, opts: Shared, arg_name: str) -> list:
  """``u + weight_decay * w``, none on the ``exempt`` leaves (the peer's argument
  ``arg_name``, named in errors); nothing for 0. A schedule (optax's drop-ins take
  one) is called with its own count, from 0 at the first update, as
  :func:`optax.add_decayed_weights` calls it."""
  if utils.is_const(weight_decay, 0):
    return []
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


def _torch_momentum(lr: Any, momentum: Any, dampening: Any,
                    nesterov: bool) -> list[GradientTransformation]:
  """PyTorch's SGD tail: a buffer of the steps (first step undamped), then the rate."""
  if utils.is_const(momentum, 0):
    trace: list[GradientTransformation] = []
  elif utils.is_const(dampening, 0):
    trace = [utils.keep_dtypes(optax.trace(decay=momentum, nesterov=nesterov), momentum)]
  else:
    trace = [unchecked_dampened_trace(momentum, dampening=dampening, nesterov=nesterov)]
  return [*trace, base.learning_rate_part(lr)]


def _optax_mask(mask: Any, arg_name: str) -> masks.MaskLike:
  """An optax mask (True = apply) as the leaves to exempt (True = exempt)."""
  if mask is None or mask is True:
    return None
  if mask is False:
    return lambda params: jax.tree.map(lambda _: True, params)
  if callable(mask):
    return lambda params: jax.tree.map(lambda m: not bool(m), mask(params))
  masks.check_mask_like(mask, arg_name)
  return jax.tree.map(lambda m: not bool(m), mask)


def _regexes(arg_name: str, patterns: Iterable[str] | None) -> masks.Mask | None:
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


def _betas(arg_name: str, betas: Any) -> tuple[Any, Any]:
  if not isinstance(betas, (tuple, list)) or len(betas) != 2:
    raise TypeError(f"{arg_name}: expected a pair (beta1, beta2), got {betas!r}.")
  for i, b in enumerate(betas):
    v.check_scalar(f"{arg_name}[{i}]", b, low=0.0, high=1.0, high_open=True)
  return betas[0], betas[1]


# --------------------------------------------------------------------------
# timm
# --------------------------------------------------------------------------


def _timm_lars(name: str, lr: Any, *, momentum: Any, dampening: Any, weight_decay: Any,
               nesterov: bool, trust_coeff: Any, eps: Any, trust_clip: bool,
               always_adapt: bool, foreach: bool | None = None, no_decay: masks.MaskLike,
               opts: Shared):
  v.check_learning_rate("lr", lr)
  if foreach is not None:
    v.check_flag("foreach", foreach)
  v.check_scalar("weight_decay", weight_decay, low=0.0)
  v.check_scalar("trust_coeff", trust_coeff, low=0.0)
  v.check_scalar("eps", eps, low=0.0)
  check_torch_momentum(momentum, dampening, nesterov)
  trust_clip = v.check_flag("trust_clip", trust_clip)
  always_adapt = v.check_flag("always_adapt", always_adapt)

  def layer_wise(o: Shared, m: dict[str, Any]) -> list:
    no_decay = m["no_weight_decay"]
    decay_mult = None if no_decay is None else [(no_decay, 0.0)]
    parts: list = []
    if always_adapt or not utils.is_const(weight_decay, 0):
      # timm adapts a group whose weight_decay is not 0, or every group with always_adapt.
      decay = _decay(weight_decay, no_decay, o, "no_weight_decay")
      parts.append(unchecked_scale_by_lars_trust_ratio(
          optax.chain(*decay) if decay else None, trust_coefficient=trust_coeff,
          ratio_weight_decay=weight_decay, eps=eps, skip=None if always_adapt else no_decay,
          wd_mult=decay_mult, axis_name=o["axis_name"], stacked=o["stacked"],
          larc_learning_rate=lr if trust_clip else None))
    return parts + _torch_momentum(lr, momentum, dampening, nesterov)

  return _finish_layer_wise(layer_wise, name, opts, masks_by_arg={"no_weight_decay": no_decay},
                            exempt=[("no_weight_decay", no_decay)],
                            hyperparams=[("lr", lr), ("weight_decay", weight_decay),
                                         ("trust_coeff", trust_coeff), ("eps", eps)])


@v.renamed_keywords({})
def timm_lars(
    lr: optax.ScalarOrSchedule = 1.0,
    *,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    trust_coeff: float = 0.001,
    eps: float = 1e-8,
    trust_clip: bool = False,
    always_adapt: bool = False,
    foreach: bool | None = None,
    lr_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
    group_by_shape: bool = False,
) -> GradientTransformationExtraArgs:
  r"""timm's ``Lars(params, lr, momentum, ...)``: one parameter group, timm's defaults.

  Per leaf, when ``weight_decay != 0`` or ``always_adapt``:
  :math:`\rho = \eta\|w\| / (\|g\| + \lambda\|w\| + \epsilon)` (1 when a norm is 0),
  with LARC's clip :math:`\rho \leftarrow \min(\rho/\alpha_t, 1)` under
  ``trust_clip``; :math:`u = \rho(g + \lambda w)`. Then PyTorch's SGD:
  :math:`b_t = \mu b_{t-1} + (1 - d) u` (the first step :math:`b_1 = u`),
  :math:`w_t = w_{t-1} - \alpha_t b_t` (Nesterov: :math:`u + \mu b_t`). With
  ``weight_decay == 0`` and no ``always_adapt`` there is no ratio at all:
  ``timm_lars(lr=0.1, momentum=0.9)`` is plain SGD with momentum, as in timm.

  The chain: :func:`~lars_optax.scale_by_lars_trust_ratio` (decay inside,
  ``trust_clip=lr``), a momentum trace (:func:`~lars_optax.dampened_trace`
  with dampening), :func:`optax.scale_by_learning_rate`.

  ``lr`` is a scalar or an optax schedule. ``momentum``, ``dampening``,
  ``weight_decay``, ``nesterov``, ``trust_coeff``, ``eps``, ``trust_clip`` and
  ``always_adapt`` are timm's, with timm's defaults; ``foreach`` (how
  PyTorch loops) is accepted and changes no number. ``lr_mult``,
  ``multi_precision``, ``axis_name``, ``stacked`` and ``group_by_shape`` are
  the shared options ("Common arguments" in docs/optimizers.md).

  References:
    timm ``timm.optim.Lars``; You, Gitman and Ginsburg, `Large Batch Training
    of Convolutional Networks <https://arxiv.org/abs/1708.03888>`_, 2017.
  """
  return _timm_lars("timm_lars", lr, momentum=momentum, dampening=dampening,
                    weight_decay=weight_decay, nesterov=nesterov, trust_coeff=trust_coeff,
                    eps=eps, trust_clip=trust_clip, always_adapt=always_adapt,
                    foreach=foreach, no_decay=None,
                    opts=_shared(lr_mult, multi_precision, axis_name, stacked, group_by_shape))


def _timm_lamb(name: str, lr: Any, *, bias_correction: bool, betas: Any, eps: Any,
               weight_decay: Any, grad_averaging: bool, max_grad_norm: Any, trust_clip: bool,
               always_adapt: bool, caution: bool, decoupled_decay: bool,
               corrected_weight_decay: bool = False, max_lr: Any = None,
               foreach: bool | None = None, no_decay: masks.MaskLike, opts: Shared):
  v.check_learning_rate("lr", lr)
  if foreach is not None:
    v.check_flag("foreach", foreach)
  b1, b2 = _betas("betas", betas)
  v.check_scalar("eps", eps, low=0.0)
  v.check_scalar("weight_decay", weight_decay, low=0.0)
  if max_grad_norm is not None:
    v.check_scalar("max_grad_norm", max_grad_norm, low=0.0, low_open=True)
  flags = {k: v.check_flag(k, x) for k, x in (
      ("bias_correction", bias_correction), ("grad_averaging", grad_averaging),
      ("trust_clip", trust_clip), ("always_adapt", always_adapt), ("caution", caution),
      ("decoupled_decay", decoupled_decay), ("corrected_weight_decay", corrected_weight_decay))}
  decays = not utils.is_const(weight_decay, 0)
  decay_lr = _timm_decay_rate(lr, flags["corrected_weight_decay"], max_lr)

  def layer_wise(o: Shared, m: dict[str, Any]) -> list:
    no_decay = m["no_weight_decay"]
    direction: GradientTransformation = unchecked_scale_by_lamb_adam(
        b1, b2=b2, eps=eps, bias_correction=flags["bias_correction"],
        grad_averaging=flags["grad_averaging"])
    if flags["caution"]:
      direction = unchecked_scale_by_caution(direction, stacked=o["stacked"],
                                             axis_name=o["axis_name"])
    step = [direction]
    if not flags["decoupled_decay"]:
      step += _decay(weight_decay, no_decay, o, "no_weight_decay")
    if flags["always_adapt"] or decays:
      step.append(unchecked_scale_by_lamb_trust_ratio(
          skip=None if flags["always_adapt"] else no_decay, axis_name=o["axis_name"],
          stacked=o["stacked"], max_trust_ratio=1.0 if flags["trust_clip"] else None))
    step += [base.learning_rate_part(lr), *_lr_mult(o)]
    parts: list = []
    if decays and flags["decoupled_decay"]:
      # timm's corrected decay is (lr·s)²/max_lr: a group's rate scale s enters twice.
      twice = o["lr_mult"] if flags["corrected_weight_decay"] else None
      parts.append(unchecked_add_decoupled_weight_decay(
          optax.chain(*step), learning_rate=decay_lr, weight_decay=weight_decay,
          wd_mult=base.wd_mult_with_skip(twice, no_decay), lr_mult=o["lr_mult"],
          stacked=o["stacked"]))
    else:
      parts += step
    return parts

  # timm's global clip, once over the whole tree (built once, also with group_by_shape).
  clip = ([] if max_grad_norm is None
          else [clip_by_global_norm(max_grad_norm, axis_name=opts["axis_name"])])
  return _finish_layer_wise(layer_wise, name, opts, masks_by_arg={"no_weight_decay": no_decay},
                            exempt=[("no_weight_decay", no_decay)],
                            with_lr_mult=False, pre=clip,
                            hyperparams=[("lr", lr), ("weight_decay", weight_decay),
                                         ("eps", eps)])


@v.renamed_keywords({})
def timm_lamb(
    lr: optax.ScalarOrSchedule = 1e-3,
    *,
    bias_correction: bool = True,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    grad_averaging: bool = True,
    max_grad_norm: float | None = 1.0,
    trust_clip: bool = False,
    always_adapt: bool = False,
    caution: bool = False,
    decoupled_decay: bool = False,
    corrected_weight_decay: bool = False,
    foreach: bool | None = None,
    max_lr: float | None = None,
    lr_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
    group_by_shape: bool = False,
) -> GradientTransformationExtraArgs:
  r"""timm's ``Lamb(params, lr, ...)``: one parameter group, timm's defaults.

  The global gradient norm is clipped to ``max_grad_norm`` first. Then Adam's
  direction :math:`d = \hat m / (\sqrt{\hat v} + \epsilon)` (bias-corrected by
  default; without ``grad_averaging`` the first moment adds the whole
  gradient), masked by ``caution`` as in C-Optim; :math:`u = d + \lambda w`
  (``decoupled_decay``: :math:`w \leftarrow (1 - \alpha_t\lambda) w` before
  the step instead; with ``corrected_weight_decay`` too, :math:`w \leftarrow
  (1 - \alpha_t^2\lambda/\alpha_{max}) w`); when ``weight_decay != 0`` or
  ``always_adapt``, :math:`u \leftarrow \rho u` with :math:`\rho = \|w\| /
  \|u\|` (1 when a norm is 0; at most 1 under ``trust_clip``); :math:`w
  \leftarrow w - \alpha_t u`.

  ``lr`` is a scalar or an optax schedule. ``bias_correction``, ``betas``,
  ``eps``, ``weight_decay``, ``grad_averaging``, ``max_grad_norm`` (None: no
  global clip), ``trust_clip``, ``always_adapt``, ``caution``,
  ``decoupled_decay`` and ``corrected_weight_decay`` are timm's, with timm's
  defaults; ``foreach`` (how PyTorch loops) is accepted and changes no number.
  :math:`\alpha_{max}` is the rate timm's constructor took, the peak of its
  scheduler: ``lr`` when it is a number; with ``lr`` a schedule, pass it as
  ``max_lr`` (used only with ``corrected_weight_decay``). A leaf whose rate
  ``lr_mult`` scales by :math:`s` decays by :math:`(s\alpha_t)^2\lambda/\alpha_{max}`,
  as a timm group with ``lr_scale`` :math:`s` does. ``lr_mult``,
  ``multi_precision``, ``axis_name``, ``stacked`` and ``group_by_shape`` are
  the shared options ("Common arguments" in docs/optimizers.md).

  References:
    timm ``timm.optim.Lamb``; You et al., `Large Batch Optimization for Deep
    Learning: Training BERT in 76 minutes <https://arxiv.org/abs/1904.00962>`_,
    2019.
  """
  return _timm_lamb("timm_lamb", lr, bias_correction=bias_correction, betas=betas, eps=eps,
                    weight_decay=weight_decay, grad_averaging=grad_averaging,
                    max_grad_norm=max_grad_norm, trust_clip=trust_clip,
                    always_adapt=always_adapt, caution=caution,
                    decoupled_decay=decoupled_decay,
                    corrected_weight_decay=corrected_weight_decay, max_lr=max_lr,
                    foreach=foreach, no_decay=None,
                    opts=_shared(lr_mult, multi_precision, axis_name, stacked, group_by_shape))


def _timm_decay_rate(lr: Any, corrected: bool, max_lr: Any) -> Any:
  """The rate of timm's decoupled decay: ``lr``, or ``lr ** 2 / max_lr`` when corrected."""
  if not corrected:
    if max_lr is not None:
      raise ValueError("max_lr: it is the peak rate of corrected_weight_decay=True; without "
                       "it, leave max_lr out.")
    return lr
  if max_lr is None:
    if callable(lr):
      raise ValueError(
          "max_lr: corrected_weight_decay=True with lr a schedule needs the peak rate, which "
          "timm takes from the constructor's lr (the scheduler's base): pass max_lr=<peak>.")
    max_lr = lr
  v.check_scalar("max_lr", max_lr, low=0.0, low_open=True)
  if callable(lr):
    return lambda count: lr(count) ** 2 / max_lr
  return lr ** 2 / max_lr


def _timm_no_decay(no_weight_decay: Iterable[str], exclude_1d: bool) -> masks.Mask | None:
  """timm's no-decay group: with ``exclude_1d`` (``filter_bias_and_bn``) ``ndim <= 1`` or
  a leaf named ``bias``; whatever it says, a leaf whose dotted name matches a pattern
  of the model's ``no_weight_decay()`` (fnmatch, as timm's ``param_groups_weight_decay``).
  None: no leaf is kept out."""
  patterns = _names_list("no_weight_decay", no_weight_decay)
  if not exclude_1d and not patterns:
    return None

  def test(name: str, leaf: Any) -> bool:
    return ((exclude_1d and (np.ndim(leaf) <= 1 or name.rsplit("/", 1)[-1] == "bias"))
            or any(fnmatch.fnmatchcase(name.replace("/", "."), p) for p in patterns))

  what = "ndim <= 1, *bias, no_weight_decay" if exclude_1d else "no_weight_decay"
  return masks.by_predicate(test, description=f"timm's no-decay group ({what})")


def _names_list(arg: str, names: Any) -> list[str]:
  """A list of names or patterns (a lone string is an error naming ``arg``)."""
  if isinstance(names, str) or not isinstance(names, Iterable):
    raise TypeError(f"{arg}: expected a list of names, got {names!r}.")
  return [str(n) for n in names]


class _TimmLayers:
  """timm's ``param_groups_layer_decay``: layer ids from a ``group_matcher`` dict, the
  rate scale of each layer, the frozen leaves and the no-decay group, from leaf names."""

  def __init__(self, layer_decay: Any, group_matcher: Any, min_scale: Any, no_opt_scale: Any,
               exclude_1d: bool, no_weight_decay: Any):
    v.check_scalar("layer_decay", layer_decay, low=0.0, low_open=True)
    v.check_scalar("layer_decay_min_scale", min_scale, low=0.0)
    if no_opt_scale is not None:
      v.check_scalar("layer_decay_no_opt_scale", no_opt_scale, low=0.0)
    if not isinstance(group_matcher, Mapping):
      raise TypeError("group_matcher: expected the model's group_matcher(coarse=False) dict "
                      f"(group name: regex, or a list of (regex, suffix)), got "
                      f"{group_matcher!r}; layer_decay needs it.")
    self.compiled: list[tuple[Any, tuple, Any]] = []
    for ordinal, (group, spec) in enumerate(group_matcher.items()):
      if spec is None:
        continue
      entries = spec if isinstance(spec, (list, tuple)) else [(spec, None)]
      for entry in entries:
        try:
          regex, suffix = entry
          self.compiled.append((re.compile(regex), (ordinal,), suffix))
        except (TypeError, ValueError, re.error) as e:
          raise ValueError(f"group_matcher: group {group!r} has the entry {entry!r}; "
                           "expected a regex or (regex, suffix) pairs.") from e
    self.decay, self.min_scale, self.no_opt_scale = layer_decay, min_scale, no_opt_scale
    self.exclude_1d = exclude_1d
    self.no_weight_decay = _names_list("no_weight_decay", no_weight_decay)
    self._dotted: dict[str, str] = {}  # a stacked leaf's name -> its first layer's, unrolled

  def _ordinal(self, name: str) -> tuple[float, ...]:
    for regex, prefix, suffix in self.compiled:
      m = regex.match(name)
      if m:
        parts = [prefix, m.groups(), suffix]
        return tuple(float(x) for part in parts if part for x in part if x is not None)
    return (float("inf"),)  # the head

  def unrolled(self, name: str, layers: int) -> list[str]:
    """The dotted names of a stacked leaf's layers in the unrolled model: the layer index
    goes after the first part of the name that makes a ``group_matcher`` regex capture it
    (``blocks/attn/kernel`` as ``blocks.3.attn.kernel``); the stacked name for each layer
    when no position does."""
    parts = name.split("/")
    for at in range(len(parts) + 1):
      names = [".".join([*parts[:at], str(i), *parts[at:]]) for i in range(layers)]
      if layers > 1 and self._ordinal(names[0]) != self._ordinal(names[1]):
        return names
    return [".".join(parts)] * layers

  def scales(self, params: Any, layer_axes: Sequence[int]) -> dict[str, Any]:
    """Each leaf's rate scale (timm's ``lr_scale``), by leaf name: a float, or for a
    stacked leaf one per layer (a numpy array), as its layers would get unrolled."""
    named = masks.named_leaves(params)
    dotted = {n: ([n.replace("/", ".")] if not k else self.unrolled(n, np.shape(x)[0]))
              for (n, x), k in zip(named, layer_axes)}
    keys = {d: self._ordinal(d) for ds in dotted.values() for d in ds}
    ids: dict[tuple, int] = {}
    lid = -1
    for k in sorted(set(keys.values())):
      if lid < 0 or k[-1] != 99999:  # timm's MATCH_PREV_GROUP joins the previous layer
        lid += 1
      ids[k] = lid
    top = lid

    def scale(d: str) -> float:
      return max(self.min_scale, self.decay ** (top - ids[keys[d]]))

    return {n: (scale(ds[0]) if not k else np.array([scale(d) for d in ds]))
            for ((n, _), k), ds in zip(zip(named, layer_axes), dotted.values())}

  def no_decay(self, name: str, leaf: Any) -> bool:
    """timm's no-decay group; ``leaf`` is one layer of a stacked leaf (the masks' view),
    and the patterns are matched against the name of its first layer when unrolled."""
    dotted = self._dotted.get(name, name.replace("/", "."))
    return ((self.exclude_1d and np.ndim(leaf) <= 1)
            or any(fnmatch.fnmatchcase(dotted, p) for p in self.no_weight_decay))

  def optimizer(self, make: Callable[[Any, Any], Any],
                stacked: Any) -> GradientTransformationExtraArgs:
    """The optimizer ``make(no_decay, lr_mult)`` builds for a tree's names (and layer
    axes, ``stacked``), built at ``init`` and again (cached) at each ``update``."""
    built: dict[tuple, Any] = {}

    def get(params: Any) -> Any:
      named = masks.named_leaves(params)
      ks = stacked_mod.resolve(stacked, params)
      key = tuple((n, k, np.shape(x)[:1] if k else ()) for (n, x), k in zip(named, ks))
      if key not in built:
        scales = self.scales(params, ks)
        self._dotted.update({n: self.unrolled(n, np.shape(x)[0])[0]
                             for (n, x), k in zip(named, ks) if k})
        keep = {n: np.asarray(x) >= self.no_opt_scale for n, x in scales.items()
                if self.no_opt_scale is not None}
        keep = {n: m for n, m in keep.items() if not np.all(m)}
        no_decay = masks.by_predicate(self.no_decay, description="timm's no-decay group")
        tx = make(no_decay, {n: _where(keep[n], x) if n in keep else x
                             for n, x in scales.items()})
        if keep:  # timm leaves them out: no step, no share of a global norm
          tx = optax.chain(_frozen(keep), tx)
        built[key] = optax.with_extra_args_support(tx)
      return built[key]

    def init_fn(params):
      return get(params).init(params)

    def update_fn(updates, state, params=None, **extra_args):
      if params is None:
        raise ValueError("layer_decay: update needs params (the layer ids come from their "
                         "names).")
      return get(params).update(updates, state, params, **extra_args)

    return GradientTransformationExtraArgs(init_fn, update_fn)


def _where(keep: Any, scale: Any) -> Any:
  """``scale`` where ``keep``, else 0: a float for a leaf, an array for a stack's layers."""
  out = np.where(keep, scale, 0.0)
  return float(out) if np.ndim(out) == 0 else out


def _frozen(keep: Mapping[str, Any]) -> GradientTransformation:
  """Zeroes the gradients of the leaves (or layers of a stacked leaf) not in ``keep``."""
  def zero(updates: Any, params: Any = None) -> Any:
    del params
    def one(name: str, g: Any) -> Any:
      if name not in keep:
        return g
      m = keep[name]
      return (jnp.zeros_like(g) if not np.any(m)
              else jnp.where(stacked_mod.per_layer(jnp.asarray(m), g), g, jnp.zeros_like(g)))
    names = [n for n, _ in masks.named_leaves(updates)]
    flat, treedef = jax.tree.flatten(updates)
    return jax.tree.unflatten(treedef, [one(n, g) for n, g in zip(names, flat)])

  return optax.stateless(zero)


_TIMM_LARS = {"lars": {}, "larc": {"trust_clip": True}, "nlars": {"nesterov": True},
              "nlarc": {"nesterov": True, "trust_clip": True}}
_TIMM_LAMB = {"lamb": {}, "lambc": {"trust_clip": True}, "lambw": {"decoupled_decay": True},
              "clamb": {"caution": True}}
_TIMM_NAMES = (*_TIMM_LARS, *_TIMM_LAMB, "cadamw")
_SHARED = ("lr_mult", "multi_precision", "axis_name", "stacked",
           "group_by_shape")  # the library's options


def timm_optimizer(
    opt: str,
    *,
    lr: optax.ScalarOrSchedule | None = None,
    weight_decay: float = 0.0,
    momentum: float = 0.9,
    filter_bias_and_bn: bool = True,
    no_weight_decay: Iterable[str] = (),
    layer_decay: float | None = None,
    group_matcher: Mapping[str, Any] | None = None,
    layer_decay_min_scale: float = 0.0,
    layer_decay_no_opt_scale: float | None = None,
    fallback_list: Iterable[str] = (),
    fallback_no_weight_decay: bool = False,
    foreach: bool | None = None,
    **kwargs: Any,
) -> GradientTransformationExtraArgs:
  r"""timm's ``create_optimizer_v2(model, opt, lr, weight_decay, momentum, ...)``.

  ``opt`` is one of ``"lars"``, ``"larc"``, ``"nlars"``, ``"nlarc"`` (timm's
  ``Lars``, with ``trust_clip`` and ``nesterov`` as their names say),
  ``"lamb"``, ``"lambc"``, ``"lambw"``, ``"clamb"`` (``Lamb`` with
  ``trust_clip``, ``decoupled_decay``, ``caution``) and ``"cadamw"``
  (``AdamW`` with ``caution``). A name's flags are defaults, as in timm:
  ``timm_optimizer("larc", trust_clip=False)`` is ``"lars"``. As in timm 1.0,
  with ``weight_decay`` the leaves whose names match ``no_weight_decay`` (the
  model's ``no_weight_decay()``: ``fnmatch`` patterns such as XCiT's
  ``"pos_embed.*"``, matched against the leaf names with ``/`` read as ``.``)
  and, with ``filter_bias_and_bn``, the leaves of ``ndim <= 1`` and those named
  ``bias`` form a group with ``weight_decay=0``, which under LARS and LAMB also
  gets no trust ratio (unless ``always_adapt=True``). ``filter_bias_and_bn=False``
  keeps the ``no_weight_decay`` names out all the same, as timm does. ``momentum`` goes to the LARS
  optimizers only, as timm passes it; other keywords (``trust_coeff``,
  ``eps``, ``betas``, ``max_grad_norm``, ...) go to the optimizer's class,
  whose defaults apply otherwise (``lr=None`` too).

  ``layer_decay`` is timm's layer-wise rate decay (BEiT, MAE and ViT
  fine-tuning recipes): ``group_matcher`` is the model's
  ``group_matcher(coarse=False)`` dict (a regex, or a list of ``(regex,
  suffix)``, per group), matched against the leaf names with ``/`` read as
  ``.`` (``blocks/3/attn/qkv/kernel`` as ``blocks.3.attn.qkv.kernel``), and the
  leaves get timm's layer ids (numbers the regexes capture order them within
  a group; a ``(99999,)`` suffix joins the previous layer; a leaf no regex
  matches is the last layer, the head). Layer ``i`` of ``n`` takes the rate
  scale ``max(layer_decay_min_scale, layer_decay ** (n - 1 - i))``, as timm's
  scheduler applies the groups' ``lr_scale`` (timm applies it through its
  schedulers: with a constant rate and no scheduler it applies none). A leaf
  whose scale is below ``layer_decay_no_opt_scale`` is frozen (timm sets
  ``requires_grad=False``: no step, and no share of a clipped global norm).
  On this path timm's no-decay group is ``ndim <= 1`` (with
  ``filter_bias_and_bn``) and the names ``no_weight_decay`` matches as
  ``fnmatch`` patterns (dotted names). A stacked leaf (``stacked=``) reads as
  its layers unrolled, the layer index placed where a regex captures it
  (``blocks/attn/kernel`` as ``blocks.3.attn.kernel``), and gets one scale per
  layer. The layer ids come from the leaf names at ``init``, so ``update``
  needs ``params``. ``fallback_list`` and
  ``fallback_no_weight_decay`` choose a hybrid optimizer's fallback (Muon's),
  which LARS and LAMB do not have, and ``foreach`` how PyTorch loops: none of
  the three changes a number here.

  >>> import lars_optax
  >>> tx = lars_optax.porting.timm_optimizer("lamb", lr=2e-3, weight_decay=0.01)

  References:
    timm ``timm.optim.create_optimizer_v2``, ``param_groups_weight_decay``.
  """
  if not isinstance(opt, str) or opt.lower() not in _TIMM_NAMES:
    raise ValueError(f"opt: expected one of {', '.join(_TIMM_NAMES)}, got {opt!r}.")
  opt = opt.lower()
  filter_bias_and_bn = v.check_flag("filter_bias_and_bn", filter_bias_and_bn)
  v.check_flag("fallback_no_weight_decay", fallback_no_weight_decay)
  if foreach is not None:
    v.check_flag("foreach", foreach)
  _names_list("fallback_list", fallback_list)
  if layer_decay is not None:
    layers = _TimmLayers(layer_decay, group_matcher, layer_decay_min_scale,
                         layer_decay_no_opt_scale, filter_bias_and_bn, no_weight_decay)
    if opt == "cadamw" or "lr_mult" in kwargs:
      raise ValueError("layer_decay: takes a LARS or LAMB opt, without lr_mult (the layer "
                       "scales are its per-leaf rates).")
    _timm_groups(opt, lr, weight_decay, momentum, None, kwargs)  # (checks the rest now)
    return layers.optimizer(lambda no_decay, lr_mult: _timm_groups(
        opt, lr, weight_decay, momentum, no_decay, {**kwargs, "lr_mult": lr_mult}),
        kwargs.get("stacked", stacked_mod.FROM_METADATA))
  no_decay = (None if utils.is_const(weight_decay, 0)
              else _timm_no_decay(no_weight_decay, filter_bias_and_bn))
  return _timm_groups(opt, lr, weight_decay, momentum, no_decay, kwargs)


def _timm_groups(opt: str, lr: Any, weight_decay: Any, momentum: Any, no_decay: Any,
                 kwargs: dict) -> GradientTransformationExtraArgs:
  """:func:`timm_optimizer` once its no-decay group is known."""
  kwargs = dict(kwargs)
  shared = {k: kwargs.pop(k) for k in _SHARED if k in kwargs}
  opts = _shared(shared.get("lr_mult"), shared.get("multi_precision", False),
                 shared.get("axis_name"), shared.get("stacked", stacked_mod.FROM_METADATA),
                 shared.get("group_by_shape", False))
  if opt == "cadamw":
    return _timm_cadamw(lr, weight_decay, no_decay, kwargs, opts)
  family, make, defaults = ((_TIMM_LARS, _timm_lars, timm_lars) if opt in _TIMM_LARS
                            else (_TIMM_LAMB, _timm_lamb, timm_lamb))
  signature = inspect.signature(defaults).parameters
  own = {k: p.default for k, p in signature.items() if k != "lr" and k not in _SHARED}
  unknown = set(kwargs) - set(own)
  if unknown:
    raise TypeError(f"{sorted(unknown)[0]}: timm's {opt!r} optimizer takes no such "
                    f"argument; it takes {', '.join(sorted(own))}.")
  # As in timm, the name's flags are defaults: the user's keywords win.
  args = {**own, **family[opt], **kwargs, "weight_decay": weight_decay}
  if family is _TIMM_LARS:
    args["momentum"] = momentum
  return make(f"timm_{opt}", signature["lr"].default if lr is None else lr,
              no_decay=no_decay, opts=opts, **args)


def _timm_cadamw(lr: Any, weight_decay: Any, no_decay: masks.MaskLike, kwargs: dict,
                 opts: Shared) -> GradientTransformationExtraArgs:
  if opts["group_by_shape"]:
    raise ValueError("group_by_shape: timm's 'cadamw' takes no per-leaf norms to group; "
                     "pass it with a LARS or LAMB opt, or leave it out.")
  """timm's ``AdamW(caution=True)``: optax's AdamW step with a cautious direction."""
  betas = kwargs.pop("betas", (0.9, 0.999))
  eps = kwargs.pop("eps", 1e-8)
  if kwargs:
    raise TypeError(f"{sorted(kwargs)[0]}: timm's 'cadamw' optimizer takes no such "
                    "argument; it takes betas, eps.")
  lr = 1e-3 if lr is None else lr
  v.check_learning_rate("lr", lr)
  b1, b2 = _betas("betas", betas)
  v.check_scalar("eps", eps, low=0.0)
  v.check_scalar("weight_decay", weight_decay, low=0.0)
  parts = [unchecked_scale_by_caution(optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
                                      stacked=opts["stacked"], axis_name=opts["axis_name"]),
           *_decay(weight_decay, no_decay, opts, "no_weight_decay"), base.learning_rate_part(lr)]
  return _finish(parts, "timm_cadamw", opts, exempt=[("no_weight_decay", no_decay)],
                 hyperparams=[("lr", lr), ("weight_decay", weight_decay)])


# --------------------------------------------------------------------------
# torch.optim, Keras
# --------------------------------------------------------------------------


@v.renamed_keywords({})
def torch_sparse_adam(
    lr: optax.ScalarOrSchedule = 1e-3,
    *,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    maximize: bool = False,
    lr_mult: masks.LeafValues = None,
    multi_precision: bool = False,
) -> optax.GradientTransformation:
  r"""``torch.optim.SparseAdam(params, lr, betas, eps, maximize)``: lazy Adam on row-sparse
  gradients.

  Only the rows of a row-sparse gradient (:func:`lars_optax.sparse.value_and_grad`)
  move, and only their moments decay; :math:`\epsilon` is added to
  :math:`\sqrt{v_t}` before the bias correction, as in PyTorch. It is
  :func:`lars_optax.mxnet.adam` with ``lazy_update=True`` (MXNet's rule is
  PyTorch's); dense gradients update the rows whose gradient is not all zero.
  ``maximize=True`` ascends: the step of the negated gradient, as PyTorch takes it.

  References:
    PyTorch ``torch.optim.SparseAdam``; Kingma and Ba, `Adam
    <https://arxiv.org/abs/1412.6980>`_, 2015.
  """
  v.check_learning_rate("lr", lr)
  b1, b2 = _betas("betas", betas)
  v.check_scalar("eps", eps, low=0.0)
  maximize = v.check_flag("maximize", maximize)
  multi_precision = v.check_flag("multi_precision", multi_precision)
  masks.check_leaf_values(lr_mult, "lr_mult")
  # MXNet's lazy Adam (PyTorch's rule), from the links' twins: checked above, in torch's words.
  tx = base.finish([unchecked_scale_by_mxnet_adam(b1, b2=b2, eps=eps),
                    base.learning_rate_part(lr), *base.lr_mult_part(lr_mult)],
                   "torch_sparse_adam", lazy=True, multi_precision=multi_precision,
                   complex_params=True, leaf_values=[("lr_mult", lr_mult)],
                   hyperparams=base.hyperparams(lr=lr, eps=eps))
  if not maximize:
    return tx
  # The gradient negated on its rows (a row-sparse gradient stays row-sparse).
  return optax.chain(lazy_update(optax.scale(-1.0)), tx)


@v.renamed_keywords({})
def keras_lamb(
    learning_rate: optax.ScalarOrSchedule = 0.001,
    *,
    beta_1: float = 0.9,
    beta_2: float = 0.999,
    epsilon: float = 1e-7,
    weight_decay: float | None = None,
    exclude_from_weight_decay: Iterable[str] | None = None,
    clipnorm: float | None = None,
    clipvalue: float | None = None,
    global_clipnorm: float | None = None,
    use_ema: bool = False,
    ema_momentum: float = 0.99,
    ema_overwrite_frequency: int | None = None,
    loss_scale_factor: float | None = None,
    gradient_accumulation_steps: int | None = None,
    name: str | None = None,
    lr_mult: masks.LeafValues = None,
    multi_precision: bool = False,
    axis_name: stacked_mod.AxisNameLike = None,
    stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA,
    group_by_shape: bool = False,
) -> GradientTransformationExtraArgs:
  r"""Keras 3's ``keras.optimizers.Lamb(learning_rate, beta_1, beta_2, epsilon, weight_decay)``.

  Keras decays every variable before the step, :math:`w \leftarrow (1 -
  \alpha_t\lambda) w`, outside the ratio; then the bias-corrected Adam
  direction :math:`d` and :math:`w \leftarrow w - \alpha_t\rho d` with
  :math:`\rho = \|w\| / \|d\|` (1 when a norm is 0), every variable adapted.
  ``exclude_from_weight_decay`` takes the names of
  ``optimizer.exclude_from_weight_decay(var_names=...)``: a leaf whose name
  contains one of them is not decayed.

  The base optimizer's clips act on the gradients first, as in Keras (one of
  them at most): ``clipnorm`` scales each leaf's gradient to a norm of at most
  ``clipnorm``, ``global_clipnorm`` the whole tree's
  (:func:`lars_optax.sparse.clip_by_global_norm`, which inside ``shard_map``
  takes the norm of the whole tree), ``clipvalue`` clips each entry to
  :math:`[-v, v]`. ``name`` and, without ``use_ema``, ``ema_momentum`` and
  ``ema_overwrite_frequency`` change no number and are accepted as Keras takes
  them. ``use_ema`` and ``loss_scale_factor`` are refused with the optax way to
  do the same.

  ``gradient_accumulation_steps=n`` steps every ``n`` calls, with the mean of
  the ``n`` gradients (clipped after the mean), and returns zero updates in
  between (:class:`optax.MultiSteps` around the chain). As in Keras 3, Adam's
  bias correction counts the steps taken, and a schedule reads every call:
  the ``j``-th step (from 0) takes the rate of call :math:`(j + 1)n - 1`.

  References:
    Keras 3 ``keras.optimizers.Lamb``.
  """
  opts = _shared(lr_mult, multi_precision, axis_name, stacked, group_by_shape)
  clip = _keras_clip(clipnorm, clipvalue, global_clipnorm, axis_name)
  _keras_refused(use_ema, loss_scale_factor)
  if name is not None and not isinstance(name, str):
    raise TypeError(f"name: expected a string or None, got {name!r}.")
  v.check_learning_rate("learning_rate", learning_rate)
  v.check_scalar("beta_1", beta_1, low=0.0, high=1.0, high_open=True)
  v.check_scalar("beta_2", beta_2, low=0.0, high=1.0, high_open=True)
  v.check_scalar("epsilon", epsilon, low=0.0)
  if weight_decay is not None:
    v.check_scalar("weight_decay", weight_decay, low=0.0)
  every = _keras_accumulation(gradient_accumulation_steps)
  if every > 1 and callable(learning_rate):
    # The j-th update is Keras's call (j + 1)·n - 1, the count its schedule reads.
    learning_rate = functools.partial(_keras_accumulated_rate, learning_rate, every)
  exempt = None
  if exclude_from_weight_decay:
    if isinstance(exclude_from_weight_decay, str):
      raise TypeError("exclude_from_weight_decay: expected a list of names, got the string "
                      f"{exclude_from_weight_decay!r}.")
    named = masks.by_substring(*exclude_from_weight_decay)
    exempt = named.optional()  # (Keras ignores a name that matches nothing: so do we)

  def layer_wise(o: Shared, m: dict[str, Any]) -> list:
    exempt = m["exclude_from_weight_decay"]
    step = [unchecked_scale_by_lamb_adam(beta_1, b2=beta_2, eps=epsilon),
            unchecked_scale_by_lamb_trust_ratio(axis_name=o["axis_name"], stacked=o["stacked"]),
            base.learning_rate_part(learning_rate), *_lr_mult(o)]
    if weight_decay is None or utils.is_const(weight_decay, 0):
      return step
    return [unchecked_add_decoupled_weight_decay(
        optax.chain(*step), learning_rate=learning_rate, weight_decay=weight_decay,
        wd_mult=None if exempt is None else [(exempt, 0.0)], lr_mult=o["lr_mult"],
        stacked=o["stacked"])]

  tx = _finish_layer_wise(layer_wise, "keras_lamb", opts, with_lr_mult=False, pre=clip,
                          masks_by_arg={"exclude_from_weight_decay": exempt},
                          hyperparams=[("learning_rate", learning_rate),
                                       ("weight_decay", weight_decay),
                                       ("epsilon", epsilon)])
  if exempt is not None:
    tx = _warning_unmatched(tx, named, "exclude_from_weight_decay")
  if every > 1:
    return optax.with_extra_args_support(
        optax.MultiSteps(tx, every_k_schedule=every).gradient_transformation())
  return tx


def _warning_unmatched(tx: Any, named: masks.Mask, arg_name: str) -> Any:
  """``tx`` whose ``init`` warns of the names given to ``named`` that match no leaf.

  Keras skips such a name silently, and its numbers do not change; but a Keras script's
  names (``gamma``, ``beta``) are not a JAX model's (``scale``, ``bias``), so the leaf
  the user meant to exempt is decayed. Elsewhere this library refuses such a name.
  """
  def init_fn(params):
    missing = named.unmatched(params)
    if missing:
      names = [n for n, _ in masks.named_leaves(params)]
      warnings.warn(
          f"{arg_name}: no parameter name " + ", and none ".join(missing)
          + f" (names look like {names[:3]}, {len(names)} in all), so those names exempt "
          "nothing, as in Keras. A Keras model's names (gamma, beta) are not a JAX "
          "model's (scale, bias): give the names the leaves have here "
          "(lars_optax.leaf_names(params)).", UserWarning, stacklevel=2)
    return tx.init(params)

  return tx._replace(init=init_fn)


def _keras_accumulation(steps: Any) -> int:
  """Keras's ``gradient_accumulation_steps``: None, or an int >= 2 (Keras's check)."""
  if steps is None:
    return 1
  if isinstance(steps, (bool, np.bool_)) or not isinstance(steps, (int, np.integer)):
    raise TypeError(f"gradient_accumulation_steps: expected an int >= 2 or None, got "
                    f"{steps!r}.")
  if steps < 2:
    raise ValueError(f"gradient_accumulation_steps: must be an int >= 2 (Keras's bound), "
                     f"got {steps}.")
  return int(steps)


def _keras_accumulated_rate(schedule: Callable[[Any], Any], every: int, count: Any) -> Any:
  """Keras's schedule under accumulation: it reads every call, (count + 1)·every - 1."""
  return schedule((count + 1) * every - 1)


def _keras_clip(clipnorm: Any, clipvalue: Any, global_clipnorm: Any, axis_name: Any) -> list:
  """Keras's base-optimizer gradient clips, as links (at most one, as Keras asserts)."""
  given = {k: x for k, x in (("clipnorm", clipnorm), ("clipvalue", clipvalue),
                             ("global_clipnorm", global_clipnorm)) if x is not None}
  if len(given) > 1:
    raise ValueError(f"{', '.join(given)}: Keras takes only one of clipnorm, clipvalue and "
                     "global_clipnorm.")
  for k, x in given.items():
    v.check_scalar(k, x, low=0.0, low_open=True)
  if clipvalue is not None:
    return [optax.clip(clipvalue)]
  if global_clipnorm is not None:
    return [clip_by_global_norm(global_clipnorm, axis_name=axis_name)]
  if clipnorm is not None:
    def one(g: jax.Array) -> jax.Array:  # g * c / max(|g|, c), Keras's form
      norm = jnp.sqrt(jnp.sum(jnp.square(g.astype(jnp.float32))))
      return (g * (clipnorm / jnp.maximum(norm, clipnorm))).astype(g.dtype)

    return [optax.stateless(lambda updates, params=None: jax.tree.map(one, updates))]
  return []


def _keras_refused(use_ema: Any, loss_scale_factor: Any) -> None:
  """Keras's arguments with no port, each refused with the optax way to do the same."""
  if v.check_flag("use_ema", use_ema):
    raise ValueError(
        "use_ema: lars_optax keeps no moving average of the weights inside the optimizer. "
        "Keep one beside it: ema = optax.incremental_update(params, ema, "
        "step_size=1 - ema_momentum) after each step.")
  if loss_scale_factor is not None:
    raise ValueError(
        "loss_scale_factor: scale the loss before jax.grad and divide the gradients by the "
        "same factor before update (or use a loss-scaling library such as jmp); the "
        "optimizer takes the true gradients.")


# --------------------------------------------------------------------------
# optax
# --------------------------------------------------------------------------


@v.renamed_keywords({})
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
  opts = _shared(lr_mult, multi_precision, axis_name, stacked, group_by_shape)
  v.check_learning_rate("learning_rate", learning_rate)
  if not callable(weight_decay):  # (a schedule too, as optax takes)
    v.check_scalar("weight_decay", weight_decay, low=0.0)
  v.check_scalar("trust_coefficient", trust_coefficient, low=0.0)
  v.check_scalar("eps", eps, low=0.0)
  v.check_scalar("momentum", momentum, low=0.0, high=1.0, high_open=True)
  nesterov = v.check_flag("nesterov", nesterov)
  no_decay = _optax_mask(weight_decay_mask, "weight_decay_mask")
  no_ratio = _optax_mask(trust_ratio_mask, "trust_ratio_mask")

  def layer_wise(o: Shared, m: dict[str, Any]) -> list:
    return [*_decay(weight_decay, m["weight_decay_mask"], o, "weight_decay_mask"),
            unchecked_scale_by_lars_trust_ratio(trust_coefficient=trust_coefficient, eps=eps,
                                                skip=m["trust_ratio_mask"],
                                                axis_name=o["axis_name"], stacked=o["stacked"]),
            unchecked_mxnet_momentum(learning_rate, momentum=momentum, nesterov=nesterov)]

  tx = _finish_layer_wise(layer_wise, "optax_lars", opts,
                          masks_by_arg={"weight_decay_mask": no_decay,
                                        "trust_ratio_mask": no_ratio},
                          hyperparams=[("learning_rate", learning_rate),
                                       ("weight_decay", weight_decay),
                                       ("trust_coefficient", trust_coefficient),
                                       ("eps", eps)])
  return _as_optax_stacks(tx, stacked, "optax_lars", "optax.lars")


@v.renamed_keywords({})
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
  opts = _shared(lr_mult, multi_precision, axis_name, stacked, group_by_shape)
  v.check_learning_rate("learning_rate", learning_rate)
  v.check_betas(b1, b2, eps)
  v.check_scalar("eps_root", eps_root, low=0.0)
  if not callable(weight_decay):  # (a schedule too, as optax takes)
    v.check_scalar("weight_decay", weight_decay, low=0.0)

  def layer_wise(o: Shared, m: dict[str, Any]) -> list:
    return [unchecked_scale_by_lamb_adam(b1, b2=b2, eps=eps, eps_root=eps_root),
            *_decay(weight_decay, m["mask"], o, "mask"),
            unchecked_scale_by_lamb_trust_ratio(axis_name=o["axis_name"], stacked=o["stacked"]),
            base.learning_rate_part(learning_rate)]

  tx = _finish_layer_wise(layer_wise, "optax_lamb", opts,
                          masks_by_arg={"mask": _optax_mask(mask, "mask")},
                          hyperparams=[("learning_rate", learning_rate),
                                       ("weight_decay", weight_decay), ("eps", eps),
                                       ("eps_root", eps_root)])
  return _as_optax_stacks(tx, stacked, "optax_lamb", "optax.lamb")


# --------------------------------------------------------------------------
# BYOL, SimCLR, ALBERT
# --------------------------------------------------------------------------


def _as_optax_stacks(tx: GradientTransformationExtraArgs, stacked: Any, name: str,
                     peer: str) -> GradientTransformationExtraArgs:
  """``tx``; with ``stacked=None`` (optax's one ratio per stack, the drop-ins' default),
  one whose ``init`` warns on leaves with Flax ``"layers"`` metadata."""
  if stacked is not None:
    return tx
  return stacked_mod.warn_one_ratio_per_stack(tx, name, peer)


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


@v.renamed_keywords({})
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
  opts = _shared(lr_mult, multi_precision, axis_name, stacked, group_by_shape)
  v.check_learning_rate("learning_rate", learning_rate)
  v.check_scalar("weight_decay", weight_decay, low=0.0)
  v.check_scalar("momentum", momentum, low=0.0, high=1.0, high_open=True)
  v.check_scalar("eta", eta, low=0.0)

  def layer_wise(o: Shared, m: dict[str, Any]) -> list:
    return [*_decay(weight_decay, m["weight_decay_filter"], o, "weight_decay_filter"),
            unchecked_scale_by_lars_trust_ratio(trust_coefficient=eta, eps=0.0,
                                                axis_name=o["axis_name"], stacked=o["stacked"],
                                                skip=m["lars_adaptation_filter"]),
            *_torch_momentum(learning_rate, momentum, 0.0, False)]

  return _finish_layer_wise(
      layer_wise, "byol_lars", opts,
      masks_by_arg={
          "weight_decay_filter": _byol_exempt("weight_decay_filter", weight_decay_filter),
          "lars_adaptation_filter": _byol_exempt("lars_adaptation_filter",
                                                 lars_adaptation_filter)},
      hyperparams=[("learning_rate", learning_rate), ("weight_decay", weight_decay),
                   ("eta", eta)])


@v.renamed_keywords({})
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
  opts = _shared(lr_mult, multi_precision, axis_name, stacked, group_by_shape)
  v.check_learning_rate("learning_rate", learning_rate)
  v.check_scalar("momentum", momentum, low=0.0, high=1.0, high_open=True)
  v.check_scalar("weight_decay", weight_decay, low=0.0)
  v.check_scalar("eeta", eeta, low=0.0)
  use_nesterov = v.check_flag("use_nesterov", use_nesterov)
  classic_momentum = v.check_flag("classic_momentum", classic_momentum)
  no_decay = _regexes("exclude_from_weight_decay", exclude_from_weight_decay)
  no_ratio = _regexes("exclude_from_layer_adaptation", exclude_from_layer_adaptation)
  no_ratio = no_decay if no_ratio is None else no_ratio

  def layer_wise(o: Shared, m: dict[str, Any]) -> list:
    ratio = unchecked_scale_by_lars_trust_ratio(trust_coefficient=eeta, eps=0.0,
                                                skip=m["exclude_from_layer_adaptation"],
                                                axis_name=o["axis_name"], stacked=o["stacked"])
    if classic_momentum:
      tail = [ratio, unchecked_mxnet_momentum(learning_rate, momentum=momentum,
                                              nesterov=use_nesterov)]
    else:
      tail = [utils.keep_dtypes(optax.trace(decay=momentum, nesterov=use_nesterov), momentum),
              ratio, base.learning_rate_part(learning_rate)]
    return [*_decay(weight_decay, m["exclude_from_weight_decay"], o,
                    "exclude_from_weight_decay"), *tail]

  return _finish_layer_wise(layer_wise, "simclr_lars", opts,
                            masks_by_arg={"exclude_from_weight_decay": no_decay,
                                          "exclude_from_layer_adaptation": no_ratio},
                            hyperparams=[("learning_rate", learning_rate),
                                         ("weight_decay", weight_decay), ("eeta", eeta)])


@v.renamed_keywords({})
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
  opts = _shared(lr_mult, multi_precision, axis_name, stacked, group_by_shape)
  v.check_learning_rate("learning_rate", learning_rate)
  v.check_scalar("weight_decay_rate", weight_decay_rate, low=0.0)
  v.check_scalar("beta_1", beta_1, low=0.0, high=1.0, high_open=True)
  v.check_scalar("beta_2", beta_2, low=0.0, high=1.0, high_open=True)
  v.check_scalar("epsilon", epsilon, low=0.0)
  no_decay = _regexes("exclude_from_weight_decay", exclude_from_weight_decay)
  no_ratio = _regexes("exclude_from_layer_adaptation", exclude_from_layer_adaptation)
  no_ratio = no_decay if no_ratio is None else no_ratio

  def layer_wise(o: Shared, m: dict[str, Any]) -> list:
    return [unchecked_scale_by_lamb_adam(beta_1, b2=beta_2, eps=epsilon, bias_correction=False),
            *_decay(weight_decay_rate, m["exclude_from_weight_decay"], o,
                    "exclude_from_weight_decay"),
            unchecked_scale_by_lamb_trust_ratio(skip=m["exclude_from_layer_adaptation"],
                                                axis_name=o["axis_name"], stacked=o["stacked"]),
            base.learning_rate_part(learning_rate)]

  return _finish_layer_wise(layer_wise, "albert_lamb", opts,
                            masks_by_arg={"exclude_from_weight_decay": no_decay,
                                          "exclude_from_layer_adaptation": no_ratio},
                            hyperparams=[("learning_rate", learning_rate),
                                         ("weight_decay_rate", weight_decay_rate),
                                         ("epsilon", epsilon)])
