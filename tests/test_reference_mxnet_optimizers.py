"""Signum/signSGD, Adam, SGD and LARS against values produced by Apache MXNet 2.0.0b1.

The values come from ``tests/reference/make_mxnet_optimizers.py`` (run with
MXNet in a virtual environment of its own; see the script). Each case is built
here with ``lars_optax.mxnet.create(<MXNet name>, **<the kwargs given to
mx.optimizer.create>)``, so these tests check :func:`lars_optax.mxnet.create` as
well as the optimizers. Every case runs 12 steps, one of which has all-zero
gradients. Cases cover ``lr_mult``/``wd_mult``, a stateful MXNet-style
``FactorScheduler`` with ``begin_num_update``, row-sparse gradients with and
without ``lazy_update``, and float16 weights with ``multi_precision``.

Tolerances (of the largest entry of each leaf): float32 1e-5, Adam 1e-4,
float16 2e-3. For Adam the measured error is about 1e-5 on ``var`` and 7e-6 on
the weights: MXNet's fused kernel rounds ``1 - beta2`` to float32 (0.00099998713
for 0.999), the rule and this library use 0.001.
"""

import json
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax

REF = json.loads(
    (pathlib.Path(__file__).parent / "reference" / "mxnet_optimizers.json").read_text())
CASES = {c["name"]: c for c in REF["cases"]}


def _rtol(case):
  if case["dtype"] == "float16":
    return 2e-3
  return 1e-4 if case["optimizer"] == "adam" else 1e-5


class FactorScheduler:
  """Written like ``mx.lr_scheduler.FactorScheduler``: stateful plain Python."""

  def __init__(self, step, factor=1.0, stop_factor_lr=1e-8, base_lr=0.01):
    self.step, self.factor, self.stop_factor_lr = step, factor, stop_factor_lr
    self.base_lr = base_lr
    self.count = 0

  def __call__(self, num_update):
    while num_update > self.count + self.step:
      self.count += self.step
      self.base_lr = max(self.base_lr * self.factor, self.stop_factor_lr)
    return self.base_lr


def _scheduler(case):
  spec = dict(case["lr_scheduler"])
  assert spec.pop("type") == "FactorScheduler"
  return FactorScheduler(**spec)


def _create(case):
  kwargs = dict(case["kwargs"])
  for key in ("lr_mult", "wd_mult"):
    if key in case:
      kwargs[key] = case[key]
  if "lr_scheduler" in case:
    kwargs["lr_scheduler"] = _scheduler(case)
  return lars_optax.mxnet.create(case["optimizer"], **kwargs)


def _tree(d, dtype):
  return {k: jnp.asarray(np.asarray(v), dtype) for k, v in d.items()}


def _rel_err(actual, expected):
  exp = np.asarray(expected, np.float64)
  act = np.asarray(actual, np.float64)
  scale = max(np.abs(exp).max(initial=0.0), 1e-30)
  return np.abs(act - exp).max(initial=0.0) / scale


def _states(case, state, params):
  """Our state buffers under MXNet's names (signum's ``mom`` is -ema)."""
  get = optax.tree_utils.tree_get
  out = {}
  if case["optimizer"] in ("sgd", "lars"):
    out["mom"] = get(state, "momentum")
  elif case["optimizer"] == "signum" and case["kwargs"].get("momentum", 0.9) != 0:
    out["mom"] = jax.tree.map(jnp.negative, get(state, "ema"))
  elif case["optimizer"] == "adam":
    out["mean"], out["var"] = get(state, "mu"), get(state, "nu")
  if case["kwargs"].get("multi_precision"):
    out["master"] = lars_optax.master_params(state, params)
  return out


def _run(case, jit=True):
  """Runs the case; returns the worst relative error of weights and states."""
  dtype = jnp.dtype(case["dtype"])
  tx = _create(case)
  params = _tree(case["params"], dtype)
  state = tx.init(params)

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  step = jax.jit(step) if jit else step
  worst = {"weights": 0.0}
  for t, grads in enumerate(case["grads"]):
    params, state = step(params, state, _tree(grads, dtype))
    chex.assert_trees_all_equal_dtypes(params, _tree(case["params"], dtype))
    for name, exp in case["weights"][t].items():
      worst["weights"] = max(worst["weights"], _rel_err(params[name], exp))
    ours = _states(case, state, params)
    for name, bufs in case["states"][t].items():
      for buf, exp in bufs.items():
        worst[buf] = max(worst.get(buf, 0.0), _rel_err(ours[buf][name], exp))
  return worst


@pytest.mark.quick
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_mxnet(name):
  case = CASES[name]
  worst = _run(case)
  bad = {k: f"{e:.2e}" for k, e in worst.items() if e > _rtol(case)}
  assert not bad, f"{name}: relative error above {_rtol(case):.0e}: {bad}"


@pytest.mark.parametrize("name", ["signum_full", "adam_lazy", "sgd_mp_f16", "lars_mult"])
def test_matches_mxnet_without_jit(name):
  case = CASES[name]
  worst = _run(case, jit=False)
  assert max(worst.values()) <= _rtol(case), worst


@pytest.mark.parametrize("name", [n for n, c in sorted(CASES.items()) if "lr_scheduler" in c])
def test_scheduler_gives_mxnets_learning_rates(name):
  case = CASES[name]
  assert case["lr_scheduler"]["base_lr"] == case["kwargs"]["learning_rate"]
  sched = lars_optax.mxnet.mxnet_schedule(_scheduler(case),
                                          begin_num_update=case["kwargs"].get("begin_num_update",
                                                                              0))
  for count, (num_update, lr) in enumerate(case["lr_calls"]):
    assert num_update == count + 1 + case["kwargs"].get("begin_num_update", 0)
    np.testing.assert_allclose(float(sched(jnp.asarray(count))), lr, rtol=1e-6)


def test_lazy_cases_leave_absent_rows_alone():
  """The MXNet data itself shows the lazy semantics we reproduce."""
  case = CASES["adam_lazy"]
  prev = case["params"]
  for grads, weights in zip(case["grads"], case["weights"]):
    for name, g in grads.items():
      g, w0, w1 = (np.asarray(x) for x in (g, prev[name], weights[name]))
      absent = ~np.any(g.reshape(g.shape[0], -1) != 0, axis=1)
      np.testing.assert_array_equal(w1[absent], w0[absent])
    prev = weights


def test_reference_covers_the_issue():
  """The committed reference exercises every option issue #3 lists."""
  by_opt = {}
  for c in REF["cases"]:
    by_opt.setdefault(c["optimizer"], []).append(c)
    assert len(c["grads"]) >= 10
    assert any(all(not np.any(np.asarray(g)) for g in s.values()) for s in c["grads"])
  assert set(by_opt) == {"signum", "adam", "sgd", "lars"}
  assert any(c["kwargs"].get("momentum") == 0 for c in by_opt["signum"])  # signSGD path
  assert any(c["kwargs"].get("wd_lh") for c in by_opt["signum"])
  assert any(c["kwargs"].get("lazy_update") and c["sparse"] for c in by_opt["adam"])
  assert {c["optimizer"] for c in REF["cases"]
          if c["kwargs"].get("multi_precision") and c["dtype"] == "float16"} >= {"adam", "lars"}
  assert all(any("lr_mult" in c and "wd_mult" in c for c in cs) for cs in by_opt.values())
  assert any("lr_scheduler" in c for c in REF["cases"])
  for key in ("rescale_grad", "clip_gradient", "beta1", "beta2", "epsilon"):
    assert any(key in c["kwargs"] for c in REF["cases"]), key
