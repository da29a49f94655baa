"""``lars_optax.mxnet.lr_scheduler`` against MXNet 2.0.0b1's schedulers, and their errors.

The reference values come from ``tests/reference/make_mxnet_schedules.py`` (run
with MXNet in a virtual environment of its own; see the script): whole runs of
each MXNet scheduler, called once per update in order, past ``max_update``;
optimizer runs through ``mx.optimizer.create(..., lr_scheduler=...)``; and
LAMB on MXNet's two code paths.
"""

import json
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import public

import lars_optax
from lars_optax.mxnet import lr_scheduler as schedules

REF = json.loads(
    (pathlib.Path(__file__).parent / "reference" / "mxnet_schedules.json").read_text())
SCHEDULES = {c["name"]: c for c in REF["schedules"]}
RUNS = {c["name"]: c for c in REF["runs"]}
LAMB_PATHS = {c["name"]: c for c in REF["lamb_paths"]}

RATE_RTOL = 1e-6  # float32 rates against MXNet's float64 ones, count by count
WEIGHT_RTOL = 1e-5  # the registry's float32 tolerance
LAMB_RTOL = {"float32": 2e-5, "float16": 2e-3}  # tests/test_reference_mxnet_registry.py's


def _scheduler(kind, kwargs):
  return getattr(schedules, kind)(**kwargs)


def _rate_errors(ours, expected):
  ours = np.asarray(ours, np.float64)
  expected = np.asarray(expected, np.float64)
  return np.abs(ours - expected) / np.maximum(np.abs(expected), 1e-30)


@pytest.mark.quick
@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedule_matches_mxnet_over_the_whole_run(name):
  case = SCHEDULES[name]
  sched = _scheduler(case["scheduler"], case["kwargs"])
  counts = jnp.arange(1, len(case["rates"]) + 1, dtype=jnp.int32)
  jitted = jax.jit(jax.vmap(sched))(counts)  # the whole run
  eager = [sched(n) for n in range(1, min(len(counts), 60) + 1)]  # Python ints, no jit
  for ours in (jitted, eager):
    assert all(jnp.asarray(r).dtype == jnp.float32 for r in ours)
    err = _rate_errors(ours, case["rates"][: len(ours)])
    assert err.max() <= RATE_RTOL, (name, int(err.argmax()) + 1, float(err.max()))


@pytest.mark.parametrize("name", ["factor_warmup_linear", "poly_warmup_constant",
                                  "cosine_final", "multifactor"])
def test_as_optax_is_the_rate_of_the_next_update(name):
  case = SCHEDULES[name]
  sched = _scheduler(case["scheduler"], case["kwargs"])
  counts = jnp.arange(len(case["rates"]), dtype=jnp.int32)  # optax: 0 at the first update
  for schedule in (sched.as_optax(), schedules.to_optax(sched)):
    err = _rate_errors(jax.jit(jax.vmap(schedule))(counts), case["rates"])
    assert err.max() <= RATE_RTOL


def test_counts_saturate_at_the_int32_maximum():
  sched = schedules.FactorScheduler(step=1, factor=0.5, stop_factor_lr=1e-3, base_lr=1.0)
  top = np.iinfo(np.int32).max
  assert float(sched.as_optax()(jnp.int32(top))) == pytest.approx(1e-3)
  assert float(sched(top)) == pytest.approx(1e-3)


def test_rate_is_float64_under_x64():
  from conftest import x64  # pylint: disable=g-import-not-at-top
  case = SCHEDULES["cosine_long"]
  sched = _scheduler(case["scheduler"], case["kwargs"])
  with x64():
    ours = jax.jit(jax.vmap(sched))(jnp.arange(1, len(case["rates"]) + 1))
    assert ours.dtype == jnp.float64
  # (MXNet forms 1 + cos in float64: ~2e-12 relative near max_update.)
  assert _rate_errors(ours, case["rates"]).max() <= 1e-10


# --- optimizer runs through create -------------------------------------------

def _tree(d, dtype="float32"):
  return {k: jnp.asarray(np.asarray(v), dtype) for k, v in d.items()}


def _rel(actual, expected):
  exp = np.asarray(expected, np.float64)
  return float(np.abs(np.asarray(actual, np.float64) - exp).max()
               / max(np.abs(exp).max(), 1e-30))


def _run(tx, case, weights_key="weights"):
  params = _tree(case["params"], case["dtype"])
  state = tx.init(params)

  @jax.jit
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  worst = {}
  for t, grads in enumerate(case["grads"]):
    params, state = step(params, state, _tree(grads, case["dtype"]))
    for name, exp in case[weights_key][t].items():
      worst[name] = max(worst.get(name, 0.0), _rel(params[name], exp))
  return worst


@pytest.mark.quick
@pytest.mark.parametrize("name", sorted(RUNS))
def test_create_with_scheduler_matches_mxnet_weights(name):
  case = RUNS[name]
  sched = _scheduler(case["scheduler"]["type"], case["scheduler"]["kwargs"])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "base_lr ... is replaced by learning_rate", as MXNet says
    tx = lars_optax.mxnet.create(case["optimizer"], lr_scheduler=sched,
                           begin_num_update=case["begin_num_update"], **case["kwargs"])
  worst = _run(tx, case)
  assert max(worst.values()) <= WEIGHT_RTOL, worst


def test_create_takes_the_traced_path_and_leaves_the_scheduler_alone():
  sched = schedules.PolyScheduler(max_update=10, base_lr=0.05, warmup_steps=2)
  with pytest.warns(UserWarning, match="base_lr 0.05 is replaced by learning_rate 0.1"):
    tx = lars_optax.mxnet.create("lars", learning_rate=0.1, momentum=0.9, lr_scheduler=sched)
  assert sched.base_lr == 0.05  # the caller's object is unchanged
  params = {"w": jnp.ones((3, 2))}
  state = tx.init(params)
  jaxpr = jax.make_jaxpr(lambda g, s, p: tx.update(g, s, p))(params, state, params)
  assert "callback" not in str(jaxpr)


def test_with_base_lr_returns_a_copy_and_keeps_the_warmup_target():
  sched = schedules.FactorScheduler(step=2, factor=0.5, base_lr=0.1, warmup_steps=4,
                                    warmup_begin_lr=0.02)
  other = sched.with_base_lr(1.0)
  assert (sched.base_lr, other.base_lr) == (0.1, 1.0)
  assert float(other(2)) == pytest.approx(0.02 + (0.1 - 0.02) * 2 / 4)  # MXNet's warm-up
  assert float(other(4)) == pytest.approx(0.5)  # then 1.0 * 0.5 ** floor(3 / 2)
  with pytest.raises(AttributeError, match="immutable"):
    sched.base_lr = 1.0  # type: ignore[misc]
  assert sched == schedules.FactorScheduler(step=2, factor=0.5, base_lr=0.1, warmup_steps=4,
                                            warmup_begin_lr=0.02)
  assert sched != other and hash(sched) != hash(other)
  assert repr(other) == repr(sched) + ".with_base_lr(1.0)"
  assert eval(repr(other), vars(schedules)) == other  # the repr rebuilds it


@pytest.mark.parametrize("optimizer", ["lars", "lamb", "sgd"])
def test_as_optax_is_a_learning_rate_for_the_optimizers(optimizer):
  sched = schedules.CosineScheduler(max_update=5, base_lr=0.1, warmup_steps=1)
  via_create = lars_optax.mxnet.create(optimizer, learning_rate=0.1, lr_scheduler=sched)
  direct = public(optimizer)(learning_rate=sched.as_optax())
  params = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(3, 2)}
  grads = {"w": jnp.linspace(0.5, -0.3, 6).reshape(3, 2)}
  for tx in (via_create, direct):
    p, state = params, tx.init(params)
    for _ in range(7):
      updates, state = tx.update(grads, state, p)
      p = optax.apply_updates(p, updates)
    if tx is via_create:
      expected = p
  np.testing.assert_allclose(p["w"], expected["w"], rtol=1e-6)


# --- LAMB: which of MXNet's two paths we follow ----------------------------------

@pytest.mark.parametrize("name", sorted(LAMB_PATHS))
def test_lamb_follows_mxnet_default_multi_tensor_path(name):
  case = LAMB_PATHS[name]
  kwargs = dict(case["kwargs"])
  ours = {}
  for aggregate_num in (None, 1):  # accepted, changes nothing: always the default path
    extra = {} if aggregate_num is None else {"aggregate_num": aggregate_num}
    tx = lars_optax.mxnet.create("lamb", **kwargs, **extra)
    ours[aggregate_num] = _run(tx, case, "weights_default")
    assert max(ours[aggregate_num].values()) <= LAMB_RTOL[case["dtype"]], ours[aggregate_num]
  # ... and measurably not MXNet's single-tensor path (aggregate_num=1).
  single = _run(lars_optax.mxnet.create("lamb", **kwargs, aggregate_num=1), case, "weights_single")
  assert max(single.values()) > 10 * LAMB_RTOL[case["dtype"]], single
  assert max(case["difference"].values()) > 10 * LAMB_RTOL[case["dtype"]]


# --- bad input --------------------------------------------------------------------

@pytest.mark.parametrize("make, error, match", [
    (lambda: schedules.FactorScheduler(step=0), ValueError, "^step: must be >= 1"),
    (lambda: schedules.FactorScheduler(step=2.5), TypeError, "^step: expected an int"),
    (lambda: schedules.FactorScheduler(step=2, factor=1.5), ValueError, "^factor:"),
    (lambda: schedules.FactorScheduler(step=2, factor=-0.5), ValueError, "^factor:"),
    (lambda: schedules.FactorScheduler(step=2, warmup_steps=-1), ValueError,
     "^warmup_steps: must be >= 0"),
    (lambda: schedules.FactorScheduler(step=2, warmup_steps=3.0), TypeError, "^warmup_steps:"),
    (lambda: schedules.FactorScheduler(step=2, warmup_begin_lr=0.1), ValueError,
     "^warmup_begin_lr: must be <= base_lr"),
    (lambda: schedules.FactorScheduler(step=2, warmup_mode="cosine"), ValueError,
     "^warmup_mode: expected one of"),
    (lambda: schedules.FactorScheduler(step=2, base_lr=float("nan")), ValueError, "^base_lr:"),
    (lambda: schedules.MultiFactorScheduler(step=[]), ValueError, "^step: expected a non-empty"),
    (lambda: schedules.MultiFactorScheduler(step=5), ValueError, "^step: expected a non-empty"),
    (lambda: schedules.MultiFactorScheduler(step=[3, 3]), ValueError,
     "^step: must be a strictly increasing"),
    (lambda: schedules.MultiFactorScheduler(step=[5, 2]), ValueError,
     "^step: must be a strictly increasing"),
    (lambda: schedules.MultiFactorScheduler(step=[0, 2]), ValueError, "^step: must be >= 1"),
    (lambda: schedules.MultiFactorScheduler(step=[2], factor=2.0), ValueError, "^factor:"),
    (lambda: schedules.MultiFactorScheduler(step=[2], warmup_mode="exp"), ValueError,
     "^warmup_mode:"),
    (lambda: schedules.PolyScheduler(max_update=0), ValueError, "^max_update: must be >= 1"),
    (lambda: schedules.PolyScheduler(max_update=10.0), TypeError, "^max_update:"),
    (lambda: schedules.PolyScheduler(max_update=10, warmup_steps=10), ValueError,
     "^warmup_steps: must be < max_update"),
    (lambda: schedules.PolyScheduler(max_update=10, pwr=-1), ValueError, "^pwr:"),
    (lambda: schedules.PolyScheduler(max_update=10, warmup_mode="Linear"), ValueError,
     "^warmup_mode:"),
    (lambda: schedules.CosineScheduler(max_update=-3), ValueError, "^max_update:"),
    (lambda: schedules.CosineScheduler(max_update=5, warmup_steps=7), ValueError,
     "^warmup_steps: must be < max_update"),
    (lambda: schedules.CosineScheduler(max_update=5, base_lr=0.01, warmup_begin_lr=0.1),
     ValueError, "^warmup_begin_lr:"),
])
def test_bad_arguments_raise_naming_the_argument(make, error, match):
  with pytest.raises(error, match=match):
    make()


@pytest.mark.parametrize("count", [1.0, np.float32(3), jnp.float32(2), True,
                                   jnp.arange(3)])
def test_non_integer_count_is_a_type_error(count):
  sched = schedules.CosineScheduler(max_update=5)
  with pytest.raises(TypeError, match=r"^num_update:"):
    sched(count)


def test_float_count_under_jit_is_a_type_error():
  sched = schedules.MultiFactorScheduler(step=[2, 4], factor=0.5)
  with pytest.raises(TypeError, match=r"^num_update: .*float32"):
    jax.jit(sched)(jnp.float32(3))
  with pytest.raises(TypeError, match=r"^num_update:"):
    jax.jit(sched.as_optax())(jnp.float32(3))
  assert float(jax.jit(sched)(jnp.int32(3))) == pytest.approx(0.005)


def test_to_optax_rejects_other_schedulers():
  with pytest.raises(TypeError, match=r"^scheduler: .*mxnet_schedule"):
    schedules.to_optax(lambda n: 0.1)


@pytest.mark.parametrize("make", [
    lambda n: n, np.int64, np.uint64, np.array, lambda n: jnp.asarray(n, jnp.int64),
    lambda n: jnp.asarray(n, jnp.uint32)],
    ids=["python", "numpy_int64", "numpy_uint64", "numpy_array", "jax_int64", "jax_uint32"])
def test_counts_past_int32_saturate_instead_of_wrapping(make):
  """PolyScheduler gave -2147483.6 at jnp.int64(2**31) (the count wrapped to -2**31)."""
  from conftest import x64  # pylint: disable=g-import-not-at-top
  sched = schedules.PolyScheduler(max_update=1000, base_lr=0.1, warmup_steps=100)
  with x64():
    for n in (2**31, 2**31 + 7, 2**40):
      if n >= 2**32 and str(getattr(make(0), "dtype", "")) == "uint32":
        continue
      assert float(sched(make(n))) == pytest.approx(float(sched(2**31 - 1)))
      assert float(jax.jit(sched)(make(n))) == pytest.approx(0.0)


@pytest.mark.parametrize("make,arg", [
    (lambda n: schedules.FactorScheduler(step=n), "step"),
    (lambda n: schedules.MultiFactorScheduler(step=[10, n]), "step"),
    (lambda n: schedules.PolyScheduler(max_update=n), "max_update"),
    (lambda n: schedules.CosineScheduler(max_update=n), "max_update"),
    (lambda n: schedules.PolyScheduler(max_update=100, warmup_steps=n), "warmup_steps"),
])
def test_lengths_past_int32_are_rejected_naming_the_argument(make, arg):
  with pytest.raises(ValueError, match=rf"^{arg}: must be <= 2147483647"):
    make(2**31)
