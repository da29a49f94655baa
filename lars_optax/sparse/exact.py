r"""Dense-exact lazy optimizers: optax's Adam, AdamW and SGD on row-sparse gradients.

A lazy step (MXNet's ``lazy_update``, TF's LazyAdam, torch's SparseAdam)
touches only the rows in the batch: it is cheap, but it is another optimizer,
since under the dense step every row's moments decay and its weight keeps
moving each step. Here a row untouched for :math:`n` steps is brought up to
date when the batch next touches it, along the path the dense step would
have taken with a zero gradient on it (Adam's steps :math:`t = s+1, \dots,
s+n`, with :math:`\alpha_t` the learning rate and :math:`\lambda_t` the
decoupled weight decay of step :math:`t`):

.. math::

  m \leftarrow \beta_1^n m, \qquad v \leftarrow \beta_2^n v, \qquad
  w \leftarrow D \Big(w - \sum_{k=1}^{n} \frac{\alpha_{s+k}}{D_k}
      \frac{\beta_1^k m / (1-\beta_1^{s+k})}
           {\sqrt{\beta_2^k v / (1-\beta_2^{s+k})} + \epsilon}\Big),

with :math:`D_k = \prod_{i=1}^{k} (1 - \alpha_{s+i}\lambda_{s+i})` and
:math:`D = D_n`; SGD's momentum buffer decays by :math:`\mu^n` and its
weight moves by :math:`-\sum_k \alpha_{s+k}\mu^k b`. Then the step itself is
optax's, on the touched rows. The result is optax's ``adam``, ``adamw`` or
``sgd`` on the dense gradient with zeros on the absent rows, at the cost of a
lazy step. A model reads the rows too: bring a batch's rows up to date
before its forward pass (:func:`catch_up` with ``rows=``), and the gradients,
and so the whole run, are the dense run's. The only extra state is one int32
per row, the step the row was last brought up to date (and, with a schedule, one
float32 per row: for AdamW the log of the decay applied so far, for SGD with
momentum the discounted sum of the rates to come).

How the sum is taken: its terms shrink geometrically (by about
:math:`\beta_1/\sqrt{\beta_2}` a step), so its first ``window`` terms are
summed per row from the schedule, and the rest as a geometric series with
the schedule frozen at the window's last step. For Adam, :math:`\epsilon`
makes the terms depend on each entry's :math:`v`: with :math:`u_k =
\sqrt{1-\beta_2^{s+k}}/\beta_2^{k/2}` the drift is
:math:`m\sum_k w_k u_k / (\sqrt{v} + \epsilon u_k)`, a function of
:math:`\sqrt{v}` with one pole per term. The terms are grouped into runs,
and in each run the weights :math:`w_k` at the points :math:`u_k` are
replaced by their two-node Gauss rule (the run's mean and its second and third
central moments): exact when :math:`\epsilon \ll \sqrt{\hat v}` and when
:math:`\epsilon \gg \sqrt{\hat v}`. In between, a run whose points spread by
a factor :math:`e^L` errs by about :math:`4 \cdot 10^{-4} L^4` of its share of
the sum, so the runs are cut where that reaches 1e-6 of the sum: 7 runs at
:math:`\beta = (0.9, 0.999)`, 21 at :math:`\beta_1 = \beta_2 = 0.98`, where the
points spread over six orders of magnitude. What needs more than 32 runs
(:math:`\beta_2` well below :math:`\beta_1`), or :math:`\beta_2 \le \beta_1^2`,
is refused when built. tests/test_sparse_exact_domain.py draws the whole
accepted domain against float64 (docs/sparse.md gives the envelope). SGD's
sum is exact for any schedule: past the window a row's move is
:math:`P(s) - \mu^n P(s+n)`, with :math:`P(t) = \sum_{k \ge 1}
\alpha_{t+k}\mu^k` kept per row and summed from the schedule once a step.

A whole loop: each batch's rows brought up to date before the forward pass,
and every row before evaluation::

  import jax, jax.numpy as jnp, numpy as np, optax, lars_optax

  params = {"table": jnp.zeros((10_000, 16)), "w": jnp.ones(16)}
  tx = lars_optax.sparse.adam(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 10, 100))
  state = tx.init(params)

  def loss_fn(params, ids, y):
    return jnp.mean((params["table"][ids].mean(axis=1) @ params["w"] - y) ** 2)

  grad_fn = lars_optax.sparse.value_and_grad(loss_fn, sparse="table")

  @jax.jit
  def train_step(params, state, ids, y):
    params, state = lars_optax.sparse.catch_up(tx, params, state, rows={"table": ids})
    loss, grads = grad_fn(params, ids, y)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  rng = np.random.default_rng(0)
  for step in range(20):
    ids = jnp.asarray(rng.zipf(1.3, size=(32, 4)) % 10_000, jnp.int32)
    params, state, loss = train_step(params, state, ids, jnp.ones(32))
  params, state = lars_optax.sparse.catch_up(tx, params, state)  # every row at step 20

References:
  Kingma and Ba, `Adam: A Method for Stochastic Optimization
  <https://arxiv.org/abs/1412.6980>`_, 2014; Loshchilov and Hutter,
  `Decoupled Weight Decay Regularization <https://arxiv.org/abs/1711.05101>`_, 2019.
"""

from __future__ import annotations

import dataclasses
import math
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

__all__ = ["CatchUpState", "adam", "adamw", "catch_up", "sgd"]

_MAX_WINDOW = 2048  # Adam: b1 <= 0.99 needs at most 1,447 terms (b1 / sqrt(b2) <= 0.9905)
_SGD_WINDOW = 512  # SGD: past its window the sum is taken whole, exactly
_BLOCK = 4096  # gaps computed once each, and rows at a time (catch_up over a whole table)
_NEAR = 32  # a batch's gaps computed once each (catch_up(rows=) and the step)
_FAR_BLOCK = 256  # a batch's rows away longer, computed this many at a time


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


@dataclasses.dataclass(frozen=True)
class _Rule:
  """What the catch-up needs to know of one optimizer."""

  name: str
  twin: optax.GradientTransformation
  lr: Callable[[jax.Array], jax.Array]
  lr_is_schedule: bool
  kind: str  # "adam" or "sgd"
  b1: float = 0.0
  b2: float = 0.0
  eps: float = 0.0
  nesterov: bool = False
  momentum: float | None = None
  wd: Callable[[jax.Array], jax.Array] | None = None
  wd_is_schedule: bool = False
  wd_mask: Any = None
  window: int = 0
  runs: tuple[tuple[int, int], ...] = ()  # Adam: the window's runs (_adam_runs)
  constants: tuple[tuple[str, Any], ...] = ()  # (name, value): checked against the params

  def check_params(self, params: Any) -> None:
    """At ``init``: float params, each constant finite in their dtypes, a well-formed mask."""
    v.check_float_params(params, self.name)
    for arg, value in self.constants:
      v.check_representable(f"{self.name}: {arg}", value, params)
    _decay_mask(self, params, jax.tree.structure(params))

  def rates(self) -> np.ndarray:
    """The constant learning rate and weight decay, for :attr:`CatchUpState.rates`."""
    return np.array([float(x) for arg, x in self.constants
                     if arg in ("learning_rate", "weight_decay") and x is not None
                     and not callable(x)], np.float32)

  @property
  def decays(self) -> bool:
    return self.wd is not None

  @property
  def tracks_log_decay(self) -> bool:
    return self.decays and (self.lr_is_schedule or self.wd_is_schedule)

  @property
  def tracks_future(self) -> bool:
    """SGD with momentum and a schedule: each row keeps :math:`P(s)` (:func:`_future`)."""
    return self.kind == "sgd" and self.momentum is not None and self.lr_is_schedule


def _as_schedule(value: Any) -> Callable[[jax.Array], jax.Array]:
  if callable(value):
    return lambda count: jnp.asarray(value(count), jnp.float32)
  return lambda count: jnp.asarray(value, jnp.float32)


def _needed_window(ratio: float, tol: float = 1e-6) -> int | None:
  """Terms until ``ratio**k`` falls below ``tol`` (the rest: a geometric tail); None: never."""
  if ratio <= 0.0:
    return 1
  if ratio >= 1.0:
    return None
  return int(max(4, math.ceil(math.log(tol) / math.log(ratio))))


def _default_window(ratio: float, cap: int = _MAX_WINDOW) -> int:
  need = _needed_window(ratio)
  return cap if need is None else min(cap, need)


# The momentum's discounted sum of the rates to come is summed over this many
# steps at most: mu**k falls below _FUTURE_TOL by then for mu <= _MAX_FUTURE_MOMENTUM.
_FUTURE_TOL = 1e-9
_MAX_FUTURE_TERMS = 1 << 18
_MAX_FUTURE_MOMENTUM = math.exp(math.log(_FUTURE_TOL) / _MAX_FUTURE_TERMS)  # 0.99992


def _future_terms(mu: float) -> int:
  """Terms of :func:`_future` (a power of 2): until ``mu**k < _FUTURE_TOL``."""
  if mu <= 0.0:
    return 1
  need = math.ceil(math.log(_FUTURE_TOL) / math.log(mu))
  return 1 << max(0, (need - 1).bit_length())


def _pairwise_sum(x: jax.Array) -> jax.Array:
  """The sum of a power-of-2 vector, halved pairwise (error ~ log2(n) roundings)."""
  while x.shape[0] > 1:
    half = x.shape[0] // 2
    x = x[:half] + x[half:]
  return x[0]


def _future(rule: _Rule, t: jax.Array) -> jax.Array:
  r"""SGD's :math:`P(t) = \sum_{k \ge 1} \alpha_{t+k}\mu^k` (:math:`\alpha_t` the rate of
  step :math:`t`, 1-based), to float32 precision.

  A row last brought up to date at step :math:`s` and left for :math:`n` steps moves
  by :math:`-b\sum_{k=1}^{n}\alpha_{s+k}\mu^k = -b\,(P(s) - \mu^n P(s+n))`, exactly,
  for any schedule: each row keeps :math:`P(s)` and the step computes :math:`P` at its
  own count, once for all rows.
  """
  assert rule.momentum is not None
  terms = _future_terms(rule.momentum)
  k = jnp.arange(1, terms + 1, dtype=jnp.int32)
  mu = jnp.float32(rule.momentum)
  return _pairwise_sum(rule.lr(t + k - 1) * mu ** k.astype(jnp.float32))


def _known(where: str, name: str, value: Any) -> Any:
  """``value`` as a Python number (a concrete array too); a traced one is refused.

  ``optax.inject_hyperparams`` passes every numeric argument as an array, traced
  under ``jit``: the catch-up needs the decay rates and the window when it is
  built, and the learning rate and decay at every skipped step, which a value
  set from outside each step does not give.
  """
  if value is None or callable(value) or isinstance(value, (bool, np.bool_)):
    return value
  if isinstance(value, jax.core.Tracer):
    raise ValueError(
        f"{where}: {name} is traced (optax.inject_hyperparams passes its arguments as "
        f"arrays): the catch-up of the steps a row skipped needs {name}'s value for each "
        "of them. Pass a number, or for a learning rate or weight decay an optax schedule, "
        f"and leave it out of inject_hyperparams (static_args=({name!r}, ...)).")
  if np.ndim(value) == 0 and hasattr(value, "dtype"):
    return value.item() if hasattr(value, "item") else value
  return value


def _check_window(window: Any, poles: Any, where: str) -> None:
  if window is not None:
    v.check_count(f"{where}: window", window, 1, arrays=False, maximum=4096)
  if poles is not None:
    v.check_count(f"{where}: poles", poles, 1, arrays=False, maximum=_MAX_RUNS)


_COUPLED = ("weight decay added to the gradient (coupled L2 decay, as MXNet's wd) has no "
            "catch-up form: an untouched row's gradient would be lambda * w, not 0, so every "
            "row would move every step. ")
_OPTAX_WORDS = {
    "beta1": "it takes optax's b1=.", "beta2": "it takes optax's b2=.",
    "epsilon": "it takes optax's eps=.", "lr": "it takes optax's learning_rate=.",
}
_adam_names = v.renamed_keywords({
    **_OPTAX_WORDS, "weight_decay": _COUPLED + "Use lars_optax.sparse.adamw (decoupled decay).",
    "wd": _COUPLED + "Use lars_optax.sparse.adamw (decoupled decay)."})
_adamw_names = v.renamed_keywords({
    **_OPTAX_WORDS, "wd": "it takes optax's weight_decay= (decoupled: w *= 1 - lr * wd)."})
_sgd_names = v.renamed_keywords({
    **_OPTAX_WORDS,
    "weight_decay": _COUPLED + "Use lars_optax.sparse.adamw, or keep the decay off the "
                    "sparse leaves (optax.masked).",
    "wd": _COUPLED + "Use lars_optax.sparse.adamw, or keep the decay off the sparse leaves "
          "(optax.masked)."})


# --------------------------------------------------------------------------
# Per-row scalars: the window of skipped steps, summed from the schedule
# --------------------------------------------------------------------------


def _geometric(ratio: jax.Array, m: jax.Array) -> jax.Array:
  """``sum_{j=1}^{m} ratio**j``, elementwise (``ratio`` >= 0, ``m`` >= 0)."""
  zero = ratio <= 0
  log_r = jnp.log(jnp.where(zero, 1.0, ratio))
  m = m.astype(jnp.float32)
  safe = jnp.where(log_r == 0, 1.0, log_r)
  total = jnp.where(log_r == 0, m, ratio * jnp.expm1(m * safe) / jnp.expm1(safe))
  return jnp.where(zero, 0.0, total)


# The two-node rule's worst error over a run whose points u spread by a factor e**L is
# about _GAUSS_ERROR * L**4 of the run's share of the sum (measured in float64 over
# geometric runs: 2.2e-5 at L = 0.5, 3.8e-4 at L = 1, 6.5e-3 at L = 2).
_GAUSS_ERROR = 4e-4
_RUN_TARGET = 1e-6  # each run's estimated error, of the whole sum
_MAX_RUNS = 32  # two divisions per entry and run: beyond this the catch-up is refused
_MAX_RUN_SPREAD = 20.0  # a run's log-spread of u at most (its third moment stays finite)
_MAX_LOG_U = 60.0  # the window's points u stay below e**60 (float32's range is e**88)
_NEGLIGIBLE = 1e-9  # terms below this of the first are left out of the window


def _profiles(b1: float, b2: float, window: int, nesterov: bool
              ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  r"""Per sample row age :math:`s`: :math:`\log u_k` and the cumulative shares of the
  weights :math:`w_k` and of :math:`h_k = w_k u_k`, for :math:`k = 1..` ``window``
  (float64, constant rate). Their run-by-run spreads and shares bound the rule's error."""
  k = np.arange(1, window + 1, dtype=np.float64)
  log_q = 0.5 * math.log(b2)
  out = []
  for s in (0, max(1, round(0.3 / (1 - b2))), round(3 / (1 - b2)), 1 << 30):
    log_u = 0.5 * np.log1p(-np.exp((s + k) * math.log(b2))) - k * log_q
    j = k + float(nesterov)
    log_w = j * math.log(b1) - np.log1p(-np.exp((s + j) * math.log(b1)))
    shares = []
    for x in (log_w, log_w + log_u):
      e = np.exp(x - x.max())
      shares.append(np.cumsum(e) / e.sum())
    out.append((log_u, shares[0], shares[1]))
  return out


def _run_error(profiles: list, a: int, b: int) -> tuple[float, float]:
  """Terms ``a..b-1`` (0-based) as one run: its log-spread and estimated error."""
  spread = max(p[0][b - 1] - p[0][a] for p in profiles)
  share = max(max(c[b - 1] - (c[a - 1] if a else 0.0) for c in p[1:]) for p in profiles)
  return spread, _GAUSS_ERROR * spread ** 4 * share


def _cuts(profiles: list, window: int, target: float) -> list[tuple[int, int]]:
  """Runs of the window, each as long as its estimated error stays below ``target``."""
  runs, a = [], 0
  for b in range(2, window + 1):
    spread, err = _run_error(profiles, a, b)
    if err > target or spread > _MAX_RUN_SPREAD:
      runs.append((a, b - 1))
      a = b - 1
  runs.append((a, window))
  return runs


def _effective_window(b1: float, b2: float, window: int) -> int:
  """The window without the terms below ``_NEGLIGIBLE`` of the first (any row age): a
  window given larger than the sum needs adds nothing but points past float32's range."""
  ratio = b1 / math.sqrt(b2)
  need = _needed_window(ratio, _NEGLIGIBLE)
  return window if need is None else max(1, min(window, need))


def _adam_runs(where: str, b1: float, b2: float, window: int, nesterov: bool,
               poles: int | None) -> tuple[tuple[int, int], ...]:
  r"""The runs of Adam's window, each summed by a two-node Gauss rule.

  Chosen from the rule's error model so that each run's estimated error is below
  1e-6 of the sum (``poles`` given: the best cuts into that many runs, at most). Early
  in training the points :math:`u_k` grow as a power of the step, later as
  :math:`\beta_2^{-k/2}`: with :math:`\beta_2` near or below :math:`\beta_1` they
  spread over many orders of magnitude and need many runs.
  """
  if b1 == 0.0:
    return ((0, window),)
  log_u_max = window * -0.5 * math.log(b2)
  if log_u_max > _MAX_LOG_U:
    raise ValueError(
        f"{where}: b2: with b1={b1:g} and b2={b2:g} the skipped steps' terms grow by "
        f"b2**(-k/2) to e**{log_u_max:.0f} over the {window:,} steps that matter, past "
        "float32's range. Use a b2 closer to 1 (b2 >= b1 keeps it within e**14), or a "
        "plain lazy step (lars_optax.sparse.lazy_update(optax.adam(...)), another "
        "optimizer).")
  profiles = _profiles(b1, b2, window, nesterov)
  runs = _cuts(profiles, window, _RUN_TARGET)
  if poles is not None:  # the smallest target that fits in ``poles`` runs
    lo, hi = _RUN_TARGET, 1.0
    if len(runs) > poles:
      for _ in range(40):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if len(_cuts(profiles, window, mid)) > poles else (lo, mid)
      runs = _cuts(profiles, window, hi)
  elif len(runs) > _MAX_RUNS:
    raise ValueError(
        f"{where}: b2: with b1={b1:g} and b2={b2:g} the skipped steps' terms spread over "
        f"e**{max(p[0][-1] - p[0][0] for p in profiles):.0f} in the eps term, and their "
        f"sum would need {len(runs)} runs of its two-node rule to stay within 1e-5 of the "
        f"dense step's move, more than the {_MAX_RUNS} it takes at a lazy step's cost. "
        "Use a b2 closer to 1 (b2 >= b1 needs at most 22), or pass poles= to accept a "
        "larger error, or a plain lazy step (lars_optax.sparse.lazy_update(optax.adam("
        "...)), another optimizer).")
  return tuple(runs)


def _two_nodes(mean: jax.Array, c2: jax.Array, c3: jax.Array
               ) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
  r"""The two-node Gauss rule of a positive measure with this mean and central moments.

  The nodes :math:`\bar u + z_{1,2}` are the roots of the degree-2 orthogonal
  polynomial :math:`z^2 - (c_3/c_2) z - c_2`; their shares
  :math:`z_2/(z_2-z_1)` and :math:`-z_1/(z_2-z_1)` sum to 1. Where the spread
  is below float32's resolution the rule is one node at the mean.
  """
  spread = c2 > (1e-6 * mean) ** 2
  c2s = jnp.where(spread, c2, 1.0)
  a = c3 / c2s
  root = jnp.sqrt(a * a + 4.0 * c2s)
  z1, z2 = (a - root) / 2.0, (a + root) / 2.0
  share1 = jnp.where(spread, z2 / (z2 - z1), 1.0)
  share2 = jnp.where(spread, -z1 / (z2 - z1), 0.0)
  node1 = jnp.where(spread, mean + z1, mean)
  node2 = jnp.where(spread, mean + z2, mean)
  return (node1, node2), (share1, share2)


def _row_scalars(rule: _Rule, s: jax.Array, count: jax.Array, decays: bool,
                 future: tuple[jax.Array, jax.Array] | None = None) -> dict[str, jax.Array]:
  """Per row: the factors that bring it from step ``s`` to step ``count``.

  ``decays``: whether the leaf takes the decoupled decay (AdamW's ``mask``).
  ``future``: SGD with a schedule: the rows' :math:`P(s)` and :math:`P(count)`
  (:func:`_future`), for gaps longer than the window.

  Returns ``m_decay`` (:math:`\\beta_1^n` or :math:`\\mu^n`), ``v_decay``,
  ``w_log`` (:math:`\\log D`, without the part read from ``log_decay``), and per
  node of each run's two-node rule ``h`` (its weight times its point,
  :math:`W_j U_j`) and ``e`` (:math:`\\epsilon U_j`), so that the drift is
  :math:`m \\sum_j h_j / (\\sqrt{v} + e_j)`; for SGD ``h`` is the momentum's
  whole drift factor.
  """
  n = jnp.maximum(count - s, 0)
  if rule.kind == "sgd" and rule.momentum is None:  # plain SGD: nothing moves while away
    return {"w_log": jnp.zeros(n.shape, jnp.float32)}
  window = rule.window
  k = jnp.arange(1, window + 1, dtype=jnp.int32)
  t = s[:, None] + k[None, :]  # the skipped step (1-based) of each term
  valid = k[None, :] <= n[:, None]
  kf = k.astype(jnp.float32)
  sf = s.astype(jnp.float32)[:, None]
  lr = jnp.broadcast_to(rule.lr(t - 1), t.shape)
  decays = decays and rule.decays
  if decays:
    assert rule.wd is not None
    dec = jnp.where(valid, 1.0 - lr * rule.wd(t - 1), 1.0)
    d_k = jnp.cumprod(dec, axis=1)
  else:
    dec = d_k = jnp.ones_like(lr)
  out: dict[str, jax.Array] = {}
  m_tail = jnp.maximum(n - window, 0)
  if rule.kind == "sgd":
    mu = jnp.float32(rule.momentum)
    mom = mu ** (kf + 1.0) if rule.nesterov else mu ** kf
    w = jnp.where(valid, lr * mom / d_k, 0.0)
    if future is None:  # a constant rate: the tail is geometric, exactly
      h = w.sum(axis=1) + w[:, -1] * _geometric(mu / dec[:, -1], m_tail)
    else:  # the window's terms one by one; past it, P(s) - mu**n P(count), exactly
      p_s, p_now = future
      lead = mu if rule.nesterov else jnp.float32(1.0)
      far = lead * (p_s - mu ** n.astype(jnp.float32) * p_now)
      h = jnp.where(n <= window, w.sum(axis=1), far)
    out["h"] = h[:, None]
    out["m_decay"] = mu ** n.astype(jnp.float32)
  elif rule.b1 == 0.0:  # the moment is the last gradient alone: an absent row does not move
    b2 = jnp.float32(rule.b2)
    out["h"] = jnp.zeros((n.shape[0], 1), jnp.float32)
    out["e"] = jnp.ones((n.shape[0], 1), jnp.float32)
    out["m_decay"] = jnp.where(n == 0, 1.0, 0.0).astype(jnp.float32)
    out["v_decay"] = b2 ** n.astype(jnp.float32)
  else:
    b1, b2 = jnp.float32(rule.b1), jnp.float32(rule.b2)
    log_q = 0.5 * jnp.log(b2)
    # b**t as b**s * b**k: a power per row and per column, not per term.
    b1_k, b1_s = b1 ** kf, b1 ** sf
    mom = ((b1 * b1_k) / (1.0 - (b1 * b1_s) * b1_k) if rule.nesterov
           else b1_k / (1.0 - b1_s * b1_k))
    w = jnp.where(valid, lr * mom / d_k if decays else lr * mom, 0.0)
    # u_k = sqrt(1 - b2**(s+k)) / b2**(k/2): b2**(s+k) may underflow (to 0, harmlessly);
    # 1 / b2**(k/2) is a column constant, below e**60 (the build keeps it there).
    u = jnp.sqrt(1.0 - (b2 ** sf) * (b2 ** kf)) * jnp.exp(-kf * log_q)
    h = w * u
    # The tail, with the schedule frozen at the window's end, joins the last run
    # (its terms are below 1e-6 of the first, at the default window).
    rho = b1 / dec[:, -1]
    tail_w = w[:, -1] * _geometric(rho, m_tail)
    tail_h = h[:, -1] * _geometric(rho * jnp.exp(-log_q), m_tail)
    # Each run's two-node Gauss rule for the weights w at the points u: its mean
    # and central second and third moments give the nodes and their shares. The
    # moments are taken of z = u / u0 - 1, u0 the run's first point (so that float32
    # keeps the central ones, and a run spread over orders of magnitude stays finite).
    runs = rule.runs
    first = np.array([a for a, _ in runs])
    column_run = np.repeat(np.arange(len(runs)), [b - a for a, b in runs])
    u0 = u[:, first]
    z = jnp.where(valid, u * (1.0 / u0)[:, column_run] - 1.0, 0.0)
    wz = w * z
    # Each run's sums in products with a 0/1 matrix (not reductions per run; one
    # product each, so that no five-fold [rows, window] temporary is formed).
    member = np.zeros((window, len(runs)), np.float32)
    for i, (a, b) in enumerate(runs):
      member[a:b, i] = 1.0
    hi = jax.lax.Precision.HIGHEST  # float32 sums on GPU and TPU too

    def per_run(x):
      return jnp.dot(x, member, precision=hi)

    w_p = per_run(w).at[:, -1].add(tail_w)
    h_p = per_run(h).at[:, -1].add(tail_h)
    safe_w = jnp.where(w_p > 0, w_p, 1.0)
    m1, m2, m3 = (per_run(x) / safe_w for x in (wz, wz * z, wz * z * z))
    mean = jnp.where(w_p > 0, h_p / (safe_w * u0), 1.0) - 1.0  # the run's mean of z
    nodes, shares = _two_nodes(mean + 1.0, m2 - m1 * m1,
                               m3 - 3.0 * m1 * m2 + 2.0 * m1 * m1 * m1)
    nodes = (nodes[0] * u0, nodes[1] * u0)
    out["h"] = jnp.concatenate([w_p * shares[0] * nodes[0], w_p * shares[1] * nodes[1]], axis=1)
    out["e"] = jnp.float32(rule.eps) * jnp.concatenate(nodes, axis=1)
    out["m_decay"] = b1 ** n.astype(jnp.float32)
    out["v_decay"] = b2 ** n.astype(jnp.float32)
  if decays and not rule.tracks_log_decay:
    assert rule.wd is not None
    step = jnp.log1p(-rule.lr(jnp.int32(0)) * rule.wd(jnp.int32(0)))
    out["w_log"] = n.astype(jnp.float32) * step
  else:
    out["w_log"] = jnp.zeros(n.shape, jnp.float32)
  return out


def _row_scalars_by_gap(rule: _Rule, s: jax.Array, count: jax.Array, decays: bool,
                        future: tuple[jax.Array, jax.Array] | None = None
                        ) -> dict[str, jax.Array]:
  """:func:`_row_scalars` over many rows (a whole table): computed once per gap.

  A row's factors depend on its last step ``s`` only through the gap
  ``count - s`` (``count`` is the same for every row), and a table holds far fewer
  distinct gaps than rows. So the factors of every gap below ``_BLOCK`` are computed
  once, in one ``[_BLOCK, window]`` block, and gathered per row; the rows away
  for longer are computed as their own rows, ``_BLOCK`` at a time, and cost only
  where there are any. SGD with a schedule reads its rows past the window from
  their :math:`P(s)`, row by row, exactly.
  """
  rows = s.shape[0]
  if rows <= _BLOCK:
    return _row_scalars(rule, s, count, decays, future)
  size = max(_BLOCK, rule.window + 1)
  gap = jnp.maximum(count - s, 0)
  table = _row_scalars(rule, jnp.maximum(count - jnp.arange(size, dtype=s.dtype), 0), count,
                       decays, None if future is None else
                       (jnp.zeros((size,), jnp.float32), future[1]))
  near = jnp.minimum(gap, size - 1)
  out = {k: v[near] for k, v in table.items()}
  if future is not None:  # SGD with a schedule: past the window, P(s) - mu**n P(count)
    assert rule.momentum is not None
    mu = jnp.float32(rule.momentum)
    lead = mu if rule.nesterov else jnp.float32(1.0)
    decay = mu ** gap.astype(jnp.float32)  # each row's own (the table stops at its end)
    far = lead * (future[0] - decay * future[1])
    out["h"] = jnp.where((gap <= rule.window)[:, None], out["h"], far[:, None])
    out["m_decay"] = decay
    return out
  return _far_rows(rule, s, count, decays, gap >= size, out)


def _row_scalars_of_batch(rule: _Rule, s: jax.Array, count: jax.Array, decays: bool,
                          future: tuple[jax.Array, jax.Array] | None = None
                          ) -> dict[str, jax.Array]:
  """:func:`_row_scalars` for a batch's rows: the factors of each gap below ``_NEAR``
  computed once and gathered (most rows of a Zipfian batch were touched a few steps
  ago), and the rows away longer as their own rows, ``_FAR_BLOCK`` at a time."""
  if future is not None or s.shape[0] <= _NEAR + _FAR_BLOCK:
    return _row_scalars(rule, s, count, decays, future)
  gap = jnp.maximum(count - s, 0)
  table = _row_scalars(rule, jnp.maximum(count - jnp.arange(_NEAR, dtype=s.dtype), 0), count,
                       decays)
  near = jnp.minimum(gap, _NEAR - 1)
  return _far_rows(rule, s, count, decays, gap >= _NEAR,
                   {k: v[near] for k, v in table.items()}, _FAR_BLOCK)


def _far_rows(rule: _Rule, s: jax.Array, count: jax.Array, decays: bool, far: jax.Array,
              out: dict[str, jax.Array], block: int = _BLOCK) -> dict[str, jax.Array]:
  """``out`` with the rows marked ``far`` computed as their own rows, ``block`` at a
  time (a loop that runs once per ``block`` such rows, not at all without any)."""
  rows = s.shape[0]

  def body(carry):
    left, out = carry
    (idx,) = jnp.nonzero(left, size=block, fill_value=rows)
    sc = _row_scalars(rule, s[jnp.minimum(idx, rows - 1)], count, decays)
    out = {k: v.at[idx].set(sc[k], mode="drop") for k, v in out.items()}
    return left.at[idx].set(False, mode="drop"), out

  return jax.lax.while_loop(lambda carry: jnp.any(carry[0]), body, (far, out))[1]


def _bcast(x: jax.Array, ndim: int) -> jax.Array:
  return x.reshape(x.shape + (1,) * (ndim - x.ndim))


_BUFFER_DECAY = {"trace": "m_decay", "mu": "m_decay", "nu": "v_decay"}


def _decayed(sc: dict[str, jax.Array], bufs: dict[str, Any]) -> dict[str, Any]:
  """The buffers' rows decayed over the skipped steps (momentum or moments)."""
  return {f: (_bcast(sc[_BUFFER_DECAY[f]], b.ndim) * b.astype(jnp.float32)).astype(b.dtype)
          for f, b in bufs.items()}


def _catch_up_rows(rule: _Rule, sc: dict[str, jax.Array], w: jax.Array, bufs: dict[str, Any],
                   extra_log: jax.Array | None, decays: bool) -> tuple[jax.Array, dict]:
  """Rows of the weight and buffers brought up to date with the per-row scalars ``sc``."""
  nd = w.ndim
  w32 = w.astype(jnp.float32)
  if rule.kind == "sgd":
    if "trace" not in bufs:  # plain SGD: an absent row does not move
      return w, bufs
    new_w = w32 - _bcast(sc["h"][:, 0], nd) * bufs["trace"].astype(jnp.float32)
    return new_w.astype(w.dtype), _decayed(sc, bufs)
  m = bufs["mu"].astype(jnp.float32)
  root = jnp.sqrt(bufs["nu"].astype(jnp.float32))
  drift = jnp.zeros_like(w32)
  for p in range(sc["h"].shape[1]):
    den = root + _bcast(sc["e"][:, p], nd)
    drift = drift + jnp.where(den > 0, m * _bcast(sc["h"][:, p], nd)
                              / jnp.where(den > 0, den, 1.0), 0.0)
  new_w = w32 - drift
  if decays:
    # D w as w + (D - 1) w, D - 1 from expm1: a decay of 1e-5 a step stays exact to
    # float32's resolution of the weights (as optax adds its small decay term).
    log_d = sc["w_log"] if extra_log is None else sc["w_log"] + extra_log
    new_w = new_w + _bcast(jnp.expm1(log_d), nd) * new_w
  return new_w.astype(w.dtype), _decayed(sc, bufs)


# --------------------------------------------------------------------------
# The twin's buffers
# --------------------------------------------------------------------------

_BUFFERS = {optax.ScaleByAdamState: ("mu", "nu"), optax.TraceState: ("trace",)}


def _is_buffer_state(x: Any) -> bool:
  return type(x) in _BUFFERS


def _buffer_trees(inner: Any) -> dict[str, Any]:
  """The twin's params-shaped buffers by field name (``mu``, ``nu``, ``trace``)."""
  out: dict[str, Any] = {}
  for node in jax.tree.leaves(inner, is_leaf=_is_buffer_state):
    if _is_buffer_state(node):
      for f in _BUFFERS[type(node)]:
        out[f] = getattr(node, f)
  return out


def _with_buffer_trees(inner: Any, trees: dict[str, Any]) -> Any:
  def visit(node):
    if _is_buffer_state(node):
      return node._replace(**{f: trees[f] for f in _BUFFERS[type(node)]})
    return node
  return jax.tree.map(visit, inner, is_leaf=_is_buffer_state)


def _decay_mask(rule: _Rule, params: Any, treedef: Any) -> list[bool]:
  if not rule.decays:
    return [False] * treedef.num_leaves
  mask = rule.wd_mask
  if mask is None:
    return [True] * treedef.num_leaves
  if callable(mask):
    mask = mask(params)
  if isinstance(mask, (bool, np.bool_)):
    return [bool(mask)] * treedef.num_leaves
  try:
    flat = treedef.flatten_up_to(mask)
  except (ValueError, TypeError) as e:
    raise ValueError(f"{rule.name}: mask: a bool pytree must have the params' structure "
                     f"(optax's mask: True where the decay applies): {e}") from None
  for x in flat:
    if not (isinstance(x, (bool, np.bool_)) or (np.ndim(x) == 0 and hasattr(x, "dtype")
                                                and x.dtype == np.bool_)):
      raise TypeError(f"{rule.name}: mask: expected a bool per leaf (optax's mask: True "
                      f"where the decay applies), got {x!r}.")
  return [bool(x) for x in flat]


def _check_mask(where: str, mask: Any) -> None:
  """``optax.adamw``'s ``mask``: None, a bool, a bool pytree or a callable returning one."""
  if mask is None or callable(mask) or isinstance(mask, (bool, np.bool_)):
    return
  if isinstance(mask, (str, bytes, int, float, complex, np.number, np.ndarray, jax.Array)):
    raise TypeError(f"{where}: mask: expected optax's mask (a bool pytree with the params' "
                    "structure, or a callable params -> bool pytree; True where the decay "
                    f"applies), got {mask!r}.")


def _two_sum(hi: jax.Array, lo: jax.Array, x: jax.Array) -> jax.Array:
  """``(hi, lo) + x`` in compensated float32 (Knuth's two-sum)."""
  s = hi + x
  bb = s - hi
  err = (hi - (s - bb)) + (x - bb)
  return jnp.stack([s, lo + err])


# --------------------------------------------------------------------------
# The transformation
# --------------------------------------------------------------------------


def _row_count(p: Any) -> int | None:
  shape = np.shape(p)
  return shape[0] if len(shape) else None


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


def _gather_up(rule: _Rule, leaf: _Leaf, r: jax.Array, count: jax.Array,
               log_now: jax.Array | None, decays: bool) -> tuple[Any, ...]:
  """Rows ``r`` of a leaf, gathered and brought up to date.

  Returns ``(s, logs, w0, w1, b1)``: the rows' last steps and decay logs (for
  the write-back), the rows as stored, and the rows and buffers brought up to
  date. Rows already up to date (``catch_up(rows=...)`` before the forward
  pass) skip the work, in a ``lax.cond`` whose outputs are the rows only.
  """
  s = _rows.gather(leaf.last, r)
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
    return _catch_up_rows(rule, _row_scalars_of_batch(rule, s, count, decays, future), w, b,
                          extra, decays)

  w1, b1 = jax.lax.cond(jnp.any(s != count), run, lambda args: args, (w0, b0))
  return s, logs, w0, w1, b1


def _bring_up(rule: _Rule, leaf: _Leaf, count: jax.Array, log_now: jax.Array | None,
              decays: bool) -> _Caught:
  """Gathers a row-sparse leaf's rows and brings them up to date (a dense leaf: all rows)."""
  g, p = leaf.grad, leaf.param
  if not _rows.is_row_sparse(g):
    return _bring_up_dense(rule, leaf, count, log_now, decays)
  ok = _checks.check_row_sparse(leaf.name, g, p, rule.name)
  r, values = _rows.combine(g, p.shape[0])
  r = r + jnp.asarray(ok, r.dtype)
  s, logs, w0, w1, b1 = _gather_up(rule, leaf, r, count, log_now, decays)
  return _Caught(r, values, w0, w1, b1, s, logs)


def _catch_up_all_rows(rule: _Rule, leaf: _Leaf, count: jax.Array, log_now: jax.Array | None,
                       decays: bool) -> tuple[jax.Array, dict[str, Any], dict[str, jax.Array]]:
  """Every row of a leaf (a 0-d leaf: its one value) brought up to date, and the
  per-row factors used."""
  p, b = leaf.param, leaf.bufs
  flat = p.ndim == 0
  future = extra = None
  if log_now is not None and rule.tracks_future:
    future = (leaf.rowlog.reshape(-1), log_now)
  elif log_now is not None:
    extra = (log_now - leaf.rowlog).reshape(-1)
  sc = _row_scalars_by_gap(rule, leaf.last.reshape(-1), count, decays, future)
  w1, b1 = _catch_up_rows(rule, sc, p[None] if flat else p,
                          {f: x[None] if flat else x for f, x in b.items()}, extra, decays)
  return (w1[0], {f: x[0] for f, x in b1.items()}, sc) if flat else (w1, b1, sc)


def _bring_up_dense(rule: _Rule, leaf: _Leaf, count: jax.Array, log_now: jax.Array | None,
                    decays: bool) -> _Caught:
  """A dense leaf, every row brought up to date: a branch taken only when one is behind
  (a dense step after sparse ones).

  Only the weights' drift and the row-sized decay factors leave the branch; the
  buffers are decayed outside it (the identity factors otherwise), in the step's own
  fused pass. A branch that passed param-sized buffers through would copy them on
  every step.
  """
  p = leaf.param
  names = sorted({_BUFFER_DECAY[f] for f in leaf.bufs})

  def behind(p):
    w1, _, sc = _catch_up_all_rows(rule, leaf._replace(param=p), count, log_now, decays)
    return w1.astype(jnp.float32) - p.astype(jnp.float32), {k: sc[k] for k in names}

  # behind's types, typed shardings included (explicit mesh axes): the drift is
  # p's, each row factor follows the rows' last steps. (Read off the inputs:
  # tracing behind again to get them doubles the step's trace time.)
  # Inside shard_map (check_vma) the drift varies where any input does, the
  # factors where the last steps do.
  drift_type = utils.struct_like(p, jnp.float32)
  factor_type = utils.struct_like(leaf.last.reshape(-1), jnp.float32)
  inputs = [p, leaf.last, *leaf.bufs.values(), leaf.rowlog]
  drift_axes = tuple(sorted(frozenset().union(
      *(utils.vma(x) for x in inputs if hasattr(x, "dtype")))))
  factor_axes = tuple(sorted(utils.vma(leaf.last)))

  def current(p):
    del p
    return (utils.to_varying(utils.full(drift_type, 0), drift_axes),
            {k: utils.to_varying(utils.full(factor_type, 1), factor_axes) for k in names})

  drift, factors = jax.lax.cond(jnp.any(leaf.last != count), behind, current, p)
  if p.ndim == 0:
    b1 = {f: (x[None] * factors[_BUFFER_DECAY[f]]).astype(x.dtype)[0]
          for f, x in leaf.bufs.items()}
  else:
    b1 = _decayed(factors, leaf.bufs)
  return _Caught(None, leaf.grad, p, (p.astype(jnp.float32) + drift).astype(p.dtype), b1,
                 None, None, drift)


def _write_back(leaf: _Leaf, caught: _Caught, step_update: jax.Array, bufs_out: dict[str, Any],
                new_count: jax.Array, log_next: jax.Array | None) -> tuple[Any, ...]:
  """A leaf's update (catch-up plus step) and its new buffers, last steps and logs."""
  u = step_update
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


def _same_rates(rule: _Rule, rates: jax.Array) -> Any:
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


def _snapshots(rule: _Rule, state: CatchUpState) -> Any:
  """The rows' snapshots: AdamW's ``row_log_decay`` or SGD's ``row_future`` (or empty)."""
  return state.row_future if rule.tracks_future else state.row_log_decay


def _with_snapshots(rule: _Rule, state: CatchUpState, snaps: Any) -> CatchUpState:
  if rule.tracks_future:
    return state._replace(row_future=snaps)
  return state._replace(row_log_decay=snaps)


def _now(rule: _Rule, state: CatchUpState) -> jax.Array | None:
  """The running global value the rows' snapshots are taken of, at the state's count."""
  if rule.tracks_log_decay:
    return state.log_decay[0] + state.log_decay[1]
  if rule.tracks_future:
    return _future(rule, state.count)
  return None


def _dense_exact(rule: _Rule) -> GradientTransformationExtraArgs:
  twin = optax.with_extra_args_support(rule.twin)
  where = rule.name

  def init_fn(params):
    rule.check_params(params)
    last = jax.tree.map(lambda p: jnp.zeros(np.shape(p)[:1], jnp.int32), params)
    empty = jax.tree.map(lambda p: optax.MaskedNode(), params)
    log_decay, row_log, row_future = optax.MaskedNode(), empty, empty
    if rule.tracks_log_decay:
      log_decay = jnp.zeros((2,), jnp.float32)
      row_log = jax.tree.map(lambda p: jnp.zeros(np.shape(p)[:1], jnp.float32), params)
    if rule.tracks_future:
      p0 = _future(rule, jnp.int32(0))
      row_future = jax.tree.map(lambda p: jnp.full(np.shape(p)[:1], p0, jnp.float32), params)
    rates = rule.rates()
    return CatchUpState(jnp.zeros([], jnp.int32), last, log_decay, row_log, twin.init(params),
                        jnp.asarray(rates) if rates.size else optax.MaskedNode(), row_future)

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
    decays = _decay_mask(rule, jax.tree.unflatten(treedef, [x.param for x in leaves]), treedef)
    log_now = future_next = None
    if rule.tracks_future:  # P(count) from P(count + 1): one sum of the schedule a step
      assert rule.momentum is not None
      future_next = _future(rule, state.count + 1)
      log_now = jnp.float32(rule.momentum) * (rule.lr(state.count) + future_next)
    else:
      log_now = _now(rule, state)
    caught = [_bring_up(rule, x, state.count, log_now, d) for x, d in zip(leaves, decays)]

    def tree(values):
      return jax.tree.unflatten(treedef, list(values))

    # optax's own step on the rows brought up to date.
    inner_in = _with_buffer_trees(
        state.inner, {f: tree(c.bufs[f] for c in caught) for f in leaves[0].bufs})
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
      ok = _checks.raise_at_run_time(rate >= 1.0, _sign_flip(where, " at this step"), rate)
      log_decay = _two_sum(state.log_decay[0], state.log_decay[1],
                           jnp.log1p(-rate) + jnp.asarray(ok, jnp.float32))
      log_next = log_decay[0] + log_decay[1]
    elif rule.tracks_future:
      log_next = future_next

    out = [_write_back(x, c, u, {f: b[i] for f, b in bufs_out.items()}, new_count, log_next)
           for i, (x, c, u) in enumerate(zip(leaves, caught, flat_u))]
    inner_state = _with_buffer_trees(
        inner_out, {f: tree(o[3][f] for o in out) for f in leaves[0].bufs})
    snaps = tree(o[2] for o in out)
    new_state = CatchUpState(new_count, tree(o[1] for o in out), log_decay,
                             state.row_log_decay, inner_state, state.rates, state.row_future)
    return tree(o[0] for o in out), _with_snapshots(rule, new_state, snaps)

  def update_fn(updates, state, params=None, **extra_args):
    if params is None:
      raise ValueError(f"{where}: params are required; call update(updates, state, params).")
    return step(updates, state, params, extra_args)

  update_fn.catch_up_rule = rule  # type: ignore[attr-defined]  # read by catch_up
  return GradientTransformationExtraArgs(init_fn, update_fn)


# --------------------------------------------------------------------------
# Public constructors
# --------------------------------------------------------------------------


def _sign_flip(where: str, when: str) -> Any:
  def report(rate: Any) -> str:
    return (f"{where}: weight_decay: learning_rate * weight_decay is {float(rate):g}"
            f"{when}, >= 1: the decoupled decay multiplies each weight by 1 - "
            "learning_rate * weight_decay <= 0, flipping its sign, which the catch-up of "
            "skipped steps (a product of such factors, taken in log form) cannot follow. "
            "Keep learning_rate * weight_decay below 1 at every step.")
  return report


def _checked_lr(where: str, learning_rate: Any) -> None:
  v.check_learning_rate(f"{where}: learning_rate", learning_rate)


@_adam_names
def adam(learning_rate: optax.ScalarOrSchedule, *, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Any = None,
         nesterov: bool = False, window: int | None = None,
         poles: int | None = None) -> GradientTransformationExtraArgs:
  r"""``optax.adam`` with lazy rows: the dense step's numbers at a lazy step's cost.

  On a gradient tree with row-sparse leaves (:mod:`lars_optax.sparse`), each
  touched row is first brought up to date over the steps it skipped (see the
  module doc), then takes ``optax.adam``'s step; the update is row-sparse.
  After :func:`catch_up` the params equal ``optax.adam`` on the dense
  gradients (zeros on the absent rows): within 1e-5 of the largest move or 3x
  float32 ``optax.adam``'s own error, over b1 from 0 to 0.99, b2 from below b1
  to 0.9999, eps, gradients from 1e-9 to 1e3, any gap, constant rates and
  schedules (docs/sparse.md states the domain as tested). Refused when built:
  a b1 whose skipped steps matter for more than 2,048 steps, such as 0.999
  (unless ``window`` is given), b2 <= b1**2, and a b2 so far below b1 that
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
    window: how many skipped steps are summed term by term (the rest: a
      geometric tail at the window's last rate); default: until
      :math:`(\beta_1/\sqrt{\beta_2})^k < 10^{-6}`, at most 2,048. A larger
      one is cut where the terms fall below 1e-9 of the first.
    poles: at most this many runs of the window, each summed by a two-node
      Gauss rule (1 to 32); default: as many as keep each run's estimated
      error below 1e-6 of the sum (7 at the default betas). Fewer trade
      accuracy for speed, and the bound above is then not promised.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs` with a
    :class:`CatchUpState`. A ``weight_decay`` (coupled L2 decay) is refused:
    use :func:`adamw`.
  """
  where = "sparse.adam"
  return _adam_rule(where, learning_rate, b1, b2, eps, eps_root, mu_dtype, nesterov, window,
                    poles, None, None)


@_adamw_names
def adamw(learning_rate: optax.ScalarOrSchedule, *, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Any = None,
          weight_decay: optax.ScalarOrSchedule = 1e-4, mask: Any = None,
          nesterov: bool = False, window: int | None = None,
          poles: int | None = None) -> GradientTransformationExtraArgs:
  r"""``optax.adamw`` with lazy rows: the dense step's numbers at a lazy step's cost.

  As :func:`adam`, with ``optax.adamw``'s decoupled decay: a row untouched
  for :math:`n` steps is multiplied by :math:`\prod (1 - \alpha_t\lambda_t)`
  over them. With a schedule for the learning rate or ``weight_decay`` the
  state keeps one float32 per row more (the log of the decay applied so far).

  Args:
    learning_rate, b1, b2, eps, mu_dtype, weight_decay, mask, nesterov: as
      ``optax.adamw``'s.
    eps_root, window, poles: as in :func:`adam`.
  """
  where = "sparse.adamw"
  v.check_learning_rate(f"{where}: weight_decay", weight_decay)
  _check_mask(where, mask)
  return _adam_rule(where, learning_rate, b1, b2, eps, eps_root, mu_dtype, nesterov, window,
                    poles, weight_decay, mask)


def _adam_rule(where, learning_rate, b1, b2, eps, eps_root, mu_dtype, nesterov, window, poles,
               weight_decay, mask):
  learning_rate, b1, b2, eps, eps_root, window, poles, weight_decay = (
      _known(where, name, x) for name, x in zip(
          ("learning_rate", "b1", "b2", "eps", "eps_root", "window", "poles", "weight_decay"),
          (learning_rate, b1, b2, eps, eps_root, window, poles, weight_decay)))
  _checked_lr(where, learning_rate)
  v.check_betas(b1, b2, eps, names=(f"{where}: b1", f"{where}: b2", f"{where}: eps"))
  v.check_scalar(f"{where}: eps_root", eps_root, low=0.0)
  if float(eps_root) != 0.0:
    raise ValueError(f"{where}: eps_root must be 0 (got {float(eps_root):g}): with it the "
                     "skipped steps of an untouched row have no closed form here.")
  nesterov = v.check_flag(f"{where}: nesterov", nesterov)
  _check_window(window, poles, where)
  b1f, b2f = float(b1), float(b2)
  if weight_decay is None:
    twin = optax.adam(learning_rate, b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov)
  else:
    twin = optax.adamw(learning_rate, b1, b2, eps, eps_root, mu_dtype,
                       weight_decay=weight_decay, mask=mask, nesterov=nesterov)
  ratio = b1f / math.sqrt(b2f) if b2f > 0 else (math.inf if b1f > 0 else 0.0)
  need = _needed_window(ratio)
  if need is None:
    raise ValueError(
        f"{where}: b2: b1 / sqrt(b2) is {ratio:.6g} >= 1 (b1={b1f:g}, b2={b2f:g}): with "
        "b2 <= b1**2 the dense step's terms for a row's skipped steps never shrink, so no "
        "sum over a window of them is dense Adam's. Use b2 > b1**2 (b2 >= b1 is cheapest), "
        "or a plain lazy step (lars_optax.sparse.lazy_update(optax.adam(...)), another "
        "optimizer).")
  window_given = window is not None
  if not window_given and need > _MAX_WINDOW:
    raise ValueError(
        f"{where}: b1: b1 / sqrt(b2) is {ratio:.6g}: a row's skipped steps matter until "
        f"(b1 / sqrt(b2))**k < 1e-6, after {need:,} steps, "
        f"more than the {_MAX_WINDOW:,} the catch-up sums a row at a lazy step's cost, so "
        "it would not be dense Adam's. Use b1 <= 0.99; or a plain lazy step "
        "(lars_optax.sparse.lazy_update(optax.adam(...)), another optimizer); or pass "
        "window= to accept a tail past it taken at the window's last rate.")
  window = _effective_window(b1f, b2f, _default_window(ratio) if window is None else window)
  runs = _adam_runs(where, b1f, b2f, window, nesterov, poles)
  decays = weight_decay is not None and (callable(weight_decay) or float(weight_decay) != 0.0)
  if decays and not callable(weight_decay) and not callable(learning_rate):
    rate = float(learning_rate) * float(weight_decay)
    if rate >= 1.0:
      raise ValueError(_sign_flip(where, "")(rate))
  return _dense_exact(_Rule(
      name=where, twin=twin, lr=_as_schedule(learning_rate),
      lr_is_schedule=callable(learning_rate), kind="adam", b1=b1f, b2=b2f, eps=float(eps),
      nesterov=nesterov, wd=_as_schedule(weight_decay) if decays else None,
      wd_is_schedule=callable(weight_decay), wd_mask=mask,
      window=window, runs=runs,
      constants=(("learning_rate", learning_rate), ("eps", eps),
                 ("weight_decay", weight_decay))))


@_sgd_names
def sgd(learning_rate: optax.ScalarOrSchedule, *, momentum: float | None = None,
        nesterov: bool = False, accumulator_dtype: Any = None,
        window: int | None = None) -> GradientTransformationExtraArgs:
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
  """
  where = "sparse.sgd"
  learning_rate, momentum, window = (
      _known(where, name, x) for name, x in zip(("learning_rate", "momentum", "window"),
                                                 (learning_rate, momentum, window)))
  _checked_lr(where, learning_rate)
  if momentum is not None:
    v.check_scalar(f"{where}: momentum", momentum, low=0.0, high=1.0, high_open=True)
  nesterov = v.check_flag(f"{where}: nesterov", nesterov)
  _check_window(window, 1, where)
  mu = None if momentum is None else float(momentum)
  if mu is not None and callable(learning_rate) and mu > _MAX_FUTURE_MOMENTUM:
    raise ValueError(
        f"{where}: momentum: {mu:g} with a schedule is above {_MAX_FUTURE_MOMENTUM:.5f}: "
        "a row's catch-up sums the schedule over the steps until momentum**k < "
        f"{_FUTURE_TOL:g}, more than {_MAX_FUTURE_TERMS:,} of them, at every step. Use a "
        "lower momentum or a constant learning rate (exact for any momentum < 1).")
  return _dense_exact(_Rule(
      name=where, twin=optax.sgd(learning_rate, momentum, nesterov, accumulator_dtype),
      lr=_as_schedule(learning_rate), lr_is_schedule=callable(learning_rate), kind="sgd",
      momentum=mu, nesterov=nesterov,
      window=(_default_window(mu or 0.0, _SGD_WINDOW) if window is None else window),
      constants=(("learning_rate", learning_rate),)))


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
  Works under ``jit``; training continues exactly after it.

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
  if not isinstance(rule, _Rule):
    raise TypeError("catch_up: tx must be lars_optax.sparse.adam, adamw or sgd (the "
                    "transformation itself, not a chain around it; pass the chain's "
                    "state as state).")
  found = utils.find_states(state, CatchUpState)
  if len(found) != 1:
    raise ValueError(f"catch_up: state holds {len(found)} CatchUpState; expected exactly one "
                     f"(the state of {rule.name}).")
  mp = next((m for m in utils.find_states(state, _master_states())
             if utils.find_states(m.inner_state, CatchUpState)), None)
  full = params if mp is None else jax.tree.map(
      lambda p, m: p if isinstance(m, optax.MaskedNode) else m, params, mp.master,
      is_leaf=lambda x: isinstance(x, optax.MaskedNode))
  treedef: Any = jax.tree.structure(full)
  v.check_axis_name(axis_name)
  picked = _rows_by_leaf(rows, full, treedef)
  picked = _own_rows(picked, masks.named_leaves(full), axis_name)
  new_full, new_cu = _catch_up_state(rule, full, found[0], picked)

  def replace(node):
    if node is found[0]:
      return new_cu
    if mp is not None and node is mp:
      master = jax.tree.map(lambda m, w: m if isinstance(m, optax.MaskedNode) else w,
                            mp.master, new_full,
                            is_leaf=lambda x: isinstance(x, optax.MaskedNode))
      return type(mp)(master, _replace_in(mp.inner_state, replace))
    return None

  new_state = _replace_in(state, replace)
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


def _rows_by_leaf(rows: dict[str, Any] | None, params: Any, treedef: Any) -> list[Any]:
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


def _own_rows(picked: list[Any], named: list[tuple[str, Any]],
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


def _master_states() -> tuple[type, ...]:
  """State types holding float32 masters (``lars_optax.multi_precision``'s), by declaration.

  They declare a row-wise ``master`` field beside an ``inner_state``
  (:mod:`lars_optax._row_wise`), so this package need not import them.
  """
  return tuple(cls for cls, fields in _row_wise.row_wise_fields().items()
               if "master" in fields and "inner_state" in getattr(cls, "_fields", ()))


def _replace_in(node: Any, replace: Callable[[Any], Any]) -> Any:
  new = replace(node)
  if new is not None:
    return new
  if isinstance(node, dict):
    return type(node)({k: _replace_in(c, replace) for k, c in node.items()})
  if isinstance(node, tuple) and hasattr(node, "_fields"):
    return type(node)(*[_replace_in(c, replace) for c in node])
  if isinstance(node, (tuple, list)):
    return type(node)(_replace_in(c, replace) for c in node)
  return node


def _catch_up_state(rule: _Rule, params: Any, state: CatchUpState,
                    picked: list[Any]) -> tuple[Any, CatchUpState]:
  """:func:`catch_up` on the state's own tree: every row of a leaf (``picked`` None) or
  the rows ``picked`` lists."""
  flat, treedef_ = jax.tree.flatten(params)
  treedef: Any = treedef_
  flat_p = [jnp.asarray(p) for p in flat]
  count = state.count
  decay_mask = _decay_mask(rule, params, treedef)
  bufs = {f: treedef.flatten_up_to(t) for f, t in _buffer_trees(state.inner).items()}
  log_now = _now(rule, state)
  leaves = [_Leaf("", None, p, {f: b[i] for f, b in bufs.items()}, last, rowlog)
            for i, (p, last, rowlog) in enumerate(zip(
                flat_p, treedef.flatten_up_to(state.last_step),
                treedef.flatten_up_to(_snapshots(rule, state))))]
  out = []
  for leaf, r, decays in zip(leaves, picked, decay_mask):
    p, last, rowlog = leaf.param, leaf.last, leaf.rowlog
    if isinstance(last, optax.MaskedNode):  # a leaf masked out of tx (optax.masked,
      out.append((p, leaf.bufs, last, rowlog))  # multi_transform, partition): not tx's
    elif r is None:
      def all_rows(p, bufs, last, rowlog, count, log_now, decays=decays):
        leaf = _Leaf("", None, p, bufs, last, rowlog)
        return _catch_up_all_rows(rule, leaf, count, log_now, decays)[:2]

      # (Where the leaf's rows are split over explicit mesh axes, under automatic ones.)
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
