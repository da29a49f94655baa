"""The dense-exact transformation's state, and its surgery: the rows gathered, brought
up to date with :mod:`lars_optax.sparse._catch_up_factors`'s factors, stepped by
optax's twin and written back; and :func:`lars_optax.sparse.catch_up`'s walk over
a state's tree."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import GradientTransformationExtraArgs

from lars_optax import _row_wise
from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import _masks as masks
from lars_optax.sparse import _checks, _rows, _types
from lars_optax.sparse import _catch_up_factors as factors

class CatchUpState(NamedTuple):
  """State of :func:`adam`, :func:`adamw` and :func:`sgd`.

  Attributes:
    count: the steps taken (int32).
    last_step: per leaf, an int32 per row (axis 0; a scalar for a 0-d leaf):
      the step the row was last brought up to date.
    log_decay: AdamW with a schedule: the running sum of
      :math:`\\log(1 - \\alpha_t\\lambda_t)`, as a float32 pair (value and
      rounding error); otherwise an empty :class:`optax.MaskedNode`.
    row_log_decay: AdamW with a schedule: per leaf, a float32 per row, the
      ``log_decay`` at the row's ``last_step``; otherwise empty nodes.
    inner: the optax twin's state (``optax.adam(...)``, ``adamw`` or ``sgd``);
      after :func:`catch_up` it is that optimizer's state for the params.
    rates: the constant learning rate and weight decay the state was made
      with (float32; a schedule has no entry, and with no constant at all this is
      an empty :class:`optax.MaskedNode`, as orbax saves no zero-size array): a step
      made with other
      constants is refused, since the catch-up would take the new ones for the
      steps a row skipped (``optax.inject_hyperparams`` with a schedule).
    row_future: SGD with momentum and a schedule: per leaf, a float32 per
      row, :math:`P(s) = \\sum_{k \\ge 1} \\alpha_{s+k}\\mu^k` at the row's
      ``last_step`` :math:`s` (the momentum's discounted sum of the rates to
      come); otherwise empty nodes.
  """

  count: jax.Array  # type: ignore[assignment]
  last_step: Any
  log_decay: Any
  row_log_decay: Any
  inner: optax.OptState
  rates: Any = optax.MaskedNode()
  row_future: Any = None


# --------------------------------------------------------------------------
# The twin's buffers
# --------------------------------------------------------------------------

def _fields(x: Any) -> tuple[str, ...]:
  """The row-wise buffer fields of a state node (``mu``, ``nu``, ``trace``), by the
  registry of :mod:`lars_optax._row_wise`; none for other nodes."""
  return _row_wise.row_wise_fields().get(type(x), ())


def _buffer_trees(inner: Any) -> dict[str, Any]:
  """The twin's params-shaped buffers by field name (``mu``, ``nu``, ``trace``)."""
  nodes = jax.tree.leaves(inner, is_leaf=lambda x: bool(_fields(x)))
  return {f: getattr(node, f) for node in nodes for f in _fields(node)}


def _with_buffer_trees(inner: Any, trees: dict[str, Any]) -> Any:
  return jax.tree.map(lambda node: node._replace(**{f: trees[f] for f in _fields(node)})
                      if _fields(node) else node, inner, is_leaf=lambda x: bool(_fields(x)))


# --------------------------------------------------------------------------
# The transformation
# --------------------------------------------------------------------------


class _Leaf(NamedTuple):
  """One leaf of the step: its gradient, param, twin buffers and row bookkeeping."""

  name: str
  grad: Any
  param: jax.Array
  bufs: dict[str, Any]
  last: jax.Array
  rowlog: Any
  given: Any = None  # the param as given (a numpy one gets an update it can take)


class _Caught(NamedTuple):
  """A leaf's rows brought up to date: the twin's input, and what the write-back needs."""

  rows: jax.Array | None  # None: every row (a dense leaf)
  grad: Any  # the twin's gradient: the rows' summed values, or the dense gradient
  w0: jax.Array  # the rows as stored
  w1: jax.Array  # the rows brought up to date
  bufs: dict[str, Any]
  last: jax.Array | None  # the gathered last steps and logs (for the write-back)
  logs: jax.Array | None
  drift: jax.Array | None = None  # a dense leaf: w1 - w0


def _plain(leaf: _Leaf) -> bool:
  """Whether the leaf keeps no rows (not named by ``sparse=``): optax's step alone."""
  return isinstance(leaf.last, optax.MaskedNode)


def _check_named(where: str, leaves: list[_Leaf]) -> None:
  """Refuses a row-sparse gradient on a leaf that keeps no rows (not named by sparse=)."""
  for x in leaves:
    if _plain(x) and _rows.is_row_sparse(x.grad):
      raise ValueError(
          f"{where}: sparse: the leaf {x.name!r} has a row-sparse gradient, and it is not "
          "among the leaves sparse= names (those that take row-sparse gradients; the "
          "others take optax's step and keep no rows). Name it in sparse=.")


def _gather_up(rule: factors.Rule, leaf: _Leaf, r: jax.Array, count: jax.Array,
               log_now: jax.Array | None, decays: bool) -> tuple[Any, ...]:
  """Rows ``r`` of a leaf, gathered and brought up to date.

  Returns ``(s, logs, w0, w1, b1)``: the rows' last steps and decay logs (for
  the write-back), the rows as stored, and the rows and buffers brought up to
  date. Rows already up to date (``catch_up(rows=...)`` before the forward
  pass) skip the work, in a ``lax.cond`` whose outputs are the rows only.
  """
  # A padding slot (index: the row count; its results are dropped by the scatter) reads
  # as up to date, so that a batch whose rows are all current skips the catch-up.
  s = jnp.where(r < leaf.last.shape[0], _rows.gather(leaf.last, r), count)
  w0 = _rows.gather(leaf.param, r)
  b0 = {f: _rows.gather(b, r) for f, b in leaf.bufs.items()}
  logs = extra = future = None
  if log_now is not None:
    logs = _rows.gather(leaf.rowlog, r)
    if rule.tracks_future:
      future = (logs, log_now)
    else:
      extra = log_now - logs

  def run(args):
    w, b = args
    sc = factors.row_scalars_of_batch(rule, s, count, decays, future)
    return factors.catch_up_rows(rule, sc, w, b, extra, decays)

  w1, b1 = jax.lax.cond(jnp.any(s != count), run, lambda args: args, (w0, b0))
  return s, logs, w0, w1, b1


def _bring_up(rule: factors.Rule, leaf: _Leaf, count: jax.Array, log_now: jax.Array | None,
              decays: bool) -> _Caught:
  """Gathers a row-sparse leaf's rows and brings them up to date."""
  g, p = leaf.grad, leaf.param
  ok = _checks.check_row_sparse(leaf.name, g, p, rule.name)
  r, values = _rows.combine(g, p.shape[0])
  r = r + jnp.asarray(ok, r.dtype)
  s, logs, w0, w1, b1 = _gather_up(rule, leaf, r, count, log_now, decays)
  return _Caught(r, values, w0, w1, b1, s, logs)


def _extra_log(rule: factors.Rule, leaf: _Leaf, log_now: jax.Array | None) -> Any:
  """AdamW with a schedule: each row's decay log still to apply (else None)."""
  if log_now is None or rule.tracks_future:
    return None
  return (log_now - leaf.rowlog).reshape(-1)


def _future(rule: factors.Rule, leaf: _Leaf, log_now: jax.Array | None) -> Any:
  """SGD with momentum and a schedule: each row's :math:`P(s)` (else None)."""
  return leaf.rowlog.reshape(-1) if log_now is not None and rule.tracks_future else None


def _all_rows_with(rule: factors.Rule, leaf: _Leaf, sc: dict[str, jax.Array],
                   log_now: jax.Array | None, decays: bool) -> tuple[jax.Array, dict[str, Any]]:
  """Every row of a leaf (a 0-d leaf: its one value) brought up to date with the
  per-row factors ``sc``."""
  p, b = leaf.param, leaf.bufs
  flat = p.ndim == 0
  w1, b1 = factors.catch_up_rows(rule, sc, p[None] if flat else p,
                                 {f: x[None] if flat else x for f, x in b.items()},
                                 _extra_log(rule, leaf, log_now), decays)
  return (w1[0], {f: x[0] for f, x in b1.items()}) if flat else (w1, b1)


def _factors_of(rule: factors.Rule, leaves: list[_Leaf], count: jax.Array,
                log_now: jax.Array | None, decays: list[bool]) -> list[dict[str, jax.Array]]:
  """Each leaf's per-row factors (:func:`factors.row_scalars_of_leaves`), the leaves'
  last steps varying over the same mesh axes."""
  futures = [_future(rule, x, log_now) for x in leaves]
  shared = all(f is not None for f in futures)
  return factors.row_scalars_of_leaves(rule, [x.last for x in leaves], count, decays,
                                       futures if shared else None,
                                       log_now if shared else None)


def _by_axes(leaves: list[_Leaf], among: list[int]) -> list[list[int]]:
  """The indices ``among`` grouped by the mesh axes their leaves' last steps vary over
  (inside ``shard_map``; one group outside it): each group's factors are computed together."""
  groups: dict[frozenset, list[int]] = {}
  for i in among:
    groups.setdefault(utils.vma(leaves[i].last), []).append(i)
  return list(groups.values())


def _bring_up_dense(rule: factors.Rule, leaves: list[_Leaf], count: jax.Array,
                    log_now: jax.Array | None, decays: list[bool]) -> list[_Caught]:
  """Dense leaves, every row brought up to date: a branch taken only when a row of one
  of them is behind (a dense step after sparse ones).

  The leaves' last steps vary over the same mesh axes (:func:`_by_axes`): their factors
  are computed together, once per gap (:func:`factors.row_scalars_of_leaves`), in one
  branch; in it each leaf's drift is computed in a branch of its own, taken where that
  leaf is behind. Only the weights' drift and the row-sized decay factors leave the
  branches; the buffers are decayed outside them (the identity factors otherwise), in
  the step's own fused pass. A branch that passed param-sized buffers through would
  copy them on every step.
  """
  names = [sorted({factors.BUFFER_DECAY[f] for f in x.bufs}) for x in leaves]

  # The branches' types, typed shardings included (explicit mesh axes): a drift is
  # its param's, each row factor follows the rows' last steps. (Read off the inputs:
  # tracing a branch again to get them doubles the step's trace time.)
  # Inside shard_map (check_vma) a drift varies where any of its leaf's inputs does,
  # the factors where the last steps do.
  def axes(x: _Leaf) -> tuple[tuple[str, ...], tuple[str, ...]]:
    inputs = [x.param, x.last, *x.bufs.values(), x.rowlog]
    return (tuple(sorted(frozenset().union(*(utils.vma(y) for y in inputs
                                             if hasattr(y, "dtype"))))),
            tuple(sorted(utils.vma(x.last))))

  def zero_drift(x: _Leaf) -> jax.Array:
    return utils.to_varying(utils.full(utils.struct_like(x.param, jnp.float32), 0), axes(x)[0])

  def current(params):
    del params
    return ([zero_drift(x) for x in leaves],
            [{k: utils.to_varying(utils.full(utils.struct_like(x.last.reshape(-1),
                                                               jnp.float32), 1), axes(x)[1])
              for k in n} for x, n in zip(leaves, names)])

  def behind(params):
    scs = _factors_of(rule, leaves, count, log_now, decays)
    drifts = []
    for x, p, sc, d, late in zip(leaves, params, scs, decays, behind_each):
      def drift(p, x=x, sc=sc, d=d):
        w1, _ = _all_rows_with(rule, x._replace(param=p), sc, log_now, d)
        return w1.astype(jnp.float32) - p.astype(jnp.float32)

      drifts.append(jax.lax.cond(late, drift, lambda p, x=x: zero_drift(x), p))
    return drifts, [{k: sc[k] for k in n} for sc, n in zip(scs, names)]

  behind_each = [jnp.any(x.last != count) for x in leaves]
  anyone = functools.reduce(jnp.logical_or, behind_each)
  drifts, row_factors = jax.lax.cond(anyone, behind, current, [x.param for x in leaves])
  out = []
  for x, drift, rf in zip(leaves, drifts, row_factors):
    p = x.param
    if p.ndim == 0:
      b1 = {f: (y[None] * rf[factors.BUFFER_DECAY[f]]).astype(y.dtype)[0]
            for f, y in x.bufs.items()}
    else:
      b1 = factors.decayed(rf, x.bufs)
    out.append(_Caught(None, x.grad, p, (p.astype(jnp.float32) + drift).astype(p.dtype), b1,
                       None, None, drift))
  return out


def _write_back(leaf: _Leaf, caught: _Caught, step_update: jax.Array, bufs_out: dict[str, Any],
                new_count: jax.Array, log_next: jax.Array | None) -> tuple[Any, ...]:
  """A leaf's update (catch-up plus step) and its new buffers, last steps and logs."""
  u = step_update
  if _plain(leaf):  # optax's step, with no rows kept
    return u, leaf.last, leaf.rowlog, bufs_out
  drift = (caught.w1.astype(jnp.float32) - caught.w0.astype(jnp.float32)
           if caught.drift is None else caught.drift.astype(jnp.float32))
  delta = (drift + u.astype(jnp.float32)).astype(u.dtype)
  r = caught.rows
  if r is None:
    rowlog = leaf.rowlog if log_next is None else jnp.full_like(leaf.rowlog, log_next)
    return delta, jnp.full_like(leaf.last, new_count), rowlog, bufs_out
  update = _types.update_like(leaf.grad, delta, r, leaf.param.shape[0], leaf.given)
  # The new values are computed from the gathered ones (max(s, count + 1) is count + 1),
  # so that XLA gathers before it scatters in place instead of copying the vector.
  s = caught.last
  assert s is not None
  last = _rows.scatter(leaf.last, r, jnp.maximum(s, new_count))
  rowlog = leaf.rowlog
  if log_next is not None and caught.logs is not None:
    rowlog = _rows.scatter(rowlog, r, jnp.where(s < new_count, log_next, caught.logs))
  bufs = {f: _rows.scatter(old, r, bufs_out[f]) for f, old in leaf.bufs.items()}
  return update, last, rowlog, bufs


def _same_rates(rule: factors.Rule, rates: jax.Array) -> Any:
  """Zero, or an error when the constant rates differ from those the state was made with.

  ``optax.inject_hyperparams`` with a schedule builds the optimizer anew each
  step with that step's rate (a constant, outside ``jit``): the catch-up
  would take it for every step a row skipped.
  """
  want = rule.rates()
  if np.shape(rates) != want.shape and not (isinstance(rates, optax.MaskedNode)
                                            and not want.size):
    raise ValueError(f"{rule.name}: the state was made by an optimizer with other "
                     "arguments (its constant learning rate or weight decay differ in "
                     "kind); use the state this optimizer's init made.")
  if not want.size:
    return 0

  def report(rates: Any) -> str:
    return (f"{rule.name}: learning_rate: the constant learning rate or weight decay "
            f"changed between steps (the state was made with {rates.tolist()}, this step "
            f"has {want.tolist()}). The catch-up of the steps a row skipped needs the rate "
            "of each of them: pass an optax schedule as learning_rate (or weight_decay), "
            "not a value set from outside each step (with optax.inject_hyperparams, name "
            "it in static_args).")
  return _checks.raise_at_run_time(jnp.any(rates != want), report, rates)


_LAST_COUNT = np.iinfo(np.int32).max


def _counting(where: str, count: jax.Array) -> Any:
  """Zero, or an error when the step count can no longer advance (int32's maximum).

  ``optax.safe_increment`` stops there; the catch-up would then leave every row
  touched afterwards behind the steps it skips. Reached only by a state restored or
  set by hand.
  """
  def report(count: Any) -> str:
    return (f"{where}: count: the state's step count is {int(count):,}, int32's maximum, "
            "where it stops counting: the catch-up of the steps a row skips needs each step "
            "numbered, so the rows touched from now on would stay behind. Restart the count "
            "(a state from init, with the params as they are) or restore an earlier state.")
  return _checks.raise_at_run_time(count >= _LAST_COUNT, report, count)


def _snapshots(rule: factors.Rule, state: CatchUpState) -> Any:
  """The rows' snapshots: AdamW's ``row_log_decay`` or SGD's ``row_future`` (or empty)."""
  return state.row_future if rule.tracks_future else state.row_log_decay


def _with_snapshots(rule: factors.Rule, state: CatchUpState, snaps: Any) -> CatchUpState:
  if rule.tracks_future:
    return state._replace(row_future=snaps)
  return state._replace(row_log_decay=snaps)


def _now(rule: factors.Rule, state: CatchUpState) -> jax.Array | None:
  """The running global value the rows' snapshots are taken of, at the state's count."""
  if rule.tracks_log_decay:
    return state.log_decay[0] + state.log_decay[1]
  if rule.tracks_future:
    return factors.rates_to_come(rule, state.count)
  return None


def sign_flip(where: str, when: str) -> Any:
  def report(rate: Any) -> str:
    return (f"{where}: weight_decay: learning_rate * weight_decay is {float(rate):g}"
            f"{when}, >= 1: the decoupled decay multiplies each weight by 1 - "
            "learning_rate * weight_decay <= 0, flipping its sign, which the catch-up of "
            "skipped steps (a product of such factors, taken in log form) cannot follow. "
            "Keep learning_rate * weight_decay below 1 at every step.")
  return report


def _init(rule: factors.Rule, twin: optax.GradientTransformation, params: Any) -> CatchUpState:
  """The state: each leaf that may take row-sparse gradients keeps its rows' last
  steps (and snapshots), the others nothing."""
  rule.check_params(params)
  if rule.kind == "adam":  # (its squared gradients, as every Adam's, in float16)
    utils.warn_float16(params, rule.name)
  flat, treedef = jax.tree.flatten(params)
  tables = rule.tables(params)

  def per_row(value, dtype):
    return jax.tree.unflatten(treedef, [
        jnp.full(np.shape(p)[:1], value, dtype) if t else optax.MaskedNode()
        for p, t in zip(flat, tables)])

  empty = jax.tree.map(lambda p: optax.MaskedNode(), params)
  log_decay, row_log, row_future = optax.MaskedNode(), empty, empty
  if rule.tracks_log_decay:
    log_decay = jnp.zeros((2,), jnp.float32)
    row_log = per_row(0, jnp.float32)
  if rule.tracks_future:
    row_future = per_row(factors.rates_to_come(rule, jnp.int32(0)), jnp.float32)
  rates = rule.rates()
  return CatchUpState(jnp.zeros([], jnp.int32), per_row(0, jnp.int32), log_decay, row_log,
                      twin.init(params), jnp.asarray(rates) if rates.size else optax.MaskedNode(),
                      row_future)


def dense_exact(rule: factors.Rule) -> GradientTransformationExtraArgs:
  twin = optax.with_extra_args_support(rule.twin)
  where = rule.name

  init_fn = functools.partial(_init, rule, twin)

  def leaves_of(updates, state, params):
    flat_g, treedef = jax.tree.flatten(updates, is_leaf=_rows.is_row_sparse)
    flat_p = _checks.params_up_to(treedef, params)
    if any(p is None for p in flat_p):
      raise ValueError(f"{where}: gradients and params have different tree structures: "
                       f"{treedef} vs {jax.tree.structure(params)}.")
    given = flat_p
    flat_p = [jnp.asarray(p) for p in flat_p]
    bufs = {f: treedef.flatten_up_to(t) for f, t in _buffer_trees(state.inner).items()}
    leaves = [_Leaf(n, g, p, {f: b[i] for f, b in bufs.items()}, last, rowlog, given[i])
              for i, (n, g, p, last, rowlog) in enumerate(zip(
                  _checks.leaf_names_of(treedef), flat_g, flat_p,
                  treedef.flatten_up_to(state.last_step),
                  treedef.flatten_up_to(_snapshots(rule, state))))]
    return leaves, treedef

  def step(updates, state, params, extra_args):
    leaves, treedef = leaves_of(updates, state, params)
    _check_named(where, leaves)
    if all(_plain(x) for x in leaves):  # no leaf keeps rows (sparse=False): optax's step
      step_updates, inner = twin.update(updates, state.inner,
                                        jax.tree.unflatten(treedef, [x.param for x in leaves]),
                                        **extra_args)
      return step_updates, state._replace(count=optax.safe_increment(state.count),
                                          inner=inner)
    decays = factors.decay_mask(rule, jax.tree.unflatten(treedef, [x.param for x in leaves]),
                                treedef)
    log_now = future_next = None
    if rule.tracks_future:  # P(count) from P(count + 1): one sum of the schedule a step
      assert rule.momentum is not None
      future_next = factors.rates_to_come(rule, state.count + 1)
      log_now = jnp.float32(rule.momentum) * (rule.lr(state.count) + future_next)
    else:
      log_now = _now(rule, state)
    dense = [i for i, x in enumerate(leaves)
             if not _rows.is_row_sparse(x.grad) and not _plain(x)]
    caught: list[Any] = [
        _Caught(None, x.grad, x.param, x.param, x.bufs, None, None) if _plain(x)
        else None if i in dense else _bring_up(rule, x, state.count, log_now, d)
        for i, (x, d) in enumerate(zip(leaves, decays))]
    for idx in _by_axes(leaves, dense):  # (each group's factors computed together)
      for i, c in zip(idx, _bring_up_dense(rule, [leaves[i] for i in idx], state.count,
                                           log_now, [decays[i] for i in idx])):
        caught[i] = c

    def tree(values):
      return jax.tree.unflatten(treedef, list(values))

    # optax's own step on the rows brought up to date.
    fields = list(_buffer_trees(state.inner))
    inner_in = _with_buffer_trees(
        state.inner, {f: tree(c.bufs[f] for c in caught) for f in fields})
    step_updates, inner_out = twin.update(tree(c.grad for c in caught), inner_in,
                                          tree(c.w1 for c in caught), **extra_args)
    flat_u = treedef.flatten_up_to(step_updates)
    bufs_out = {f: treedef.flatten_up_to(t) for f, t in _buffer_trees(inner_out).items()}
    new_count = (optax.safe_increment(state.count) + _same_rates(rule, state.rates)
                 + _counting(where, state.count))
    log_decay, log_next = state.log_decay, None
    if rule.tracks_log_decay:
      assert rule.wd is not None
      rate = rule.lr(state.count) * rule.wd(state.count)
      ok = _checks.raise_at_run_time(rate >= 1.0, sign_flip(where, " at this step"), rate)
      log_decay = factors.two_sum(state.log_decay[0], state.log_decay[1],
                                  jnp.log1p(-rate) + jnp.asarray(ok, jnp.float32))
      log_next = log_decay[0] + log_decay[1]
    elif rule.tracks_future:
      log_next = future_next

    out = [_write_back(x, c, u, {f: b[i] for f, b in bufs_out.items()}, new_count, log_next)
           for i, (x, c, u) in enumerate(zip(leaves, caught, flat_u))]
    inner_state = _with_buffer_trees(
        inner_out, {f: tree(o[3][f] for o in out) for f in fields})
    snaps = tree(o[2] for o in out)
    new_state = CatchUpState(new_count, tree(o[1] for o in out), log_decay,
                             state.row_log_decay, inner_state, state.rates, state.row_future)
    return tree(o[0] for o in out), _with_snapshots(rule, new_state, snaps)

  def update_fn(updates, state, params=None, **extra_args):
    v.require_params(params, where)
    # (An Equinox model passed whole: its non-array leaves, None in the gradients, drop.)
    params = v.align_params(updates, params)
    view = _rows.shape_view(updates)  # row-sparse leaves by their dense shape and dtype
    v.check_same_structure(view, params, where)
    v.check_float_params(view, where, "gradient")
    v.check_float_params(params, where)
    # A gradient of another float dtype is cast to its param's, so the state keeps its dtypes.
    return step(jax.tree.map(_to_param_dtype, updates, params, is_leaf=_rows.is_row_sparse),
                state, params, extra_args)

  update_fn.catch_up_rule = rule  # type: ignore[attr-defined]  # read by catch_up
  return GradientTransformationExtraArgs(init_fn, update_fn)


# --------------------------------------------------------------------------
# catch_up's walk over the state
# --------------------------------------------------------------------------


def _to_param_dtype(g: Any, p: Any) -> Any:
  """``g`` in ``p``'s dtype (a row-sparse gradient: its rows' values)."""
  dtype = jnp.result_type(p)
  return g if g.dtype == dtype else _rows.astype(g, dtype)


def rows_by_leaf(rows: dict[str, Any] | None, params: Any, treedef: Any) -> list[Any]:
  """Per leaf: None (every row), or the row ids to bring up to date (an empty vector: none)."""
  names = [n for n, _ in masks.named_leaves(params)]
  if rows is None:
    return [None] * len(names)
  if not isinstance(rows, dict):
    raise TypeError(f"catch_up: rows: expected a dict of leaf name to row ids, got "
                    f"{type(rows).__name__}.")
  picked: list[Any] = [jnp.zeros((0,), jnp.int32)] * len(names)
  for key, ids in rows.items():
    hits = [i for i, n in enumerate(names) if n == key or n.rsplit("/", 1)[-1] == key]
    if not hits:
      raise ValueError(f"catch_up: rows: {key!r} names no leaf of params (its full path or "
                       f"last name); names: {names[:10]}.")
    ids = jnp.asarray(ids)
    if not jnp.issubdtype(ids.dtype, jnp.integer):
      raise TypeError(f"catch_up: rows[{key!r}]: expected integer row ids, got {ids.dtype}.")
    for i in hits:
      picked[i] = ids.reshape(-1)
  return picked


def own_rows(picked: list[Any], named: list[tuple[str, Any]],
             axis_name: str | None) -> list[Any]:
  """Each leaf's ids as this device must bring them up: gathered over the mesh axes
  along which they vary and the leaf does not (or, with ``axis_name``, over which
  the leaf is split by rows too), as the rows ``table[ids]`` reads; with
  ``axis_name``, rows of the device's block (``num_rows``, dropped, where not)."""
  split = [(n, p) for (n, p), r in zip(named, picked) if r is not None and r.shape[0]]
  blocks = _checks.split_blocks(axis_name, split) if split else 1
  manual = set(utils.manual_axes())
  for name, p in split if axis_name is None else ():
    varying = sorted(utils.vma(p) & manual)
    if varying:
      raise ValueError(
          f"catch_up: axis_name: the leaf {name!r} differs across mesh axis {varying[0]!r} of the "
          "enclosing shard_map (a table split by rows over it), and axis_name is not given: "
          "its ids would be read as rows of each device's own block. Pass "
          f"axis_name={varying[0]!r}, as to sparse.value_and_grad, and the ids are read as "
          "global rows, each device bringing up those of its block.")
  out = []
  for (_, p), r in zip(named, picked):
    if r is None or np.ndim(p) == 0 or r.shape[0] == 0:
      out.append(r)
      continue
    axes = tuple(sorted(utils.vma(r) - (utils.vma(p) - {axis_name})))
    if axes:
      r = _rows.gather_over(r, axes)
    n = np.shape(p)[0]
    if axis_name is None:
      r = _rows.as_read(r, n)  # the rows the model's table[ids] reads
    else:
      local = _rows.as_read(r, n * blocks) - jax.lax.axis_index(axis_name).astype(r.dtype) * n
      r = jnp.where((local >= 0) & (local < n), local, n)  # n: not this block's (dropped)
    out.append(r)
  return out


def master_states() -> tuple[type, ...]:
  """State types holding float32 masters (``lars_optax.multi_precision``'s), by declaration.

  They declare a row-wise ``master`` field beside an ``inner_state``
  (:mod:`lars_optax._row_wise`), so this package need not import them.
  """
  return tuple(cls for cls, fields in _row_wise.row_wise_fields().items()
               if "master" in fields and "inner_state" in getattr(cls, "_fields", ()))


def replace_in(node: Any, replace: Callable[[Any], Any]) -> Any:
  new = replace(node)
  if new is not None:
    return new
  if isinstance(node, dict):
    return type(node)({k: replace_in(c, replace) for k, c in node.items()})
  if isinstance(node, tuple) and hasattr(node, "_fields"):
    return type(node)(*[replace_in(c, replace) for c in node])
  if isinstance(node, (tuple, list)):
    return type(node)(replace_in(c, replace) for c in node)
  return node


def caught_up_tree(rule: factors.Rule, params: Any, state: CatchUpState,
                   picked: list[Any]) -> tuple[Any, CatchUpState]:
  """:func:`catch_up` on the state's own tree: every row of a leaf (``picked`` None) or
  the rows ``picked`` lists."""
  flat, treedef_ = jax.tree.flatten(params)
  treedef: Any = treedef_
  flat_p = [jnp.asarray(p) for p in flat]
  count = state.count
  decay_mask = factors.decay_mask(rule, params, treedef)
  bufs = {f: treedef.flatten_up_to(t) for f, t in _buffer_trees(state.inner).items()}
  log_now = _now(rule, state)
  leaves = [_Leaf("", None, p, {f: b[i] for f, b in bufs.items()}, last, rowlog)
            for i, (p, last, rowlog) in enumerate(zip(
                flat_p, treedef.flatten_up_to(state.last_step),
                treedef.flatten_up_to(_snapshots(rule, state))))]
  # Every row of the leaves that ask for all: their factors computed together where
  # they can be (a leaf whose rows are split over explicit mesh axes on its own).
  whole = [i for i, (x, r) in enumerate(zip(leaves, picked))
           if r is None and not isinstance(x.last, optax.MaskedNode)]
  together = [i for i in whole if not _rows.splits_rows(leaves[i].param)]
  scs: dict[int, dict[str, jax.Array]] = {}
  for idx in _by_axes(leaves, together):
    scs.update(zip(idx, _factors_of(rule, [leaves[i] for i in idx], count, log_now,
                                    [decay_mask[i] for i in idx])))
  out = []
  for i, (leaf, r, decays) in enumerate(zip(leaves, picked, decay_mask)):
    p, last, rowlog = leaf.param, leaf.last, leaf.rowlog
    if isinstance(last, optax.MaskedNode):  # a leaf masked out of tx (optax.masked,
      out.append((p, leaf.bufs, last, rowlog))  # multi_transform, partition): not tx's
    elif r is None:
      if i in scs:
        w1, b1 = _all_rows_with(rule, leaf, scs[i], log_now, decays)
      else:
        def all_rows(p, bufs, last, rowlog, count, log_now, decays=decays):
          leaf = _Leaf("", None, p, bufs, last, rowlog)
          sc = _factors_of(rule, [leaf], count, log_now, [decays])[0]
          return _all_rows_with(rule, leaf, sc, log_now, decays)

        # (The leaf's rows split over explicit mesh axes: under automatic ones.)
        w1, b1 = _rows.on_split_rows(
            all_rows, p, leaf.bufs, last, rowlog, count, log_now,
            out_spec=jax.tree.map(_rows.typed_spec, (p, leaf.bufs)))
      out.append((w1, b1, jnp.full_like(last, count),
                 rowlog if log_now is None else jnp.full_like(rowlog, log_now)))
    elif p.ndim == 0 or r.shape[0] == 0 or p.shape[0] == 0:  # nothing asked of this leaf
      out.append((p, leaf.bufs, last, rowlog))
    else:
      s, logs, _, w1, b1 = _gather_up(rule, leaf, r, count, log_now, decays)
      if logs is not None and log_now is not None:
        rowlog = _rows.scatter(rowlog, r, jnp.where(s <= count, log_now, logs))
      out.append((_rows.scatter(p, r, w1),
                 {f: _rows.scatter(x, r, b1[f]) for f, x in leaf.bufs.items()},
                 _rows.scatter(last, r, jnp.maximum(s, count)), rowlog))

  def tree(i):
    return jax.tree.unflatten(treedef, [o[i] for o in out])

  inner = _with_buffer_trees(state.inner, {
      f: jax.tree.unflatten(treedef, [o[1][f] for o in out]) for f in bufs})
  return tree(0), _with_snapshots(rule, state._replace(last_step=tree(2), inner=inner), tree(3))
