"""Produce reference values for Signum/signSGD, Adam, SGD and LARS by running Apache MXNet 2.0.0b1.

The project's tests compare ``lars_optax`` against the numbers this script
writes to ``tests/reference/mxnet_optimizers.json``. The tests read only that
JSON file, so they never need MXNet. This script imports nothing from the
project. It is the companion of ``tests/reference/make_mxnet_lars.py`` (which
covers the plain LARS hyperparameters); this one covers the other MXNet
optimizers and the parts of MXNet's optimizer base that they share:
``lr_mult``/``wd_mult``, learning-rate schedules with ``begin_num_update``,
row-sparse gradients with and without ``lazy_update``, and float16 weights
with ``multi_precision``.

How to run it (from the repository root; MXNet 2.0.0b1 is a pre-release that
runs on CPU and needs an old numpy, so it lives in a virtual environment of its
own, kept out of git):

    python3 -m venv .venv-mx2
    .venv-mx2/bin/pip install "mxnet==2.0.0b1" "numpy<1.24"
    .venv-mx2/bin/python tests/reference/make_mxnet_optimizers.py

Running it again gives the same file (every random number comes from a
``numpy.random.default_rng`` with a fixed seed). It takes a few seconds.

What it does
------------
Each case builds the optimizer with
``mx.optimizer.create(optimizer, param_idx2name={...}, **kwargs)`` (plus
``lr_scheduler=...`` in the schedule cases), sets ``opt.set_lr_mult(...)`` /
``opt.set_wd_mult(...)`` (keyed by parameter name) where the case has them,
and makes an updater with ``mx.optimizer.get_updater(opt)``. It then runs 12
steps. Each step makes a single updater call with every parameter,
``updater(indices, grads, weights)``, the way MXNet's Module and gluon Trainer
call it. After each step it records every weight and the state buffers MXNet
keeps in ``updater.states[index]``:

    signum (momentum != 0), sgd, lars (momentum != 0):  mom
    signum with momentum == 0 (signSGD):                no state (None)
    adam:                                               (mean, var)
    multi_precision with float16 weights:               (master, <the above>)

With ``multi_precision=True`` and float16 weights the state is a tuple whose
first item is a float32 copy of the weight (the "master" weight, made from the
float16 weight when the state is created) and whose second item is the state
the optimizer keeps for float32 weights, in float32: for sgd and lars
``(master, mom)``, for adam ``(master, (mean, var))``. The update runs on the
master and the float16 weight is then overwritten with the master cast to
float16. (Adam has no multi-precision kernel of its own: the optimizer base
casts the float16 gradient to float32 and runs the float32 update on the
master. SGD and LARS use the ``mp_sgd_mom_update`` kernel, which takes the
float16 gradient and weight directly; LARS takes ``||w||`` from the float16
weight, not from the master.)

The parameter tree is the same in every case:

    fc1_weight   (4, 3)     0.5 * N(0, 1)
    fc1_bias     (3,)       0.1 * N(0, 1)   (LARS: name ends in "bias"  -> trust ratio 1)
    bn0_gamma    (3,)       1 + 0.1 * N(0, 1) (LARS: ends in "gamma" -> trust ratio 1)
    bn0_beta     (3,)       0.1 * N(0, 1)   (LARS: ends in "beta"  -> trust ratio 1)
    conv0_weight (2, 3, 2)  0.5 * N(0, 1)
    zero_weight  (3, 2)     all zeros at the start
    embed_weight (8, 3)     0.5 * N(0, 1)   (the row-sparse cases' embedding-like leaf)

Gradients have per-step and per-leaf scales drawn from 0.05, 0.3, 1 and 3 (as
in the LARS script), so clipping takes effect in the clip cases. At step 5
every gradient is exactly zero. In the "sparse" cases, at every other step
each leaf's gradient has a random subset of its rows (index along axis 0;
each row zero with probability 1/2, redrawn until at least one row is zero and
at least one is not) set exactly to zero, and the gradients are given to MXNet
as ``row_sparse`` NDArrays made with ``mx.nd.array(g).tostype('row_sparse')``.
The script asserts that their ``indices`` are exactly the rows of ``g`` with a
non-zero entry (at step 5 there are none). Weights and states are always dense
(default storage type); with a dense weight and a row-sparse gradient MXNet's
``lazy_update=True`` kernels leave the absent rows of the weight and of the
state untouched, and with ``lazy_update=False`` they do the standard (dense)
update, treating absent rows as zero gradient.

Cases (hyperparameters not listed take MXNet's defaults; signum:
learning_rate=0.01, momentum=0.9, wd_lh=0; adam: learning_rate=0.001,
beta1=0.9, beta2=0.999, epsilon=1e-8, lazy_update=False; sgd:
learning_rate=0.1, momentum=0, lazy_update=False; lars: learning_rate=0.1,
momentum=0, eta=0.001, epsilon=1e-8; every optimizer: wd=0, rescale_grad=1,
clip_gradient=None, begin_num_update=0, multi_precision=False):

    signum_defaults    signum, all defaults
    signum_full        signum, momentum 0.9, wd 1e-2, wd_lh 1e-2, rescale_grad 0.5,
                       clip_gradient 0.5, learning_rate 0.01
    signsgd            signum, momentum 0 (signSGD, no state), wd 1e-2, wd_lh 2e-2,
                       learning_rate 0.01
    signum_mult        signum, momentum 0.9, wd 1e-2, wd_lh 1e-3, multipliers A
    adam_defaults      adam, all defaults
    adam_full          adam, learning_rate 0.01, wd 1e-2, rescale_grad 0.5, clip_gradient 0.5,
                       beta1 0.8, beta2 0.99, epsilon 1e-6
    adam_lazy          adam, sparse, lazy_update True, learning_rate 0.01, wd 1e-2
    adam_dense_sparse  adam, sparse, lazy_update False, learning_rate 0.01, wd 1e-2
    adam_sched         adam, learning_rate 0.01, wd 1e-3, begin_num_update 2,
                       FactorScheduler(step=3, factor=0.5, base_lr=0.01)
    adam_mult          adam, learning_rate 0.01, wd 1e-2, multipliers B
    adam_mp_f16        adam, float16, multi_precision True, learning_rate 0.01, wd 1e-3
    adam_lazy_mp_f16   adam, float16, sparse, lazy_update True, multi_precision True,
                       learning_rate 0.01, wd 1e-3
    sgd_momentum       sgd, learning_rate 0.1, momentum 0.9, wd 1e-3, rescale_grad 0.5,
                       clip_gradient 1
    sgd_lazy           sgd, sparse, lazy_update True, momentum 0.9, learning_rate 0.1, wd 1e-3
    sgd_mult_sched     sgd, momentum 0.9, learning_rate 0.1, wd 1e-2, begin_num_update 0,
                       multipliers B, FactorScheduler(step=4, factor=0.1, base_lr=0.1)
    sgd_mp_f16         sgd, float16, multi_precision True, momentum 0.9, learning_rate 0.1, wd 1e-3
    lars_mult          lars, eta 0.1, momentum 0.9, wd 1e-2, multipliers A
    lars_mp_f16        lars, float16, multi_precision True, eta 0.1, momentum 0.9, wd 1e-3
    lars_sched         lars, eta 0.1, momentum 0.9, learning_rate 0.1, begin_num_update 1,
                       FactorScheduler(step=3, factor=0.5, base_lr=0.1)

with the multipliers (set with ``opt.set_lr_mult`` / ``opt.set_wd_mult``)

    A: lr_mult {fc1_weight: 0.5, bn0_gamma: 2},    wd_mult {fc1_bias: 0, conv0_weight: 3}
    B: lr_mult {fc1_weight: 0.5, embed_weight: 3}, wd_mult {fc1_bias: 0, conv0_weight: 3}

(``sgd_mult_sched`` uses wd 1e-2 so that wd_mult has something to act on.)

Left out because MXNet rejects them: ``lazy_update=True`` together with
``multi_precision=True`` for sgd and lars (they assert against it in their
constructors; Adam takes both, ``adam_lazy_mp_f16``: the optimizer base casts
the float16 row_sparse gradient to float32 and the lazy kernel updates the
present rows of the float32 master), and ``lazy_update=True`` with
``use_fused_step=False``.

What MXNet does that these cases show (each is checked by the numpy rule
below, which agrees with MXNet only if it is modelled this way):

- ``lr_mult`` multiplies the learning rate and ``wd_mult`` multiplies ``wd``,
  looked up by parameter name. Signum's ``wd_lh`` is NOT multiplied by
  ``wd_mult`` (it is ``self.wd_lh``); it enters as ``lr * wd_lh``, so it does
  scale with ``lr_mult`` (and with the schedule).
- signSGD (momentum 0) uses ``wd + wd_lh`` as one decay,
  ``w = (1 - lr * (wd + wd_lh)) * w - lr * sign(g)``; its kernel ignores
  ``rescale_grad`` and ``clip_gradient`` (with a positive ``rescale_grad``
  they could not change ``sign(g)`` anyway; the script also runs it with
  ``rescale_grad=-1`` and ``clip_gradient=0.5`` and gets the same weights bit
  for bit).
  ``sign(0) = 0``: at step 5 only the decay acts.
- Adam's bias-correction step count ``t`` is MXNet's per-parameter update
  count, which starts at ``begin_num_update``: in ``adam_sched`` (begin 2) the
  first step uses ``t = 3``. So ``t`` = ``num_update`` below.
- Adam ``lazy_update=True``: absent rows keep weight, mean and var; ``t``
  still advances every step (it is the parameter's count, not a row's).
  ``lazy_update=False`` with a row-sparse gradient is the ordinary dense update.
- SGD ``lazy_update=True``: absent rows keep weight and momentum unchanged;
  no weight decay and no momentum decay is applied to them (at step 5, whose
  gradient has no rows at all, nothing changes).
- Learning-rate schedules: at step k (1-based) every parameter of the updater
  call uses ``lr = scheduler(num_update)`` with
  ``num_update = begin_num_update + k`` (the updater updates the parameters one
  at a time and the scheduler is called once per parameter, always with that
  same value). ``learning_rate`` given to the optimizer overwrites the
  scheduler's ``base_lr`` (here they are equal). ``FactorScheduler`` is
  stateful Python (it multiplies ``base_lr`` by ``factor`` in place each time
  ``num_update`` passes ``count + step``), but for increasing ``num_update``
  it computes
      lr = base_lr * factor ** floor((num_update - 1) / step)   for num_update >= 1,
  as long as that stays above ``stop_factor_lr`` (default 1e-8; not reached
  here). The script records the values MXNet used and asserts this closed form
  (to 1e-12 relative, as the scheduler forms it by repeated multiplication).

Checks made while generating
----------------------------
The error measure is, for each leaf and step, max|a - b| / max|b|. The script
prints the largest value for each case and fails if it passes the tolerance.

1. A separate float64 numpy version of each rule (signum/signSGD, adam with
   lazy rows, sgd with momentum ``mom = momentum * mom - lr * (clip(rescale *
   g) + wd * w); w += mom`` with lazy rows, lars), with lr_mult, wd_mult, the
   closed-form schedule and ``t = num_update``, runs on the same data and is
   compared with MXNet's weights and every state buffer. For float16 cases it
   runs on a float64 copy of the master weight (starting from the float16
   initial values); its LARS takes ``||w||`` from that master cast to float16,
   as MXNet does. Weights (float32 cases) and masters (float16 cases) agree to
   at most 5.2e-7 for signum, sgd and lars, and state buffers to 1.3e-6.
   Adam agrees to 6.8e-6 (weights, masters) and 1.3e-5 (states): MXNet's
   fused kernel receives beta2 as a float32 parameter and forms ``1 - beta2``
   in float32, and 1 - float32(0.999) = 0.00099998713, 1.3e-5 below 0.001;
   ``var`` carries that relative error. A second run of the numpy rule that
   copies this rounding ("kernel_betas"; it changes nothing else) agrees to at
   most 4.3e-7 in every Adam case. (With beta2=0.99, ``adam_full``, the
   rounding is 1e-6.)
2. The float16 weight MXNet returns is asserted to be exactly MXNet's own
   float32 master cast to float16, at every step. Cast from the numpy master,
   the float16 weights match exactly for sgd and lars; for adam 5 of 756
   entries land on the other side of a float16 rounding boundary (one
   float16 ulp; reported, not asserted).
3. For signum, sign flips: if MXNet's float32 momentum and the float64 one
   had opposite signs somewhere, the weight would differ by 2 * lr there. The
   script asserts there are none and prints the smallest |mom| seen (5e-6 in
   ``signum_full``, far above float32 rounding of the momentum).
4. Every dense case is also run with ``use_fused_step=False`` (the
   plain-Python ``step`` path) and must agree with the default (fused kernel)
   path: exactly for sgd and lars, to 5e-7 for signum, and to 1.3e-5 for
   adam (the plain path forms ``1 - beta2`` in double). For float16
   multi-precision cases the masters and states are compared; LARS's plain
   path takes ``||w||`` from the float32 master instead of the float16 weight
   and differs by 1.7e-4 there.
5. In ``signsgd`` a run with ``rescale_grad=-1, clip_gradient=0.5`` gives the
   same weights bit for bit, and step 5 (zero gradients) is the decay alone.
6. Row-sparse cases: with ``lazy_update=True`` every absent row of the weight
   is asserted unchanged (state rows are checked by the numpy rule).
7. Schedules: per step, one scheduler call per parameter, all with
   ``num_update = begin_num_update + step``; the value equals the closed
   form above. ``adam_sched`` (begin 2) calls it with 3..14, ``sgd_mult_sched``
   (begin 0) with 1..12 (lr 0.1 for 1-4, 0.01 for 5-8, 0.001 for 9-12) and
   ``lars_sched`` (begin 1) with 2..13.

Output format (read by the project's tests)::

    {"generator": "tests/reference/make_mxnet_optimizers.py",
     "mxnet_version": mx.__version__,
     "cases": [{"name", "optimizer" ("signum" | "adam" | "sgd" | "lars"),
                "dtype" ("float32" | "float16"),
                "kwargs": the keyword arguments given to mx.optimizer.create
                          other than param_idx2name and lr_scheduler,
                "lr_mult", "wd_mult": name -> multiplier (only when used),
                "lr_scheduler": {"type": "FactorScheduler", "step", "factor",
                                 "base_lr", "stop_factor_lr"} (only when used),
                "lr_calls": per step [num_update, lr] of the scheduler call
                            MXNet made for it (only when a scheduler is used),
                "sparse": whether gradients were given as row_sparse,
                "params": initial weights, name -> nested list,
                "grads": per step, name -> gradient fed in,
                "weights": per step, name -> weight after the update,
                "states": per step, name -> {"mom"} or {"mean", "var"}, plus
                          "master" for multi_precision (names without state
                          are left out; signSGD has {} at every step)}, ...]}

Step k+1 is at list index k. Numbers are the exact float32 or float16 array
values written as Python floats (state buffers of float16 cases are float32).
"""

import json
import math
import os
import sys

import mxnet as mx
import numpy as np

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxnet_optimizers.json")
GENERATOR = "tests/reference/make_mxnet_optimizers.py"

NUM_STEPS = 12
ALL_ZERO_GRAD_STEP = 5  # 1-based step at which every gradient is zero
GRAD_SCALES = (0.05, 0.3, 1.0, 3.0)

# (name, shape, kind) -- kind picks the initialisation.
PARAMS = (
    ("fc1_weight", (4, 3), "weight"),
    ("fc1_bias", (3,), "small"),
    ("bn0_gamma", (3,), "gamma"),
    ("bn0_beta", (3,), "small"),
    ("conv0_weight", (2, 3, 2), "weight"),
    ("zero_weight", (3, 2), "zeros"),
    ("embed_weight", (8, 3), "weight"),
)
NAMES = tuple(name for name, _, _ in PARAMS)
LARS_SKIP_SUFFIXES = ("gamma", "beta", "bias")

# MXNet's defaults, used by the numpy rules (checked against the optimizer objects).
BASE_DEFAULTS = {"wd": 0.0, "rescale_grad": 1.0, "clip_gradient": None,
                 "begin_num_update": 0, "multi_precision": False}
DEFAULTS = {
    "signum": {"learning_rate": 0.01, "momentum": 0.9, "wd_lh": 0.0},
    "adam": {"learning_rate": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8,
             "lazy_update": False},
    "sgd": {"learning_rate": 0.1, "momentum": 0.0, "lazy_update": False},
    "lars": {"learning_rate": 0.1, "momentum": 0.0, "eta": 0.001, "epsilon": 1e-8,
             "lazy_update": False},
}

MULT_A = {"lr_mult": {"fc1_weight": 0.5, "bn0_gamma": 2.0},
          "wd_mult": {"fc1_bias": 0.0, "conv0_weight": 3.0}}
MULT_B = {"lr_mult": {"fc1_weight": 0.5, "embed_weight": 3.0},
          "wd_mult": {"fc1_bias": 0.0, "conv0_weight": 3.0}}


def _case(name, optimizer, seed, dtype="float32", sparse=False, lr_mult=None, wd_mult=None,
          lr_scheduler=None, **kwargs):
    unknown = set(kwargs) - set(DEFAULTS[optimizer]) - set(BASE_DEFAULTS)
    assert not unknown, (name, unknown)
    return {"name": name, "optimizer": optimizer, "seed": seed, "dtype": dtype,
            "sparse": sparse, "kwargs": kwargs, "lr_mult": lr_mult, "wd_mult": wd_mult,
            "lr_scheduler": lr_scheduler}


def _factor(step, factor, base_lr):
    return {"type": "FactorScheduler", "step": step, "factor": factor, "base_lr": base_lr,
            "stop_factor_lr": 1e-8}


CASES = (
    _case("signum_defaults", "signum", 300),
    _case("signum_full", "signum", 301, momentum=0.9, wd=1e-2, wd_lh=1e-2, rescale_grad=0.5,
          clip_gradient=0.5, learning_rate=0.01),
    _case("signsgd", "signum", 302, momentum=0.0, wd=1e-2, wd_lh=2e-2, learning_rate=0.01),
    _case("signum_mult", "signum", 303, momentum=0.9, wd=1e-2, wd_lh=1e-3, **MULT_A),
    _case("adam_defaults", "adam", 310),
    _case("adam_full", "adam", 311, learning_rate=0.01, wd=1e-2, rescale_grad=0.5,
          clip_gradient=0.5, beta1=0.8, beta2=0.99, epsilon=1e-6),
    _case("adam_lazy", "adam", 312, sparse=True, lazy_update=True, learning_rate=0.01, wd=1e-2),
    _case("adam_dense_sparse", "adam", 313, sparse=True, lazy_update=False, learning_rate=0.01,
          wd=1e-2),
    _case("adam_sched", "adam", 314, learning_rate=0.01, begin_num_update=2, wd=1e-3,
          lr_scheduler=_factor(3, 0.5, 0.01)),
    _case("adam_mult", "adam", 315, learning_rate=0.01, wd=1e-2, **MULT_B),
    _case("adam_mp_f16", "adam", 316, dtype="float16", multi_precision=True, learning_rate=0.01,
          wd=1e-3),
    _case("adam_lazy_mp_f16", "adam", 317, dtype="float16", sparse=True, lazy_update=True,
          multi_precision=True, learning_rate=0.01, wd=1e-3),
    _case("sgd_momentum", "sgd", 320, learning_rate=0.1, momentum=0.9, wd=1e-3, rescale_grad=0.5,
          clip_gradient=1.0),
    _case("sgd_lazy", "sgd", 321, sparse=True, lazy_update=True, momentum=0.9, learning_rate=0.1,
          wd=1e-3),
    _case("sgd_mult_sched", "sgd", 322, momentum=0.9, learning_rate=0.1, wd=1e-2,
          begin_num_update=0, lr_scheduler=_factor(4, 0.1, 0.1), **MULT_B),
    _case("sgd_mp_f16", "sgd", 323, dtype="float16", multi_precision=True, momentum=0.9,
          learning_rate=0.1, wd=1e-3),
    _case("lars_mult", "lars", 330, eta=0.1, momentum=0.9, wd=1e-2, **MULT_A),
    _case("lars_mp_f16", "lars", 331, dtype="float16", multi_precision=True, eta=0.1,
          momentum=0.9, wd=1e-3),
    _case("lars_sched", "lars", 332, eta=0.1, momentum=0.9, learning_rate=0.1,
          begin_num_update=1, lr_scheduler=_factor(3, 0.5, 0.1)),
)

# Tolerances for the checks (leaf-wise max|a - b| / max|b|).
SELF_CHECK_TOL = 1e-5       # MXNet vs the float64 numpy rule (float32 values / float32 master)
# States: Adam's var is off by up to 1.3e-5 relative (1 - float32(0.999) in the kernel).
SELF_CHECK_TOL_STATES = {"signum": 1e-5, "adam": 3e-5, "sgd": 1e-5, "lars": 1e-5}
KERNEL_BETAS_TOL = 2e-6     # ... with the kernel's float32 1 - beta copied
# use_fused_step=False vs the default path (Adam's plain path forms 1 - beta2 in double).
FUSED_PATH_TOL = {"signum": 1e-5, "adam": 3e-5, "sgd": 1e-5, "lars": 1e-5}
LARS_MP_PATH_TOL = 1e-3     # ... for LARS multi-precision (||w|| from master vs float16)
SCHEDULE_RTOL = 1e-12       # recorded scheduler values vs the closed form


def resolved(case):
    """All hyperparameters of the case, MXNet's defaults filled in."""
    kw = dict(BASE_DEFAULTS)
    kw.update(DEFAULTS[case["optimizer"]])
    kw.update(case["kwargs"])
    return kw


def is_mp(case):
    return case["dtype"] == "float16" and case["kwargs"].get("multi_precision", False)


def has_mom(case):
    return case["optimizer"] != "adam" and resolved(case)["momentum"] != 0


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------

def present_rows(g):
    """Boolean mask of the rows (axis 0) of `g` with at least one non-zero entry."""
    g = np.asarray(g)
    return np.any(g.reshape(g.shape[0], -1) != 0, axis=1)


def make_data(seed, dtype, sparse):
    """Initial parameters and the gradient of every step, as `dtype` arrays."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape, kind in PARAMS:
        if kind == "weight":
            value = 0.5 * rng.standard_normal(shape)
        elif kind == "gamma":
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif kind == "small":
            value = 0.1 * rng.standard_normal(shape)
        elif kind == "zeros":
            value = np.zeros(shape)
        else:
            raise ValueError(kind)
        params[name] = value.astype(dtype)

    grads = []
    for step in range(1, NUM_STEPS + 1):
        grad = {}
        for leaf, (name, shape, _) in enumerate(PARAMS):
            scale = GRAD_SCALES[(step + 2 * leaf) % len(GRAD_SCALES)]
            value = scale * rng.standard_normal(shape)
            if sparse:
                while True:
                    zero_rows = rng.random(shape[0]) < 0.5
                    if 0 < zero_rows.sum() < shape[0]:
                        break
                value[zero_rows] = 0.0
            if step == ALL_ZERO_GRAD_STEP:
                value = np.zeros(shape)
            value = value.astype(dtype)
            if sparse and step != ALL_ZERO_GRAD_STEP:
                rows = present_rows(value)
                assert np.array_equal(rows, ~zero_rows), (name, step)
            grad[name] = value
        grads.append(grad)
    return params, grads


# --------------------------------------------------------------------------
# MXNet
# --------------------------------------------------------------------------

class LoggedFactorScheduler(mx.lr_scheduler.FactorScheduler):
    """FactorScheduler that records every (num_update, lr) it is called with/returns."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def __call__(self, num_update):
        lr = super().__call__(num_update)
        self.calls.append((num_update, lr))
        return lr


def make_scheduler(spec):
    assert spec["type"] == "FactorScheduler"
    return LoggedFactorScheduler(step=spec["step"], factor=spec["factor"],
                                 base_lr=spec["base_lr"], stop_factor_lr=spec["stop_factor_lr"])


def to_nd_grad(value, dtype, sparse):
    g = mx.nd.array(value, dtype=dtype)
    if not sparse:
        return g
    rsp = g.tostype("row_sparse")
    assert rsp.stype == "row_sparse"
    indices = rsp.indices.asnumpy()
    assert np.array_equal(indices, np.flatnonzero(present_rows(value))), indices
    assert np.array_equal(rsp.data.asnumpy(), value[indices])
    return rsp


def _state_tree(case, state):
    """MXNet's updater state of one parameter -> {"mom"/"mean"/"var"/"master": numpy array}."""
    out = {}
    if is_mp(case):
        assert isinstance(state, tuple) and len(state) == 2, state
        master, state = state
        out["master"] = master
    if case["optimizer"] == "adam":
        assert isinstance(state, tuple) and len(state) == 2, state
        out["mean"], out["var"] = state
    elif has_mom(case):
        out["mom"] = state
    else:
        assert state is None, state
    state_dtype = "float32" if is_mp(case) else case["dtype"]
    result = {}
    for key, value in out.items():
        assert value.stype == "default", (key, value.stype)
        arr = value.asnumpy()
        assert arr.dtype == np.dtype(state_dtype), (key, arr.dtype)
        result[key] = arr.copy()
    return result


def run_mxnet(case, params, grads, **overrides):
    """Run MXNet; return (weights per step, states per step, lr_calls per step or None)."""
    dtype = case["dtype"]
    kwargs = dict(case["kwargs"])
    kwargs.update(overrides)
    scheduler = None
    if case["lr_scheduler"] is not None:
        scheduler = make_scheduler(case["lr_scheduler"])
        kwargs["lr_scheduler"] = scheduler
    opt = mx.optimizer.create(case["optimizer"], param_idx2name=dict(enumerate(NAMES)), **kwargs)
    if case["lr_mult"] is not None:
        opt.set_lr_mult(dict(case["lr_mult"]))
    if case["wd_mult"] is not None:
        opt.set_wd_mult(dict(case["wd_mult"]))
    if not overrides:
        # The numpy rules use these values; make sure they are MXNet's.
        kw = resolved(case)
        assert opt.lr == kw["learning_rate"], opt.lr
        for key in ("wd", "rescale_grad", "clip_gradient", "begin_num_update",
                    "multi_precision", *(k for k in DEFAULTS[case["optimizer"]]
                                         if k != "learning_rate")):
            assert getattr(opt, key) == kw[key], (key, getattr(opt, key), kw[key])
        if scheduler is not None:
            assert scheduler.base_lr == kw["learning_rate"]
    updater = mx.optimizer.get_updater(opt)

    weights_nd = [mx.nd.array(params[name], dtype=dtype) for name in NAMES]
    weights_hist, states_hist, lr_calls = [], [], []
    for grad in grads:
        grads_nd = [to_nd_grad(grad[name], dtype, case["sparse"]) for name in NAMES]
        n_calls = len(scheduler.calls) if scheduler is not None else 0
        updater(list(range(len(NAMES))), grads_nd, weights_nd)
        if scheduler is not None:
            calls = scheduler.calls[n_calls:]
            # One call per parameter, all with the same num_update and lr.
            assert len(calls) == len(NAMES), calls
            assert len(set(calls)) == 1, calls
            lr_calls.append([int(calls[-1][0]), float(calls[-1][1])])

        weights_hist.append({})
        states_hist.append({})
        for idx, name in enumerate(NAMES):
            w = weights_nd[idx]
            assert w.stype == "default"
            w = w.asnumpy()
            assert w.dtype == np.dtype(dtype), (name, w.dtype)
            weights_hist[-1][name] = w.copy()
            state = _state_tree(case, updater.states[idx])
            if state:
                states_hist[-1][name] = state
    return weights_hist, states_hist, (lr_calls if scheduler is not None else None)


# --------------------------------------------------------------------------
# Independent float64 numpy versions of the rules, used only as a self-check
# --------------------------------------------------------------------------

def closed_form_lr(spec, num_update):
    assert num_update >= 1
    return spec["base_lr"] * spec["factor"] ** math.floor((num_update - 1) / spec["step"])


def run_numpy(case, params, grads, kernel_betas=False):
    """Apply the case's rule in float64; returns (weights per step, states per step).

    For multi-precision cases the float64 weight plays the part of the master
    copy; "weights" are then that master cast to float16 and the state gets
    "master".

    kernel_betas=True copies one rounding of MXNet's fused kernels: they get
    Adam's beta1/beta2 (and Signum's momentum) as float32 parameters and form
    1 - beta in float32. Everything else stays float64.
    """
    opt, kw = case["optimizer"], resolved(case)

    def decay_pair(beta):
        """(beta, 1 - beta) as the rule uses them."""
        if kernel_betas:
            return float(np.float32(beta)), float(np.float32(1) - np.float32(beta))
        return beta, 1 - beta

    mp = is_mp(case)
    lr_mult, wd_mult = case["lr_mult"] or {}, case["wd_mult"] or {}
    rescale, clip = kw["rescale_grad"], kw["clip_gradient"]
    lazy = case["sparse"] and kw.get("lazy_update", False)

    weights = {name: np.asarray(params[name], dtype=np.float64).copy() for name in NAMES}
    state = {}
    for name in NAMES:
        if opt == "adam":
            state[name] = {"mean": np.zeros_like(weights[name]),
                           "var": np.zeros_like(weights[name])}
        elif has_mom(case):
            state[name] = {"mom": np.zeros_like(weights[name])}
        else:
            state[name] = {}

    weights_hist, states_hist = [], []
    for k, grad in enumerate(grads, start=1):
        num_update = kw["begin_num_update"] + k
        if case["lr_scheduler"] is not None:
            base_lr = closed_form_lr(case["lr_scheduler"], num_update)
        else:
            base_lr = kw["learning_rate"]
        for name in NAMES:
            w, s = weights[name], state[name]
            g = np.asarray(grad[name], dtype=np.float64)
            lr = base_lr * lr_mult.get(name, 1.0)
            wd = kw["wd"] * wd_mult.get(name, 1.0)
            u = rescale * g
            if clip is not None:
                u = np.clip(u, -clip, clip)
            u = u + wd * w

            new_s = {}
            if opt == "signum":
                if kw["momentum"] != 0:
                    mu, one_m_mu = decay_pair(kw["momentum"])
                    new_s["mom"] = mu * s["mom"] - one_m_mu * u
                    new_w = (1 - lr * kw["wd_lh"]) * w + lr * np.sign(new_s["mom"])
                else:
                    new_w = (1 - lr * (wd + kw["wd_lh"])) * w - lr * np.sign(g)
            elif opt == "adam":
                t = num_update
                b1, one_m_b1 = decay_pair(kw["beta1"])
                b2, one_m_b2 = decay_pair(kw["beta2"])
                new_s["mean"] = b1 * s["mean"] + one_m_b1 * u
                new_s["var"] = b2 * s["var"] + one_m_b2 * u * u
                # The bias correction is formed in Python (double) from the given betas.
                step_lr = (lr * math.sqrt(1 - kw["beta2"] ** t)
                           / (1 - kw["beta1"] ** t))
                new_w = w - step_lr * new_s["mean"] / (np.sqrt(new_s["var"]) + kw["epsilon"])
            elif opt in ("sgd", "lars"):
                step_lr = lr
                if opt == "lars" and not name.endswith(LARS_SKIP_SUFFIXES):
                    w_for_norm = w.astype(np.float16) if mp else w
                    wn = float(np.linalg.norm(w_for_norm.astype(np.float64)))
                    gn = float(np.linalg.norm(rescale * g))
                    ratio = 1.0
                    if wn > 0 and gn > 0:
                        ratio = kw["eta"] * wn / (gn + wd * wn + kw["epsilon"])
                    step_lr = lr * ratio
                if kw["momentum"] != 0:
                    new_s["mom"] = kw["momentum"] * s["mom"] - step_lr * u
                    new_w = w + new_s["mom"]
                else:
                    new_w = w - step_lr * u
            else:
                raise ValueError(opt)

            if lazy:
                rows = present_rows(g).reshape((-1,) + (1,) * (g.ndim - 1))
                new_w = np.where(rows, new_w, w)
                new_s = {key: np.where(rows, value, s[key]) for key, value in new_s.items()}
            weights[name] = new_w
            state[name] = new_s

        if mp:
            weights_hist.append({n: w.astype(np.float16) for n, w in weights.items()})
            states_hist.append({n: dict(state[n], master=weights[n].copy()) for n in NAMES})
        else:
            weights_hist.append({n: w.copy() for n, w in weights.items()})
            states_hist.append({n: dict(state[n]) for n in NAMES if state[n]})
    return weights_hist, states_hist


def _rel(a, b, name):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    scale = np.max(np.abs(b))
    diff = np.max(np.abs(a - b))
    if scale == 0:
        assert diff == 0, (name, diff)
        return 0.0
    return diff / scale


def max_rel_diff(hist_a, hist_b):
    """Largest leaf-wise max|a - b| / max|b| over all steps and leaves (nested dicts allowed)."""
    worst = 0.0
    for step_a, step_b in zip(hist_a, hist_b, strict=True):
        assert step_a.keys() == step_b.keys(), (step_a.keys(), step_b.keys())
        for name in step_a:
            if isinstance(step_a[name], dict):
                worst = max(worst, max_rel_diff([step_a[name]], [step_b[name]]))
            else:
                worst = max(worst, _rel(step_a[name], step_b[name], name))
    return worst


def states_only(hist, keys):
    return [{n: {k: v for k, v in s.items() if k in keys} for n, s in step.items()}
            for step in hist]


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def _tolist(tree):
    return {name: np.asarray(value).tolist() for name, value in tree.items()}


def check_case(case, params, grads, weights, states, lr_calls):
    """All self-checks for one case; prints one summary line (plus extras)."""
    name, mp = case["name"], is_mp(case)
    kw = resolved(case)
    msg = []

    if mp:
        # The float16 weight is MXNet's own master cast down, exactly.
        for step_w, step_s in zip(weights, states):
            for n in NAMES:
                assert np.array_equal(step_w[n], step_s[n]["master"].astype(np.float16)), (name, n)

    def compare(ref_w, ref_s):
        """(weights or master, float16 weights or None, other states) vs a numpy run."""
        if mp:
            d_w = max_rel_diff(states_only(states, ("master",)), states_only(ref_s, ("master",)))
            d_w16 = max_rel_diff(weights, ref_w)
        else:
            d_w, d_w16 = max_rel_diff(weights, ref_w), None
        d_s = max_rel_diff(states_only(states, ("mom", "mean", "var")),
                           states_only(ref_s, ("mom", "mean", "var")))
        return d_w, d_w16, d_s

    ref_w, ref_s = run_numpy(case, params, grads)
    d_w, d_w16, d_s = compare(ref_w, ref_s)
    msg.append(f"{'master' if mp else 'weights'} vs numpy {d_w:.2e}, states {d_s:.2e}"
               + (f" (float16 weights {d_w16:.2e})" if mp else ""))
    assert d_w <= SELF_CHECK_TOL, (name, d_w)
    assert d_s <= SELF_CHECK_TOL_STATES[case["optimizer"]], (name, d_s)
    if case["optimizer"] == "adam" or (case["optimizer"] == "signum" and has_mom(case)):
        kb_w, _, kb_s = compare(*run_numpy(case, params, grads, kernel_betas=True))
        msg.append(f"kernel_betas: {kb_w:.2e}, states {kb_s:.2e}")
        assert max(kb_w, kb_s) <= KERNEL_BETAS_TOL, (name, kb_w, kb_s)

    # Other MXNet code path (plain-Python `step`).
    if not case["sparse"]:
        unf_w, unf_s, _ = run_mxnet(case, params, grads, use_fused_step=False)
        if mp:
            d_unf = max_rel_diff(states, unf_s)
            tol = (LARS_MP_PATH_TOL if case["optimizer"] == "lars"
                   else FUSED_PATH_TOL[case["optimizer"]])
        else:
            d_unf = max(max_rel_diff(weights, unf_w), max_rel_diff(states, unf_s))
            tol = FUSED_PATH_TOL[case["optimizer"]]
        msg.append(f"use_fused_step=False {d_unf:.2e}")
        assert d_unf <= tol, (name, d_unf)
    print(f"{name:18s} {case['dtype']}: " + " | ".join(msg))

    if case["optimizer"] == "signum" and has_mom(case):
        flips, smallest = 0, np.inf
        for step_s, step_r in zip(states, ref_s):
            for n in NAMES:
                m, r = step_s[n]["mom"], step_r[n]["mom"]
                flips += int(np.sum(np.sign(m) != np.sign(r)))
                smallest = min(smallest, float(np.min(np.abs(m))))
        print(f"{'':18s} sign(mom) MXNet vs numpy: {flips} flips; smallest |mom| {smallest:.3e}")
        assert flips == 0, (name, flips)

    clip = kw["clip_gradient"]
    if clip is not None:
        scaled = np.concatenate([kw["rescale_grad"] * np.ravel(g[n]) for g in grads for n in g])
        n_clipped = int(np.sum(np.abs(scaled) > clip))
        print(f"{'':18s} clip_gradient={clip}: {n_clipped} of {scaled.size} rescaled gradient "
              f"entries are clipped")
        assert n_clipped > scaled.size // 10, n_clipped

    if case["sparse"]:
        total = sum(g[n].shape[0] for g in grads for n in NAMES)
        present = sum(int(present_rows(g[n]).sum()) for g in grads for n in NAMES)
        unchanged = 0
        for k in range(NUM_STEPS):
            before = params if k == 0 else weights[k - 1]
            for n in NAMES:
                absent = ~present_rows(grads[k][n])
                unchanged += int(np.sum(np.all(
                    (weights[k][n] == before[n]).reshape(len(absent), -1), axis=1)[absent]))
        print(f"{'':18s} row_sparse grads: {present} of {total} rows present; "
              f"{unchanged} of {total - present} absent rows left unchanged")
        if kw["lazy_update"]:
            assert unchanged == total - present, unchanged

    if lr_calls is not None:
        spec = case["lr_scheduler"]
        for k, (num_update, lr) in enumerate(lr_calls, start=1):
            assert num_update == kw["begin_num_update"] + k, (k, num_update)
            expected = closed_form_lr(spec, num_update)
            assert abs(lr - expected) <= SCHEDULE_RTOL * expected, (num_update, lr, expected)
            assert lr > spec["stop_factor_lr"], lr
        print(f"{'':18s} scheduler calls (num_update, lr): "
              + ", ".join(f"({u}, {lr:.6g})" for u, lr in lr_calls))

    if name == "signsgd":
        # signSGD's kernel ignores rescale_grad and clip_gradient.
        probe_w, _, _ = run_mxnet(case, params, grads, rescale_grad=-1.0, clip_gradient=0.5)
        same = all(np.array_equal(a[n], b[n]) for a, b in zip(weights, probe_w) for n in NAMES)
        print(f"{'':18s} same weights with rescale_grad=-1, clip_gradient=0.5: {same}")
        assert same
        zero_step = ALL_ZERO_GRAD_STEP - 1
        decay = 1 - kw["learning_rate"] * (kw["wd"] + kw["wd_lh"])
        d0 = max(_rel(weights[zero_step][n],
                      decay * weights[zero_step - 1][n].astype(np.float64), n) for n in NAMES)
        print(f"{'':18s} step {ALL_ZERO_GRAD_STEP} (zero grads) is the decay alone: "
              f"max rel diff {d0:.2e}")
        assert d0 <= SELF_CHECK_TOL


def main():
    print("MXNet", mx.__version__, "numpy", np.__version__)
    out_cases = []
    for case in CASES:
        params, grads = make_data(case["seed"], case["dtype"], case["sparse"])
        weights, states, lr_calls = run_mxnet(case, params, grads)
        check_case(case, params, grads, weights, states, lr_calls)

        entry = {"name": case["name"], "optimizer": case["optimizer"], "dtype": case["dtype"],
                 "kwargs": dict(case["kwargs"])}
        for key in ("lr_mult", "wd_mult", "lr_scheduler"):
            if case[key] is not None:
                entry[key] = dict(case[key])
        if lr_calls is not None:
            entry["lr_calls"] = lr_calls
        entry.update({
            "sparse": case["sparse"],
            "params": _tolist(params),
            "grads": [_tolist(g) for g in grads],
            "weights": [_tolist(w) for w in weights],
            "states": [{n: _tolist(s) for n, s in step.items()} for step in states],
        })
        out_cases.append(entry)

    data = {"generator": GENERATOR, "mxnet_version": mx.__version__, "cases": out_cases}
    with open(OUT_PATH, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"wrote tests/reference/{os.path.basename(OUT_PATH)} "
          f"({os.path.getsize(OUT_PATH)} bytes, {len(out_cases)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
