"""Produce reference values for MXNet 2.0.0b1's row-sparse AdaGrad, GroupAdaGrad and FTRL.

The project's tests (``tests/test_reference_mxnet_row_sparse.py``) compare
``lars_optax.mxnet.create(<name>, **kwargs)`` fed with row-sparse BCOO gradients
against the numbers this script writes to
``tests/reference/mxnet_row_sparse.json``. The tests read only that JSON file,
so they never need MXNet. This script imports nothing from the project; it
reuses the parameters and the row-sparse gradients of its companion
``make_mxnet_optimizers.py`` (same directory): 7 leaves of 1 to 3 dimensions
(one all zeros at the start), 12 steps, and at every step each leaf's gradient
has a random subset of its rows (axis 0) exactly zero, at least one zero and
one not; at step 5 every gradient is zero.

How to run it (from the repository root; MXNet 2.0.0b1 lives in a virtual
environment of its own, kept out of git):

    python3 -m venv .venv-mx2
    .venv-mx2/bin/pip install "mxnet==2.0.0b1" "numpy<1.24"
    .venv-mx2/bin/python tests/reference/make_mxnet_row_sparse.py

Running it again gives the same file (every random number comes from a
``numpy.random.default_rng`` with a fixed seed). It takes a few seconds.

What it does
------------
Each case builds ``mx.optimizer.create(optimizer, param_idx2name={...},
**kwargs)``, sets ``opt.set_lr_mult``/``opt.set_wd_mult`` where the case has
them, makes an updater with ``mx.optimizer.get_updater(opt)`` and runs 12
steps, one updater call with every parameter per step. Each gradient is given
as ``mx.nd.array(g).tostype('row_sparse')``: its ``indices`` are exactly the
rows of ``g`` with a non-zero entry (asserted). MXNet then runs its
row-sparse kernels:

    adagrad       sparse.adagrad_update on a dense weight and dense history
    groupadagrad  contrib.group_adagrad_update on a dense weight, history (rows, 1)
    ftrl          ftrl_update with the weight (and so z and n) stored as
                  row_sparse arrays holding every row

FTRL needs the row-sparse weight: with a dense weight MXNet falls back to its
dense kernel (with a storage-fallback warning), which rewrites every row
(FTRL's weight is a function of z and n, not a sum of steps). The weight is
made with ``mx.nd.sparse.row_sparse_array((w, arange(rows)))`` so that every
row is stored, including the rows of the zero-initialised leaf.

MXNet's row-sparse AdaGrad has no weight decay (``wd != 0`` fails with
"Operator not implemented: _sparse_adagrad_update"), and GroupAdaGrad asserts
``wd == 0``; FTRL's ``wd`` is the L2 term of its weight formula and is
covered.

After each step it records every weight and the state buffers MXNet keeps in
``updater.states[index]`` (as dense arrays):

    adagrad       history
    groupadagrad  history      (shape (rows, 1); GroupAdaGrad takes 2-d weights only)
    ftrl          z, n

Cases (hyperparameters not listed take MXNet's defaults; adagrad and
groupadagrad: learning_rate=0.01, epsilon=1e-6; ftrl: learning_rate=0.1,
lamda1=0.01, beta=1; every optimizer: wd=0, rescale_grad=1,
clip_gradient=None):

    adagrad_rsp            learning_rate 0.1
    adagrad_rsp_full       learning_rate 0.05, epsilon 0.1, rescale_grad 0.5,
                           clip_gradient 0.5, lr_mult {fc1_weight: 0.5, embed_weight: 3}
    groupadagrad_rsp       2-d leaves only, learning_rate 0.1
    groupadagrad_rsp_full  2-d leaves only, learning_rate 0.05, epsilon 0.1,
                           rescale_grad 0.5, clip_gradient 0.5, lr_mult as above
    ftrl_rsp               all defaults
    ftrl_rsp_full          learning_rate 0.05, lamda1 0.02, beta 0.5, wd 0.01,
                           rescale_grad 0.5, clip_gradient 0.5, lr_mult as above,
                           wd_mult {fc1_bias: 0, conv0_weight: 3}

(epsilon 0.1 tells apart epsilon outside the square root, sqrt(h) + eps,
from inside, sqrt(h + eps): MXNet's row-sparse kernels put it outside, as its
dense step does.)

Checks made while generating
----------------------------
The error measure is, for each leaf and step, max|a - b| / max|b|.

1. A float64 numpy version of each rule, updating only the rows present in
   the gradient (weight and every buffer of an absent row unchanged), is
   compared with MXNet's weights and buffers: they agree to ``SELF_CHECK_TOL``
   (the largest difference is printed).
2. For adagrad and groupadagrad, where the update of an absent row is a no-op
   (wd = 0), the same case run with dense gradients (MXNet's dense ``step``)
   gives the same weights and buffers, to ``DENSE_TOL``.
3. For every case, the absent rows of the weight and of every buffer are
   asserted unchanged, bit for bit, at every step.

Output format (read by the project's tests)::

    {"generator": "tests/reference/make_mxnet_row_sparse.py",
     "mxnet_version": mx.__version__,
     "cases": [{"name", "optimizer", "dtype" ("float32"),
                "kwargs": the keyword arguments given to mx.optimizer.create
                          other than param_idx2name,
                "lr_mult", "wd_mult": name -> multiplier (only when used),
                "params": initial weights, name -> nested list,
                "grads": per step, name -> the dense gradient (its non-zero rows
                         are the rows MXNet got as row_sparse),
                "weights": per step, name -> weight after the update,
                "states": per step, name -> {buffer name: array}}, ...]}

Step k+1 is at list index k. Numbers are written as the shortest decimals that
give back the exact float32 values.
"""

import json
import os
import sys

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_mxnet_optimizers import PARAMS, make_data, present_rows  # the shared data

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxnet_row_sparse.json")
GENERATOR = "tests/reference/make_mxnet_row_sparse.py"
SELF_CHECK_TOL = 2e-6   # MXNet (float32) vs the float64 numpy rule
DENSE_TOL = 1e-6        # MXNet's row-sparse kernel vs its dense step (adagrad, groupadagrad)

NAMES = tuple(name for name, _, _ in PARAMS)
TWO_D = tuple(name for name, shape, _ in PARAMS if len(shape) == 2)
LR_MULT = {"fc1_weight": 0.5, "embed_weight": 3.0}
WD_MULT = {"fc1_bias": 0.0, "conv0_weight": 3.0}

DEFAULTS = {
    "adagrad": {"learning_rate": 0.01, "epsilon": 1e-6},
    "groupadagrad": {"learning_rate": 0.01, "epsilon": 1e-6},
    "ftrl": {"learning_rate": 0.1, "lamda1": 0.01, "beta": 1.0},
}
BASE_DEFAULTS = {"wd": 0.0, "rescale_grad": 1.0, "clip_gradient": None}
BUFFERS = {"adagrad": ("history",), "groupadagrad": ("history",), "ftrl": ("z", "n")}


def _case(name, optimizer, seed, leaves=NAMES, lr_mult=None, wd_mult=None, **kwargs):
  return {"name": name, "optimizer": optimizer, "seed": seed, "leaves": leaves,
          "kwargs": kwargs, "lr_mult": lr_mult, "wd_mult": wd_mult}


FULL = {"rescale_grad": 0.5, "clip_gradient": 0.5}
CASES = (
    _case("adagrad_rsp", "adagrad", 400, learning_rate=0.1),
    _case("adagrad_rsp_full", "adagrad", 401, lr_mult=LR_MULT, learning_rate=0.05,
          epsilon=0.1, **FULL),
    _case("groupadagrad_rsp", "groupadagrad", 402, leaves=TWO_D, learning_rate=0.1),
    _case("groupadagrad_rsp_full", "groupadagrad", 403, leaves=TWO_D, lr_mult=LR_MULT,
          learning_rate=0.05, epsilon=0.1, **FULL),
    _case("ftrl_rsp", "ftrl", 404),
    _case("ftrl_rsp_full", "ftrl", 405, lr_mult=LR_MULT, wd_mult=WD_MULT, learning_rate=0.05,
          lamda1=0.02, beta=0.5, wd=0.01, **FULL),
)


def resolved(case):
  kw = dict(BASE_DEFAULTS)
  kw.update(DEFAULTS[case["optimizer"]])
  kw.update(case["kwargs"])
  return kw


# --------------------------------------------------------------------------
# MXNet
# --------------------------------------------------------------------------

def _rsp_grad(value):
  g = mx.nd.array(value, dtype="float32").tostype("row_sparse")
  assert g.stype == "row_sparse"
  assert np.array_equal(g.indices.asnumpy(), np.flatnonzero(present_rows(value)))
  return g


def _weight(case, value):
  if case["optimizer"] != "ftrl":
    return mx.nd.array(value, dtype="float32")
  # Every row stored, so that the row-sparse kernel runs (see the module docstring).
  rows = np.arange(value.shape[0], dtype=np.int64)
  w = mx.nd.sparse.row_sparse_array((value.astype(np.float32), rows), shape=value.shape,
                                    dtype="float32")
  assert w.stype == "row_sparse" and w.indices.shape[0] == value.shape[0]
  return w


def run_mxnet(case, params, grads, sparse=True):
  """Weights and buffers per step (dense numpy arrays)."""
  leaves = case["leaves"]
  opt = mx.optimizer.create(case["optimizer"], param_idx2name=dict(enumerate(leaves)),
                            **case["kwargs"])
  if case["lr_mult"] is not None:
    opt.set_lr_mult(dict(case["lr_mult"]))
  if case["wd_mult"] is not None:
    opt.set_wd_mult(dict(case["wd_mult"]))
  kw = resolved(case)
  for key, value in kw.items():
    assert getattr(opt, "lr" if key == "learning_rate" else key) == value, key
  updater = mx.optimizer.get_updater(opt)
  weights_nd = [_weight(case, params[n]) if sparse else mx.nd.array(params[n])
                for n in leaves]
  weights_hist, states_hist = [], []
  for grad in grads:
    grads_nd = [_rsp_grad(grad[n]) if sparse else mx.nd.array(grad[n]) for n in leaves]
    updater(list(range(len(leaves))), grads_nd, weights_nd)
    weights_hist.append({n: w.asnumpy().copy() for n, w in zip(leaves, weights_nd)})
    step = {}
    for idx, n in enumerate(leaves):
      state = updater.states[idx]
      bufs = state if isinstance(state, tuple) else (state,)
      assert len(bufs) == len(BUFFERS[case["optimizer"]])
      step[n] = {b: s.asnumpy().copy() for b, s in zip(BUFFERS[case["optimizer"]], bufs)}
      for value in step[n].values():
        assert value.dtype == np.float32
    states_hist.append(step)
  return weights_hist, states_hist


# --------------------------------------------------------------------------
# The float64 numpy rules (self-check)
# --------------------------------------------------------------------------

def run_numpy(case, params, grads):
  kw = resolved(case)
  opt = case["optimizer"]
  lr_mult, wd_mult = case["lr_mult"] or {}, case["wd_mult"] or {}
  weights = {n: params[n].astype(np.float64) for n in case["leaves"]}
  state = {}
  for n, w in weights.items():
    if opt == "groupadagrad":
      state[n] = {"history": np.zeros((w.shape[0], 1))}
    else:
      state[n] = {b: np.zeros_like(w) for b in BUFFERS[opt]}
  weights_hist, states_hist = [], []
  for grad in grads:
    for n in case["leaves"]:
      w, s = weights[n], state[n]
      g = grad[n].astype(np.float64)
      lr = kw["learning_rate"] * lr_mult.get(n, 1.0)
      wd = kw["wd"] * wd_mult.get(n, 1.0)
      u = kw["rescale_grad"] * g
      if kw["clip_gradient"] is not None:
        u = np.clip(u, -kw["clip_gradient"], kw["clip_gradient"])
      new = {}
      if opt == "adagrad":
        new["history"] = s["history"] + u * u
        new_w = w - lr * u / (np.sqrt(new["history"]) + kw["epsilon"])
      elif opt == "groupadagrad":
        new["history"] = s["history"] + np.mean(u * u, axis=1, keepdims=True)
        new_w = w - lr * u / (np.sqrt(new["history"]) + kw["epsilon"])
      else:
        new["n"] = s["n"] + u * u
        new["z"] = s["z"] + u - (np.sqrt(new["n"]) - np.sqrt(s["n"])) / lr * w
        denom = (kw["beta"] + np.sqrt(new["n"])) / lr + wd
        new_w = -np.sign(new["z"]) * np.maximum(np.abs(new["z"]) - kw["lamda1"], 0) / denom
      rows = present_rows(g)
      weights[n] = np.where(rows.reshape((-1,) + (1,) * (w.ndim - 1)), new_w, w)
      state[n] = {b: np.where(rows.reshape((-1,) + (1,) * (v.ndim - 1)), v, s[b])
                  for b, v in new.items()}
    weights_hist.append({n: w.copy() for n, w in weights.items()})
    states_hist.append({n: dict(s) for n, s in state.items()})
  return weights_hist, states_hist


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  scale = np.max(np.abs(b))
  diff = np.max(np.abs(a - b))
  return 0.0 if scale == 0 and diff == 0 else diff / scale


def max_rel(weights_a, states_a, weights_b, states_b):
  worst = 0.0
  for wa, sa, wb, sb in zip(weights_a, states_a, weights_b, states_b, strict=True):
    for n in wa:
      worst = max(worst, _rel(wa[n], wb[n]))
      for b in sa[n]:
        worst = max(worst, _rel(sa[n][b], sb[n][b]))
  return worst


def check_case(case, params, grads, weights, states):
  msg = []
  d = max_rel(weights, states, *run_numpy(case, params, grads))
  msg.append(f"vs float64 numpy rule {d:.2e}")
  assert d <= SELF_CHECK_TOL, (case["name"], d)
  if case["optimizer"] in ("adagrad", "groupadagrad"):
    d_dense = max_rel(weights, states, *run_mxnet(case, params, grads, sparse=False))
    msg.append(f"vs MXNet's dense step {d_dense:.2e}")
    assert d_dense <= DENSE_TOL, (case["name"], d_dense)
  absent_total = 0
  for k in range(len(grads)):
    for n in case["leaves"]:
      absent = ~present_rows(grads[k][n])
      absent_total += int(absent.sum())
      before_w = params[n] if k == 0 else weights[k - 1][n]
      assert np.array_equal(weights[k][n][absent], before_w[absent]), (case["name"], k, n)
      if k:
        for b, value in states[k][n].items():
          assert np.array_equal(value[absent], states[k - 1][n][b][absent]), (case["name"], b)
  msg.append(f"{absent_total} absent rows left unchanged")
  print(f"{case['name']:22s} " + " | ".join(msg))


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def _short(a):
  """Nested lists of the shortest decimals that give back the same float32."""
  a = np.asarray(a, np.float32)
  flat = [float(np.format_float_scientific(x, unique=True)) for x in a.ravel()]
  return np.array(flat, dtype=np.float64).reshape(a.shape).tolist()


def main():
  print("MXNet", mx.__version__, "numpy", np.__version__)
  out_cases = []
  for case in CASES:
    params, grads = make_data(case["seed"], "float32", sparse=True)
    params = {n: params[n] for n in case["leaves"]}
    grads = [{n: g[n] for n in case["leaves"]} for g in grads]
    weights, states = run_mxnet(case, params, grads)
    check_case(case, params, grads, weights, states)
    entry = {"name": case["name"], "optimizer": case["optimizer"], "dtype": "float32",
             "kwargs": dict(case["kwargs"])}
    for key in ("lr_mult", "wd_mult"):
      if case[key] is not None:
        entry[key] = dict(case[key])
    entry.update({
        "params": {n: _short(v) for n, v in params.items()},
        "grads": [{n: _short(v) for n, v in g.items()} for g in grads],
        "weights": [{n: _short(v) for n, v in w.items()} for w in weights],
        "states": [{n: {b: _short(v) for b, v in s.items()} for n, s in step.items()}
                   for step in states],
    })
    out_cases.append(entry)
  head = {"generator": GENERATOR, "mxnet_version": mx.__version__}
  with open(OUT_PATH, "w") as f:
    f.write(json.dumps(head)[:-1] + ', "cases": [\n')
    f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in out_cases))
    f.write("\n]}\n")
  print(f"wrote tests/reference/{os.path.basename(OUT_PATH)} "
        f"({os.path.getsize(OUT_PATH)} bytes, {len(out_cases)} cases)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
