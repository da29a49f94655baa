"""Produce reference values for the rest of MXNet 2.0.0b1's optimizer registry.

The project's tests (``tests/test_reference_mxnet_registry.py``) compare
``lars_optax.mxnet.create(<name>, **kwargs)`` against the numbers this script writes
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

A case with ``leaves`` uses only those parameters (GroupAdaGrad takes 2-d
weights only); its JSON entry then holds only them.

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
                "state_layout": the names of the case's buffers, in MXNet's order
                                (without "master"; e.g. no momentum buffer when
                                momentum=0),
                "buffers": the key of the test's STATE_BUFFERS that reads ours
                           (the optimizer, or e.g. "rmsprop_centered"),
                "params": initial weights, name -> nested list,
                "grads": per step, name -> gradient fed in,
                "weights": per step, name -> weight after the update,
                "states": per step, name -> [buffers, in STATE_LAYOUT order]
               }, ...]}

Step k+1 is at list index k. Numbers are written as the shortest decimals that
give back the exact float32 or float16 values.
"""

import json
import os
import sys

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_mxnet_optimizers import ALL_ZERO_GRAD_STEP, make_data  # the shared data

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxnet_registry.json")
GENERATOR = "tests/reference/make_mxnet_registry.py"
UNFUSED_TOL = 3e-5  # fused kernel vs plain-Python step (leaf-wise max|a - b| / max|b|)

# optimizer -> names of the buffers MXNet keeps per parameter, in its order (float32 case;
# multi_precision float16 cases have "master" in front).
STATE_LAYOUT = {}

MULT = {"lr_mult": {"fc1_weight": 0.5, "embed_weight": 3.0},
        "wd_mult": {"fc1_bias": 0.0, "conv0_weight": 3.0}}


def _case(name, optimizer, seed, dtype="float32", lr_mult=None, wd_mult=None,
          check_unfused=False, layout=None, leaves=None, zero_grad_step=True, per_param=False,
          **kwargs):
  """``layout``: the case's state buffers where they differ from the optimizer's
  ``STATE_LAYOUT``: another key of ``STATE_LAYOUT`` (an option that changes MXNet's
  buffers, e.g. centered RMSProp) or a list (MXNet keeps no momentum buffer when
  ``momentum=0``, for example). ``leaves``: the parameters to use when the
  optimizer takes only some shapes. ``zero_grad_step=False`` replaces the all-zero
  gradient step by non-zero gradients (for optimizers that divide by a gradient's
  norm, where MXNet turns NaN). ``per_param``: one MXNet optimizer per parameter
  (for optimizers that keep per-step state on the optimizer object)."""
  return {"name": name, "optimizer": optimizer, "seed": seed, "dtype": dtype,
          "kwargs": kwargs, "lr_mult": lr_mult, "wd_mult": wd_mult,
          "check_unfused": check_unfused, "layout": layout, "leaves": leaves,
          "zero_grad_step": zero_grad_step, "per_param": per_param}


def _without_zero_grad_step(grads, seed, dtype):
  """The gradients with the all-zero step replaced by non-zero ones (for optimizers
  that divide by the gradient's norm)."""
  rng = np.random.default_rng(seed + 10_000)
  grads = list(grads)
  grads[ALL_ZERO_GRAD_STEP - 1] = {
      name: (0.3 * rng.standard_normal(g.shape)).astype(dtype)
      for name, g in grads[ALL_ZERO_GRAD_STEP - 1].items()}
  return grads


# One block per family of optimizers. Random hyperparameters come from a
# default_rng with a fixed seed, so the file is reproducible.

# --- LAMB and LANS (the trust-ratio family) -------------------------------
# LAMB keeps (mean, var); so does LANS. Random hyperparameters cover every
# option: lower_bound (0.05 to 0.5) binds on the small leaves and lifts the
# zero-initialised one, upper_bound (1 to 2) binds on the large ones (weight
# norms are about 0.2 to 2.5 here), clip_gradient binds on the larger steps.
# LANS divides the gradient by its norm: MXNet's weights and moments become
# NaN for good at the all-zero gradient step, so the LANS cases replace that
# step's gradients with non-zero ones ("zero_grad_step": False); the test
# suite checks separately that our LANS stays finite there.
STATE_LAYOUT["lamb"] = ["mean", "var"]
STATE_LAYOUT["lans"] = ["mean", "var"]


def _trust_ratio_random(optimizer, seed, count):
  rng = np.random.default_rng(seed)
  cases = []
  for k in range(count):
    kwargs = {"learning_rate": float(rng.uniform(0.005, 0.05)),
              "beta1": float(rng.uniform(0.5, 0.95)),
              "beta2": float(rng.uniform(0.9, 0.999)),
              "epsilon": float(10.0 ** rng.uniform(-8, -3)),
              "lower_bound": float(rng.uniform(0.05, 0.5)),
              "upper_bound": float(rng.uniform(1.0, 2.0)),
              "wd": float(rng.uniform(0.0, 0.1)),
              "rescale_grad": float(rng.uniform(0.2, 2.0)),
              "clip_gradient": float(rng.uniform(0.2, 0.5) if optimizer == "lans"
                                     else rng.uniform(0.5, 2.0))}
    if optimizer == "lamb":
      kwargs["bias_correction"] = bool(k % 2)
    cases.append(_case(f"{optimizer}_random_{k}", optimizer, seed + k,
                       zero_grad_step=optimizer != "lans", **kwargs))
  return cases


TRUST_RATIO_CASES = [
    _case("lamb_defaults", "lamb", 300, check_unfused=True),
    *_trust_ratio_random("lamb", 310, 4),
    _case("lamb_no_bias_correction", "lamb", 320, bias_correction=False, wd=0.01,
          clip_gradient=1.0, check_unfused=True),
    _case("lamb_lower_bound_only", "lamb", 321, lower_bound=0.3, wd=0.02),
    _case("lamb_upper_bound_only", "lamb", 322, upper_bound=1.5, learning_rate=0.01),
    _case("lamb_mult", "lamb", 330, learning_rate=0.01, wd=0.05, **MULT),
    _case("lamb_float16_mp", "lamb", 340, dtype="float16", multi_precision=True,
          learning_rate=0.01, wd=0.01, lower_bound=0.1),
    _case("lans_defaults", "lans", 350, zero_grad_step=False, check_unfused=True),
    *_trust_ratio_random("lans", 360, 3),
    _case("lans_mult", "lans", 370, zero_grad_step=False, learning_rate=0.01, wd=0.05,
          **MULT),
    _case("lans_float16_mp", "lans", 380, zero_grad_step=False, dtype="float16",
          multi_precision=True, learning_rate=0.01, wd=0.01, upper_bound=1.5),
]

# --- Adam-like: adamw, adamax, nadam, adabelief, ftml (filled in below) ---
ADAPTIVE_CASES = []

# --- adagrad, groupadagrad, rmsprop, adadelta, ftrl (sums and averages of squares) -------
STATE_LAYOUT["adagrad"] = ["history"]
STATE_LAYOUT["groupadagrad"] = ["history"]  # one entry per row: shape (rows, 1)
MATRICES = ["fc1_weight", "zero_weight", "embed_weight"]  # the 2-d leaves
STATE_LAYOUT["rmsprop"] = ["var"]
STATE_LAYOUT["rmsprop_centered"] = ["mean", "var", "mom"]
STATE_LAYOUT["adadelta"] = ["acc_g", "acc_delta"]
STATE_LAYOUT["ftrl"] = ["z", "n"]
_ADAGRAD_RNG = np.random.default_rng(1500)


def _log_uniform(low, high):
  return float(np.exp(_ADAGRAD_RNG.uniform(np.log(low), np.log(high))))


def _base_kwargs():
  """Random MXNet base arguments: wd, rescale_grad, clip_gradient (every option on)."""
  return {"wd": _log_uniform(1e-4, 1e-1), "rescale_grad": float(_ADAGRAD_RNG.uniform(0.3, 2.0)),
          "clip_gradient": float(_ADAGRAD_RNG.uniform(0.5, 2.0))}


ADAGRAD_CASES = [
    _case("adagrad_defaults", "adagrad", 1501),
    _case("adagrad_random", "adagrad", 1502, learning_rate=_log_uniform(1e-3, 0.3),
          epsilon=_log_uniform(1e-8, 1e-2), **_base_kwargs()),
    _case("adagrad_mult", "adagrad", 1503, learning_rate=0.05, wd=0.01, **MULT),
    _case("adagrad_float16", "adagrad", 1504, dtype="float16", learning_rate=0.05, wd=0.01,
          multi_precision=True),
    # GroupAdaGrad takes 2-d weights only, and no weight decay.
    _case("groupadagrad_defaults", "groupadagrad", 1505, leaves=MATRICES),
    _case("groupadagrad_random", "groupadagrad", 1506, leaves=MATRICES,
          learning_rate=_log_uniform(1e-3, 0.3), epsilon=_log_uniform(1e-8, 1e-2),
          rescale_grad=float(_ADAGRAD_RNG.uniform(0.3, 2.0)),
          clip_gradient=float(_ADAGRAD_RNG.uniform(0.5, 2.0))),
    _case("groupadagrad_mult", "groupadagrad", 1507, leaves=MATRICES, learning_rate=0.05,
          lr_mult=MULT["lr_mult"]),
    _case("groupadagrad_float16", "groupadagrad", 1508, leaves=MATRICES, dtype="float16",
          learning_rate=0.05, multi_precision=True),
    _case("rmsprop_defaults", "rmsprop", 1511, check_unfused=True),
    _case("rmsprop_random", "rmsprop", 1512, check_unfused=True,
          learning_rate=_log_uniform(1e-4, 0.03), rho=float(_ADAGRAD_RNG.uniform(0.5, 0.99)),
          epsilon=_log_uniform(1e-8, 1e-3), clip_weights=float(_ADAGRAD_RNG.uniform(0.6, 1.0)),
          **_base_kwargs()),
    _case("rmsprop_centered_random", "rmsprop", 1515, check_unfused=True,
          layout="rmsprop_centered", centered=True, learning_rate=_log_uniform(1e-4, 0.03),
          rho=float(_ADAGRAD_RNG.uniform(0.5, 0.99)),
          momentum=float(_ADAGRAD_RNG.uniform(0.0, 0.95)), epsilon=_log_uniform(1e-8, 1e-3),
          clip_weights=float(_ADAGRAD_RNG.uniform(0.6, 1.0)), **_base_kwargs()),
    _case("rmsprop_centered_defaults", "rmsprop", 1516, check_unfused=True,
          layout="rmsprop_centered", centered=True),
    _case("rmsprop_mult", "rmsprop", 1513, check_unfused=True, learning_rate=0.01, wd=0.01,
          **MULT),
    _case("rmsprop_centered_mult", "rmsprop", 1517, check_unfused=True,
          layout="rmsprop_centered", centered=True, learning_rate=0.01, wd=0.01, **MULT),
    _case("rmsprop_float16", "rmsprop", 1514, dtype="float16", learning_rate=0.01, wd=0.01,
          multi_precision=True),
    _case("rmsprop_centered_float16", "rmsprop", 1518, dtype="float16",
          layout="rmsprop_centered", centered=True, learning_rate=0.01, wd=0.01,
          multi_precision=True),
    _case("adadelta_defaults", "adadelta", 1521),
    _case("adadelta_random", "adadelta", 1522, learning_rate=float(_ADAGRAD_RNG.uniform(0.3, 2.0)),
          rho=float(_ADAGRAD_RNG.uniform(0.5, 0.99)), epsilon=_log_uniform(1e-8, 1e-3),
          **_base_kwargs()),
    _case("adadelta_mult", "adadelta", 1523, wd=0.01, **MULT),
    _case("adadelta_float16", "adadelta", 1524, dtype="float16", wd=0.01, multi_precision=True),
    _case("ftrl_defaults", "ftrl", 1531, check_unfused=True),
    _case("ftrl_random", "ftrl", 1532, check_unfused=True,
          learning_rate=_log_uniform(1e-2, 1.0), lamda1=_log_uniform(1e-3, 0.3),
          beta=float(_ADAGRAD_RNG.uniform(0.1, 3.0)), **_base_kwargs()),
    _case("ftrl_mult", "ftrl", 1533, check_unfused=True, wd=0.01, **MULT),
    _case("ftrl_float16", "ftrl", 1534, dtype="float16", wd=0.01, multi_precision=True),
]

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

# --- nag, dcasgd --------------------------------------------------------------
STATE_LAYOUT["nag"] = ["mom"]
STATE_LAYOUT["dcasgd"] = ["mom", "previous_weight"]
_SGD_RNG = np.random.default_rng(4000)


def _sgd_base(rng):
  """Random values of every base option (learning rate, wd, rescale, clip)."""
  return {"learning_rate": round(float(rng.uniform(0.01, 0.3)), 4),
          "wd": round(float(rng.uniform(1e-3, 3e-2)), 5),
          "rescale_grad": round(float(rng.uniform(0.3, 1.5)), 3),
          "clip_gradient": round(float(rng.uniform(0.5, 2.0)), 3)}


def _unit(rng, low=0.5, high=0.99):
  return round(float(rng.uniform(low, high)), 4)


OTHER_CASES = [
    _case("nag_defaults", "nag", 400, momentum=0.9, check_unfused=True),
    _case("nag_random", "nag", 401, check_unfused=True, momentum=_unit(_SGD_RNG),
          **_sgd_base(_SGD_RNG)),
    _case("nag_no_momentum", "nag", 402, check_unfused=True, layout=[], momentum=0.0,
          **_sgd_base(_SGD_RNG)),
    _case("nag_mult", "nag", 403, check_unfused=True, momentum=_unit(_SGD_RNG),
          learning_rate=0.1, wd=1e-2, **MULT),
    _case("nag_mp_f16", "nag", 404, dtype="float16", check_unfused=True, multi_precision=True,
          momentum=_unit(_SGD_RNG), **_sgd_base(_SGD_RNG)),
    _case("nag_mp_f16_no_momentum", "nag", 405, dtype="float16", check_unfused=True, layout=[],
          multi_precision=True, momentum=0.0, **_sgd_base(_SGD_RNG)),
    # DCASGD has only MXNet's plain-Python step (use_fused_step=False is its default).
    _case("dcasgd_defaults", "dcasgd", 410, layout=["previous_weight"]),
    _case("dcasgd_momentum_random", "dcasgd", 411, momentum=_unit(_SGD_RNG),
          lamda=_unit(_SGD_RNG, 0.05, 1.0), **_sgd_base(_SGD_RNG)),
    _case("dcasgd_no_momentum_random", "dcasgd", 412, layout=["previous_weight"], momentum=0.0,
          lamda=_unit(_SGD_RNG, 0.05, 1.0), **_sgd_base(_SGD_RNG)),
    _case("dcasgd_mult", "dcasgd", 413, momentum=_unit(_SGD_RNG), lamda=0.5, learning_rate=0.1,
          wd=1e-2, **MULT),
    _case("dcasgd_mp_f16", "dcasgd", 414, dtype="float16", multi_precision=True,
          momentum=_unit(_SGD_RNG), lamda=_unit(_SGD_RNG, 0.05, 1.0), **_sgd_base(_SGD_RNG)),
    _case("dcasgd_mp_f16_no_momentum", "dcasgd", 415, dtype="float16", multi_precision=True,
          layout=["previous_weight"], momentum=0.0, lamda=_unit(_SGD_RNG, 0.05, 1.0),
          **_sgd_base(_SGD_RNG)),
]

CASES = [*TRUST_RATIO_CASES, *ADAPTIVE_CASES, *ADAGRAD_CASES, *OTHER_CASES]


# --------------------------------------------------------------------------
# MXNet
# --------------------------------------------------------------------------

def _state_layout(case):
  """The names of the case's state buffers, in MXNet's order (without the master)."""
  layout = case["layout"]
  if layout is None:
    return list(STATE_LAYOUT[case["optimizer"]])
  return list(STATE_LAYOUT[layout]) if isinstance(layout, str) else list(layout)


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
  names = list(params)
  # per_param: one optimizer object per parameter (for optimizers that keep
  # per-step state on the object rather than per parameter).
  updaters = []
  for _ in range(len(names) if case["per_param"] else 1):
    opt = mx.optimizer.create(case["optimizer"], param_idx2name=dict(enumerate(names)),
                              **kwargs)
    if case["lr_mult"] is not None:
      opt.set_lr_mult(dict(case["lr_mult"]))
    if case["wd_mult"] is not None:
      opt.set_wd_mult(dict(case["wd_mult"]))
    updaters.append(mx.optimizer.get_updater(opt))
  weights_nd = [mx.nd.array(params[name], dtype=dtype) for name in names]
  weights_hist, states_hist = [], []
  for grad in grads:
    grads_nd = [mx.nd.array(grad[name], dtype=dtype) for name in names]
    if case["per_param"]:
      for idx, updater in enumerate(updaters):
        updater([idx], [grads_nd[idx]], [weights_nd[idx]])
    else:
      updaters[0](list(range(len(names))), grads_nd, weights_nd)
    weights_hist.append({})
    states_hist.append({})
    for idx, name in enumerate(names):
      w = weights_nd[idx].asnumpy()
      assert w.dtype == np.dtype(dtype), (name, w.dtype)
      weights_hist[-1][name] = w.copy()
      states_hist[-1][name] = _flat(updaters[idx if case["per_param"] else 0].states[idx])
  return weights_hist, states_hist


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.abs(a - b).max(initial=0.0) / max(np.abs(b).max(initial=0.0), 1e-30)


def _short(a):
  """Nested lists of the shortest decimals that give back the same float32/float16."""
  a = np.asarray(a)
  flat = [float(np.format_float_scientific(x, unique=True)) for x in a.ravel()]
  return np.array(flat, dtype=np.float64).reshape(a.shape).tolist()


def _tolist(tree):
  return {k: _short(v) for k, v in tree.items()}


def main():
  print("MXNet", mx.__version__, "numpy", np.__version__)
  out_cases = []
  names = [c["name"] for c in CASES]
  assert len(names) == len(set(names)), "duplicate case names"
  for case in CASES:
    params, grads = make_data(case["seed"], case["dtype"], False)
    if case["leaves"] is not None:
      params = {n: params[n] for n in case["leaves"]}
      grads = [{n: g[n] for n in case["leaves"]} for g in grads]
    if not case["zero_grad_step"]:
      grads = _without_zero_grad_step(grads, case["seed"], case["dtype"])
    weights, states = run_mxnet(case, params, grads)
    for step in weights:
      for name, w in step.items():
        assert np.all(np.isfinite(w)), (case["name"], name)
    layout = _state_layout(case)
    n_bufs = len(layout) + (1 if case["kwargs"].get("multi_precision") and
                            case["dtype"] == "float16" else 0)
    for step in states:
      for name, bufs in step.items():
        assert len(bufs) == n_bufs, (case["name"], name, len(bufs), layout)
    if case["check_unfused"]:
      w2, s2 = run_mxnet(case, params, grads, use_fused_step=False)
      worst = max(_rel(a[n], b[n]) for a, b in zip(w2, weights) for n in params)
      worst_s = max((_rel(x, y) for a, b in zip(s2, states) for n in params
                     for x, y in zip(a[n], b[n])), default=0.0)
      print(f"  {case['name']}: fused vs plain step, weights {worst:.1e}, states {worst_s:.1e}")
      tol = UNFUSED_TOL if case["check_unfused"] is True else case["check_unfused"]
      assert max(worst, worst_s) <= tol, case["name"]
    entry = {"name": case["name"], "optimizer": case["optimizer"], "dtype": case["dtype"],
             "kwargs": dict(case["kwargs"])}
    entry["state_layout"] = _state_layout(case)
    entry["buffers"] = case["layout"] if isinstance(case["layout"], str) else case["optimizer"]
    for key in ("lr_mult", "wd_mult"):
      if case[key] is not None:
        entry[key] = dict(case[key])
    entry.update({
        "params": _tolist(params),
        "grads": [_tolist(g) for g in grads],
        "weights": [_tolist(w) for w in weights],
        "states": [{n: [_short(b) for b in bufs] for n, bufs in step.items()}
                   for step in states],
    })
    out_cases.append(entry)
    print(f"{case['name']}: ok")

  data = {"generator": GENERATOR, "mxnet_version": mx.__version__,
          "state_layout": STATE_LAYOUT, "cases": out_cases}
  with open(OUT_PATH, "w") as f:  # one case per line: compact, and diffs stay per case
    head = {k: x for k, x in data.items() if k != "cases"}
    f.write(json.dumps(head)[:-1] + ', "cases": [\n')
    f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in out_cases))
    f.write("\n]}\n")
  print(f"wrote tests/reference/{os.path.basename(OUT_PATH)} "
        f"({os.path.getsize(OUT_PATH)} bytes, {len(out_cases)} cases)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
