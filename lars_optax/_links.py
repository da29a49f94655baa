"""Private: a public link from its rule, and the one declaration of each argument.

A link is written once, as its rule ``unchecked_<name>``: a plain function of its
arguments that builds the :class:`optax.GradientTransformation` and checks
nothing. The optimizers chain the rules, having checked their own arguments and,
in their first link (:func:`lars_optax.check_inputs`), the trees;
``group_by_shape`` builds the rules on stacks. :func:`public_link` makes the
public ``<name>``, which checks what it is given, every time, whoever calls it:

* its arguments, when it is built: each by its declaration in :data:`DECLARED`
  (its kind, its range, and whether it must be finite in the params' dtype),
  looked up by name, since a name means one thing everywhere; then the relations
  between them (``relations``, a function of the link's arguments);
* the trees, in ``init`` and ``update``: one wrapper (see :func:`public_link`'s
  keywords) around the rule's transformation.

An optimizer's arguments are declared in the same table and checked by
:func:`optimizer` when it is built; its ``init`` then checks the params
against the same declarations (:func:`checked_at_init`: the names in masks and
per-leaf values, the constants' dtypes), so no constructor lists them again.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lars_optax import _masks as masks
from lars_optax import _utils as utils
from lars_optax import _stacked as stacked_mod
from lars_optax import _validation as v

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Arg:
  """One argument's declaration.

  Attributes:
    check: ``check(name, value)`` raises, naming ``name``, for a value of the
      wrong kind or out of range (a None passes where the default is None).
    in_dtype: a scalar that must be finite in the dtype it is used in (checked
      at ``init``, see :func:`lars_optax._validation.check_representable`):
      the params' dtype, or with ``computed`` the float32-or-wider dtype of the
      norms (a LARS coefficient, LAMB's bounds on a norm).
    computed: see ``in_dtype``.
    named_by: the argument whose value names this one in messages (``arg_name``).
    matched: ``"mask"`` or ``"values"``: the argument names leaves (a mask, or
      per-leaf values as ``lr_mult``), each of which must match one at ``init``.
  """

  check: Callable[[str, Any], Any]
  in_dtype: bool = False
  computed: bool = False
  named_by: str | None = None
  matched: Literal["mask", "values"] | None = None


def scalar(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False, alternative: str = "", in_dtype: bool = True,
           computed: bool = False) -> Arg:
  """A real number in the given range."""
  return Arg(functools.partial(_scalar, low=low, high=high, low_open=low_open,
                               high_open=high_open, alternative=alternative),
             in_dtype=in_dtype, computed=computed)


def optional(arg: Arg) -> Arg:
  """``arg``, or None."""
  def check(name: str, value: Any) -> None:
    if value is not None:
      arg.check(name, value)

  return dataclasses.replace(arg, check=check)


def _scalar(name: str, value: Any, **range_: Any) -> None:
  v.check_scalar(name, value, **range_)


def _rate(name: str, value: Any, positive: bool = False) -> None:
  v.check_learning_rate(name, value, positive=positive)


def _flag(name: str, value: Any) -> None:
  v.check_flag(name, value)


def _initial_count(name: str, value: Any) -> None:
  v.check_count(name, value, maximum=v.MAX_INITIAL_COUNT, why=v.COUNT_WHY)


def _text(name: str, value: Any) -> None:
  if not isinstance(value, str):
    raise TypeError(f"{name}: expected a string, got {value!r}.")


def _axis_names(name: str, value: Any) -> None:
  stacked_mod.check_axis_names(value, name)


def _stacked(name: str, value: Any) -> None:
  stacked_mod.check_stacked(value, name)


def _leaf_values(name: str, value: Any) -> None:
  masks.check_leaf_values(value, name)


def _mask(name: str, value: Any) -> None:
  masks.check_mask_like(value, name)


def _betas(name: str, value: Any) -> None:
  if not isinstance(value, (tuple, list)) or len(value) != 2:
    raise TypeError(f"{name}: expected a pair (beta1, beta2), got {value!r}.")
  for i, b in enumerate(value):
    v.check_scalar(f"{name}[{i}]", b, low=0.0, high=1.0, high_open=True)


def _non_negative_or_schedule(name: str, value: Any) -> None:
  if not callable(value):  # (optax takes a schedule)
    v.check_scalar(name, value, low=0.0)


def _transformation(name: str, value: Any) -> None:
  v.check_transformation(value, name)


UNIT = scalar(0.0, 1.0, high_open=True, in_dtype=False)
"""A decay rate or momentum in [0, 1)."""
NON_NEGATIVE = scalar(low=0.0)
POSITIVE = scalar(low=0.0, low_open=True)
COEFFICIENT = scalar(low=0.0, computed=True)
"""A coefficient >= 0 used in the float32-or-wider dtype of the norms."""
RATE = Arg(_rate, in_dtype=True)
POSITIVE_RATE = Arg(functools.partial(_rate, positive=True), in_dtype=True)
"""A learning rate that is divided by: a constant one must be > 0."""
FLAG = Arg(_flag)
LEAF_VALUES = Arg(_leaf_values, matched="values")
MULTIPLIERS = Arg(_leaf_values, named_by="arg_name")
MASK = Arg(_mask, matched="mask")
TEXT = Arg(_text)
IN_BODY = Arg(lambda name, value: None)
"""An argument the constructor checks itself, where the check builds what it checks
(a peer's filter or name patterns, a layer-decay table) or refuses it with advice."""
UNUSED = Arg(lambda name, value: None)
"""A peer's argument accepted as the peer takes it, which changes no number here."""
NON_NEGATIVE_OR_SCHEDULE = Arg(_non_negative_or_schedule, in_dtype=True)

DECLARED: dict[str, Arg] = {
    "learning_rate": RATE,
    "larc_learning_rate": Arg(_rate),
    "momentum": UNIT,
    "dampening": UNIT,
    "nesterov": FLAG,
    "b1": UNIT,
    "b2": UNIT,
    "eps": NON_NEGATIVE,
    "eps_root": NON_NEGATIVE,
    "bias_correction": FLAG,
    "grad_averaging": FLAG,
    "weight_decay": NON_NEGATIVE,
    "wd_mult": LEAF_VALUES,
    "lr_mult": LEAF_VALUES,
    "multipliers": MULTIPLIERS,
    "arg_name": TEXT,
    "skip": MASK,
    "axis_name": Arg(_axis_names),
    "stacked": Arg(_stacked),
    "inner": Arg(_transformation),
    "trust_coefficient": COEFFICIENT,
    "ratio_weight_decay": COEFFICIENT,
    "grad_scale": POSITIVE,
    "lower_bound": scalar(low=0.0, alternative=" or None", computed=True),
    # (0 is refused: MXNet's fused kernels read upper_bound=0 as "no bound", its
    # plain step as a norm of 0.)
    "upper_bound": scalar(low=0.0, low_open=True, alternative=" or None", computed=True),
    "max_trust_ratio": scalar(low=0.0, low_open=True, in_dtype=False),
    "initial_count": Arg(_initial_count),
    "schedule_decay": scalar(low=0.0, computed=True),
    "max_abs": POSITIVE,
    "lamda1": NON_NEGATIVE,
    "beta": NON_NEGATIVE,
    "variance_control": NON_NEGATIVE,
    # The optimizers' own (MXNet's names; the ports declare their peers')
    "wd": NON_NEGATIVE,
    "rescale_grad": POSITIVE,
    "clip_gradient": scalar(low=0.0, low_open=True, in_dtype=False),  # (1e39 clips nothing)
    "multi_precision": FLAG,
    "lazy_update": FLAG,
    "beta1": UNIT,
    "beta2": UNIT,
    "epsilon": NON_NEGATIVE,
    "begin_num_update": Arg(_initial_count),
    "correct_bias": FLAG,
    "lamda": NON_NEGATIVE,
    "wd_lh": NON_NEGATIVE,
    "rho": UNIT,
    "centered": FLAG,
    "clip_weights": scalar(low=0.0, low_open=True, alternative=", or None", in_dtype=False),
    "eta": COEFFICIENT,
    "wd_skip": MASK,
    "group_by_shape": FLAG,
    # TensorFlow's
    "eeta": COEFFICIENT,
    "use_nesterov": FLAG,
    # The peers' (the ports)
    "lr": RATE,
    "betas": Arg(_betas),
    "trust_coeff": COEFFICIENT,
    "trust_clip": FLAG,
    "always_adapt": FLAG,
    "caution": FLAG,
    "decoupled_decay": FLAG,
    "corrected_weight_decay": FLAG,
    "max_grad_norm": optional(scalar(low=0.0, low_open=True, in_dtype=False)),
    "max_lr": optional(scalar(low=0.0, low_open=True, in_dtype=False)),
    "foreach": FLAG,
    "maximize": FLAG,
    "beta_1": UNIT,
    "beta_2": UNIT,
    "weight_decay_rate": NON_NEGATIVE,
    "classic_momentum": FLAG,
    "filter_bias_and_bn": FLAG,
    "fallback_no_weight_decay": FLAG,
}
"""Each argument a link or an optimizer takes, declared once, by name."""

POSITIVE_EPSILON = {"epsilon": POSITIVE}
"""For the rules that divide by epsilon alone (RMSProp, AdaDelta)."""


def check_declared(values: Mapping[str, Any], declared: Mapping[str, Arg] = DECLARED, *,
                   prefix: str = "") -> None:
  """Checks each of ``values`` (name: value) by its declaration, in order (messages
  name it ``prefix`` + its name)."""
  for name, value in values.items():
    arg = declared[name]
    label = values[arg.named_by] if arg.named_by else name
    arg.check(prefix + label, value)


ParamsKind = Literal["real", "complex"] | None


def _binder(fn: Callable[..., Any], name: str, declared: Mapping[str, Arg] | None,
            relations: Callable[..., None] | None,
            prefix: str = "") -> Callable[..., inspect.BoundArguments]:
  """``bind(*args, **kwargs)``: ``fn``'s arguments, with defaults, each checked by its
  declaration (a None passes where the default is None), then ``relations``."""
  signature = inspect.signature(fn)
  table = {**DECLARED, **(declared or {})}
  named = [p.name for p in signature.parameters.values()
           if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]  # (those are checked where they go)
  undeclared = [p for p in named if p not in table]
  if undeclared:
    raise TypeError(f"{name}: arguments {undeclared} are not declared.")
  defaults = {p.name: p.default for p in signature.parameters.values()}

  def bind(*args: Any, **kwargs: Any) -> inspect.BoundArguments:
    try:
      bound = signature.bind(*args, **kwargs)
    except TypeError as e:
      raise TypeError(f"{name}() {e}") from None
    bound.apply_defaults()
    values = bound.arguments
    check_declared({k: values[k] for k in named
                    if not (values[k] is None and defaults[k] is None)}, table, prefix=prefix)
    if relations is not None:
      relations(**values)
    return bound

  return bind


def optimizer(*, hints: Mapping[str, str] | None = None,
              declared: Mapping[str, Arg] | None = None,
              relations: Callable[..., None] | None = None,
              where: str | None = None) -> Callable[[_F], _F]:
  """The one decorator of every optimizer constructor: its arguments are checked by
  their declarations in :data:`DECLARED` (``declared``: this optimizer's own), then
  ``group_by_shape`` (not with ``axis_name``) where it takes it, then ``relations`` (a
  function of all of them), before it runs; its ``init`` checks the params against them
  (:func:`checked_at_init`); a keyword it does not take, of ``hints`` or optax's, gets
  the advice (:func:`lars_optax._validation.keyword_hints`). Messages name an argument
  alone, or ``"<where>: <name>"`` (``where``: the optimizer's name where others share
  its arguments' names, such as ``"sparse.adam"``). The function keeps its signature."""
  prefix = f"{where}: " if where else ""

  def all_relations(**values: Any) -> None:
    if "group_by_shape" in values:
      v.check_group_by_shape(values["group_by_shape"], values.get("axis_name"))
    if relations is not None:
      relations(**values)

  def decorate(fn: _F) -> _F:
    bind = _binder(fn, where or fn.__name__, declared, all_relations, prefix)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
      bound = bind(*args, **kwargs)
      return checked_at_init(fn(*args, **kwargs), bound.arguments, declared, prefix=prefix)

    wrapper.checked_by_declaration = True  # type: ignore[attr-defined]
    return v.keyword_hints(hints or {})(cast(_F, wrapper))

  return decorate


def public_link(rule: _F, *, relations: Callable[..., None] | None = None,
                declared: Mapping[str, Arg] | None = None, params: ParamsKind = "real",
                matches: Sequence[str] = (), same_structure: bool = False,
                hints: Mapping[str, str] | None = None) -> _F:
  """The public link of ``unchecked_<name>``, its rule: it checks its arguments, builds
  the rule and checks the trees.

  Args:
    rule: ``unchecked_<name>``, a plain function of the link's arguments.
    relations: a check of the arguments together (e.g. Nesterov needs
      ``dampening == 0``), called with all of them after each is checked.
    declared: declarations that differ from :data:`DECLARED` for this link.
    params: ``init`` accepts ``"real"`` floating point params, or
      ``"complex"`` ones too (and ``update``, with ``same_structure``, checks
      them again); None: the rule reads no param values.
    matches: the masks whose names must each match a leaf (checked at ``init``,
      with the leaves' names unique).
    same_structure: ``update`` checks that the gradients have the params' tree
      structure and shapes (when params are given; the rule requires them).
    hints: as :func:`lars_optax._validation.keyword_hints`.
  """
  name = rule.__name__.removeprefix("unchecked_")
  bind = _binder(rule, name, declared, relations)
  table = {**DECLARED, **(declared or {})}
  in_dtype = [p for p in inspect.signature(rule).parameters if table[p].in_dtype]

  @functools.wraps(rule)
  def link(*args: Any, **kwargs: Any) -> Any:
    bound = bind(*args, **kwargs)
    values = bound.arguments
    tx = rule(*bound.args, **bound.kwargs)
    return checked_trees(tx, name, params=params,
                         in_dtype={k: values[k] for k in in_dtype if values[k] is not None},
                         matches={k: values[k] for k in matches},
                         same_structure=same_structure, declared=table)

  link.__name__ = link.__qualname__ = name
  return v.keyword_hints(hints or {})(cast(_F, link))


def checked_trees(tx: optax.GradientTransformation, name: str, *, params: ParamsKind,
                  in_dtype: Mapping[str, Any], matches: Mapping[str, masks.MaskLike],
                  same_structure: bool,
                  declared: Mapping[str, Arg] = DECLARED) -> optax.GradientTransformation:
  """``tx`` whose ``init`` and ``update`` first check the trees (see :func:`public_link`;
  ``declared``: the table the constants' dtypes are read from)."""
  kind, allow_complex = params, params == "complex"

  def init_fn(params: optax.Params) -> optax.OptState:
    if kind is not None:
      v.check_float_params(params, name, allow_complex=allow_complex)
    check_constants(in_dtype.items(), params, declared)
    if matches:
      masks.check_unique_names(params)
      for arg, mask in matches.items():
        masks.check_matches(mask, params, arg)
    return tx.init(params)

  def check_update(updates: optax.Updates, params: optax.Params | None) -> None:
    if same_structure and params is not None:
      params = v.align_params(updates, params)
      v.check_same_structure(updates, params, name)
      if kind is not None:
        v.check_float_params(params, name, allow_complex=allow_complex)

  # (optax's own name for the third argument: update(updates, state, params=params) works.)
  if isinstance(tx, optax.GradientTransformationExtraArgs):
    def update_extra(updates, state, params=None, **extra_args):
      check_update(updates, params)
      return tx.update(updates, state, params, **extra_args)

    return optax.GradientTransformationExtraArgs(init_fn, update_extra)

  def update_fn(updates, state, params=None):
    check_update(updates, params)
    return tx.update(updates, state, params)

  return optax.GradientTransformation(init_fn, update_fn)


def check_constants(constants: Iterable[tuple[str, Any]], params: Any,
                    declared: Mapping[str, Arg] = DECLARED, *, prefix: str = "") -> None:
  """Each ``(argument, value)`` is finite in the dtype it is used in, by the argument's
  declaration (an undeclared name: the params' dtype); messages name it ``prefix`` +
  its name."""
  for arg, value in constants:
    computed = arg in declared and declared[arg].computed
    v.check_representable(prefix + arg, value, params, computed=computed)


def check_names(params: Any, names: Sequence[tuple[str, masks.MaskLike, str | None]],
                leaf_values: Sequence[tuple[str, masks.LeafValues]]) -> None:
  """Each name given in a mask (``(argument, mask, hint)``) or in per-leaf values
  (``(argument, spec)``) matches a leaf, and the leaves' names are unique; an
  exemption mask that looks like an optax mask passed as it is gets a warning."""
  if any(mask is not None for _, mask, _ in names) or any(
      spec is not None for _, spec in leaf_values):
    masks.check_unique_names(params)
  for arg, mask, hint in names:
    masks.check_matches(mask, params, arg, hint=hint)
    chosen = masks.resolve_mask(mask, params, arg)  # a bool pytree's structure, bools
    if arg in v.EXEMPT_MASKS:
      _warn_inverted(arg, chosen, params)
  for arg, spec in leaf_values:
    masks.resolve_leaf_values(spec, params, arg, check_names=True, check_layers=False)


def _warn_inverted(arg: str, exempt: Sequence[bool], params: Any) -> None:
  """Warns when an exemption mask (True = left out) exempts every leaf of two or
  more axes and none of one or none: an optax mask (True = apply), inverted."""
  big = [np.ndim(p) > 1 for p in jax.tree.leaves(params)]
  if all(big) or not any(big) or list(exempt) != big:
    return
  warnings.warn(
      f"{arg}: exempts every weight (each leaf of 2 or more axes) and no bias or norm "
      f"scale (the leaves of 0 or 1 axis), the reverse of the usual rule. {arg} takes "
      "True = left out, the reverse of an optax mask (True = applied): this looks like "
      "an optax mask passed as it is. Pass its inverse, e.g. "
      "jax.tree.map(operator.not_, mask) or lars_optax.by_ndim(1) (the leaves of "
      "at most one axis).", UserWarning, stacklevel=4)


def _master_dtypes(params: Any) -> Any:
  """``params``' shapes and dtypes, float32 for float16 and bfloat16 leaves: the dtypes
  the rule runs in with master weights (:func:`lars_optax.multi_precision`)."""
  def master(p: Any) -> Any:
    dtype = getattr(p, "dtype", None)
    dtype = jnp.dtype(np.asarray(p).dtype if dtype is None else dtype)
    return jax.ShapeDtypeStruct(np.shape(p), jnp.float32 if dtype in utils.LOW_PRECISION
                                else dtype)

  return jax.tree.map(master, params)


def checked_at_init(tx: optax.GradientTransformation, arguments: Mapping[str, Any],
                    declared: Mapping[str, Arg] | None = None, *, prefix: str = "") -> Any:
  """``tx`` whose ``init`` first checks the params against what ``arguments``
  (an optimizer's, by name) declare: each name in a mask or in per-leaf values
  matches a leaf (:func:`check_names`), and each constant is finite in the dtype it
  is used in (:func:`check_constants`; with ``multi_precision``, float32 for
  float16 and bfloat16 params, their master weights')."""
  table = {**DECLARED, **(declared or {})}
  given = {k: x for k, x in arguments.items() if k in table and x is not None}
  constants = [(k, x) for k, x in given.items() if table[k].in_dtype]
  names = [(k, x, None) for k, x in given.items() if table[k].matched == "mask"]
  leaf_values = [(k, x) for k, x in given.items() if table[k].matched == "values"]
  master = bool(arguments.get("multi_precision", False))
  if not (constants or names or leaf_values):
    return tx

  def init_fn(params: optax.Params) -> optax.OptState:
    check_constants(constants, _master_dtypes(params) if master else params, table,
                    prefix=prefix)
    check_names(params, names, leaf_values)
    return tx.init(params)

  return tx._replace(init=init_fn)
