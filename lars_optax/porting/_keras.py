"""``keras.optimizers.Lamb`` (Keras 3), in Keras's words."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import GradientTransformationExtraArgs

from lars_optax import _assembly as assembly
from lars_optax import _links
from lars_optax import _utils as utils
from lars_optax import _masks as masks
from lars_optax import _stacked as stacked_mod
from lars_optax._lamb import unchecked_scale_by_lamb_adam
from lars_optax.sparse.optax_compat import clip_by_global_norm
from lars_optax._transforms import unchecked_add_decoupled_weight_decay
from lars_optax._trust_ratio import unchecked_scale_by_lamb_trust_ratio
from lars_optax.porting import _shared as shared


def _keras_name(name: str, value: Any) -> None:
  if value is not None and not isinstance(value, str):
    raise TypeError(f"{name}: expected a string or None, got {value!r}.")


def _one_clip(*, clipnorm: Any, clipvalue: Any, global_clipnorm: Any, **_: Any) -> None:
  given = [k for k, x in (("clipnorm", clipnorm), ("clipvalue", clipvalue),
                          ("global_clipnorm", global_clipnorm)) if x is not None]
  if len(given) > 1:
    raise ValueError(f"{', '.join(given)}: Keras takes only one of clipnorm, clipvalue and "
                     "global_clipnorm.")


_KERAS = {
    "clipnorm": _links.POSITIVE, "clipvalue": _links.POSITIVE,
    "global_clipnorm": _links.POSITIVE, "use_ema": _links.FLAG,
    "ema_momentum": _links.UNUSED, "ema_overwrite_frequency": _links.UNUSED,
    "loss_scale_factor": _links.IN_BODY, "exclude_from_weight_decay": _links.IN_BODY,
    "gradient_accumulation_steps": _links.Arg(lambda name, steps: _keras_accumulation(steps)),
    "name": _links.Arg(_keras_name),
}
"""Keras's own: one clip at most; ``use_ema`` and ``loss_scale_factor`` refused with the
optax way (:func:`_keras_refused`); the names excluded from decay, checked as they
become a mask."""


@_links.optimizer(declared=_KERAS, relations=_one_clip)
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
  opts = shared.options(lr_mult, multi_precision, axis_name, stacked, group_by_shape)
  clip = _keras_clip(clipnorm, clipvalue, global_clipnorm, axis_name)
  _keras_refused(use_ema, loss_scale_factor)
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

  def layer_wise(o: shared.Shared, m: dict[str, Any]) -> list:
    exempt = m["exclude_from_weight_decay"]
    step = [unchecked_scale_by_lamb_adam(beta_1, b2=beta_2, eps=epsilon),
            unchecked_scale_by_lamb_trust_ratio(axis_name=o["axis_name"], stacked=o["stacked"]),
            assembly.learning_rate_part(learning_rate), *shared.lr_mult_links(o)]
    if weight_decay is None or utils.is_const(weight_decay, 0):
      return step
    return [unchecked_add_decoupled_weight_decay(
        optax.chain(*step), learning_rate=learning_rate, weight_decay=weight_decay,
        wd_mult=None if exempt is None else [(exempt, 0.0)], lr_mult=o["lr_mult"],
        stacked=o["stacked"])]

  tx = assembly.finish(clip, "keras_lamb", **shared.assembled(
      opts, layer_wise, masks_by_arg={"exclude_from_weight_decay": exempt}, with_lr_mult=False))
  if exempt is not None:
    tx = shared.warning_at_init(tx, _unmatched(named, "exclude_from_weight_decay"))
  if every > 1:
    return optax.with_extra_args_support(
        optax.MultiSteps(tx, every_k_schedule=every).gradient_transformation())
  return tx


def _unmatched(named: masks.Mask, arg_name: str) -> Callable[[Any], str | None]:
  """The warning for the names given to ``named`` that match no leaf.

  Keras skips such a name silently, and its numbers do not change; but a Keras script's
  names (``gamma``, ``beta``) are not a JAX model's (``scale``, ``bias``), so the leaf
  the user meant to exempt is decayed. Elsewhere this library refuses such a name.
  """
  def message(params: Any) -> str | None:
    missing = named.unmatched(params)
    if not missing:
      return None
    names = [n for n, _ in masks.named_leaves(params)]
    return (f"{arg_name}: no parameter name " + ", and none ".join(missing)
            + f" (names look like {names[:3]}, {len(names)} in all), so those names exempt "
            "nothing, as in Keras. A Keras model's names (gamma, beta) are not a JAX "
            "model's (scale, bias): give the names the leaves have here "
            "(lars_optax.leaf_names(params)).")

  return message


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
  if use_ema:
    raise ValueError(
        "use_ema: lars_optax keeps no moving average of the weights inside the optimizer. "
        "Keep one beside it: ema = optax.incremental_update(params, ema, "
        "step_size=1 - ema_momentum) after each step.")
  if loss_scale_factor is not None:
    raise ValueError(
        "loss_scale_factor: scale the loss before jax.grad and divide the gradients by the "
        "same factor before update (or use a loss-scaling library such as jmp); the "
        "optimizer takes the true gradients.")
