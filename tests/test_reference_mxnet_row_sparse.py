"""Row-sparse AdaGrad, GroupAdaGrad and FTRL against MXNet 2.0.0b1's ``row_sparse`` kernels.

The values come from ``tests/reference/make_mxnet_row_sparse.py`` (run with
MXNet in a virtual environment of its own; see the script). Each case is built
here with ``lars_optax.mxnet.create(<MXNet name>, **<the kwargs given to
mx.optimizer.create>)`` and runs 12 jitted steps on row-sparse BCOO gradients
holding the rows MXNet got as ``row_sparse`` (padded to one slot per row with
the padding index, so that every step compiles once). Weights and every state
buffer are compared, leaf by leaf, as max|ours - MXNet| / max|MXNet|.

Tolerances (``RTOL``): 1e-6 for AdaGrad and GroupAdaGrad, 2e-6 for FTRL. Both
sides compute in float32, in different orders: the generator's float64 rule
agrees with MXNet to 1.4e-7 (AdaGrad, GroupAdaGrad) and 4.4e-7 (FTRL), and
this library agrees with MXNet to 1.4e-7 and 1.0e-6 (FTRL's ``z``, a running
sum of ``g - (sqrt(n_t) - sqrt(n_{t-1})) / lr * w`` whose terms cancel).
AdaGrad and GroupAdaGrad must also equal their dense step on the same
gradients (an absent row's update is 0 there), and FTRL must leave an absent
row exactly as it was (its dense step rewrites every weight).
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import as_row_sparse as _as_row_sparse

import lars_optax

REF = json.loads(
    (pathlib.Path(__file__).parent / "reference" / "mxnet_row_sparse.json").read_text())
CASES = {c["name"]: c for c in REF["cases"]}
RTOL = {"adagrad": 1e-6, "groupadagrad": 1e-6, "ftrl": 2e-6}

get = optax.tree_utils.tree_get


def _create(case):
  kwargs = dict(case["kwargs"])
  for key in ("lr_mult", "wd_mult"):
    if key in case:
      kwargs[key] = case[key]
  return lars_optax.mxnet.create(case["optimizer"], **kwargs)


def _buffers(case, state):
  """Our state buffers under MXNet's names."""
  if case["optimizer"] == "adagrad":
    return {"history": get(state, "sum_of_squares")}
  if case["optimizer"] == "groupadagrad":
    return {"history": get(state, "row_sum_of_squares")}
  return {"z": get(state, "z"), "n": get(state, "n")}


def _rel_err(actual, expected):
  exp = np.asarray(expected, np.float64)
  act = np.asarray(actual, np.float64)
  return np.abs(act - exp).max(initial=0.0) / max(np.abs(exp).max(initial=0.0), 1e-30)


def _run(case, sparse=True):
  tx = _create(case)
  params = {k: jnp.asarray(v, jnp.float32) for k, v in case["params"].items()}
  state = tx.init(params)

  @jax.jit
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  history = []
  for grads in case["grads"]:
    grads = {k: _as_row_sparse(g) if sparse else jnp.asarray(g, jnp.float32)
             for k, g in grads.items()}
    params, state = step(params, state, grads)
    history.append((params, _buffers(case, state)))
  return history


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.quick) if n in ("adagrad_rsp_full", "ftrl_rsp_full") else n
    for n in sorted(CASES)])
def test_bcoo_gradients_match_mxnet_row_sparse(name):
  case = CASES[name]
  worst = {}
  for t, (params, bufs) in enumerate(_run(case)):
    for leaf, exp in case["weights"][t].items():
      worst["weights"] = max(worst.get("weights", 0.0), _rel_err(params[leaf], exp))
    for leaf, exp_bufs in case["states"][t].items():
      for buf, exp in exp_bufs.items():
        worst[buf] = max(worst.get(buf, 0.0), _rel_err(bufs[buf][leaf], exp))
  rtol = RTOL[case["optimizer"]]
  bad = {k: f"{e:.2e}" for k, e in worst.items() if e > rtol}
  assert not bad, f"{name}: relative error above {rtol:.0e}: {bad}"


@pytest.mark.parametrize("name", sorted(n for n in CASES if "adagrad" in n))
def test_adagrad_bcoo_step_equals_the_dense_step(name):
  case = CASES[name]
  for (p_s, b_s), (p_d, b_d) in zip(_run(case), _run(case, sparse=False)):
    for leaf in p_s:
      np.testing.assert_allclose(p_s[leaf], p_d[leaf], rtol=1e-6, atol=1e-7)
      for buf in b_s:
        np.testing.assert_allclose(b_s[buf][leaf], b_d[buf][leaf], rtol=1e-6, atol=1e-7)


def test_ftrl_bcoo_step_leaves_absent_rows_alone():
  """FTRL's dense step rewrites every weight; its row-sparse one only the present rows."""
  case = CASES["ftrl_rsp_full"]
  before = {k: np.asarray(v, np.float32) for k, v in case["params"].items()}
  for t, (params, _) in enumerate(_run(case)):
    for leaf, g in case["grads"][t].items():
      g = np.asarray(g)
      absent = ~np.any(g.reshape(g.shape[0], -1) != 0, axis=1)
      np.testing.assert_array_equal(np.asarray(params[leaf])[absent], before[leaf][absent])
    before = {k: np.asarray(v) for k, v in params.items()}
