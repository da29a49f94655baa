"""Produce reference values for the rest of MXNet 2.0.0b1's optimizer registry.

The project's tests (``tests/test_reference_mxnet_registry.py``) compare
``lars_optax.create(<name>, **kwargs)`` against the numbers this script writes
to ``tests/reference/mxnet_registry.json``. The tests read only that JSON
file, so they never need MXNet. This script imports nothing from the project;
it reuses the parameter tree and gradients of its companion
``make_mxnet_optimizers.py`` (same directory), so the data are made the same
way: 7 leaves (one of them all zeros at the start: a zero-initialised layer),
12 steps, every gradient exactly zero at step 5, per-step/per-leaf gradient
scales from 0.05 to 3 so that clipping takes effect.

How to run it (from the repository root; MXNet 2.0.0b1 lives in a virtual
environment of its own, kept out of git):

    python3 -m venv .venv-mx2
    .venv-mx2/bin/pip install "mxnet==2.0.0b1" "numpy<1.24"
    .venv-mx2/bin/python tests/reference/make_mxnet_registry.py

Running it again gives the same file (every random number comes from a
``numpy.random.default_rng`` with a fixed seed). It takes a few seconds.

Each case builds ``mx.optimizer.create(optimizer, param_idx2name={...},
**kwargs)``, sets ``opt.set_lr_mult``/``opt.set_wd_mult`` where the case has
them, makes an updater with ``mx.optimizer.get_updater(opt)`` and runs the
steps, one updater call with every parameter per step (as MXNet's Module and
gluon Trainer call it). After each step it records every weight and every
state buffer MXNet keeps in ``updater.states[index]``, flattened in order
(``None`` -> ``[]``, an NDArray -> ``[it]``, a tuple -> its items' buffers in
turn; with ``multi_precision`` and float16 weights the float32 master comes
first). Which buffer is which is stated per optimizer in ``STATE_LAYOUT``.

Cases with ``"check_unfused": True`` are also run with
``use_fused_step=False`` (MXNet's plain-Python ``step``) and must agree with
the default path to ``UNFUSED_TOL`` (the largest difference is printed); a
number instead of True is that case's own tolerance.

Output format::

    {"generator": "tests/reference/make_mxnet_registry.py",
     "mxnet_version": mx.__version__,
     "state_layout": {optimizer: [buffer names in MXNet's order]},
     "cases": [{"name", "optimizer", "dtype" ("float32" | "float16"),
                "kwargs": the keyword arguments given to mx.optimizer.create
                          other than param_idx2name,
                "lr_mult", "wd_mult": name -> multiplier (only when used),
                "params": initial weights, name -> nested list,
                "grads": per step, name -> gradient fed in,
                "weights": per step, name -> weight after the update,
                "states": per step, name -> [buffers, in STATE_LAYOUT order]
               }, ...]}

Step k+1 is at list index k. Numbers are the exact float32 or float16 values.
"""

import json
import os
import sys

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_mxnet_optimizers import NAMES, make_data  # the shared data

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxnet_registry.json")
GENERATOR = "tests/reference/make_mxnet_registry.py"
UNFUSED_TOL = 3e-5  # fused kernel vs plain-Python step (leaf-wise max|a - b| / max|b|)

# optimizer -> names of the buffers MXNet keeps per parameter, in its order (float32 case;
# multi_precision float16 cases have "master" in front).
STATE_LAYOUT = {}

MULT = {"lr_mult": {"fc1_weight": 0.5, "embed_weight": 3.0},
        "wd_mult": {"fc1_bias": 0.0, "conv0_weight": 3.0}}


def _case(name, optimizer, seed, dtype="float32", lr_mult=None, wd_mult=None,
          check_unfused=False, per_param=False, **kwargs):
  return {"name": name, "optimizer": optimizer, "seed": seed, "dtype": dtype,
          "kwargs": kwargs, "lr_mult": lr_mult, "wd_mult": wd_mult,
          "check_unfused": check_unfused, "per_param": per_param}


# One block per family of optimizers. Random hyperparameters come from a
# default_rng with a fixed seed, so the file is reproducible.

# --- LAMB and LANS (the trust-ratio family) -------------------------------
TRUST_RATIO_CASES = []

# --- Adam-like: adamw, adamax, nadam, adabelief, ftml, adagrad, groupadagrad
ADAPTIVE_CASES = []

# adamw, adamax, nadam, adabelief, ftml: per optimizer, MXNet's defaults, two
# draws of random hyperparameters covering every option (the bias-correction
# flags both ways, begin_num_update > 0), MULT, and float16 with master weights.
STATE_LAYOUT.update({"adamw": ["mean", "var"], "adamax": ["mean", "var"],
                     "nadam": ["mean", "var"], "adabelief": ["mean", "var"],
                     "ftml": ["d", "v", "z"]})


def _adam_family_draw(rng, optimizer):
  """Random hyperparameters for every option of ``optimizer`` (plain floats)."""
  kw = {"learning_rate": float(rng.uniform(1e-3, 0.05)),
        "beta1": float(rng.uniform(0.5, 0.95)),
        "beta2": float(rng.uniform(0.9, 0.9999)),
        "epsilon": float(10 ** rng.uniform(-8, -3)),
        "wd": float(rng.uniform(1e-3, 0.1)),
        "rescale_grad": float(rng.uniform(0.5, 2.0)),
        "clip_gradient": float(rng.uniform(0.5, 2.0)),
        "begin_num_update": int(rng.integers(1, 100))}
  if optimizer in ("adamw", "adabelief"):
    kw["correct_bias"] = bool(rng.integers(0, 2))
  if optimizer == "nadam":
    kw["schedule_decay"] = float(rng.uniform(0.0, 0.1))
  return kw


# MXNet has a fused kernel and a plain-Python step for these. The aggregated
# kernels (multi_adamw_update, multi_adabelief_update: MXNet's default for
# more than one parameter) form the second moment with up to ~1e-4 relative
# error against the float64 rule, which the plain step follows.
# adamw's plain step also decays the weight it has just updated (the kernel
# decays w_{t-1}, as the rule says), a difference of lr^2 * wd * step that the
# random draws' larger rates make visible: those are checked on the kernel only.
_ADAM_FAMILY_FUSED = {"adamw": 2e-4, "adabelief": 2e-4, "ftml": True}
# nadam: MXNet multiplies its momentum schedule once per parameter per step on
# the optimizer object; one optimizer per parameter gives the per-tree rule.
_ADAM_FAMILY_PER_PARAM = {"nadam"}

_adam_family_rng = np.random.default_rng(1515)
for _i, _opt in enumerate(["adamw", "adamax", "nadam", "adabelief", "ftml"]):
  _extra = {"check_unfused": _ADAM_FAMILY_FUSED.get(_opt, False),
            "per_param": _opt in _ADAM_FAMILY_PER_PARAM}
  _draws = [_adam_family_draw(_adam_family_rng, _opt) for _ in range(2)]
  if _opt in ("adamw", "adabelief"):  # both values of the flag
    _draws[0]["correct_bias"], _draws[1]["correct_bias"] = True, False
  ADAPTIVE_CASES += [
      _case(f"{_opt}_defaults", _opt, 500 + 10 * _i, **_extra),
      *[_case(f"{_opt}_random_{ab}", _opt, 501 + j + 10 * _i,
              **dict(_extra, check_unfused=_extra["check_unfused"] and _opt != "adamw"),
              **draw) for j, (ab, draw) in enumerate(zip("ab", _draws))],
      _case(f"{_opt}_mult", _opt, 503 + 10 * _i, **MULT, **_extra,
            learning_rate=0.01, wd=0.01),
      _case(f"{_opt}_float16_mp", _opt, 504 + 10 * _i, dtype="float16",
            per_param=_opt in _ADAM_FAMILY_PER_PARAM, multi_precision=True,
            learning_rate=0.01, wd=0.01, clip_gradient=1.0),
  ]

# --- nag, rmsprop, adadelta, ftrl, dcasgd ----------------------------------
STATE_LAYOUT["nag"] = ["mom"]
OTHER_CASES = [
    _case("nag_defaults", "nag", 400, momentum=0.9, check_unfused=True),
]

CASES = [*TRUST_RATIO_CASES, *ADAPTIVE_CASES, *OTHER_CASES]


# --------------------------------------------------------------------------
# MXNet
# --------------------------------------------------------------------------

def _flat(state):
  if state is None:
    return []
  if isinstance(state, (tuple, list)):
    return [b for s in state for b in _flat(s)]
  assert isinstance(state, mx.nd.NDArray), type(state)
  assert state.stype == "default", state.stype
  return [state.asnumpy().copy()]


def run_mxnet(case, params, grads, **overrides):
  """Run MXNet; return (weights per step, states per step)."""
  dtype = case["dtype"]
  kwargs = dict(case["kwargs"], **overrides)
  # per_param: one optimizer object per parameter (for optimizers that keep
  # per-step state on the object rather than per parameter).
  updaters = []
  for _ in range(len(NAMES) if case["per_param"] else 1):
    opt = mx.optimizer.create(case["optimizer"], param_idx2name=dict(enumerate(NAMES)),
                              **kwargs)
    if case["lr_mult"] is not None:
      opt.set_lr_mult(dict(case["lr_mult"]))
    if case["wd_mult"] is not None:
      opt.set_wd_mult(dict(case["wd_mult"]))
    updaters.append(mx.optimizer.get_updater(opt))
  weights_nd = [mx.nd.array(params[name], dtype=dtype) for name in NAMES]
  weights_hist, states_hist = [], []
  for grad in grads:
    grads_nd = [mx.nd.array(grad[name], dtype=dtype) for name in NAMES]
    if case["per_param"]:
      for idx, updater in enumerate(updaters):
        updater([idx], [grads_nd[idx]], [weights_nd[idx]])
    else:
      updaters[0](list(range(len(NAMES))), grads_nd, weights_nd)
    weights_hist.append({})
    states_hist.append({})
    for idx, name in enumerate(NAMES):
      w = weights_nd[idx].asnumpy()
      assert w.dtype == np.dtype(dtype), (name, w.dtype)
      weights_hist[-1][name] = w.copy()
      states_hist[-1][name] = _flat(updaters[idx if case["per_param"] else 0].states[idx])
  return weights_hist, states_hist


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.abs(a - b).max(initial=0.0) / max(np.abs(b).max(initial=0.0), 1e-30)


def _tolist(tree):
  return {k: np.asarray(v).tolist() for k, v in tree.items()}


def main():
  print("MXNet", mx.__version__, "numpy", np.__version__)
  out_cases = []
  names = [c["name"] for c in CASES]
  assert len(names) == len(set(names)), "duplicate case names"
  for case in CASES:
    params, grads = make_data(case["seed"], case["dtype"], False)
    weights, states = run_mxnet(case, params, grads)
    for step in weights:
      for name, w in step.items():
        assert np.all(np.isfinite(w)), (case["name"], name)
    layout = STATE_LAYOUT[case["optimizer"]]
    n_bufs = len(layout) + (1 if case["kwargs"].get("multi_precision") and
                            case["dtype"] == "float16" else 0)
    for step in states:
      for name, bufs in step.items():
        assert len(bufs) == n_bufs, (case["name"], name, len(bufs), layout)
    if case["check_unfused"]:
      w2, s2 = run_mxnet(case, params, grads, use_fused_step=False)
      worst = max(_rel(a[n], b[n]) for a, b in zip(w2, weights) for n in NAMES)
      worst_s = max((_rel(x, y) for a, b in zip(s2, states) for n in NAMES
                     for x, y in zip(a[n], b[n])), default=0.0)
      print(f"  {case['name']}: fused vs plain step, weights {worst:.1e}, states {worst_s:.1e}")
      tol = UNFUSED_TOL if case["check_unfused"] is True else case["check_unfused"]
      assert max(worst, worst_s) <= tol, case["name"]
    entry = {"name": case["name"], "optimizer": case["optimizer"], "dtype": case["dtype"],
             "kwargs": dict(case["kwargs"])}
    for key in ("lr_mult", "wd_mult"):
      if case[key] is not None:
        entry[key] = dict(case[key])
    entry.update({
        "params": _tolist(params),
        "grads": [_tolist(g) for g in grads],
        "weights": [_tolist(w) for w in weights],
        "states": [{n: [np.asarray(b).tolist() for b in bufs] for n, bufs in step.items()}
                   for step in states],
    })
    out_cases.append(entry)
    print(f"{case['name']}: ok")

  data = {"generator": GENERATOR, "mxnet_version": mx.__version__,
          "state_layout": STATE_LAYOUT, "cases": out_cases}
  with open(OUT_PATH, "w") as f:
    json.dump(data, f, indent=1)
    f.write("\n")
  print(f"wrote tests/reference/{os.path.basename(OUT_PATH)} "
        f"({os.path.getsize(OUT_PATH)} bytes, {len(out_cases)} cases)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
