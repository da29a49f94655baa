r"""Dense-exact lazy optimizers: optax's Adam, AdamW and SGD on row-sparse gradients.

A lazy step (MXNet's ``lazy_update``, TF's LazyAdam, torch's SparseAdam)
touches only the rows in the batch: it is cheap, but it is another optimizer,
since under the dense step every row's moments decay and its weight keeps
moving each step. Here a row untouched for :math:`n` steps is brought up to
date when the batch next touches it, along the path the dense step would
have taken with a zero gradient on it: its moments decay (by :math:`\beta_1^n`
and :math:`\beta_2^n`, or SGD's momentum by :math:`\mu^n`) and its weight
moves by the sum of the steps it skipped, each at its own learning rate and
decay (the closed form is in :mod:`lars_optax.sparse._catch_up_factors`). Then
the step itself is optax's, on the touched rows. The result is optax's ``adam``, ``adamw`` or
``sgd`` on the dense gradient with zeros on the absent rows, at the cost of a
lazy step. A model reads the rows too: bring a batch's rows up to date
before its forward pass (:func:`catch_up` with ``rows=``), and the gradients,
and so the whole run, are the dense run's. The only extra state is one int32
per row, the step the row was last brought up to date (and, with a schedule, one
float32 per row: for AdamW the log of the decay applied so far, for SGD with
momentum the discounted sum of the rates to come).

How the sum is taken, and over which hyperparameters it holds (what it cannot
hold is refused when built): :mod:`lars_optax.sparse._catch_up_factors`;
docs/sparse.md gives the envelope.

docs/sparse.md has whole loops, run as written by its test: each batch's rows
brought up to date before the forward pass (``catch_up(rows=)``), and every row
before evaluation (``catch_up``).

References:
  Kingma and Ba, `Adam: A Method for Stochastic Optimization
  <https://arxiv.org/abs/1412.6980>`_, 2014; Loshchilov and Hutter,
  `Decoupled Weight Decay Regularization <https://arxiv.org/abs/1711.05101>`_, 2019.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import GradientTransformationExtraArgs

from lars_optax import _links
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax.sparse import _grad, _rows
from lars_optax.sparse import _catch_up_factors as factors
from lars_optax.sparse import _catch_up_state as surgery
from lars_optax.sparse._catch_up_state import CatchUpState

__all__ = ["CatchUpState", "adam", "adamw", "catch_up", "sgd"]


def _known(arg: _links.Arg) -> _links.Arg:
  """``arg``, refusing a traced value first.

  ``optax.inject_hyperparams`` passes every numeric argument as an array, traced
  under ``jit``: the catch-up needs the decay rates and the window when it is
  built, and the learning rate and decay at every skipped step, which a value
  set from outside each step does not give.
  """
  def check(label: str, value: Any) -> None:
    if isinstance(value, jax.core.Tracer):
      where = label.rpartition(": ")[0]
      raise ValueError(
          f"{label} is traced: {where} does not run under optax.inject_hyperparams in "
          f"jit, which passes its arguments as arrays traced from the state. The catch-up "
          "of the steps a row skipped needs every one of their rates and the decay rates "
          "when it is built, which a value set from outside each step does not give. For "
          "a rate that changes, pass an optax schedule as learning_rate (or "
          "weight_decay); to set one from outside each step, take the plain lazy step "
          "(lars_optax.sparse.lazy_update(optax.inject_hyperparams(optax.adam)(...))), or "
          "optax's own on dense gradients.")
    arg.check(label, value)

  return dataclasses.replace(arg, check=check)


def _number(value: Any) -> Any:
  """``value`` as a Python number where it is a concrete 0-d array."""
  if value is None or callable(value) or isinstance(value, (bool, np.bool_)):
    return value
  if np.ndim(value) == 0 and hasattr(value, "dtype"):
    return value.item() if hasattr(value, "item") else value
  return value


def _eps_root(label: str, value: Any) -> None:
  v.check_scalar(label, value, low=0.0)
  if float(value) != 0.0:
    raise ValueError(f"{label} must be 0 (got {float(value):g}): with it the skipped steps "
                     "of an untouched row have no closed form here.")


def _dtype(label: str, value: Any) -> None:
  try:
    jnp.dtype(value)
  except TypeError:
    raise TypeError(f"{label}: expected a dtype or None, got {value!r}.") from None


def _tables(label: str, value: Any) -> None:
  if not isinstance(value, str):  # (a string names leaves, as value_and_grad's sparse)
    masks.check_mask_like(value, label)


def _count(maximum: int) -> _links.Arg:
  return _known(_links.Arg(lambda label, value: v.check_count(
      label, value, 1, arrays=False, maximum=maximum)))


# The dense-exact optimizers' arguments (optax's names) as they take them: a value known
# when built (not traced), and their own (eps_root must be 0, the window's sizes).
_DECLARED = {
    **{k: _known(_links.DECLARED[k]) for k in ("b1", "b2", "eps", "momentum")},
    "learning_rate": _known(_links.RATE),
    "weight_decay": _known(_links.RATE),  # (optax's adamw takes a schedule)
    "eps_root": _known(_links.Arg(_eps_root)),
    "mu_dtype": _links.Arg(_dtype),
    "accumulator_dtype": _links.Arg(_dtype),
    "mask": _links.Arg(factors.check_mask),
    "sparse": _links.Arg(_tables),
    "window": _count(4096),
    "poles": _count(factors.MAX_RUNS),
}


_COUPLED = ("weight decay added to the gradient (coupled L2 decay, as MXNet's wd) has no "
            "catch-up form: an untouched row's gradient would be lambda * w, not 0, so every "
            "row would move every step. ")
_OPTAX_WORDS = {
    "beta1": "it takes optax's b1=.", "beta2": "it takes optax's b2=.",
    "epsilon": "it takes optax's eps=.", "lr": "it takes optax's learning_rate=.",
}
_ADAM_HINTS = {**_OPTAX_WORDS, **dict.fromkeys(
    ("weight_decay", "wd"), _COUPLED + "Use lars_optax.sparse.adamw (decoupled decay).")}
_ADAMW_HINTS = {
    **_OPTAX_WORDS, "wd": "it takes optax's weight_decay= (decoupled: w *= 1 - lr * wd)."}
_SGD_HINTS = {**_OPTAX_WORDS, **dict.fromkeys(
    ("weight_decay", "wd"), _COUPLED + "Use lars_optax.sparse.adamw, or keep the decay off "
    "the sparse leaves (optax.masked).")}


# --------------------------------------------------------------------------
# Public constructors
# --------------------------------------------------------------------------


@_links.optimizer(hints=_ADAM_HINTS, declared=_DECLARED, where="sparse.adam")
def adam(learning_rate: optax.ScalarOrSchedule, *, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Any = None,
         nesterov: bool = False, window: int | None = None,
         poles: int | None = None,
         sparse: masks.MaskLike = None) -> GradientTransformationExtraArgs:
  r"""``optax.adam`` with lazy rows: the dense step's numbers at a lazy step's cost.

  On a gradient tree with row-sparse leaves (:mod:`lars_optax.sparse`), each
  touched row is first brought up to date over the steps it skipped (see the
  module doc), then takes ``optax.adam``'s step; the update is row-sparse.
  After :func:`catch_up` the params equal ``optax.adam`` on the dense
  gradients (zeros on the absent rows): within 1e-5 of the largest move or 3x
  float32 ``optax.adam``'s own error, over b1 from 0 to 0.99, b2 from below b1
  to 0.9999, eps, gradients from 1e-9 to 1e3, any gap, constant rates and
  schedules (docs/sparse.md states the domain as tested). Refused when built:
  a b1 whose skipped steps matter for more than 2,048 steps, such as 0.999,
  a ``window`` shorter than that, b2 <= b1**2, and a b2 so far below b1 that
  the sum would need more than 32 runs. On a dense leaf this is
  ``optax.adam``'s step. For a model that reads the table, bring a batch's
  rows up to date before its forward pass (``catch_up(tx, params, state,
  rows={"table": ids})``): its gradients are then the dense run's too.

  Args:
    learning_rate: a float or an optax schedule, as ``optax.adam``'s: the
      catch-up evaluates it at the steps a row skipped, so a rate set from
      outside each step (traced, by ``optax.inject_hyperparams``) is refused.
    b1, b2, eps, mu_dtype, nesterov: as ``optax.adam``'s. (With a
      ``mu_dtype`` of bfloat16 the dense step rounds the moment every step
      and this one after the skipped steps: they agree to bfloat16's
      precision.)
    eps_root: must be 0 (its default): with it the skipped steps have no
      closed form here.
    window: how many skipped steps are summed term by term (the rest, below
      1e-6 of the first: a geometric tail at the window's last step); default
      and least: until :math:`(\beta_1/\sqrt{\beta_2})^k < 10^{-6}`, at most
      2,048 (a shorter one is refused). A larger one is cut where the terms
      fall below 1e-9 of the first.
    poles: at most this many runs of the window, each summed by a two-node
      Gauss rule (1 to 32); default: as many as keep each run's estimated
      error below 1e-6 of the sum (7 at the default betas). Fewer trade
      accuracy for speed, and the bound above is then not promised.
    sparse: the leaves that take row-sparse gradients (the tables), as
      :func:`value_and_grad`'s ``sparse``: a leaf's full path or last name, or
      a mask; ``False``: none. Every other leaf takes ``optax.adam``'s own step
      and keeps no rows, so a whole model compiles and steps as with
      ``optax.adam`` beside its tables; a row-sparse gradient on it is refused.
      Default: any leaf may take one (each keeps an int32 per row, and the
      step compiles a catch-up for the dense leaves too).

  Returns:
    A :class:`optax.GradientTransformationExtraArgs` with a
    :class:`CatchUpState`. A ``weight_decay`` (coupled L2 decay) is refused:
    use :func:`adamw`.
  """
  where = "sparse.adam"
  return _adam_rule(where, learning_rate, b1, b2, eps, eps_root, mu_dtype, nesterov, window,
                    poles, None, None, sparse)


@_links.optimizer(hints=_ADAMW_HINTS, declared=_DECLARED, where="sparse.adamw")
def adamw(learning_rate: optax.ScalarOrSchedule, *, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Any = None,
          weight_decay: optax.ScalarOrSchedule = 1e-4, mask: Any = None,
          nesterov: bool = False, window: int | None = None,
          poles: int | None = None,
          sparse: masks.MaskLike = None) -> GradientTransformationExtraArgs:
  r"""``optax.adamw`` with lazy rows: the dense step's numbers at a lazy step's cost.

  As :func:`adam`, with ``optax.adamw``'s decoupled decay: a row untouched
  for :math:`n` steps is multiplied by :math:`\prod (1 - \alpha_t\lambda_t)`
  over them, up to the refusal at :math:`\alpha\lambda \ge 1` (each skipped
  step's move is taken decayed by the steps after it, as the dense run makes
  it). With a schedule for the learning rate or ``weight_decay`` the state
  keeps one float32 per row more (the log of the decay applied so far).

  Args:
    learning_rate, b1, b2, eps, mu_dtype, weight_decay, mask, nesterov: as
      ``optax.adamw``'s.
    eps_root, window, poles, sparse: as in :func:`adam`.
  """
  where = "sparse.adamw"
  return _adam_rule(where, learning_rate, b1, b2, eps, eps_root, mu_dtype, nesterov, window,
                    poles, weight_decay, mask, sparse)


def _as_tables(sparse: masks.MaskLike) -> masks.MaskLike:
  return _grad.by_name(sparse) if isinstance(sparse, str) else sparse


def _adam_rule(where, learning_rate, b1, b2, eps, eps_root, mu_dtype, nesterov, window, poles,
               weight_decay, mask, sparse):
  learning_rate, b1, b2, eps, eps_root, window, poles, weight_decay = map(
      _number, (learning_rate, b1, b2, eps, eps_root, window, poles, weight_decay))
  nesterov = bool(nesterov)
  b1f, b2f = float(b1), float(b2)
  if weight_decay is None:
    twin = optax.adam(learning_rate, b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov)
  else:
    twin = optax.adamw(learning_rate, b1, b2, eps, eps_root, mu_dtype,
                       weight_decay=weight_decay, mask=mask, nesterov=nesterov)
  ratio = b1f / math.sqrt(b2f) if b2f > 0 else (math.inf if b1f > 0 else 0.0)
  need = factors.needed_window(ratio)
  if need is None:
    raise ValueError(
        f"{where}: b2: b1 / sqrt(b2) is {ratio:.6g} >= 1 (b1={b1f:g}, b2={b2f:g}): with "
        "b2 <= b1**2 the dense step's terms for a row's skipped steps never shrink, so no "
        "sum over a window of them is dense Adam's. Use b2 > b1**2 (b2 >= b1 is cheapest), "
        "or a plain lazy step (lars_optax.sparse.lazy_update(optax.adam(...)), another "
        "optimizer).")
  if window is None and need > factors.MAX_WINDOW:
    raise ValueError(
        f"{where}: b1: b1 / sqrt(b2) is {ratio:.6g}: a row's skipped steps matter until "
        f"(b1 / sqrt(b2))**k < 1e-6, after {need:,} steps, "
        f"more than the {factors.MAX_WINDOW:,} the catch-up sums a row at a lazy step's cost, so "
        "it would not be dense Adam's. Use b1 <= 0.99; or a plain lazy step "
        "(lars_optax.sparse.lazy_update(optax.adam(...)), another optimizer).")
  if window is not None and window < need:
    # Past the window the terms are taken as one geometric tail at its last step: its
    # rate, but also its bias corrections and its point of the eps sum, which is Adam's
    # only where the terms left are below 1e-6 of the first.
    raise ValueError(
        f"{where}: window: {window:,} is shorter than the {need:,} skipped steps that "
        f"matter at b1={b1f:g}, b2={b2f:g} (until (b1 / sqrt(b2))**k < 1e-6); the tail past "
        "it would not be dense Adam's. "
        + (f"Leave window out (it is then {need:,}) or pass window >= {need:,}."
           if need <= factors.MAX_WINDOW else
           f"No window holds it (at most {factors.MAX_WINDOW:,}): use b1 <= 0.99, or a plain "
           "lazy step (lars_optax.sparse.lazy_update(optax.adam(...)))."))
  window = factors.effective_window(
      b1f, b2f, factors.default_window(ratio) if window is None else window)
  runs = factors.adam_runs(where, b1f, b2f, window, nesterov, poles)
  decays = weight_decay is not None and (callable(weight_decay) or float(weight_decay) != 0.0)
  if decays and not callable(weight_decay) and not callable(learning_rate):
    rate = float(learning_rate) * float(weight_decay)
    if rate >= 1.0:
      raise ValueError(surgery.sign_flip(where, "")(rate))
  return surgery.dense_exact(factors.Rule(
      name=where, twin=twin, lr=factors.as_schedule(learning_rate),
      lr_is_schedule=callable(learning_rate), kind="adam", b1=b1f, b2=b2f, eps=float(eps),
      nesterov=nesterov, wd=factors.as_schedule(weight_decay) if decays else None,
      wd_is_schedule=callable(weight_decay), wd_mask=mask,
      window=window, runs=runs, sparse=_as_tables(sparse),
      constants=(("learning_rate", learning_rate), ("eps", eps),
                 ("weight_decay", weight_decay))))


@_links.optimizer(hints=_SGD_HINTS, declared=_DECLARED, where="sparse.sgd")
def sgd(learning_rate: optax.ScalarOrSchedule, *, momentum: float | None = None,
        nesterov: bool = False, accumulator_dtype: Any = None,
        window: int | None = None,
        sparse: masks.MaskLike = None) -> GradientTransformationExtraArgs:
  r"""``optax.sgd`` with lazy rows: the dense step's numbers at a lazy step's cost.

  Without momentum an absent row does not move, so this is a plain lazy step.
  With momentum :math:`\mu` a row untouched for :math:`n` steps has its buffer
  decayed by :math:`\mu^n` and its weight moved by
  :math:`-\sum_k \alpha_{s+k}\mu^k b` (:math:`\mu^{k+1}` with ``nesterov``),
  exactly, for any schedule and gap, before ``optax.sgd``'s step. With a
  schedule each row keeps one float32 more (the sum's value at its last step;
  see the module doc), and each step sums the schedule until
  :math:`\mu^k < 10^{-9}`; a momentum above 0.99992 with a schedule is refused.

  Args:
    learning_rate, momentum, nesterov, accumulator_dtype: as ``optax.sgd``'s.
    window: how many skipped steps are summed term by term (default: until
      :math:`\mu^k < 10^{-6}`); past it the sum is taken whole, exactly.
    sparse: the leaves that take row-sparse gradients, as in :func:`adam`.
  """
  where = "sparse.sgd"
  learning_rate, momentum, window = map(_number, (learning_rate, momentum, window))
  nesterov = bool(nesterov)
  mu = None if momentum is None else float(momentum)
  if mu is not None and callable(learning_rate) and mu > factors.MAX_FUTURE_MOMENTUM:
    raise ValueError(
        f"{where}: momentum: {mu:g} with a schedule is above "
        f"{factors.MAX_FUTURE_MOMENTUM:.5f}: a row's catch-up sums the schedule over the steps "
        f"until momentum**k < {factors.FUTURE_TOL:g}, more than "
        f"{factors.MAX_FUTURE_TERMS:,} of them, at every step. Use a lower momentum or a "
        "constant learning rate (exact for any momentum < 1).")
  return surgery.dense_exact(factors.Rule(
      name=where, twin=optax.sgd(learning_rate, momentum, nesterov, accumulator_dtype),
      lr=factors.as_schedule(learning_rate), lr_is_schedule=callable(learning_rate), kind="sgd",
      momentum=mu, nesterov=nesterov,
      window=(factors.default_window(mu or 0.0, factors.SGD_WINDOW) if window is None else window),
      sparse=_as_tables(sparse), constants=(("learning_rate", learning_rate),)))


# --------------------------------------------------------------------------
# catch_up
# --------------------------------------------------------------------------


def catch_up(tx: optax.GradientTransformation, params: Any, state: Any, *,
             rows: dict[str, Any] | None = None,
             axis_name: str | None = None) -> tuple[Any, Any]:
  """Brings rows to the current step: ``(params, state)`` as the dense optimizer has them.

  ``tx`` is :func:`adam`, :func:`adamw` or :func:`sgd` and ``state`` the
  state of the whole training transformation (it may hold ``tx``'s state
  inside a chain, :func:`~lars_optax.sparse.multi_steps`,
  :func:`~lars_optax.skip_nonfinite` or :func:`~lars_optax.multi_precision`,
  whose float32 masters are brought up to date and cast down to the params).
  Works under ``jit``, and is best called under it: outside, it runs op by op
  (docs/sparse.md gives the figures). Training continues exactly after it.

  * ``rows=None`` brings every row up to date, in O(table): for evaluation,
    export and checkpoints. ``state.inner`` is then the optax twin's state
    for these params. The per-row factors are computed once per gap (for
    rows away for fewer than 4,096 steps; the others row by row), so it
    costs 1.3 to 1.5 dense ``optax.adam`` steps after 2,000 Zipfian steps on a
    1M-row table (docs/sparse.md).
  * ``rows={"table": ids}`` brings only those rows of the named leaves (a
    leaf's full path or its last name, as ``sparse.value_and_grad``'s
    ``sparse``; ids of any shape and repeats allowed) up to date, in O(ids).
    Each id names the row that ``table[ids]`` reads: ``-1`` is the last row,
    and an id past an end (the padding id ``num_rows`` too) the row at that
    end. (Bringing a row up to date never changes the run's numbers, so a
    row more is only work.) Call it on a batch's ids before the
    forward pass, and the model reads each row as the dense optimizer has
    it, so the gradients, and the whole run, are the dense run's.

  Inside :func:`jax.shard_map`, ids that differ across devices (a batch split
  over a data axis) are gathered over those axes first, so that every device
  holding a block brings up the rows that any device's lookup will read, and
  the copies of a block stay equal. With a table split by rows over a mesh
  axis, pass it as ``axis_name`` (as to :func:`value_and_grad`): the ids are
  then global, and each device brings up the rows of its own block. Without
  it, a leaf of ``rows`` that differs across an axis of the ``shard_map`` is
  refused, naming ``axis_name``.
  """
  rule = getattr(getattr(tx, "update", None), "catch_up_rule", None)
  if not isinstance(rule, factors.Rule):
    raise TypeError("catch_up: tx must be lars_optax.sparse.adam, adamw or sgd (the "
                    "transformation itself, not a chain around it; pass the chain's "
                    "state as state).")
  found = utils.find_states(state, CatchUpState)
  if len(found) != 1:
    raise ValueError(f"catch_up: state holds {len(found)} CatchUpState; expected exactly one "
                     f"(the state of {rule.name}).")
  mp = next((m for m in utils.find_states(state, surgery.master_states())
             if utils.find_states(m.inner_state, CatchUpState)), None)
  full = params if mp is None else jax.tree.map(
      lambda p, m: p if isinstance(m, optax.MaskedNode) else m, params, mp.master,
      is_leaf=lambda x: isinstance(x, optax.MaskedNode))
  treedef: Any = jax.tree.structure(full)
  v.check_axis_name(axis_name)
  picked = surgery.rows_by_leaf(rows, full, treedef)
  picked = surgery.own_rows(picked, masks.named_leaves(full), axis_name)
  new_full, new_cu = surgery.caught_up_tree(rule, full, found[0], picked)

  def replace(node):
    if node is found[0]:
      return new_cu
    if mp is not None and node is mp:
      master = jax.tree.map(lambda m, w: m if isinstance(m, optax.MaskedNode) else w,
                            mp.master, new_full,
                            is_leaf=lambda x: isinstance(x, optax.MaskedNode))
      return type(mp)(master, surgery.replace_in(mp.inner_state, replace))
    return None

  new_state = surgery.replace_in(state, replace)
  if mp is None:
    return new_full, new_state
  out = []
  for p, w, r in zip(treedef.flatten_up_to(params), jax.tree.leaves(new_full), picked):
    p = jnp.asarray(p)
    if r is None:
      out.append(jnp.asarray(w).astype(p.dtype))
    else:
      out.append(_rows.scatter(p, r, _rows.gather(w, r)))
  return jax.tree.unflatten(treedef, out), new_state
