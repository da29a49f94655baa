r"""The catch-up's factors: what brings a row from its last step to the count.

A row untouched for :math:`n` steps, brought up to date along the path the
dense step would have taken with a zero gradient on it (Adam's steps
:math:`t = s+1, \dots, s+n`, with :math:`\alpha_t` the learning rate and
:math:`\lambda_t` the decoupled weight decay of step :math:`t`):

.. math::

  m \leftarrow \beta_1^n m, \qquad v \leftarrow \beta_2^n v, \qquad
  w \leftarrow D \Big(w - \sum_{k=1}^{n} \frac{\alpha_{s+k}}{D_k}
      \frac{\beta_1^k m / (1-\beta_1^{s+k})}
           {\sqrt{\beta_2^k v / (1-\beta_2^{s+k})} + \epsilon}\Big),

with :math:`D_k = \prod_{i=1}^{k} (1 - \alpha_{s+i}\lambda_{s+i})` and
:math:`D = D_n`; SGD's momentum buffer decays by :math:`\mu^n` and its
weight moves by :math:`-\sum_k \alpha_{s+k}\mu^k b`.

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

Pure functions of the rule (:class:`Rule`) and the rows' last steps: they hold no
state (:mod:`lars_optax.sparse._catch_up_state` reads and writes it).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lars_optax import _masks as masks
from lars_optax import _validation as v

MAX_WINDOW = 2048  # Adam: b1 <= 0.99 needs at most 1,447 terms (b1 / sqrt(b2) <= 0.9905)
SGD_WINDOW = 512  # SGD: past its window the sum is taken whole, exactly
_BLOCK = 4096  # gaps computed once each, and rows at a time (catch_up over a whole table)
NEAR = 32  # a batch's gaps computed once each (catch_up(rows=) and the step)
FAR_BLOCK = 256  # a batch's rows away longer, computed this many at a time
# Up to this many terms (rows x window) a batch's factors are computed row by row, in one
# program: half the compile of the near table and the far loop (about 0.5 s a copy on 2
# CPU cores, and a train step has two), at their speed at 1,024 rows (3 to 7% slower at
# 4,096, past the switch at the default betas' window of 132).
PLAIN_TERMS = 1 << 18
GAP_BLOCK = 128  # many leaves' rows: the factors of this many distinct gaps at a time


@dataclasses.dataclass(frozen=True)
class Rule:
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
  runs: tuple[tuple[int, int], ...] = ()  # Adam: the window's runs (adam_runs)
  sparse: Any = None  # the leaves that may take row-sparse gradients (a mask; None: any)
  constants: tuple[tuple[str, Any], ...] = ()  # (name, value): the rates kept in the state

  def check_params(self, params: Any) -> None:
    """At ``init``: float params and a well-formed mask (the constants are checked against
    the params by their declarations, see :func:`lars_optax._links.optimizer`)."""
    v.check_float_params(params, self.name)
    decay_mask(self, params, jax.tree.structure(params))
    if not isinstance(self.sparse, (bool, type(None))) and not any(self.tables(params)):
      raise ValueError(
          f"{self.name}: sparse: {self.sparse!r} selects no leaf of the params (a leaf's "
          "full path, as lars_optax.leaf_names prints it, or its last name; or a mask). "
          "Name the leaves that take row-sparse gradients, or pass sparse=False for none.")

  def tables(self, params: Any) -> list[bool]:
    """Per leaf of ``params``: whether it may take a row-sparse gradient (``sparse``)."""
    if self.sparse is None:
      return [True] * len(jax.tree.leaves(params))
    return masks.resolve_mask(self.sparse, params, "sparse")

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
    """SGD with momentum and a schedule: each row keeps :math:`P(s)` (:func:`rates_to_come`)."""
    return self.kind == "sgd" and self.momentum is not None and self.lr_is_schedule


def as_schedule(value: Any) -> Callable[[jax.Array], jax.Array]:
  if callable(value):
    return lambda count: jnp.asarray(value(count), jnp.float32)
  return lambda count: jnp.asarray(value, jnp.float32)


def needed_window(ratio: float, tol: float = 1e-6) -> int | None:
  """Terms until ``ratio**k`` falls below ``tol`` (the rest: a geometric tail); None: never."""
  if ratio <= 0.0:
    return 1
  if ratio >= 1.0:
    return None
  return int(max(4, math.ceil(math.log(tol) / math.log(ratio))))


def default_window(ratio: float, cap: int = MAX_WINDOW) -> int:
  need = needed_window(ratio)
  return cap if need is None else min(cap, need)


# The momentum's discounted sum of the rates to come is summed over this many
# steps at most: mu**k falls below FUTURE_TOL by then for mu <= MAX_FUTURE_MOMENTUM.
FUTURE_TOL = 1e-9
MAX_FUTURE_TERMS = 1 << 18
MAX_FUTURE_MOMENTUM = math.exp(math.log(FUTURE_TOL) / MAX_FUTURE_TERMS)  # 0.99992


def _future_terms(mu: float) -> int:
  """Terms of :func:`rates_to_come` (a power of 2): until ``mu**k < FUTURE_TOL``."""
  if mu <= 0.0:
    return 1
  need = math.ceil(math.log(FUTURE_TOL) / math.log(mu))
  return 1 << max(0, (need - 1).bit_length())


def _pairwise_sum(x: jax.Array) -> jax.Array:
  """The sum of a power-of-2 vector, halved pairwise (error ~ log2(n) roundings)."""
  while x.shape[0] > 1:
    half = x.shape[0] // 2
    x = x[:half] + x[half:]
  return x[0]


def rates_to_come(rule: Rule, t: jax.Array) -> jax.Array:
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


def _decayed_geometric(a: jax.Array, c: jax.Array, m: jax.Array) -> jax.Array:
  """``sum_{j=1}^{m} a**j c**(m - j)`` (``a``, ``c`` > 0), from the larger ratio's powers."""
  big = a > c
  return jnp.where(big, a ** m.astype(jnp.float32) * (1.0 + _geometric(c / a, m - 1)),
                   c ** m.astype(jnp.float32) * _geometric(a / jnp.where(big, a, c), m))


def _decay_after(rule: Rule, lr: jax.Array, t: jax.Array, valid: jax.Array, n: jax.Array,
                 m_tail: jax.Array, decays: bool
                 ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array | None]:
  """Per term: the decay of the window's skipped steps after it; per row: the window's
  last step's decay, the tail's (that decay a step) and, with a schedule, the log of the
  whole estimate (a constant rate's is exact: None)."""
  ones = jnp.ones_like(lr[:, -1])
  if not decays:
    return jnp.ones_like(lr), ones, ones, None
  assert rule.wd is not None
  tail = m_tail.astype(jnp.float32)
  if not rule.tracks_log_decay:  # one decay a step: powers of it, exact to float32
    log_c = jnp.log1p(-rule.lr(jnp.int32(0)) * rule.wd(jnp.int32(0)))
    k = jnp.arange(1, lr.shape[1] + 1, dtype=jnp.float32)
    later = jnp.maximum(jnp.minimum(n, lr.shape[1]).astype(jnp.float32)[:, None] - k, 0.0)
    return jnp.exp(later * log_c), jnp.exp(log_c) * ones, jnp.exp(tail * log_c), None
  wd = rule.wd
  dec = jnp.where(valid, 1.0 - lr * wd(t - 1), 1.0)  # each term's own step's decay
  # The next step's, 1 past the row's gap and at the window's last term, so that one
  # reverse product gives each term's prod_{i > k} dec_i.
  k = jnp.arange(1, lr.shape[1] + 1, dtype=jnp.int32)[None, :]
  later = (k < jnp.minimum(n, lr.shape[1])[:, None])
  within = jax.lax.cumprod(jnp.where(later, 1.0 - rule.lr(t) * wd(t), 1.0), axis=1,
                           reverse=True)
  c = dec[:, -1]
  return within, c, c ** tail, jnp.sum(jnp.log(dec), axis=1) + tail * jnp.log(c)


# The two-node rule's worst error over a run whose points u spread by a factor e**L is
# about _GAUSS_ERROR * L**4 of the run's share of the sum (measured in float64 over
# geometric runs: 2.2e-5 at L = 0.5, 3.8e-4 at L = 1, 6.5e-3 at L = 2).
_GAUSS_ERROR = 4e-4
_RUN_TARGET = 1e-6  # each run's estimated error, of the whole sum
MAX_RUNS = 32  # two divisions per entry and run: beyond this the catch-up is refused
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


def effective_window(b1: float, b2: float, window: int) -> int:
  """The window without the terms below ``_NEGLIGIBLE`` of the first (any row age): a
  window given larger than the sum needs adds nothing but points past float32's range."""
  ratio = b1 / math.sqrt(b2)
  need = needed_window(ratio, _NEGLIGIBLE)
  return window if need is None else max(1, min(window, need))


def adam_runs(where: str, b1: float, b2: float, window: int, nesterov: bool,
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
  elif len(runs) > MAX_RUNS:
    raise ValueError(
        f"{where}: b2: with b1={b1:g} and b2={b2:g} the skipped steps' terms spread over "
        f"e**{max(p[0][-1] - p[0][0] for p in profiles):.0f} in the eps term, and their "
        f"sum would need {len(runs)} runs of its two-node rule to stay within 1e-5 of the "
        f"dense step's move, more than the {MAX_RUNS} it takes at a lazy step's cost. "
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


def row_scalars(rule: Rule, s: jax.Array, count: jax.Array, decays: bool,
                future: tuple[jax.Array, jax.Array] | None = None) -> dict[str, jax.Array]:
  """Per row: the factors that bring it from step ``s`` to step ``count``.

  ``decays``: whether the leaf takes the decoupled decay (AdamW's ``mask``).
  ``future``: SGD with a schedule: the rows' :math:`P(s)` and :math:`P(count)`
  (:func:`rates_to_come`), for gaps longer than the window.

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
  out: dict[str, jax.Array] = {}
  m_tail = jnp.maximum(n - window, 0)
  if rule.kind == "sgd":
    mu = jnp.float32(rule.momentum)
    mom = mu ** (kf + 1.0) if rule.nesterov else mu ** kf
    w = jnp.where(valid, lr * mom, 0.0)
    if future is None:  # a constant rate: the tail is geometric, exactly
      h = w.sum(axis=1) + w[:, -1] * _geometric(mu, m_tail)
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
    # With the decay, term k is taken times D / D_k, the decay of the steps after it
    # (D's estimate: the window's own, then its last step's per tail step), at most 1:
    # the sum is of the moves as the dense run makes them, so that a strong decay
    # neither overflows 1 / D_k nor cancels D (w - sum) against w.
    rel, last_dec, tail_decay, est_log = _decay_after(rule, lr, t, valid, n, m_tail, decays)
    if est_log is not None:  # (read by catch_up_rows past the window)
      out["est_log"], out["past_window"] = est_log, n > window
    w = jnp.where(valid, lr * mom * rel if decays else lr * mom, 0.0)
    # u_k = sqrt(1 - b2**(s+k)) / b2**(k/2): b2**(s+k) may underflow (to 0, harmlessly);
    # 1 / b2**(k/2) is a column constant, below e**60 (the build keeps it there).
    u = jnp.sqrt(1.0 - (b2 ** sf) * (b2 ** kf)) * jnp.exp(-kf * log_q)
    h = w * u
    # The tail, with the schedule frozen at the window's end, joins the last run
    # (its terms are below 1e-6 of the first, at the default window).
    # (The window's terms are decayed through the tail below, by tail_decay; the last
    # term's own factor is 1, and the tail's terms are decayed by the steps after each.)
    tail_w = w[:, -1] * _decayed_geometric(b1, last_dec, m_tail)
    tail_h = h[:, -1] * _decayed_geometric(b1 * jnp.exp(-log_q), last_dec, m_tail)
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
      summed = jnp.dot(x, member, precision=hi)
      return summed * tail_decay[:, None] if decays else summed

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
  if decays and not rule.tracks_log_decay:  # (a constant rate's D: the drift's own)
    assert rule.wd is not None
    step = jnp.log1p(-rule.lr(jnp.int32(0)) * rule.wd(jnp.int32(0)))
    out["w_log"] = n.astype(jnp.float32) * step
  else:
    out["w_log"] = jnp.zeros(n.shape, jnp.float32)
  return out


def row_scalars_by_gap(rule: Rule, s: jax.Array, count: jax.Array, decays: bool,
                       future: tuple[jax.Array, jax.Array] | None = None
                       ) -> dict[str, jax.Array]:
  """:func:`row_scalars` over many rows (a whole table): computed once per gap.

  A row's factors depend on its last step ``s`` only through the gap
  ``count - s`` (``count`` is the same for every row), and a table holds far fewer
  distinct gaps than rows. So the factors of every gap below ``_BLOCK`` are computed
  once, in one ``[_BLOCK, window]`` block, and gathered per row; the rows away
  for longer are computed as their own rows, ``_BLOCK`` at a time, and cost only
  where there are any. SGD with a schedule reads its rows past the window from
  their :math:`P(s)`, row by row, exactly. Below ``_BLOCK`` rows, the rows are
  computed each.
  """
  if s.shape[0] <= _BLOCK:
    return row_scalars(rule, s, count, decays, future)
  size = max(_BLOCK, rule.window + 1)
  gap = jnp.maximum(count - s, 0)
  table = row_scalars(rule, jnp.maximum(count - jnp.arange(size, dtype=s.dtype), 0), count,
                      decays, None if future is None else
                      (jnp.zeros((size,), jnp.float32), future[1]))
  out = {k: v[jnp.minimum(gap, size - 1)] for k, v in table.items()}
  if future is not None:
    return _past_window(rule, gap, future, out)
  return _far_rows(rule, s, count, decays, gap >= size, out)


def _past_window(rule: Rule, gap: jax.Array, future: tuple[jax.Array, jax.Array],
                 out: dict[str, jax.Array]) -> dict[str, jax.Array]:
  r"""SGD with a schedule: ``out`` (a table's factors, gathered by gap) with each row
  past the window read from its :math:`P(s)`: :math:`P(s) - \mu^n P(count)`, exactly."""
  assert rule.momentum is not None
  mu = jnp.float32(rule.momentum)
  lead = mu if rule.nesterov else jnp.float32(1.0)
  decay = mu ** gap.astype(jnp.float32)  # each row's own (a table stops at its end)
  far = lead * (future[0] - decay * future[1])
  return {**out, "h": jnp.where((gap <= rule.window)[:, None], out["h"], far[:, None]),
          "m_decay": decay}


def row_scalars_of_batch(rule: Rule, s: jax.Array, count: jax.Array, decays: bool,
                         future: tuple[jax.Array, jax.Array] | None = None
                         ) -> dict[str, jax.Array]:
  """:func:`row_scalars` for a batch's rows: the factors of each gap below ``NEAR``
  computed once and gathered (most rows of a Zipfian batch were touched a few steps
  ago), and the rows away longer as their own rows, ``FAR_BLOCK`` at a time."""
  rows = s.shape[0]
  if future is not None or rows <= NEAR + FAR_BLOCK or rows * rule.window <= PLAIN_TERMS:
    return row_scalars(rule, s, count, decays, future)
  gap = jnp.maximum(count - s, 0)
  table = row_scalars(rule, jnp.maximum(count - jnp.arange(NEAR, dtype=s.dtype), 0), count,
                      decays)
  near = jnp.minimum(gap, NEAR - 1)
  return _far_rows(rule, s, count, decays, gap >= NEAR,
                   {k: v[near] for k, v in table.items()}, FAR_BLOCK)


def row_scalars_of_leaves(rule: Rule, lasts: Sequence[jax.Array], count: jax.Array,
                          decays: Sequence[bool],
                          futures: Sequence[jax.Array | None] | None = None,
                          p_now: jax.Array | None = None) -> list[dict[str, jax.Array]]:
  """:func:`row_scalars` of every row of many leaves (their last steps ``lasts``):
  of the leaves up to ``_BLOCK`` rows, computed once per gap for all of them together
  (:func:`row_scalars_shared`); of a larger leaf (a table), by gap on its own
  (:func:`row_scalars_by_gap`)."""
  futures = [None] * len(lasts) if futures is None else futures
  small = [i for i, s in enumerate(lasts) if s.size <= _BLOCK]
  shared = dict(zip(small, row_scalars_shared(
      rule, [lasts[i] for i in small], count, [decays[i] for i in small],
      None if p_now is None else [futures[i] for i in small], p_now))) if small else {}
  return [shared[i] if i in shared else row_scalars_by_gap(
      rule, s.reshape(-1), count, d, None if f is None or p_now is None
      else (f.reshape(-1), p_now)) for i, (s, d, f) in enumerate(zip(lasts, decays, futures))]


def row_scalars_shared(rule: Rule, lasts: Sequence[jax.Array], count: jax.Array,
                       decays: Sequence[bool], futures: Sequence[jax.Array | None] | None = None,
                       p_now: jax.Array | None = None, block: int = GAP_BLOCK
                       ) -> list[dict[str, jax.Array]]:
  """:func:`row_scalars` of every row of many leaves (their last steps ``lasts``),
  computed once per gap for all of them together.

  A row's factors depend on its last step only through the gap ``count - s``. So
  the ``block`` least distinct gaps of the rows not yet given their factors (found
  one after another, each the least of every leaf's rows above the one before) have
  theirs computed in one ``[block, window]`` table, and each leaf takes them where
  its rows' gaps are among them; the loop runs once per ``block`` distinct gaps
  (once where the rows are behind by fewer, as a model's dense leaves are). One
  table serves every leaf, so a model's leaves, whatever their shapes, share one
  computation of their factors. ``decays`` per leaf (AdamW's ``mask``): a table for
  each value present. ``futures``: SGD with a schedule, each leaf's rows' :math:`P(s)`, with
  ``p_now`` :math:`P(count)` (:func:`rates_to_come`), read past the window row by
  row, exactly. The leaves' last steps must vary over the same mesh axes (inside
  ``shard_map``): the loop runs on what one device holds.
  """
  gaps = [jnp.maximum(count - s.reshape(-1), 0) for s in lasts]
  none = jnp.iinfo(jnp.int32).max
  variants = sorted(set(decays))

  def least_above(lo):  # the least gap > lo of any row, or `none`
    return functools.reduce(jnp.minimum, [
        jnp.min(jnp.where(g > lo, g, none), initial=none) for g in gaps])

  def pick(lo):  # the `block` least distinct gaps > lo, ascending (`none` past the last)
    def step(carry):
      j, prev, picked = carry
      nxt = least_above(prev)
      return j + 1, nxt, picked.at[j].set(nxt)

    picked = jnp.full((block,), none, jnp.int32) + lo * 0  # (lo's type: varying axes)
    return jax.lax.while_loop(lambda c: (c[0] < block) & (c[1] < none), step,
                              (jnp.int32(0), lo, picked))[2]

  def tables(picked):
    s = jnp.maximum(count - picked, 0)
    fut = None if p_now is None else (jnp.zeros((block,), jnp.float32), p_now)
    return {d: row_scalars(rule, s, count, d, fut) for d in variants}

  shapes = jax.eval_shape(tables, jnp.zeros((block,), jnp.int32))

  def body(carry):
    lo, _, outs = carry
    picked = pick(lo)
    table = tables(picked)
    new = []
    for g, d, out in zip(gaps, decays, outs):
      at = jnp.minimum(jnp.searchsorted(picked, g, method="compare_all"), block - 1)
      here = picked[at] == g
      new.append({k: jnp.where(_bcast(here, v.ndim), table[d][k][at], v)
                  for k, v in out.items()})
    return picked[-1], picked[-1] == none, new

  # Zeros of each leaf's gaps' type (sharding, varying axes), as the loop's results are.
  outs = [{k: (_bcast(g * 0, x.ndim) + jnp.zeros(x.shape[1:], x.dtype)).astype(x.dtype)
           for k, x in shapes[d].items()} for g, d in zip(gaps, decays)]
  # The loop's carry starts at gap -1, not done, typed as the gaps are (varying axes).
  start = functools.reduce(jnp.minimum, [jnp.min(g * 0, initial=0) for g in gaps]) - 1
  outs = jax.lax.while_loop(lambda carry: ~carry[1], body, (start, start != start, outs))[2]
  if futures is None or p_now is None:
    return outs
  done = []
  for g, p_s, out in zip(gaps, futures, outs):
    assert p_s is not None
    done.append(_past_window(rule, g, (p_s.reshape(-1), p_now), out))
  return done


def _far_rows(rule: Rule, s: jax.Array, count: jax.Array, decays: bool, far: jax.Array,
              out: dict[str, jax.Array], block: int = _BLOCK) -> dict[str, jax.Array]:
  """``out`` with the rows marked ``far`` computed as their own rows, ``block`` at a
  time (a loop that runs once per ``block`` such rows, not at all without any)."""
  rows = s.shape[0]

  def body(carry):
    left, out = carry
    (idx,) = jnp.nonzero(left, size=block, fill_value=rows)
    sc = row_scalars(rule, s[jnp.minimum(idx, rows - 1)], count, decays)
    out = {k: v.at[idx].set(sc[k], mode="drop") for k, v in out.items()}
    return left.at[idx].set(False, mode="drop"), out

  return jax.lax.while_loop(lambda carry: jnp.any(carry[0]), body, (far, out))[1]


def _bcast(x: jax.Array, ndim: int) -> jax.Array:
  return x.reshape(x.shape + (1,) * (ndim - x.ndim))


BUFFER_DECAY = {"trace": "m_decay", "mu": "m_decay", "nu": "v_decay"}


def decayed(sc: dict[str, jax.Array], bufs: dict[str, Any]) -> dict[str, Any]:
  """The buffers' rows decayed over the skipped steps (momentum or moments)."""
  return {f: (_bcast(sc[BUFFER_DECAY[f]], b.ndim) * b.astype(jnp.float32)).astype(b.dtype)
          for f, b in bufs.items()}


def catch_up_rows(rule: Rule, sc: dict[str, jax.Array], w: jax.Array, bufs: dict[str, Any],
                  extra_log: jax.Array | None, decays: bool) -> tuple[jax.Array, dict]:
  """Rows of the weight and buffers brought up to date with the per-row scalars ``sc``."""
  nd = w.ndim
  w32 = w.astype(jnp.float32)
  if rule.kind == "sgd":
    if "trace" not in bufs:  # plain SGD: an absent row does not move
      return w, bufs
    new_w = w32 - _bcast(sc["h"][:, 0], nd) * bufs["trace"].astype(jnp.float32)
    return new_w.astype(w.dtype), decayed(sc, bufs)
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
    # float32's resolution of the weights (as optax adds its small decay term). The
    # drift is already decayed, by the factors' estimate of D: with a schedule, D past
    # the window is the state's, and the drift takes the ratio of the two.
    log_d = sc["w_log"] if extra_log is None else sc["w_log"] + extra_log
    if extra_log is not None and "est_log" in sc:  # (b1 = 0 has no drift)
      beyond = jnp.where(sc["past_window"], jnp.exp(log_d - sc["est_log"]), 1.0)
      new_w = w32 - _bcast(beyond, nd) * drift
    new_w = new_w + _bcast(jnp.expm1(log_d), nd) * w32
  return new_w.astype(w.dtype), decayed(sc, bufs)


def decay_mask(rule: Rule, params: Any, treedef: Any) -> list[bool]:
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


def check_mask(label: str, mask: Any) -> None:
  """``optax.adamw``'s ``mask`` (named ``label`` in the message): None, a bool, a bool
  pytree or a callable returning one."""
  if mask is None or callable(mask) or isinstance(mask, (bool, np.bool_)):
    return
  if isinstance(mask, (str, bytes, int, float, complex, np.number, np.ndarray, jax.Array)):
    raise TypeError(f"{label}: expected optax's mask (a bool pytree with the params' "
                    "structure, or a callable params -> bool pytree; True where the decay "
                    f"applies), got {mask!r}.")


def two_sum(hi: jax.Array, lo: jax.Array, x: jax.Array) -> jax.Array:
  """``(hi, lo) + x`` in compensated float32 (Knuth's two-sum)."""
  s = hi + x
  bb = s - hi
  err = (hi - (s - bb)) + (x - bb)
  return jnp.stack([s, lo + err])
