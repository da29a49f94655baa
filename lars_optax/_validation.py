"""Argument checks shared by the transformations and optimizers.

Hyperparameters are checked when a transformation is built; parameter and
gradient trees when it is first traced. Every error names the argument (or the
leaf) and says what is accepted.
"""

from __future__ import annotations

import difflib

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lars_optax import _masks as masks


def _is_traced(value: Any) -> bool:
  return isinstance(value, jax.core.Tracer)


def _range_text(low: float | None, high: float | None, low_open: bool,
                high_open: bool) -> str:
  """``"in [0, 1)"``, ``">= 0"``, ``"> 0"``, ... (empty without bounds)."""
  if low is not None and high is not None:
    return (f"in {'(' if low_open else '['}{low:g}, "
            f"{high:g}{')' if high_open else ']'}")
  if low is not None:
    return f"{'>' if low_open else '>='} {low:g}"
  if high is not None:
    return f"{'<' if high_open else '<='} {high:g}"
  return ""


def check_scalar(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    alternative: str = "",
) -> None:
  """Checks that ``value`` is a finite real scalar inside the given range.

  Every message names the argument and the accepted range; ``alternative``
  adds what else is accepted (e.g. ``" or an optax schedule"``).
  """
  rng = _range_text(low, high, low_open, high_open)
  expected = f"a real number{' ' + rng if rng else ''}{alternative}"
  if isinstance(value, (bool, np.bool_, str, bytes)) or value is None:
    raise TypeError(f"{name}: expected {expected}, got {value!r}.")
  if _is_traced(value):
    return  # A traced hyperparameter (e.g. under jit) can't be checked here.
  try:
    arr = np.asarray(value)
  except Exception as e:  # pragma: no cover - exotic objects
    raise TypeError(f"{name}: expected {expected}, got {value!r}.") from e
  # (jnp.issubdtype: numpy's own does not count bfloat16 as floating point.)
  if arr.ndim != 0 or not (jnp.issubdtype(arr.dtype, jnp.integer)
                           or jnp.issubdtype(arr.dtype, jnp.floating)):
    raise TypeError(f"{name}: expected {expected} (a real scalar), got {value!r}.")
  v = float(arr)
  if not math.isfinite(v):
    raise ValueError(f"{name}: must be finite{' and ' + rng if rng else ''}, got {v}.")
  lo_bad = low is not None and (v <= low if low_open else v < low)
  hi_bad = high is not None and (v >= high if high_open else v > high)
  if lo_bad or hi_bad:
    hint = ""
    if arr.dtype in (jnp.float16, jnp.bfloat16):
      hint = (f" (a {arr.dtype} scalar, so rounded: pass a Python float; under "
              "optax.inject_hyperparams, which casts hyperparameters to the params' dtype, "
              "pass hyperparam_dtype=jnp.float32)")
    raise ValueError(f"{name}: must be {rng}, got {v:g}{hint}.")


def check_betas(b1: Any, b2: Any, eps: Any, *,
                names: tuple[str, str, str] = ("b1", "b2", "eps")) -> None:
  """Adam's decay rates in [0, 1) and its epsilon >= 0, under ``names``."""
  check_scalar(names[0], b1, low=0.0, high=1.0, high_open=True)
  check_scalar(names[1], b2, low=0.0, high=1.0, high_open=True)
  check_scalar(names[2], eps, low=0.0)


def check_learning_rate(name: str, value: Any, *, positive: bool = False) -> None:
  """A learning rate is a schedule (callable) or a finite scalar >= 0 (``positive``:
  > 0, for the rules that divide by it)."""
  if callable(value):
    return
  check_scalar(name, value, low=0.0, low_open=positive, alternative=" or an optax schedule")


def check_count(name: str, value: Any, minimum: int = 0, *, arrays: bool = True,
                maximum: int | None = None, why: str = "") -> None:
  """An int >= ``minimum`` (and <= ``maximum``, if given): a count, a size.

  With ``arrays``, an integer array passes unchecked (step counts from
  ``optax.inject_hyperparams``). Raises a ValueError (for a wrong type too, as
  these checks always have); ``why`` explains the maximum in the message.
  """
  if arrays and isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jnp.integer):
    return
  expected = (f"an int >= {minimum}" if maximum is None
              else f"an int in [{minimum}, {maximum}]{why}")
  if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
      or value < minimum or (maximum is not None and value > maximum)):
    raise ValueError(f"{name}: expected {expected}, got {value!r}.")


INT32_MAX = int(np.iinfo(np.int32).max)
"""Step counts are int32 (optax's convention); they saturate here."""


def is_constant(value: Any) -> bool:
  """True for a hyperparameter whose value is known now (not a schedule, not traced)."""
  return not (value is None or callable(value) or _is_traced(value))


def known_value(value: Any) -> float | None:
  """The value of a scalar hyperparameter known now: a Python or numpy number, or a
  concrete JAX array (``optax.inject_hyperparams`` makes every numeric default one);
  None for a schedule, a tracer or anything else."""
  if not is_constant(value) or isinstance(value, (bool, np.bool_)):
    return None
  try:
    return float(np.asarray(value)) if np.ndim(value) == 0 else None
  except (TypeError, ValueError):
    return None


def check_representable(name: str, value: Any, params: Any, *, computed: bool = False,
                        nonzero: bool = False) -> None:
  """A constant hyperparameter must be finite in the dtype it is used in.

  Checked at ``init``, when the params' dtypes are known: ``value`` is cast to
  each parameter's dtype (with ``computed``, to the float32-or-wider dtype that
  norms use: an argument's declaration says which, see
  :class:`lars_optax._links.Arg`). A value beyond that dtype's largest finite
  number would become infinite and make the update inf or NaN; with
  ``nonzero``, a value > 0 that rounds to 0 is rejected too (an epsilon that
  would vanish). Schedules and traced values are not checked.
  """
  if not is_constant(value):
    return
  x = float(np.asarray(value, np.float64))
  seen = set()
  for leaf_name, leaf in masks.named_leaves(params):
    dtype = getattr(leaf, "dtype", None)
    dtype = jnp.dtype(np.asarray(leaf).dtype if dtype is None else dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
      continue
    if computed:
      dtype = jnp.promote_types(dtype, jnp.float32)
    if dtype in seen:
      continue
    seen.add(dtype)
    info = jnp.finfo(dtype)
    if abs(x) > float(info.max):
      raise ValueError(
          f"{name}: {x:g} is beyond the range of {dtype.name} (largest finite value "
          f"{float(info.max):g}), the dtype {'it is used in for' if computed else 'of'} "
          f"parameter {leaf_name!r}: it would make the update infinite or NaN. Use a "
          "smaller value" + (", or multi_precision=True (float32 master weights)."
                             if dtype in (jnp.float16, jnp.bfloat16) else "."))
    if nonzero and x != 0 and float(np.asarray(x).astype(dtype)) == 0:
      raise ValueError(
          f"{name}: {x:g} is 0 in {dtype.name}, the dtype "
          f"{'it is used in for' if computed else 'of'} parameter {leaf_name!r}; use a value "
          f">= {float(info.tiny):g}.")


COMPLEX_OPTIMIZERS = ("mxnet.sgd", "mxnet.nag", "mxnet.adam", "lars", "tf_lars", "lamb",
                      "porting.torch_sparse_adam")
"""The optimizers that take complex params (as :func:`optax.sgd` and
:func:`optax.adam` do): their rules are defined with :math:`|g|^2` and norms of
:math:`|w|`, :math:`|g|`. Sign-based rules, the AdaGrad family, FTRL and the
rest have no agreed complex form."""


def check_float_params(tree: Any, where: str, what: str = "parameter", *,
                       allow_complex: bool = False) -> None:
  """Rejects integer and boolean leaves (they can't be trained), and complex
  ones unless ``allow_complex``.

  ``what`` names the tree's leaves in the message (``"parameter"``,
  ``"gradient"``).
  """
  for name, leaf in masks.named_leaves(tree):
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:
      if isinstance(leaf, (int, float, complex)):
        raise TypeError(
            f"{where}: {what} {name!r} is a Python {type(leaf).__name__}, not an array; "
            f"pass arrays (e.g. jnp.asarray({leaf!r}, jnp.float32)) so that its dtype "
            "is known.")
      dtype = np.asarray(leaf).dtype
    if allow_complex and jnp.issubdtype(dtype, jnp.complexfloating):
      continue
    if jnp.issubdtype(dtype, jnp.complexfloating):
      names = ", ".join(f"lars_optax.{n}" for n in COMPLEX_OPTIMIZERS)
      raise TypeError(
          f"{where}: {what} {name!r} has dtype {dtype}; this optimizer takes only real "
          "floating point leaves (float16, bfloat16, float32, float64). Complex "
          f"params are taken by {names} (without clip_gradient or multi_precision), "
          "whose rules use "
          "|g|^2 and the norms of |w| and |g|.")
    if not jnp.issubdtype(dtype, jnp.floating):
      raise TypeError(
          f"{where}: {what} {name!r} has dtype {dtype}; only real floating "
          "point leaves (float16, bfloat16, float32, float64) are supported.")


def check_complex_gradients(updates: Any, params: Any, where: str) -> None:
  """A complex gradient needs a complex parameter (casting would drop its imaginary part)."""
  for (name, g), (_, p) in zip(masks.named_leaves(updates), masks.named_leaves(params)):
    if (jnp.iscomplexobj(g) and getattr(p, "dtype", None) is not None
        and not jnp.issubdtype(p.dtype, jnp.complexfloating)):
      raise TypeError(f"{where}: gradient {name!r} is complex ({g.dtype}) but its "
                      f"parameter is real ({p.dtype}); take the gradient of a real "
                      "loss with respect to real parameters.")


def require_params(params: Any, where: str) -> None:
  """Raises a ValueError when a rule that reads the params is given none."""
  if params is None:
    raise ValueError(f"{where}: params are required; call "
                     "update(updates, state, params).")


def check_same_structure(updates: Any, params: Any, where: str) -> None:
  """Raises a ValueError naming the leaves when two trees differ (or params are missing)."""
  require_params(params, where)
  # (Any: jax's type stubs do not describe PyTreeDef's comparison.)
  t_u: Any = jax.tree.structure(updates)
  t_p: Any = jax.tree.structure(params)
  if t_u == t_p:
    for (name, u), (_, p) in zip(masks.named_leaves(updates),
                                 masks.named_leaves(params)):
      if np.shape(u) != np.shape(p):
        raise ValueError(
            f"{where}: gradient {name!r} has shape {np.shape(u)} but the "
            f"parameter has shape {np.shape(p)}.")
    return
  u_names = {n for n, _ in masks.named_leaves(updates)}
  p_names = {n for n, _ in masks.named_leaves(params)}
  detail = []
  if p_names - u_names:
    detail.append(f"missing from gradients: {sorted(p_names - u_names)[:5]}; a gradient "
                  "may be None where a param is not trained (e.g. Equinox's filtered "
                  "gradients), or pass eqx.filter(model, eqx.is_array)")
  if u_names - p_names:
    detail.append(f"not in params: {sorted(u_names - p_names)[:5]}")
  raise ValueError(
      f"{where}: gradients and params have different tree structures"
      + (" (" + "; ".join(detail) + ")" if detail else f": {t_u} vs {t_p}")
      + ".")


def check_axis_name(axis_name: Any, arg_name: str = "axis_name") -> None:
  """An ``axis_name`` option is None or a non-empty string (a mesh axis)."""
  if axis_name is not None and (not isinstance(axis_name, str) or not axis_name):
    raise TypeError(f"{arg_name}: expected None or the name of a mesh axis (a non-empty "
                    f"string), got {axis_name!r}.")


def align_params(updates: Any, params: Any) -> Any:
  """``params`` with a None wherever ``updates`` holds a None (optax's convention).

  Equinox's documented loop calls ``update(grads, state, model)``: the model
  holds non-array leaves (activation functions, ...) where the filtered
  gradients hold None. Those params are not trained, so they are dropped, as
  optax's own transformations ignore them. Trees that do not line up this way
  are returned unchanged, for :func:`check_same_structure` to report.
  """
  if params is None or updates is None:
    return params
  t_u: Any = jax.tree.structure(updates)
  t_p: Any = jax.tree.structure(params)
  if t_u == t_p:
    return params
  try:
    return jax.tree.map(lambda u, p: None if u is None else p, updates, params,
                        is_leaf=lambda x: x is None)
  except (ValueError, TypeError):
    return params


def check_transformation(inner: Any, name: str = "inner") -> None:
  """``inner`` is an optax transformation (what a wrapper or an outer link takes)."""
  if not isinstance(inner, optax.GradientTransformation):
    raise TypeError(f"{name}: expected an optax.GradientTransformation, got "
                    f"{type(inner).__name__}.")


def check_flag(name: str, value: object) -> bool:
  """A bool (Python's or numpy's) named ``name``, as a Python bool."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name}: expected a bool, got {value!r}.")
  return bool(value)


# The largest initial count (begin_num_update, initial_count) and why.
MAX_INITIAL_COUNT = INT32_MAX - 1
COUNT_WHY = (" (the step count is int32, and the count of the first update, this + 1, "
              "must fit in it)")


_F = TypeVar("_F", bound=Callable[..., Any])


# optax's keywords (of optax.lars, lamb, adam, adamw, signum) and ours (and the
# peers' that the porting constructors take) that mean the same: the first of them
# that a function takes is named in its error.
_DECAY_MASKS = ("wd_skip", "skip_list", "wd_mult", "exclude_from_weight_decay",
                "weight_decay_filter", "no_weight_decay")
_OPTAX_EQUIVALENTS: dict[str, tuple[str, ...]] = {
    "learning_rate": ("learning_rate", "lr"),
    "lr": ("learning_rate", "lr"),
    "b1": ("beta1", "beta_1", "betas", "momentum"),
    "b2": ("beta2", "beta_2", "betas"),
    "eps": ("epsilon", "eps"),
    "weight_decay": ("wd", "weight_decay_rate"),
    "trust_coefficient": ("eta", "eeta", "trust_coeff"),
    "beta": ("momentum",),
    "momentum": ("momentum",),
    "weight_decay_mask": (*_DECAY_MASKS, "mask"),
    "mask": (*_DECAY_MASKS, "weight_decay_mask"),
    "trust_ratio_mask": ("skip", "skip_list", "exclude_from_layer_adaptation",
                         "lars_adaptation_filter"),
}
# Ours (and the peers') that name the leaves to exempt (True = left out), the reverse
# of optax's masks.
EXEMPT_MASKS = ("wd_skip", "skip", "skip_list", "exclude_from_weight_decay", "no_weight_decay",
                "exclude_from_layer_adaptation")
# optax's keywords with no equivalent in a function that lacks them.
_NO_EQUIVALENT = {
    "learning_rate": "this link takes no learning rate (chain "
                     "optax.scale_by_learning_rate after it)",
    "lr": "this link takes no learning rate (chain optax.scale_by_learning_rate after it)",
    "eps_root": "MXNet's rules add epsilon outside the square root; "
                "lars_optax.porting.optax_lamb takes eps_root",
    "mu_dtype": "the moments take the params' dtype; multi_precision=True keeps float32 "
                "masters and moments for float16/bfloat16 params",
    "accumulator_dtype": "the momentum takes the params' dtype; multi_precision=True keeps "
                         "float32 masters and momentum for float16/bfloat16 params",
    "nesterov": "this rule has no Nesterov momentum (lars_optax.porting.optax_lars, "
                "lars_optax.tf_lars(use_nesterov=True) and lars_optax.mxnet.nag have)",
    "momentum": "this rule has no momentum argument",
    "weight_decay_mask": "this rule takes no decay mask",
    "mask": "this rule takes no decay mask",
    "trust_ratio_mask": "this rule takes no trust-ratio mask",
    "trust_coefficient": "this rule has no trust coefficient",
    "b1": "this rule has no first-moment decay",
    "b2": "this rule has no second-moment decay",
    "eps": "this rule has no epsilon",
    "beta": "this rule has no momentum",
    "weight_decay": "this rule has no weight decay",
}


def _optax_hint(keyword: str, taken: set[str]) -> str | None:
  """The advice for optax's ``keyword`` in a function taking ``taken``; None if taken."""
  if keyword in taken:
    return None
  ours = next((o for o in _OPTAX_EQUIVALENTS.get(keyword, ()) if o in taken), None)
  if ours is None:
    why = _NO_EQUIVALENT.get(keyword)
    return None if why is None else f"optax's {keyword!r} has no equivalent here: {why}."
  advice = f"it takes {ours}= where optax takes {keyword}=."
  if ours == "wd_mult":
    advice += (" wd_mult gives per-leaf multipliers: 0.0 for the leaves optax's mask "
               "marks False.")
  elif ours == "skip_list":
    advice += (" skip_list names the leaves to leave out (substrings of their names), "
               "the reverse of optax's mask (True = apply).")
  elif ours in EXEMPT_MASKS:
    advice += (f" {ours} lists the leaves to leave out (True = exempt), the reverse of "
               f"optax's mask (True = apply): pass the leaves optax's mask marks False.")
  return advice


def keyword_hints(hints: Mapping[str, str]) -> Callable[[_F], _F]:
  """A decorator for a public function: a keyword of ``hints``, or one of optax's,
  that the function does not take raises a TypeError that starts with the
  keyword and says which one to use.

  ``hints`` maps a keyword (``"weight_decay"``) to the advice that ends the
  message; optax's keywords (those of ``optax.lars``, ``lamb``, ``adam``,
  ``adamw`` and ``signum``) get the function's equivalent, or say there is
  none, and for masks the polarity. The function keeps its signature
  (:func:`functools.wraps`), so :func:`inspect.signature`,
  :func:`lars_optax.mxnet.create` and ``optax.inject_hyperparams`` see its own
  arguments. An optimizer checks its own arguments and chains the links'
  rules (see :func:`lars_optax._links.public_link`).
  """

  def decorate(fn: _F) -> _F:
    parameters = inspect.signature(fn).parameters
    taken = set(parameters)
    wrong = {k: why for k in _OPTAX_EQUIVALENTS.keys() | _NO_EQUIVALENT.keys()
             if (why := _optax_hint(k, taken)) is not None}
    wrong.update({k: why for k, why in hints.items() if k not in taken})
    if any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
      wrong = {}  # (it takes any keyword, and routes it: timm_optimizer's to timm's class)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
      for k in kwargs:
        if k in wrong:
          raise TypeError(f"{k}: {fn.__name__}() has no argument {k!r}; {wrong[k]}")
      return fn(*args, **kwargs)

    return cast(_F, wrapper)

  return decorate


def check_group_by_shape(group_by_shape: Any, axis_name: Any) -> bool:
  """``group_by_shape`` checked: a bool, and not with ``axis_name``."""
  flag = check_flag("group_by_shape", group_by_shape)
  if flag and axis_name is not None:
    raise ValueError(
        "group_by_shape: not with axis_name (a leaf split over a mesh axis is stacked "
        f"only with leaves split the same way), got axis_name={axis_name!r}; pass "
        "group_by_shape=False.")
  return flag


MXNET_HINTS = {
    "weight_decay": "it takes MXNet's name for weight decay, wd (e.g. wd=1e-4).",
    "lr": "it takes learning_rate (MXNet's name).",
}
"""The MXNet-flavoured optimizers' hints: ``weight_decay=`` and ``lr=`` name ``wd`` and
``learning_rate``."""

LARS_HINTS = {
    **MXNET_HINTS,
    "weight_decay": MXNET_HINTS["weight_decay"] + " TensorFlow's LARS, lars_optax.tf_lars, "
                    "is the one that takes weight_decay.",
}
""":func:`lars_optax.lars`'s: as :data:`MXNET_HINTS`, and names ``tf_lars``."""

TF_HINTS = {
    "wd": "it takes TensorFlow's name for weight decay, weight_decay (e.g. "
          "weight_decay=1e-4). MXNet's LARS, lars_optax.lars, is the one that takes wd.",
    "eta": "it takes TensorFlow's name for the LARS coefficient, eeta.",
    "lr": "it takes learning_rate (TensorFlow's name).",
}
""":func:`lars_optax.tf_lars`'s: MXNet's ``wd=`` and ``eta=`` name TensorFlow's
``weight_decay`` and ``eeta``."""



# Per-leaf mesh axes (the layer-wise rules' and the sparse clip's axis_name)

def check_keys(rules: Mapping[str, Any], names: Sequence[str], arg_name: str) -> None:
  """A ValueError naming ``arg_name`` for a dict key that names no leaf (and the closest names)."""
  unknown = [key for key in rules if key not in set(names)]
  if unknown:
    close = difflib.get_close_matches(unknown[0], names, n=3)
    raise ValueError(
        f"{arg_name}: no parameter is named {unknown[0]!r}"
        + (f" (did you mean {close}?)" if close else "")
        + f". Leaf names look like {names[:3]}.")


AxisNameLike = str | None | Mapping[str, "str | None"] | Sequence[tuple[Any, "str | None"]]


def check_axis_names(axis_name: AxisNameLike, arg_name: str = "axis_name") -> None:
  """``axis_name`` is None, a mesh axis, ``{leaf name: axis}`` or ``[(mask, axis)]`` rules."""
  if axis_name is None or isinstance(axis_name, str):
    check_axis_name(axis_name, arg_name)
  elif isinstance(axis_name, Mapping):
    for key, axis in axis_name.items():
      if not isinstance(key, str):
        raise TypeError(f"{arg_name}: expected leaf names as keys, got {key!r}.")
      check_axis_name(axis, f"{arg_name}[{key!r}]")
  elif isinstance(axis_name, (list, tuple)) and all(
      isinstance(r, (list, tuple)) and len(r) == 2 for r in axis_name):
    for mask, axis in axis_name:
      masks.check_mask_like(mask, arg_name)
      check_axis_name(axis, arg_name)
  else:
    raise TypeError(f"{arg_name}: expected None, a mesh axis name, a dict {{leaf name: axis}} "
                    f"or a list of (mask, axis) rules, got {axis_name!r}.")


def resolve_axis_names(axis_name: AxisNameLike, tree: Any, ks: Sequence[int] | None = None,
                       arg_name: str = "axis_name") -> Any:
  """``axis_name`` itself (a str or None), or its per-leaf form: one axis or None per leaf.

  A dict key that names no leaf, or a rule whose mask is built from names and
  matches none, raises a ValueError naming ``axis_name``.
  """
  if axis_name is None or isinstance(axis_name, str):
    return axis_name
  named = masks.named_leaves(tree)
  names = [n for n, _ in named]
  if isinstance(axis_name, Mapping):
    check_keys(axis_name, names, arg_name)
    return [axis_name.get(n) for n in names]
  found: list[Any] = [False] * len(names)  # False: no rule yet (None is an axis choice)
  for mask, axis in axis_name:
    masks.check_matches(mask, tree, arg_name)
    selected = masks.resolve_mask(mask, tree, arg_name, ks)
    found = [axis if (f is False and s) else f for f, s in zip(found, selected)]
  return [None if f is False else f for f in found]
