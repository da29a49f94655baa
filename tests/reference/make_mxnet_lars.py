"""Produce reference values for LARS by running Apache MXNet 2.0.0b1 itself.

The project's tests compare ``lars_optax`` against the numbers this script
writes to ``tests/reference/mxnet_lars.json``. The tests read only that JSON
file, so they never need MXNet. This script imports nothing from the project.

How to run it (from the repository root; MXNet 2.0.0b1 is a pre-release that
runs on CPU and needs an old numpy, so it lives in a virtual environment of its
own, kept out of git):

    python3 -m venv .venv-mx2
    .venv-mx2/bin/pip install "mxnet==2.0.0b1" "numpy<1.24"
    .venv-mx2/bin/python tests/reference/make_mxnet_lars.py

Running it again gives the same file (every random number comes from a
``numpy.random.default_rng`` with a fixed seed).

What it does
------------
Each case builds the optimizer with
``mx.optimizer.create('lars', param_idx2name={...}, **kwargs)`` and an updater
with ``mx.optimizer.get_updater(opt)``. It then runs 12 steps. Each step makes
a single updater call with every parameter: ``updater(indices, grads, weights)``,
the same way MXNet's Module and gluon Trainer call it. After each step it
records every weight and the momentum buffer that MXNet keeps
(``updater.states[index]``, which is ``None`` when ``momentum == 0``, so the
JSON leaves out the ``"momentum"`` key for those cases).

The parameter tree is the same in every case:

    fc1_weight   (4, 3)     LARS-scaled
    fc1_bias     (3,)       name ends in "bias"  -> trust ratio 1
    bn0_gamma    (3,)       name ends in "gamma" -> trust ratio 1
    bn0_beta     (3,)       name ends in "beta"  -> trust ratio 1
    conv0_weight (2, 3, 2)  LARS-scaled
    zero_weight  (3, 2)     LARS-scaled, starts at all zeros (||w|| == 0 fallback)

Gradients have per-step and per-leaf scales drawn from 0.05, 0.3, 1 and 3, so
the gradient norms vary a lot and clipping takes effect in the clip cases. At step 5 every
gradient is exactly zero (the ||g|| == 0 fallback for all leaves). At step 9
only ``conv0_weight`` gets a zero gradient (the fallback for one leaf while
the others are scaled as usual).

Cases (hyperparameters not listed take MXNet's defaults: learning_rate=0.1,
momentum=0, eta=0.001, epsilon=1e-8, wd=0, rescale_grad=1,
clip_gradient=None). Every case except ``defaults`` uses eta=0.1, so the
per-layer steps are large enough to see (relative change of about 1e-2 per step):

    defaults      all of MXNet's defaults (eta=0.001, momentum 0)
    plain         eta=0.1, momentum 0, wd 0
    momentum      eta=0.1, momentum 0.9
    wd            eta=0.1, momentum 0.9, wd 1e-2
    rescale       eta=0.1, momentum 0.9, wd 1e-3, rescale_grad 0.125
    clip          eta=0.1, momentum 0.9, wd 1e-3, rescale_grad 0.5, clip_gradient 0.5
    clip_nomom    eta=0.1, momentum 0,   wd 1e-3, rescale_grad 0.5, clip_gradient 0.5
    epsilon       eta=0.1, momentum 0.9, wd 1e-3, epsilon 0.1
    momentum_f64  the momentum case with float64 arrays (same data, same seed)
    clip_f64      the clip case with float64 arrays (same data, same seed)

Checks made while generating
----------------------------
The error measure below is, for each leaf and step,
max|a - b| / max|b|. The script prints the largest value for each case and
fails if it passes the tolerance.

1. A separate float64 numpy version of the rule (written for this script,
   following the update rule described in the project's notes) runs on the
   same data. It agrees with MXNet to at most 4.5e-7 in every case, the
   float64 cases included (see the next point).
2. The float64 cases are not computed in float64 all the way through.
   MXNet honours the dtype of the arrays: weights and the momentum buffer stay
   float64, and the elementwise update runs in float64. But:
   - The trust ratio is computed in float32. MXNet casts the weight and the
     gradient to float32 before taking their norms, and it does the ratio
     arithmetic on float32 arrays. Its norm uses a scaled sum of squares
     (running maximum and sum of squared ratios) in float32, so it differs in
     the last bit from a plain float32 sum about a third of the time.
   - ``lr * ratio`` is a Python float times the float32 ratio, formed in
     double. The update kernels take lr, momentum, wd, rescale_grad and
     clip_gradient as float32 parameters, so that product and every other
     hyperparameter are rounded to float32.
   A second numpy version that copies these roundings ("mx-precision" in the
   output) matches MXNet bit for bit in every case, float32 and float64 alike,
   on the machine where this file was made. So these roundings are the whole
   difference.
3. Each case is also run with ``aggregate_num=4``, which uses MXNet's fused
   multi-tensor path (``multi_sum_sq`` + ``multi_lars`` +
   ``preloaded_multi_sgd[_mom]_update``; the updater sends the 6 parameters in
   chunks of 4 and 2). It is also run with ``use_fused_step=False`` (the
   plain-Python ``step`` path). The script asserts that both give the same
   weights and momentum as the default path to 1e-6 relative. They do. The
   aggregate path agrees to at most 3.2e-7: it gets the norms and the ratio
   from other float32 kernels (``multi_sum_sq``/``multi_lars``), so they differ
   at the level of float32 rounding. The JSON therefore has no separate
   ``*_aggregate`` case. The unfused path is bit-identical for float32. For
   float64 it agrees to 2.9e-7, because it applies ``lr * ratio`` to the
   arrays as a double rather than through a kernel's float32 parameter. For
   float64 weights the aggregate path also forms ``lr * wd`` in float32; the
   default path does not (about 1e-11 relative).

Output format (read by the project's tests)::

    {"generator": "tests/reference/make_mxnet_lars.py",
     "mxnet_version": mx.__version__,
     "cases": [{"name", "dtype", "kwargs", "params", "grads", "weights",
                "momentum" (only when momentum != 0)}, ...]}

``grads[k]``, ``weights[k]`` and ``momentum[k]`` hold, for step k+1, the
gradient fed in and the values after the update. Numbers are the exact
float32 or float64 array values written as Python floats.
"""

import json
import os
import sys

import mxnet as mx
import numpy as np

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxnet_lars.json")
GENERATOR = "tests/reference/make_mxnet_lars.py"

NUM_STEPS = 12
ALL_ZERO_GRAD_STEP = 5  # 1-based step at which every gradient is zero
ONE_ZERO_GRAD_STEP = 9  # 1-based step at which only ONE_ZERO_GRAD_LEAF has a zero gradient
ONE_ZERO_GRAD_LEAF = "conv0_weight"
GRAD_SCALES = (0.05, 0.3, 1.0, 3.0)

# (name, shape, kind) -- kind picks the initialisation.
PARAMS = (
    ("fc1_weight", (4, 3), "weight"),
    ("fc1_bias", (3,), "small"),
    ("bn0_gamma", (3,), "gamma"),
    ("bn0_beta", (3,), "small"),
    ("conv0_weight", (2, 3, 2), "weight"),
    ("zero_weight", (3, 2), "zeros"),
)
SKIP_SUFFIXES = ("gamma", "beta", "bias")

DEFAULT_KWARGS = {
    "learning_rate": 0.1,
    "momentum": 0.0,
    "eta": 0.001,
    "epsilon": 1e-8,
    "wd": 0.0,
    "rescale_grad": 1.0,
    "clip_gradient": None,
}


def _case(name, dtype, seed, **overrides):
    kwargs = dict(DEFAULT_KWARGS)
    unknown = set(overrides) - set(kwargs)
    assert not unknown, unknown
    kwargs.update(overrides)
    return {"name": name, "dtype": dtype, "seed": seed, "kwargs": kwargs}


CASES = (
    _case("defaults", "float32", 100),
    _case("plain", "float32", 101, eta=0.1),
    _case("momentum", "float32", 102, eta=0.1, momentum=0.9),
    _case("wd", "float32", 103, eta=0.1, momentum=0.9, wd=1e-2),
    _case("rescale", "float32", 104, eta=0.1, momentum=0.9, wd=1e-3, rescale_grad=0.125),
    _case("clip", "float32", 105, eta=0.1, momentum=0.9, wd=1e-3, rescale_grad=0.5,
          clip_gradient=0.5),
    _case("clip_nomom", "float32", 106, eta=0.1, momentum=0.0, wd=1e-3, rescale_grad=0.5,
          clip_gradient=0.5),
    _case("epsilon", "float32", 107, eta=0.1, momentum=0.9, wd=1e-3, epsilon=0.1),
    # float64 twins: same seed -> same data (before the cast to float32).
    _case("momentum_f64", "float64", 102, eta=0.1, momentum=0.9),
    _case("clip_f64", "float64", 105, eta=0.1, momentum=0.9, wd=1e-3, rescale_grad=0.5,
          clip_gradient=0.5),
)

# Tolerances for the checks (leaf-wise max|a - b| / max|b|).
SELF_CHECK_TOL = {"float32": 2e-6, "float64": 2e-6}
MX_PRECISION_TOL = {"float32": 1e-6, "float64": 1e-12}
PATH_AGREEMENT_TOL = 1e-6


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------

def make_data(seed, dtype):
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
            if step == ALL_ZERO_GRAD_STEP or (step == ONE_ZERO_GRAD_STEP
                                              and name == ONE_ZERO_GRAD_LEAF):
                value = np.zeros(shape)
            grad[name] = value.astype(dtype)
        grads.append(grad)
    return params, grads


# --------------------------------------------------------------------------
# MXNet
# --------------------------------------------------------------------------

def run_mxnet(case, params, grads, **extra_opt_kwargs):
    """Run MXNet's LARS; return (weights after each step, momentum after each step or None)."""
    dtype = case["dtype"]
    names = [name for name, _, _ in PARAMS]
    idx2name = dict(enumerate(names))
    opt = mx.optimizer.create("lars", param_idx2name=idx2name, **case["kwargs"],
                              **extra_opt_kwargs)
    updater = mx.optimizer.get_updater(opt)

    weights_nd = [mx.nd.array(params[name], dtype=dtype) for name in names]
    weights_hist, mom_hist = [], []
    for grad in grads:
        grads_nd = [mx.nd.array(grad[name], dtype=dtype) for name in names]
        updater(list(range(len(names))), grads_nd, weights_nd)

        weights_hist.append({})
        mom_hist.append({})
        for idx, name in enumerate(names):
            w = weights_nd[idx].asnumpy()
            assert w.dtype == np.dtype(dtype), (name, w.dtype)
            weights_hist[-1][name] = w.copy()
            state = updater.states[idx]
            if case["kwargs"]["momentum"] == 0:
                assert state is None, (name, state)
            else:
                m = state.asnumpy()
                assert m.dtype == np.dtype(dtype), (name, m.dtype)
                mom_hist[-1][name] = m.copy()
    if case["kwargs"]["momentum"] == 0:
        mom_hist = None
    return weights_hist, mom_hist


# --------------------------------------------------------------------------
# Independent numpy versions of the rule, used only as a self-check
# --------------------------------------------------------------------------

def _mx_float32_norm(x):
    """L2 norm of the float32 copy of `x`, computed the way MXNet's `norm` does.

    MXNet reduces with a scaled sum of squares (keeping a running maximum
    `scale` and `ssq` = sum of (|v| / scale)^2), in float32, over the
    flattened array in order. Plain float32 or float64 summation differs from
    it in the last bit about a third of the time.
    """
    f32 = np.float32
    ssq, scale = f32(0), f32(0)
    for v in np.asarray(x, dtype=f32).ravel():
        if v != 0:
            a = abs(v)
            if scale < a:
                ssq = f32(1) + ssq * (scale / a) * (scale / a)
                scale = a
            else:
                ssq = ssq + (a / scale) * (a / scale)
    return f32(scale * np.sqrt(ssq))


def run_numpy(case, params, grads, mx_precision=False):
    """Apply the LARS rule (MXNet flavour) with numpy.

    mx_precision=False: everything in float64 with the hyperparameters as given.
    mx_precision=True: copy MXNet's roundings. The norms and trust ratio are in
    float32. lr * ratio and the other hyperparameters are rounded to float32.
    The elementwise update runs in the case dtype.
    """
    kw = case["kwargs"]
    dtype = np.dtype(case["dtype"]) if mx_precision else np.dtype("float64")

    def hyper(x):
        return float(np.float32(x)) if mx_precision else float(x)

    lr, momentum, wd = hyper(kw["learning_rate"]), hyper(kw["momentum"]), hyper(kw["wd"])
    rescale = hyper(kw["rescale_grad"])
    clip = None if kw["clip_gradient"] is None else hyper(kw["clip_gradient"])

    weights = {name: np.asarray(value, dtype=dtype).copy() for name, value in params.items()}
    moms = {name: np.zeros_like(value) for name, value in weights.items()}
    weights_hist, mom_hist = [], []
    for grad in grads:
        for name, w in weights.items():
            g = np.asarray(grad[name], dtype=dtype)
            if name.endswith(SKIP_SUFFIXES):
                step_lr = lr
            else:
                if mx_precision:
                    f32 = np.float32
                    w_norm = _mx_float32_norm(w)
                    g_norm = _mx_float32_norm(g.astype(f32) * f32(kw["rescale_grad"]))
                    with np.errstate(divide="ignore", invalid="ignore"):
                        ratio = (f32(kw["eta"]) * w_norm
                                 / ((g_norm + f32(kw["wd"]) * w_norm) + f32(kw["epsilon"])))
                else:
                    w_norm = float(np.linalg.norm(w))
                    g_norm = float(np.linalg.norm(rescale * g))
                    with np.errstate(divide="ignore", invalid="ignore"):
                        ratio = kw["eta"] * w_norm / (g_norm + wd * w_norm + kw["epsilon"])
                if w_norm == 0 or g_norm == 0 or not np.isfinite(ratio):
                    ratio = 1.0
                if mx_precision:
                    # MXNet multiplies the Python-float lr by the float32 ratio
                    # (in double), and the kernel rounds the product to float32.
                    step_lr = float(np.float32(kw["learning_rate"] * float(ratio)))
                else:
                    step_lr = lr * float(ratio)
            u = rescale * g
            if clip is not None:
                u = np.clip(u, -clip, clip)
            u = u + wd * w
            if kw["momentum"] != 0:
                moms[name] = (momentum * moms[name] - step_lr * u).astype(dtype)
                w = (w + moms[name]).astype(dtype)
            else:
                w = (w - step_lr * u).astype(dtype)
            weights[name] = w
        weights_hist.append({k: v.copy() for k, v in weights.items()})
        mom_hist.append({k: v.copy() for k, v in moms.items()})
    return weights_hist, (mom_hist if kw["momentum"] != 0 else None)


def max_rel_diff(hist_a, hist_b):
    """Largest leaf-wise max|a - b| / max|b| over all steps and leaves."""
    if hist_a is None or hist_b is None:
        assert hist_a is None and hist_b is None
        return 0.0
    worst = 0.0
    for step_a, step_b in zip(hist_a, hist_b):
        assert step_a.keys() == step_b.keys()
        for name in step_a:
            a = np.asarray(step_a[name], dtype=np.float64)
            b = np.asarray(step_b[name], dtype=np.float64)
            scale = np.max(np.abs(b))
            diff = np.max(np.abs(a - b))
            if scale == 0:
                assert diff == 0, (name, diff)
                continue
            worst = max(worst, diff / scale)
    return worst


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def _tolist(tree):
    return {name: np.asarray(value).tolist() for name, value in tree.items()}


def main():
    print("MXNet", mx.__version__, "numpy", np.__version__)
    out_cases = []
    for case in CASES:
        name, dtype = case["name"], case["dtype"]
        params, grads = make_data(case["seed"], dtype)

        weights, moms = run_mxnet(case, params, grads)

        # Other MXNet code paths must agree with the default one.
        agg_w, agg_m = run_mxnet(case, params, grads, aggregate_num=4)
        unf_w, unf_m = run_mxnet(case, params, grads, use_fused_step=False)
        d_agg = max(max_rel_diff(agg_w, weights), max_rel_diff(agg_m, moms))
        d_unf = max(max_rel_diff(unf_w, weights), max_rel_diff(unf_m, moms))
        assert d_agg <= PATH_AGREEMENT_TOL, (name, "aggregate_num=4", d_agg)
        assert d_unf <= PATH_AGREEMENT_TOL, (name, "use_fused_step=False", d_unf)

        # Self-checks against the numpy versions of the rule.
        ref_w, ref_m = run_numpy(case, params, grads)
        d_ref = max(max_rel_diff(weights, ref_w), max_rel_diff(moms, ref_m))
        mxp_w, mxp_m = run_numpy(case, params, grads, mx_precision=True)
        d_mxp = max(max_rel_diff(weights, mxp_w), max_rel_diff(moms, mxp_m))
        print(f"{name:13s} {dtype}: self-check float64 max rel {d_ref:.2e} | "
              f"mx-precision {d_mxp:.2e} | aggregate_num=4 {d_agg:.2e} | "
              f"use_fused_step=False {d_unf:.2e}")
        print(f"{'':13s} step 1 fc1_weight[0,0]: mxnet {float(weights[0]['fc1_weight'][0, 0]):.9g}"
              f" numpy {float(ref_w[0]['fc1_weight'][0, 0]):.9g};"
              f" step {ALL_ZERO_GRAD_STEP} (zero grads) zero_weight[0,0]: mxnet "
              f"{float(weights[ALL_ZERO_GRAD_STEP - 1]['zero_weight'][0, 0]):.9g}"
              f" numpy {float(ref_w[ALL_ZERO_GRAD_STEP - 1]['zero_weight'][0, 0]):.9g}")
        clip = case["kwargs"]["clip_gradient"]
        if clip is not None:
            scaled = np.concatenate([case["kwargs"]["rescale_grad"] * np.ravel(g[k])
                                     for g in grads for k in g])
            n_clipped = int(np.sum(np.abs(scaled) > clip))
            print(f"{'':13s} clip_gradient={clip}: {n_clipped} of {scaled.size} rescaled "
                  f"gradient entries are clipped")
            assert n_clipped > scaled.size // 10, n_clipped
        assert d_ref <= SELF_CHECK_TOL[dtype], (name, d_ref)
        assert d_mxp <= MX_PRECISION_TOL[dtype], (name, d_mxp)

        entry = {
            "name": name,
            "dtype": dtype,
            "kwargs": dict(case["kwargs"]),
            "params": _tolist(params),
            "grads": [_tolist(g) for g in grads],
            "weights": [_tolist(w) for w in weights],
        }
        if moms is not None:
            entry["momentum"] = [_tolist(m) for m in moms]
        out_cases.append(entry)

    data = {"generator": GENERATOR, "mxnet_version": mx.__version__, "cases": out_cases}
    with open(OUT_PATH, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT_PATH} ({os.path.getsize(OUT_PATH)} bytes, {len(out_cases)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
