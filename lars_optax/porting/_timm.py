"""timm's LARS and LAMB classes and ``create_optimizer_v2``, in timm's words."""

from __future__ import annotations

import fnmatch
import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import GradientTransformation, GradientTransformationExtraArgs

from lars_optax import _assembly as assembly
from lars_optax import _links
from lars_optax import _mxnet_base as base
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax import _stacked as stacked_mod
from lars_optax._lamb import unchecked_scale_by_lamb_adam
from lars_optax._momentum import torch_nesterov
from lars_optax.sparse.optax_compat import clip_by_global_norm
from lars_optax._transforms import unchecked_scale_by_caution
from lars_optax._transforms import unchecked_add_decoupled_weight_decay
from lars_optax._trust_ratio import unchecked_scale_by_lars_trust_ratio
from lars_optax._trust_ratio import unchecked_scale_by_lamb_trust_ratio
from lars_optax.porting import _shared as shared


# --------------------------------------------------------------------------
# timm
# --------------------------------------------------------------------------


def _timm_lars(name: str, lr: Any, *, momentum: Any, dampening: Any, weight_decay: Any,
               nesterov: bool, trust_coeff: Any, eps: Any, trust_clip: bool,
               always_adapt: bool, foreach: bool | None = None, no_decay: masks.MaskLike,
               opts: shared.Shared):
  """timm's ``Lars`` (its arguments checked where they enter: :func:`timm_lars`, or
  :func:`timm_optimizer`'s keywords)."""
  del foreach  # (how PyTorch loops)

  def layer_wise(o: shared.Shared, m: dict[str, Any]) -> list:
    no_decay = m["no_weight_decay"]
    decay_mult = None if no_decay is None else [(no_decay, 0.0)]
    parts: list = []
    if always_adapt or not utils.is_const(weight_decay, 0):
      # timm adapts a group whose weight_decay is not 0, or every group with always_adapt.
      decay = shared.decay_links(weight_decay, no_decay, o, "no_weight_decay")
      parts.append(unchecked_scale_by_lars_trust_ratio(
          optax.chain(*decay) if decay else None, trust_coefficient=trust_coeff,
          ratio_weight_decay=weight_decay, eps=eps, skip=None if always_adapt else no_decay,
          wd_mult=decay_mult, axis_name=o["axis_name"], stacked=o["stacked"],
          larc_learning_rate=lr if trust_clip else None))
    return parts + shared.torch_momentum(lr, momentum, dampening, nesterov)

  return assembly.finish([], name, **shared.assembled(
      opts, layer_wise, masks_by_arg={"no_weight_decay": no_decay},
      exempt=[("no_weight_decay", no_decay)]))


@_links.optimizer(relations=torch_nesterov)
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
                    opts=shared.options(lr_mult, multi_precision, axis_name, stacked,
                                        group_by_shape))


def _timm_lamb(name: str, lr: Any, *, bias_correction: bool, betas: Any, eps: Any,
               weight_decay: Any, grad_averaging: bool, max_grad_norm: Any, trust_clip: bool,
               always_adapt: bool, caution: bool, decoupled_decay: bool,
               corrected_weight_decay: bool = False, max_lr: Any = None,
               foreach: bool | None = None, no_decay: masks.MaskLike, opts: shared.Shared):
  """timm's ``Lamb`` (its arguments checked where they enter: :func:`timm_lamb`, or
  :func:`timm_optimizer`'s keywords)."""
  del foreach  # (how PyTorch loops)
  b1, b2 = betas
  flags = {k: bool(x) for k, x in (
      ("bias_correction", bias_correction), ("grad_averaging", grad_averaging),
      ("trust_clip", trust_clip), ("always_adapt", always_adapt), ("caution", caution),
      ("decoupled_decay", decoupled_decay), ("corrected_weight_decay", corrected_weight_decay))}
  decays = not utils.is_const(weight_decay, 0)
  decay_lr = _timm_decay_rate(lr, flags["corrected_weight_decay"], max_lr)

  def layer_wise(o: shared.Shared, m: dict[str, Any]) -> list:
    no_decay = m["no_weight_decay"]
    direction: GradientTransformation = unchecked_scale_by_lamb_adam(
        b1, b2=b2, eps=eps, bias_correction=flags["bias_correction"],
        grad_averaging=flags["grad_averaging"])
    if flags["caution"]:
      direction = unchecked_scale_by_caution(direction, stacked=o["stacked"],
                                             axis_name=o["axis_name"])
    step = [direction]
    if not flags["decoupled_decay"]:
      step += shared.decay_links(weight_decay, no_decay, o, "no_weight_decay")
    if flags["always_adapt"] or decays:
      step.append(unchecked_scale_by_lamb_trust_ratio(
          skip=None if flags["always_adapt"] else no_decay, axis_name=o["axis_name"],
          stacked=o["stacked"], max_trust_ratio=1.0 if flags["trust_clip"] else None))
    step += [assembly.learning_rate_part(lr), *shared.lr_mult_links(o)]
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
  return assembly.finish(clip, name, **shared.assembled(
      opts, layer_wise, masks_by_arg={"no_weight_decay": no_decay},
      exempt=[("no_weight_decay", no_decay)], with_lr_mult=False))


@_links.optimizer()
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
                    opts=shared.options(lr_mult, multi_precision, axis_name, stacked,
                                        group_by_shape))


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
      v.require_params(params, "layer_decay")  # the layer ids come from their names
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


def _timm_opt(name: str, opt: Any) -> None:
  if not isinstance(opt, str) or opt.lower() not in _TIMM_NAMES:
    raise ValueError(f"{name}: expected one of {', '.join(_TIMM_NAMES)}, got {opt!r}.")


@_links.optimizer(declared={"opt": _links.Arg(_timm_opt), "no_weight_decay": _links.IN_BODY,
                       "layer_decay": _links.IN_BODY, "group_matcher": _links.IN_BODY,
                       "layer_decay_min_scale": _links.IN_BODY,
                       "layer_decay_no_opt_scale": _links.IN_BODY,
                       "fallback_list": _links.Arg(_names_list)})
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
  ``"pos_embed.*"``, matched against the leaf names with ``/`` read as ``.``, in
  the patterns too; ``init`` warns of a pattern that matches no leaf)
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
  opt = opt.lower()
  del fallback_list, fallback_no_weight_decay, foreach  # (change no number here)
  # A pattern may be spelt as leaf_names prints the leaves ("head/kernel"), or dotted.
  no_weight_decay = [p.replace("/", ".") for p in _names_list("no_weight_decay", no_weight_decay)]
  tx = _timm_optimizer(opt, lr, weight_decay, momentum, filter_bias_and_bn, no_weight_decay,
                       layer_decay, group_matcher, layer_decay_min_scale,
                       layer_decay_no_opt_scale, kwargs)
  return shared.warning_at_init(tx, _unmatched(no_weight_decay)) if no_weight_decay else tx


def _unmatched(patterns: list[str]) -> Callable[[Any], str | None]:
  """The warning for the ``no_weight_decay`` patterns that match no leaf.

  timm skips such a pattern silently (a model's ``no_weight_decay()`` may name what a
  variant lacks), and its numbers do not change; but the leaf the user meant to keep out
  is then decayed, so it is told."""
  def message(params: Any) -> str | None:
    dotted = [n.replace("/", ".") for n, _ in masks.named_leaves(params)]
    missing = [p for p in patterns if not any(fnmatch.fnmatchcase(d, p) for d in dotted)]
    if not missing:
      return None
    return (f"no_weight_decay: {missing} match no parameter name (names look like "
            f"{dotted[:3]}, {len(dotted)} in all), so they keep nothing out of the weight "
            "decay, as in timm. Give the names the leaves have here "
            "(lars_optax.leaf_names(params)), with '/' or '.'.")

  return message


def _timm_optimizer(opt: str, lr: Any, weight_decay: Any, momentum: Any,
                    filter_bias_and_bn: bool, no_weight_decay: list[str], layer_decay: Any,
                    group_matcher: Any, layer_decay_min_scale: Any,
                    layer_decay_no_opt_scale: Any, kwargs: dict) -> Any:
  """:func:`timm_optimizer` with its patterns dotted."""
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
  common = {k: kwargs.pop(k) for k in _SHARED if k in kwargs}
  shared.check_options(common)
  opts = shared.options(common.get("lr_mult"), common.get("multi_precision", False),
                        common.get("axis_name"), common.get("stacked", stacked_mod.FROM_METADATA),
                        common.get("group_by_shape", False))
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
  # What it routes (timm_optimizer checks its own), checked against the params at init
  # by the same declarations.
  routed = {**({"lr": signature["lr"].default} if lr is None else {}), **common,
            **{k: x for k, x in args.items() if k not in ("weight_decay", "momentum")}}
  lr = signature["lr"].default if lr is None else lr
  _links.check_declared({"lr": lr, **{k: x for k, x in args.items()
                                      if not (x is None and own.get(k, 0) is None)}})
  if family is _TIMM_LARS:
    torch_nesterov(**args)
  tx = make(f"timm_{opt}", lr, no_decay=no_decay, opts=opts, **args)
  return _links.checked_at_init(tx, routed)


def _timm_cadamw(lr: Any, weight_decay: Any, no_decay: masks.MaskLike, kwargs: dict,
                 opts: shared.Shared) -> GradientTransformationExtraArgs:
  """timm's ``AdamW(caution=True)``: optax's AdamW step with a cautious direction."""
  if opts["group_by_shape"]:
    raise ValueError("group_by_shape: timm's 'cadamw' takes no per-leaf norms to group; "
                     "pass it with a LARS or LAMB opt, or leave it out.")
  betas = kwargs.pop("betas", (0.9, 0.999))
  eps = kwargs.pop("eps", 1e-8)
  if kwargs:
    raise TypeError(f"{sorted(kwargs)[0]}: timm's 'cadamw' optimizer takes no such "
                    "argument; it takes betas, eps.")
  given_lr, lr = lr, 1e-3 if lr is None else lr
  _links.check_declared({"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
  b1, b2 = betas
  parts = [unchecked_scale_by_caution(optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
                                      stacked=opts["stacked"], axis_name=opts["axis_name"]),
           *shared.decay_links(weight_decay, no_decay, opts, "no_weight_decay"),
           assembly.learning_rate_part(lr)]
  tx = assembly.finish([*parts, *shared.lr_mult_links(opts)], "timm_cadamw",
                       **shared.assembled(opts, exempt=[("no_weight_decay", no_decay)]))
  return _links.checked_at_init(tx, {**({"lr": 1e-3} if given_lr is None else {}),
                                     "eps": eps, **opts})
