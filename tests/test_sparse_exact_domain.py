"""The dense-exact catch-up proven over everything the constructors accept.

A row of ``lars_optax.sparse.adam``/``adamw``/``sgd`` last brought up to date at
step ``s`` and left for ``n`` steps is brought along them by the catch-up's per-row
factors (``sparse.factors.row_scalars`` and ``_catch_up_rows``). Here hypothesis draws
the whole accepted domain: b1 from 0 to 0.99, b2 from below b1 to 0.9999, momentum
from 0 to 0.999 (Nesterov or not), eps, gradient sizes from 1e-9 to 1e3, the row's age
and its gap up to thousands of steps, ``window`` and ``poles``, constant rates, warm-up +
cosine and a piecewise rate with a zero stretch, and decoupled weight decay. Each draw
is compared with a float64 transcription of optax's zero-gradient steps, and must be
within max(1e-5 of the row's largest move, 3x float32's own error), float32's error
being the same steps taken one by one in float32 (as ``optax.adam`` takes them), and
at least 4 float32 ulps of the row's largest weight (a row's move over a one-step gap
may be below the resolution its weights are stored at; a run's largest move is not).
Configurations the method cannot hold must be refused when built.

The cells that earlier versions got wrong are fixed tests below the property.
"""

import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from jax.experimental.sparse import BCOO

import lars_optax
from lars_optax.sparse import _catch_up_factors as factors

# Each draw compiles its own catch-up (about 1 s): the suite draws a few dozen, and
# LARS_OPTAX_DOMAIN_EXAMPLES=2000 draws thousands (docs/sparse.md quotes such a run).
EXAMPLES = int(os.environ.get("LARS_OPTAX_DOMAIN_EXAMPLES", "0"))
SETTINGS = settings(deadline=None, derandomize=not EXAMPLES, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
DIM = 12
MAX_STEPS = 24_000  # the oldest row's age plus the longest gap
PEAK = {"adam": 1e-3, "sgd": 1e-2}


def _schedule(kind, peak, total):
  if kind == "constant":
    return peak
  if kind == "warm-up + cosine":
    return optax.warmup_cosine_decay_schedule(0.0, peak, max(total // 10, 1), total)
  # piecewise, with a stretch at zero in the middle of the run
  third = max(total // 3, 1)
  return optax.join_schedules([optax.constant_schedule(peak), optax.constant_schedule(0.0),
                               optax.constant_schedule(peak / 4)], [third, 2 * third])


def _values(schedule, total):
  """The rate of each step 0..total-1, as float32 gives it, in float64 (one vector)."""
  if schedule is None:
    return np.zeros(total)
  if not callable(schedule):
    return np.full(total, np.float32(schedule), np.float64)
  assert total <= MAX_STEPS
  # One length for every draw, so that the schedule's operations compile once.
  values = np.broadcast_to(np.asarray(schedule(jnp.arange(MAX_STEPS)), np.float32), MAX_STEPS)
  return values[:total].astype(np.float64)


def _adam_f64(b1, b2, eps, lr, wd, nesterov, s, n, m, v, w):
  """optax.adam(w)'s steps s+1..s+n on a zero gradient, in float64."""
  m, v, w = (x.astype(np.float64) for x in (m, v, w))
  lrs, wds = _values(lr, s + n), _values(wd, s + n)
  for t in range(s + 1, s + n + 1):
    m, v = b1 * m, b2 * v
    mh = b1 * m / (1 - b1 ** (t + 1)) if nesterov else m / (1 - b1 ** t)
    u = mh / (np.sqrt(v / (1 - b2 ** t)) + eps)
    w = w - lrs[t - 1] * (u + wds[t - 1] * w)
  return w


def _adam_f32(b1, b2, eps, lr, wd, nesterov, s, n, m, v, w):
  """The same steps one by one in float32, as optax takes them: float32's own error."""
  f = np.float32
  m, v, w = (x.astype(f) for x in (m, v, w))
  b1, b2, eps = f(b1), f(b2), f(eps)
  lrs, wds = _values(lr, s + n).astype(f), _values(wd, s + n).astype(f)
  for t in range(s + 1, s + n + 1):
    m, v = b1 * m, b2 * v
    mh = b1 * m / (f(1) - b1 ** f(t + 1)) if nesterov else m / (f(1) - b1 ** f(t))
    u = mh / (np.sqrt(v / (f(1) - b2 ** f(t))) + eps)
    w = w - lrs[t - 1] * (u + wds[t - 1] * w)
  return w


def _sgd_f64(mu, lr, nesterov, s, n, b, w, dtype=np.float64):
  b, w = b.astype(dtype), w.astype(dtype)
  mu, lrs = dtype(mu), _values(lr, s + n).astype(dtype)
  for t in range(s + 1, s + n + 1):
    b = mu * b
    w = w - lrs[t - 1] * (mu * b if nesterov else b)
  return w


def _ours(tx, s, n, w, bufs):
  """The catch-up of one row from step s to s + n, as the optimizer takes it."""
  rule = tx.update.catch_up_rule
  extra = None
  if rule.tracks_log_decay:
    rates = _values(rule.lr, s + n) * _values(rule.wd, s + n)
    extra = jnp.asarray([np.log1p(-rates[s:]).sum()], jnp.float32)

  @jax.jit
  def run(last, count, w, bufs, extra):
    future = None
    if rule.tracks_future:
      future = (factors.rates_to_come(rule, last), factors.rates_to_come(rule, count))
    sc = factors.row_scalars(rule, last, count, True, future)
    return factors.catch_up_rows(rule, sc, w, bufs, extra, True)[0]

  w1 = run(jnp.asarray([s], jnp.int32), jnp.int32(s + n), jnp.asarray(w[None], jnp.float32),
           {k: jnp.asarray(x[None], jnp.float32) for k, x in bufs.items()}, extra)
  return np.asarray(w1[0], np.float64)


def _assert_within_bound(got, want, f32, w0, what):
  move = np.abs(want - w0).max()
  err, own = np.abs(got - want).max(), np.abs(f32 - want).max()
  # (4 float32 ulps of the row's largest weight: a one-step gap of 1e-9 gradients moves
  # a row by less than the resolution its weights are stored at.)
  ulps = 4 * float(np.spacing(np.float32(np.abs(want).max())))
  bound = max(1e-5 * move, 3 * own, ulps)
  assert err <= bound, (f"{what}: error {err:.3g} = {err / move:.3g} of the largest move "
                        f"{move:.3g}; float32's own {own / move:.3g}")


def _adam_state(rng, b1, b2, s, scale):
  """A row's moments after s steps of gradients of about ``scale`` (some entries far
  smaller, so that sqrt(v) spans eps), and its weights."""
  sizes = scale * np.exp(rng.uniform(-6, 0, DIM))
  m = rng.normal(size=DIM) * sizes * (1 - b1 ** max(s, 1)) * 0.5
  v = (sizes * rng.uniform(0.5, 1.5, DIM)) ** 2 * (1 - b2 ** max(s, 1))
  return m, v, rng.normal(size=DIM) * 0.1


def _build_adam(b1, b2, eps, lr, wd, nesterov, window, poles):
  kw = {"b1": b1, "b2": b2, "eps": eps, "nesterov": nesterov, "window": window, "poles": poles}
  if wd is None:
    return lars_optax.sparse.adam(lr, **kw)
  return lars_optax.sparse.adamw(lr, weight_decay=wd, **kw)


def _adam_cell(b1, b2_gap, eps, scale, age, gap, sched, decay, nesterov, window, seed):
  b2 = round(min(0.9999, max(0.01, b1 + b2_gap if b2_gap < 0 else 1.0 - b2_gap)), 6)
  total = age + gap + 10
  lr = _schedule(sched, PEAK["adam"], total)
  # The decay up to the refusal (lr·wd >= 1; PEAK is 1e-3): constant, or warm-up + cosine.
  wd = None if decay is None else (decay if not isinstance(decay, str) else _schedule(
      "warm-up + cosine", {"schedule": 0.1, "strong schedule": 300.0}[decay], total))
  need = factors.needed_window(b1 / math.sqrt(b2))
  try:
    tx = _build_adam(b1, b2, eps, lr, wd, nesterov, window, None)
  except ValueError as e:  # refused: only where the sum cannot be held, saying why
    if window is not None and need is not None and window < need:
      assert "window" in str(e) and f"{need:,}" in str(e), e
      return
    assert b1 > 0 and (b2 < b1 or need is None or need > 2048), (b1, b2, e)
    assert "b1" in str(e) or "b2" in str(e)
    return
  assert window is None or need is None or window >= need  # (a shorter one is refused)
  rule = tx.update.catch_up_rule
  rng = np.random.default_rng(seed)
  m, v, w = _adam_state(rng, b1, b2, age, scale)
  args = (b1, b2, eps, lr, wd, nesterov, age, gap, m, v, w)
  got = _ours(tx, age, gap, w, {"mu": m, "nu": v})
  _assert_within_bound(got, _adam_f64(*args), _adam_f32(*args), w, rule.name)


ADAM_DRAWS = {"b1": st.sampled_from([0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99]),
              "b2_gap": st.floats(-0.03, 0.0999), "eps": st.sampled_from([1e-8, 1e-6, 1e-3]),
              "scale": st.sampled_from([1e-9, 1e-6, 1e-3, 1.0, 1e3]),
              "age": st.sampled_from([0, 3, 40, 1000, 20_000]), "gap": st.integers(1, 3000),
              "sched": st.sampled_from(["constant", "warm-up + cosine", "piecewise"]),
              "decay": st.sampled_from([None, 1e-2, 30.0, 500.0, 990.0, "schedule",
                                        "strong schedule"]), "nesterov": st.booleans(),
              "window": st.sampled_from([None, None, None, 1, 8, 64, 2048, 4096]),
              "seed": st.integers(0, 2 ** 16)}
# The cells that 400-example draws found (AdamW's decay factor rounded near 1; the
# weight's own rounding on a one-step gap), fixed and kept:
ADAM_CELLS = [{"b1": 0.5, "b2_gap": 0.0, "eps": 1e-6, "scale": 1e-9, "age": 3, "gap": 1,
               "sched": "constant", "decay": 0.01, "nesterov": False, "window": None,
               "seed": 0},
              {"b1": 0.5, "b2_gap": 0.034939576861957394, "eps": 1e-8, "scale": 1e-6,
               "age": 3, "gap": 1, "sched": "constant", "decay": "schedule", "nesterov": True,
               "window": None, "seed": 69},
              # A strong decoupled decay (round 7): NaN rows at lr·wd = 0.5 with the
              # default betas and at 0.07 with b1 = 0.99, when a row's 1 / D_k left
              # float32's range; 1.5x the bound at a cosine peak of 0.03 over 1,495 steps.
              {"b1": 0.9, "b2_gap": 0.001, "eps": 1e-8, "scale": 1e-3, "age": 40,
               "gap": 300, "sched": "constant", "decay": 500.0, "nesterov": False,
               "window": None, "seed": 0},
              {"b1": 0.99, "b2_gap": 0.001, "eps": 1e-8, "scale": 1e-3, "age": 40,
               "gap": 1500, "sched": "constant", "decay": 70.0, "nesterov": False,
               "window": None, "seed": 0},
              {"b1": 0.99, "b2_gap": 0.001, "eps": 1e-8, "scale": 1e-3, "age": 40,
               "gap": 1495, "sched": "warm-up + cosine", "decay": 30.0, "nesterov": False,
               "window": None, "seed": 0},
              # A window shorter than the sum needs (round 7): 1,100x the bound at
              # window=8; now refused, naming the least window that holds.
              {"b1": 0.9, "b2_gap": 0.001, "eps": 1e-8, "scale": 1e-3, "age": 40,
               "gap": 300, "sched": "constant", "decay": None, "nesterov": False,
               "window": 8, "seed": 0}]


def _drawn(body, draws, examples, cells=()):
  """``body`` as a property test of ``examples`` draws over ``draws`` (and the ``cells``)."""
  test = given(**draws)(body)
  for cell in cells:
    test = example(**cell)(test)
  return settings(SETTINGS, max_examples=EXAMPLES or examples)(test)


# Each draw compiles a catch-up: the default tier draws a few, the slow tier as many as
# before the tiers (20 and 30).
test_adam_and_adamw_catch_up_within_the_bound_or_refused = _drawn(
    _adam_cell, ADAM_DRAWS, 4, ADAM_CELLS)
test_adam_and_adamw_catch_up_within_the_bound_or_refused_over_20_draws = pytest.mark.slow(
    _drawn(_adam_cell, ADAM_DRAWS, 20, ADAM_CELLS))


def _sgd_cell(momentum, nesterov, age, gap, sched, window, seed):
  total = age + gap + 10
  lr = _schedule(sched, PEAK["sgd"], total)
  tx = lars_optax.sparse.sgd(lr, momentum=momentum, nesterov=nesterov, window=window)
  rng = np.random.default_rng(seed)
  b, w = rng.normal(size=DIM) * 0.1, rng.normal(size=DIM) * 0.1
  got = _ours(tx, age, gap, w, {"trace": b})
  want = _sgd_f64(momentum, lr, nesterov, age, gap, b, w)
  if np.abs(want - w).max() == 0:  # momentum 0: an absent row does not move
    np.testing.assert_array_equal(got, w.astype(np.float32))
    return
  _assert_within_bound(got, want, _sgd_f64(momentum, lr, nesterov, age, gap, b, w,
                                           np.float32), w, "sparse.sgd")


# --- The cells earlier versions got wrong, each through the public API -----------------

def _table_run(tx, twin, steps=60, rows=6, scale=1e-6, touch_every=(1, 7, 25)):
  """Rows touched every 1, 7 and 25 steps (the rest never) with gradients of ``scale``;
  then catch_up; against the optax twin on the dense gradient in float32. (The two
  differ by both their roundings, about 1e-5 of the largest move each here: the tests
  below allow 2e-5; the property above holds the catch-up itself against float64.)"""
  params = {"t": jnp.asarray(np.random.default_rng(0).normal(size=(rows, 4)) * 0.1,
                             jnp.float32)}
  carry = (params, tx.init(params), params, twin.init(params))

  def step(carry, t):
    params, state, dense, dstate = carry
    ids = jnp.arange(len(touch_every))
    on = (t % jnp.asarray(touch_every)) == 0
    ids = jnp.where(on, ids, rows)  # rows: dropped
    vals = jnp.sin(0.3 * t + jnp.arange(4.0))[None] * scale * jnp.ones((len(touch_every), 1))
    g = BCOO((vals, ids[:, None]), shape=(rows, 4))
    u, state = tx.update({"t": g}, state, params)
    du, dstate = twin.update({"t": g.todense()}, dstate, dense)
    return (optax.apply_updates(params, u), state, optax.apply_updates(dense, du), dstate), None

  (params, state, dense, _), _ = jax.jit(lambda c: jax.lax.scan(
      step, c, jnp.arange(steps, dtype=jnp.int32)))(carry)
  params, state = lars_optax.sparse.catch_up(tx, params, state)
  return params["t"], dense["t"], state


SGD_DRAWS = {"momentum": st.sampled_from([0.0, 0.5, 0.9, 0.99, 0.999]),
             "nesterov": st.booleans(), "age": st.sampled_from([0, 7, 1000]),
             "gap": st.integers(1, 3000),
             "sched": st.sampled_from(["constant", "warm-up + cosine", "piecewise"]),
             "window": st.sampled_from([None, None, 16]), "seed": st.integers(0, 2 ** 16)}
test_sgd_catch_up_within_the_bound = _drawn(_sgd_cell, SGD_DRAWS, 6)
test_sgd_catch_up_within_the_bound_over_30_draws = pytest.mark.slow(
    _drawn(_sgd_cell, SGD_DRAWS, 30))


@pytest.mark.parametrize("b1, b2", [(0.98, 0.98), (0.95, 0.95), (0.9, 0.9), (0.9, 0.88)])
def test_b2_near_or_below_b1_follows_optax(b1, b2):
  kw = {"b1": b1, "b2": b2, "eps": 1e-8}
  got, want, _ = _table_run(lars_optax.sparse.adam(1e-3, **kw), optax.adam(1e-3, **kw),
                            steps=400)
  w0 = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32) * 0.1
  largest = float(np.abs(np.asarray(want) - w0).max())
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * largest)


@pytest.mark.parametrize("make, twin", [
    (lambda: lars_optax.sparse.sgd(1e-2, momentum=0.0), lambda: optax.sgd(1e-2, 0.0)),
    (lambda: lars_optax.sparse.sgd(1e-2, momentum=0.0, nesterov=True),
     lambda: optax.sgd(1e-2, 0.0, nesterov=True)),
    (lambda: lars_optax.sparse.adam(1e-3, b1=0.0), lambda: optax.adam(1e-3, b1=0.0)),
    (lambda: lars_optax.sparse.adamw(1e-3, b1=0.0, weight_decay=0.1),
     lambda: optax.adamw(1e-3, b1=0.0, weight_decay=0.1)),
], ids=["sgd", "sgd-nesterov", "adam", "adamw"])
def test_momentum_0_and_b1_0_give_finite_rows_as_optax(make, twin):
  got, want, state = _table_run(make(), twin(), steps=30, scale=1e-2)
  assert np.isfinite(np.asarray(got)).all()
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
  # every row current: a full catch_up again changes nothing and stays finite
  tx = make()
  params, _ = lars_optax.sparse.catch_up(tx, {"t": got}, state)
  np.testing.assert_array_equal(params["t"], got)


@pytest.mark.parametrize("kw", [{"b1": 0.9, "b2": 0.95, "window": 4096}, {"b1": 0.9, "b2": 0.88}],
                         ids=["window-4096", "b2-0.88"])
def test_a_large_window_or_a_small_b2_keeps_the_catch_up(kw):
  got, want, _ = _table_run(lars_optax.sparse.adam(1e-3, **kw),
                            optax.adam(1e-3, b1=kw["b1"], b2=kw["b2"]), steps=200, scale=1e-3)
  w0 = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32) * 0.1
  np.testing.assert_allclose(got, want, rtol=0,
                             atol=2e-5 * float(np.abs(np.asarray(want) - w0).max()))


@pytest.mark.parametrize("b2", [0.85, 0.825, 0.5])
def test_a_b2_the_catch_up_cannot_hold_is_refused_when_built(b2):
  with pytest.raises(ValueError, match=r"sparse\.adam: b2: .*b2 closer to 1|b2 > b1\*\*2"):
    lars_optax.sparse.adam(1e-3, b1=0.9, b2=b2)


def test_poles_given_caps_the_runs():
  rule = lars_optax.sparse.adam(1e-3, b1=0.98, b2=0.98, poles=4).update.catch_up_rule
  assert len(rule.runs) <= 4
  assert rule.runs[0][0] == 0 and rule.runs[-1][1] == rule.window


@pytest.mark.parametrize("make", [
    lambda: lars_optax.sparse.adam(1e-3),
    lambda: lars_optax.sparse.adamw(optax.cosine_decay_schedule(1e-3, 20_000),
                                    weight_decay=0.1),
    lambda: lars_optax.sparse.sgd(optax.cosine_decay_schedule(0.1, 20_000), momentum=0.9),
    # (each row's sum of the rates to come, 2**15 terms of it: a long run, in the slow tier)
    pytest.param(lambda: lars_optax.sparse.sgd(optax.cosine_decay_schedule(0.1, 20_000),
                                               momentum=0.999), marks=pytest.mark.slow),
    lambda: lars_optax.sparse.sgd(0.1, momentum=0.99, nesterov=True),
], ids=["adam", "adamw-schedule", "sgd-schedule", "sgd-0.999-schedule", "sgd-nesterov"])
def test_a_full_catch_up_computed_per_gap_equals_each_rows_own(make):
  """A full catch_up computes the catch-up once per gap (below 4,096 steps) and the rows
  away longer as their own rows; catch_up(rows=) takes every row's own. A 12,000-row
  table whose rows were last brought up to date up to 9,000 steps ago."""
  rows, count = 12_000, 9_000
  tx = make()
  rng = np.random.default_rng(0)
  params = {"t": jnp.asarray(rng.normal(size=(rows, 4)), jnp.float32)}
  state = tx.init(params)
  inner = jax.tree.map(lambda x: x + 0.01 * jnp.abs(x) + 1e-3 if np.ndim(x) == 2 else x,
                       state.inner)
  last = np.concatenate([count - rng.integers(0, 300, rows // 2),
                         rng.integers(0, count, rows - rows // 2)]).astype(np.int32)
  state = state._replace(count=jnp.int32(count), last_step={"t": jnp.asarray(last)},
                         inner=inner)
  rule = tx.update.catch_up_rule
  if rule.tracks_future:  # each row's sum of the rates to come, at its last step
    state = state._replace(row_future={"t": jax.vmap(lambda s: factors.rates_to_come(rule, s))(
        jnp.asarray(last))})
  full, full_state = jax.jit(lambda p, s: lars_optax.sparse.catch_up(tx, p, s))(params, state)
  each, each_state = jax.jit(lambda p, s: lars_optax.sparse.catch_up(
      tx, p, s, rows={"t": jnp.arange(rows)}))(params, state)
  chex.assert_trees_all_close(full, each, rtol=1e-6, atol=1e-7)
  chex.assert_trees_all_close(full_state.inner, each_state.inner, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("make", [
    lambda: lars_optax.sparse.adam(1e-3),
    lambda: lars_optax.sparse.adam(optax.warmup_cosine_decay_schedule(0.0, 1e-3, 200, 20_000),
                                   nesterov=True),
    lambda: lars_optax.sparse.adamw(optax.cosine_decay_schedule(1e-3, 20_000),
                                    weight_decay=0.1),
    lambda: lars_optax.sparse.sgd(0.1, momentum=0.99, nesterov=True),
], ids=["adam", "adam-schedule-nesterov", "adamw-schedule", "sgd-nesterov"])
def test_a_batchs_factors_computed_per_gap_equal_each_rows_own(make):
  """A step's (and catch_up(rows=)'s) rows, more than the plain path's PLAIN_TERMS: the
  factors of each gap below NEAR computed once, the rows away longer FAR_BLOCK at a
  time (here over two turns of the loop),
  equal every row's own computation (to float32's rounding: the per-run sums are
  products of another shape, and a run's two nodes move apart by a few ulps)."""
  rule = make().update.catch_up_rule
  rng = np.random.default_rng(1)
  count = 6_000
  far = factors.FAR_BLOCK + 100
  near = max(500, factors.PLAIN_TERMS // rule.window + 1 - far)  # (past the plain path)
  gaps = np.concatenate([rng.integers(0, factors.NEAR, near),
                         rng.integers(factors.NEAR, count, far)])
  assert gaps.size * rule.window > factors.PLAIN_TERMS
  s = jnp.asarray(count - rng.permutation(gaps), jnp.int32)
  got = jax.jit(lambda s: factors.row_scalars_of_batch(rule, s, jnp.int32(count), True))(s)
  want = jax.jit(lambda s: factors.row_scalars(rule, s, jnp.int32(count), True))(s)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("make", [
    lambda: lars_optax.sparse.adam(1e-3),
    lambda: lars_optax.sparse.adam(optax.warmup_cosine_decay_schedule(0.0, 1e-3, 200, 20_000),
                                   nesterov=True),
    lambda: lars_optax.sparse.adamw(optax.cosine_decay_schedule(1e-3, 20_000),
                                    weight_decay=0.1),
    lambda: lars_optax.sparse.sgd(optax.cosine_decay_schedule(0.1, 20_000), momentum=0.9),
], ids=["adam", "adam-schedule-nesterov", "adamw-schedule", "sgd-schedule"])
def test_leaves_factors_computed_together_equal_each_rows_own(make):
  """Many leaves' factors computed together, once per gap (a loop over 128 distinct
  gaps at a time, here about 330 of them spread over 6,000 steps; a leaf over 4,096
  rows by gap on its own), equal each row's own computation: leaves of 0-d, 0, 1, 37,
  300 and 5,000 rows, with and without AdamW's decay, and SGD's rows past its window
  (read from their P(s))."""
  rule = make().update.catch_up_rule
  rng = np.random.default_rng(2)
  count = jnp.int32(6_000)
  lasts = [jnp.asarray(6_000 - rng.integers(0, 6_001, shape), jnp.int32)
           for shape in [(), (0,), (1,), (37,), (300,), (5_000,)]]
  lasts[3] = lasts[3].at[:20].set(6_000 - rng.integers(0, 5, 20))  # a run of near gaps
  decays = [True, False, True, False, False, True]
  futures = p_now = None
  if rule.tracks_future:
    futures = [jax.vmap(lambda t: factors.rates_to_come(rule, t))(s.reshape(-1)) for s in lasts]
    p_now = factors.rates_to_come(rule, count)
  got = jax.jit(lambda lasts, f, p: factors.row_scalars_of_leaves(
      rule, lasts, count, decays, f, p))(lasts, futures, p_now)
  for i, (s, d) in enumerate(zip(lasts, decays)):
    f = None if futures is None else (futures[i], p_now)
    want = jax.jit(lambda s, f, d=d: factors.row_scalars(rule, s, count, d, f))(
        s.reshape(-1), f)
    chex.assert_trees_all_close(got[i], want, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("make", [
    lambda: lars_optax.sparse.adamw(optax.cosine_decay_schedule(1e-3, 20_000),
                                    weight_decay=0.1),
    lambda: lars_optax.sparse.sgd(optax.cosine_decay_schedule(0.1, 20_000), momentum=0.9),
], ids=["adamw-schedule", "sgd-schedule"])
def test_leaves_sharing_factors_step_and_catch_up_as_each_leaf_alone(make):
  """Leaves of 5 and 7 rows behind by up to 5,000 steps (their factors computed
  together, over many runs of gaps): a full catch_up and a dense step of the two
  together equal those of each leaf in a tree of its own."""
  tx = make()
  rng = np.random.default_rng(3)
  count = 6_000
  weights = {k: jnp.asarray(rng.normal(size=(n, 4)), jnp.float32) for k, n in
             (("a", 5), ("b", 7))}
  lasts = {k: jnp.asarray(count - rng.integers(0, 5_000, w.shape[0]), jnp.int32)
           for k, w in weights.items()}

  def behind(keys):
    params = {k: weights[k] for k in keys}
    state = tx.init(params)
    inner = jax.tree.map(lambda x: x + 0.01 * jnp.abs(x) + 1e-3 if np.ndim(x) == 2 else x,
                         state.inner)
    last = {k: lasts[k] for k in keys}
    state = state._replace(count=jnp.int32(count), last_step=last, inner=inner)
    rule = tx.update.catch_up_rule
    if rule.tracks_future:
      state = state._replace(row_future={k: jax.vmap(
          lambda s: factors.rates_to_come(rule, s))(v) for k, v in last.items()})
    return params, state

  both = behind(["a", "b"])
  alone = [behind(["a"]), behind(["b"])]
  catch_up = jax.jit(lambda p, s: lars_optax.sparse.catch_up(tx, p, s)[0])
  step = jax.jit(lambda p, s: tx.update(jax.tree.map(jnp.ones_like, p), s, p)[0])
  for run in (catch_up, step):
    got = run(*both)
    for key, (p, s) in zip(["a", "b"], alone):
      chex.assert_trees_all_close(got[key], run(p, s)[key], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("kw, need", [({"b1": 0.999, "window": 2048}, "27,618"),
                                      ({"window": 8}, "132"), ({"window": 1}, "132")])
def test_a_window_shorter_than_the_sum_needs_is_refused_naming_the_way_out(kw, need):
  with pytest.raises(ValueError, match=rf"^sparse.adam: window: .* shorter than the {need}"):
    lars_optax.sparse.adam(1e-3, **kw)


def test_the_ways_out_a_window_refusal_names_work():
  """Leave window out, or pass one at least as long as it says; for b1 = 0.999 the plain
  lazy step. Each gives dense Adam's row (the first two) or steps (the last)."""
  with pytest.raises(ValueError, match=r"Leave window out \(it is then 132\) or pass "
                                       r"window >= 132"):
    lars_optax.sparse.adam(1e-3, window=8)
  for window in (None, 132):
    tx = lars_optax.sparse.adam(1e-3, window=window)
    rng = np.random.default_rng(0)
    m, v, w = _adam_state(rng, 0.9, 0.999, 40, 1e-3)
    args = (0.9, 0.999, 1e-8, 1e-3, None, False, 40, 300, m, v, w)
    _assert_within_bound(_ours(tx, 40, 300, w, {"mu": m, "nu": v}), _adam_f64(*args),
                         _adam_f32(*args), w, "sparse.adam")
  with pytest.raises(ValueError, match=r"No window holds it .*: use b1 <= 0.99, or a plain "
                                       r"lazy step \(lars_optax.sparse.lazy_update\(optax.adam"):
    lars_optax.sparse.adam(1e-3, b1=0.999, window=2048)
  tx = lars_optax.sparse.lazy_update(optax.adam(1e-3, b1=0.999))
  params = {"t": jnp.ones((5, 2))}
  g = {"t": BCOO((jnp.ones((1, 2)), jnp.asarray([[3]])), shape=(5, 2))}
  updates, _ = tx.update(g, tx.init(params), params)
  moved = lars_optax.sparse.apply_updates(params, updates)["t"] != params["t"]
  assert bool(moved[3].all()) and not bool(moved[:3].any())
