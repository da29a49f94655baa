"""Produce reference values for SVRG by running MXNet 1.9.1's ``SVRGModule``.

The project's tests compare their JAX replay of SVRG against the numbers this
script writes to ``tests/reference/mxnet_svrg.json``. The tests read only that
JSON file, so they never need MXNet. This script imports nothing from the
project.

How to run it (from the repository root). ``mxnet.contrib.svrg_optimization``
only exists in MXNet 1.x (it was removed in 2.0), and MXNet 1.9.1 needs an old
numpy. So it lives in a virtual environment of its own, kept out of git:

    python3 -m venv .venv-mx19
    .venv-mx19/bin/pip install "mxnet==1.9.1" "numpy<1.24"
    .venv-mx19/bin/python tests/reference/make_mxnet_svrg.py

Running it again gives the same file. Every random number comes from a
``numpy.random.default_rng`` with a fixed seed, there is no shuffling, and
everything runs on one CPU context. It takes a few seconds.

What it does
------------
The model is MXNet's own SVRG example (``example/svrg_module``): linear
regression with ``fc = FullyConnected(data, num_hidden=1, name="fc")`` and
``LinearRegressionOutput(fc, lin_reg_label)``. The data are 160 samples with 5
features, ``y = X @ w_true + b_true + noise``. They are fed through
``mx.io.NDArrayIter(X, y, batch_size=16, shuffle=False)``, so an epoch is 10
batches, always in the same order, with no padding. The batch size is a power
of two, so ``rescale_grad = 1/16`` is exact in float32 and the gradients in the
JSON (MXNet's raw values divided by 16) are exact.
The starting ``fc_weight`` (1, 5) and ``fc_bias`` (1,) are fixed float32 arrays,
passed to ``fit`` as ``arg_params``. ``fit`` runs 6 epochs with
``optimizer="sgd"``, ``optimizer_params={"learning_rate": 0.025}`` (no momentum,
no weight decay; the rate is the one in MXNet's example), ``update_freq=2`` and
the default ``kvstore="local"``. With one device that means no KVStore at all.

The script uses a subclass of ``SVRGModule`` that only records values. Its
``update_full_grads`` and ``update`` call the real methods and copy out, before
and after, the values MXNet actually uses: the snapshot weights (the auxiliary
module's parameters), the full-gradient accumulator ``_param_dict``, the raw
gradient at the current weights, the raw gradient at the snapshot (the
auxiliary module's gradient), the SVRG gradient that the optimizer gets, and the
weights after each update. A plain ``mx.mod.Module`` with the same start, data
and learning rate is trained with plain SGD for comparison.

What MXNet 1.9.1's SVRGModule does (read from
``mxnet/contrib/svrg_optimization/svrg_module.py`` and checked below)
----------------------------------------------------------------------
* Gradient scale. ``LinearRegressionOutput`` back-propagates
  ``pred - label`` for each sample, and ``FullyConnected`` sums over the batch.
  So MXNet's raw gradient is the gradient of the batch *sum*
  ``sum_i 0.5 * (x_i . w + b - y_i)^2``. ``SVRGModule._create_optimizer`` sets
  ``rescale_grad = 1/batch_size`` (as ``Module.init_optimizer`` does), and the
  wrapped SGD applies it to the whole SVRG gradient. So the effective loss is
  the batch *mean* (``"loss"`` in the JSON). All gradients in the JSON are in
  units of that loss (raw value * rescale_grad).
* Snapshot schedule. At the start of epoch ``e`` with ``e % update_freq == 0``,
  before that epoch's first batch. ``e`` is the absolute epoch number, counted
  from ``begin_epoch``. Here that is epochs 0, 2 and 4. So there is a snapshot
  at epoch 0, and it equals the initial weights. ``update_full_grads`` copies
  the current weights into the auxiliary module (w~), then runs a full pass over
  the iterator. The auxiliary module then keeps w~ until the next snapshot.
* Full-gradient average. The pass adds the raw gradient of every batch into
  ``_param_dict``, then divides by
  ``true_num_batch = num_batches - last_batch.pad / batch_size``. So it averages
  over batches, with a fractional correction for a padded last batch (the
  padded batch's gradient still includes the padding samples; read from the
  code, not exercised here). Here pad = 0, so it divides by 10.
* SURPRISE: the accumulator is never zeroed. ``_param_dict`` is set to zeros
  once, in ``init_optimizer``. ``update_full_grads`` adds into whatever it
  holds, which after the first snapshot is the previous full gradient. So
  MXNet's full gradient is
      mu_0 = mean_b grad L_b(w~_0),
      mu_k = mu_{k-1} / num_batches + mean_b grad L_b(w~_k)   (k >= 1),
  not the textbook ``mean_b grad L_b(w~_k)``. With 10 batches the stale term is
  a tenth of the previous full gradient. That changes the trajectory from epoch
  2 on (the script asserts the effect is clearly visible). The JSON records it
  in each ``full_grads`` entry as ``carried_in`` (the accumulator before the
  pass). For tests that want textbook SVRG, the JSON also has ``svrg_reset``.
  That is the same run with one patch: the accumulator is zeroed at the start
  of each ``update_full_grads``. It is *not* MXNet's behaviour.
* Per-batch rule (``_update_svrg_gradients``, in float32, in place):
  ``g = (grad_b(w) - grad_b(w~)) + mu``. Then the wrapped optimizer makes its
  usual step: SGD ``w <- w - lr * rescale_grad * g``. On the first batch after
  a snapshot, w == w~, so the two batch gradients are bit-identical and
  ``g == mu``.
* The SGD optimizer is created by ``_SVRGOptimizer`` (it wraps ``"sgd"``, with
  the same ``learning_rate`` and ``rescale_grad``, and does not pass ``sym``).
  wd = 0 here, so lr_mult/wd_mult play no part.

Weight decay: MXNet 1.x's name rule
-----------------------------------
``wd_runs`` repeats the SVRG run and the plain ``Module`` run with
``optimizer_params={"learning_rate": 0.025, "momentum": 0.9, "wd": 0.01}``.
MXNet 1.x's optimizer, when it is given ``param_idx2name`` (``Module`` and
``SVRGModule`` always give it), sets ``wd_mult = 0`` for every parameter whose
name ends in neither ``_weight`` nor ``_gamma`` (``Optimizer.set_wd_mult``). Here
that is ``fc_bias``: it is never decayed. MXNet 2.0 dropped the rule. The script
asserts the rule (the inner SGD's ``wd_mult`` is ``{"fc_bias": 0.0}``), records
it as ``wd_mult_set_by_mxnet``, and checks that it is visible: the same runs
with every parameter decayed (the rule patched out) end more than 1e-3 away.
The weights are recorded after each update (``weights``), as for plain SGD.

Checks made while generating
----------------------------
The error measure is, for each leaf and step, max|a - b| / max|b|. The script
prints the largest value and fails if it is above the tolerance.

1. A separate float64 numpy version of the rule (written for this script, from
   the description above) runs on the same float32 data and start. It must
   match MXNet's SVRG weights, snapshots, full gradients and per-batch
   gradients to 1e-5. The same holds for the reset variant against textbook
   SVRG, and for plain SGD. The SVRG gradient ``(g_w - g_snap) + mu`` can
   cancel (its bias entry gets as small as 4e-3), so its error is measured
   against the largest of the three terms instead of itself. On the machine
   where this file was made the largest errors were: weights 2.4e-6, mu
   1.1e-6, batch gradients 4.4e-6, reset variant 2.4e-6, plain SGD 2.0e-6.
2. On MXNet's own float32 numbers: the snapshot at epoch 0 equals the initial
   weights. Each recorded mu equals ``carried_in / 10`` plus the mean of the
   snapshot gradients of the following epoch. The SVRG gradient equals
   ``(g_w - g_snap) + mu`` bit for bit. On the first batch after a snapshot,
   ``g_w == g_snap``. Each SGD step matches ``w - lr * g / 16`` to float32
   rounding.
3. The carry-over matters. MXNet's weights differ from the textbook (reset)
   weights by more than 1e-3 relative. The numpy replay of the textbook rule
   does *not* match MXNet's unpatched run. And the SVRG weights differ from the
   plain SGD weights.

Output format (read by the project's tests)::

    {"generator": "tests/reference/make_mxnet_svrg.py",
     "mxnet_version": "1.9.1",
     "loss": "...",            # exact definition a replay must use
     "update_rule": "...",     # SVRG step as MXNet does it
     "full_grad_rule": "...",  # including the carried-in term
     "update_freq": 2, "learning_rate": 0.025, "batch_size": 16,
     "num_batches_per_epoch": 10, "num_epoch": 6, "rescale_grad": 0.0625,
     "X": [[...] x 160], "y": [...],                 # float32 values
     "w_true": [...], "b_true": ...,                 # how y was made (information only)
     "init": {"fc_weight": [[...]], "fc_bias": [...]},
     "full_grads": [{"epoch": e, "snapshot": {"fc_weight", "fc_bias"},
                     "carried_in": {"fc_weight", "fc_bias"},
                     "fc_weight": ..., "fc_bias": ...}, ...],   # mu, epochs 0, 2, 4
     "weights": [{"epoch": e, "batch": i, "fc_weight": ..., "fc_bias": ...}, ...],
     "batch_grads": [{"epoch": e, "batch": i,
                      "at_w": {...}, "at_snapshot": {...}, "svrg": {...}}, ...],
     "sgd_weights": [{"epoch", "batch", "fc_weight", "fc_bias"}, ...],
     "svrg_reset": {"note": "...", "full_grads": [...], "weights": [...]},
     "wd_runs": {"optimizer_params": {...}, "wd_mult_set_by_mxnet": {...},
                 "svrg": [{"epoch", "batch", "fc_weight", "fc_bias"}, ...],
                 "sgd": [...], "rule_visible": ...}}

``weights[k]`` holds the parameters after the k-th update (60 in all; ``epoch``
and ``batch`` are 0-based, with ``batch`` counted within the epoch).
``batch_grads[k]`` holds the gradients that update used, in loss units:
``at_w`` = grad L_b at the weights before the update, ``at_snapshot`` =
grad L_b(w~), ``svrg`` = what the optimizer got (times rescale_grad).
``full_grads[j]["snapshot"]`` is w~. Numbers are the exact float32 values
(gradients: exact float32 raw value / 16) written as Python floats.
"""

import itertools
import json
import logging
import os
import sys

import mxnet as mx
import numpy as np
from mxnet.contrib.svrg_optimization.svrg_module import SVRGModule

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxnet_svrg.json")
GENERATOR = "tests/reference/make_mxnet_svrg.py"

SEED = 20240519
NUM_SAMPLES = 160
NUM_FEATURES = 5
FEATURE_SCALES = (1.0, 0.5, 2.0, 1.5, 0.8)
NOISE = 0.1
BATCH_SIZE = 16  # power of two: rescale_grad = 1/16 is exact
NUM_BATCHES = NUM_SAMPLES // BATCH_SIZE
NUM_EPOCH = 6
UPDATE_FREQ = 2
LEARNING_RATE = 0.025
PARAM_NAMES = ("fc_weight", "fc_bias")

SELF_CHECK_TOL = 1e-5    # float64 numpy replay vs float32 MXNet
FLOAT32_TOL = 1e-6       # MXNet's float32 numbers vs the same formula in float32/float64
MIN_VISIBLE_DIFF = 1e-3  # effects that must be clearly visible

LOSS = ("L_b(w, b) = mean over the samples i of batch b of 0.5 * (X[i] @ w[0] + b[0] - y[i])**2, "
        "with w = fc_weight of shape (1, 5) and b = fc_bias of shape (1,); batch b (0-based) is "
        "samples 16*b .. 16*b+15 in order, 10 batches per epoch, no shuffling. (MXNet's raw "
        "gradient is that of the batch SUM; rescale_grad = 1/batch_size = 1/16 makes it "
        "this mean.)")
UPDATE_RULE = ("for each batch b: g = (grad L_b(w) - grad L_b(w_snap)) + mu; "
               "w <- w - learning_rate * g (plain SGD, no momentum, no weight decay)")
FULL_GRAD_RULE = ("at the start of every epoch e with e % update_freq == 0 (epochs 0, 2, 4; the "
                  "epoch-0 snapshot is the initial weights, taken before any update): w_snap <- w; "
                  "mu <- mu_prev / num_batches + mean over the 10 batches of grad L_b(w_snap), "
                  "with mu_prev = 0 before the first snapshot. MXNet never zeroes its accumulator, "
                  "so mu_prev / num_batches is carried in ('carried_in' in full_grads is mu_prev); "
                  "textbook SVRG (see 'svrg_reset') drops that term.")
RESET_NOTE = ("NOT MXNet's behaviour: the same SVRGModule run with one patch, the full-gradient "
              "accumulator _param_dict zeroed at the start of each update_full_grads, so "
              "mu = mean over the batches of grad L_b(w_snap) (textbook SVRG). carried_in is "
              "therefore zero.")


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------

def make_data():
    """Float32 X, y, the initial parameters, and how y was made."""
    rng = np.random.default_rng(SEED)
    X = rng.standard_normal((NUM_SAMPLES, NUM_FEATURES)) * np.asarray(FEATURE_SCALES)
    w_true = rng.standard_normal(NUM_FEATURES)
    b_true = 0.7
    y = X @ w_true + b_true + NOISE * rng.standard_normal(NUM_SAMPLES)
    init = {
        "fc_weight": (0.1 * rng.standard_normal((1, NUM_FEATURES))).astype(np.float32),
        "fc_bias": np.asarray([-0.2], dtype=np.float32),
    }
    return X.astype(np.float32), y.astype(np.float32), init, w_true, b_true


def make_symbol():
    data = mx.sym.Variable("data")
    label = mx.sym.Variable("lin_reg_label")
    fc = mx.sym.FullyConnected(data, num_hidden=1, name="fc")
    return mx.sym.LinearRegressionOutput(fc, label, name="lro")


def make_iter(X, y):
    return mx.io.NDArrayIter(X, y, batch_size=BATCH_SIZE, shuffle=False,
                             label_name="lin_reg_label")


# --------------------------------------------------------------------------
# MXNet
# --------------------------------------------------------------------------

def _np(nd):
    return nd.asnumpy().copy()


class RecordingSVRGModule(SVRGModule):
    """SVRGModule that records what it uses. It does not change the computation
    (unless reset_full_grads=True, which is the documented 'svrg_reset' patch)."""

    def __init__(self, *args, reset_full_grads=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.reset_full_grads = reset_full_grads
        self.rec_full = []
        self.rec_updates = []

    def _grads(self, exec_group):
        names = exec_group.param_names
        return {name: _np(exec_group.grad_arrays[i][0]) for i, name in enumerate(names)}

    def _params(self, exec_group):
        names = exec_group.param_names
        return {name: _np(exec_group.param_arrays[i][0]) for i, name in enumerate(names)}

    def update_full_grads(self, train_data):
        assert self._ctx_len == 1 and not self._kvstore
        if self.reset_full_grads:  # the 'svrg_reset' patch
            for name in self._param_dict[0]:
                self._param_dict[0][name][:] = 0
        carried_in = {name: _np(self._param_dict[0][name]) for name in PARAM_NAMES}
        n_updates = len(self.rec_updates)
        assert n_updates % NUM_BATCHES == 0, n_updates
        super().update_full_grads(train_data)
        self.rec_full.append({
            "epoch": n_updates // NUM_BATCHES,
            "snapshot": self._params(self._mod_aux._exec_group),
            "carried_in": carried_in,
            "mu": {name: _np(self._param_dict[0][name]) for name in PARAM_NAMES},
        })

    def update(self):
        before = {
            "weights_before": self._params(self._exec_group),
            "at_w": self._grads(self._exec_group),
            "at_snapshot": self._grads(self._mod_aux._exec_group),
            "mu": {name: _np(self._param_dict[0][name]) for name in PARAM_NAMES},
            "snapshot": self._params(self._mod_aux._exec_group),
        }
        super().update()
        before["svrg"] = self._grads(self._exec_group)
        before["weights"] = self._params(self._exec_group)
        self.rec_updates.append(before)


def _check_tags(records):
    def callback(param):
        rec = records[-1]
        assert "epoch" not in rec
        rec["epoch"], rec["batch"] = param.epoch, param.nbatch
    return callback


def run_svrg(X, y, init, reset_full_grads=False):
    mod = RecordingSVRGModule(make_symbol(), data_names=["data"], label_names=["lin_reg_label"],
                              update_freq=UPDATE_FREQ, reset_full_grads=reset_full_grads)
    mod.fit(make_iter(X, y), eval_metric="mse", optimizer="sgd",
            optimizer_params={"learning_rate": LEARNING_RATE},
            arg_params={k: mx.nd.array(v) for k, v in init.items()},
            num_epoch=NUM_EPOCH, kvstore="local",
            batch_end_callback=_check_tags(mod.rec_updates))
    # What SVRGModule handed to the optimizer.
    opt = mod._optimizer.default_opt
    assert type(opt).__name__ == "SGD", type(opt)
    assert opt.rescale_grad == 1.0 / BATCH_SIZE and opt.lr == LEARNING_RATE, opt
    assert opt.momentum == 0 and opt.wd == 0, opt
    assert len(mod.rec_updates) == NUM_EPOCH * NUM_BATCHES
    for k, rec in enumerate(mod.rec_updates):
        assert (rec["epoch"], rec["batch"]) == divmod(k, NUM_BATCHES), (k, rec["epoch"])
    return mod.rec_full, mod.rec_updates


def run_sgd(X, y, init, optimizer_params=None, svrg=False, name_rule=True):
    """Plain SGD through ``Module`` (or ``SVRGModule`` with ``svrg``); the weights
    after each update. ``name_rule=False`` patches out MXNet 1.x's wd rule."""
    optimizer_params = optimizer_params or {"learning_rate": LEARNING_RATE}
    if svrg:
        mod = SVRGModule(make_symbol(), data_names=["data"], label_names=["lin_reg_label"],
                         update_freq=UPDATE_FREQ)
    else:
        mod = mx.mod.Module(make_symbol(), data_names=["data"], label_names=["lin_reg_label"])
    records = []
    set_wd_mult = mx.optimizer.Optimizer.set_wd_mult
    if not name_rule:  # decay every parameter: the rule's names get wd_mult 1
        mx.optimizer.Optimizer.set_wd_mult = lambda self, mult: set_wd_mult(
            self, dict(dict.fromkeys(self.idx2name.values(), 1.0), **mult))

    def callback(param):
        arg, _ = mod.get_params()
        records.append({"epoch": param.epoch, "batch": param.nbatch,
                        "weights": {name: _np(arg[name]) for name in PARAM_NAMES}})

    try:
        mod.fit(make_iter(X, y), eval_metric="mse", optimizer="sgd",
                optimizer_params=optimizer_params,
                arg_params={k: mx.nd.array(v) for k, v in init.items()},
                num_epoch=NUM_EPOCH, kvstore="local", batch_end_callback=callback)
    finally:
        mx.optimizer.Optimizer.set_wd_mult = set_wd_mult
    opt = mod._optimizer.default_opt if svrg else mod._optimizer
    assert opt.rescale_grad == 1.0 / BATCH_SIZE
    assert len(records) == NUM_EPOCH * NUM_BATCHES
    return records, dict(opt.wd_mult)


# --------------------------------------------------------------------------
# Independent float64 numpy version of the rule, used only as a self-check
# --------------------------------------------------------------------------

def batch_grad(X, y, b, theta):
    """grad of L_b (batch mean of 0.5 * residual^2) at theta, in float64."""
    xb = X[b * BATCH_SIZE:(b + 1) * BATCH_SIZE].astype(np.float64)
    yb = y[b * BATCH_SIZE:(b + 1) * BATCH_SIZE].astype(np.float64)
    r = xb @ theta["fc_weight"][0] + theta["fc_bias"][0] - yb
    return {"fc_weight": (r @ xb / BATCH_SIZE)[None, :], "fc_bias": np.asarray([r.mean()])}


def replay(X, y, init, mode):
    """mode: 'mxnet' (accumulator carried over), 'textbook' (reset) or 'sgd'."""
    theta = {k: np.asarray(v, dtype=np.float64).copy() for k, v in init.items()}
    mu = {k: np.zeros_like(v) for k, v in theta.items()}
    snap = None
    full, updates = [], []
    for epoch in range(NUM_EPOCH):
        if mode != "sgd" and epoch % UPDATE_FREQ == 0:
            snap = {k: v.copy() for k, v in theta.items()}
            carried = mu if mode == "mxnet" else {k: np.zeros_like(v) for k, v in mu.items()}
            total = {k: np.zeros_like(v) for k, v in theta.items()}
            for b in range(NUM_BATCHES):
                g = batch_grad(X, y, b, snap)
                total = {k: total[k] + g[k] for k in total}
            mu = {k: (carried[k] + total[k]) / NUM_BATCHES for k in total}
            full.append({"epoch": epoch, "snapshot": snap, "carried_in": carried, "mu": mu})
        for b in range(NUM_BATCHES):
            g_w = batch_grad(X, y, b, theta)
            rec = {"at_w": g_w}
            if mode == "sgd":
                g = g_w
            else:
                g_s = batch_grad(X, y, b, snap)
                g = {k: g_w[k] - g_s[k] + mu[k] for k in g_w}
                rec.update(at_snapshot=g_s, svrg=g)
            theta = {k: theta[k] - LEARNING_RATE * g[k] for k in theta}
            rec["weights"] = theta
            updates.append(rec)
    return full, updates


def max_rel_diff(seq_a, seq_b, seq_scale=None):
    """Largest leaf-wise max|a - b| / max|b| over all entries and leaves.

    With seq_scale (a list of numbers per entry and leaf), divide by that instead.
    """
    assert len(seq_a) == len(seq_b)
    worst = 0.0
    for k, (tree_a, tree_b) in enumerate(zip(seq_a, seq_b)):
        assert tree_a.keys() == tree_b.keys()
        for name in tree_a:
            a = np.asarray(tree_a[name], dtype=np.float64)
            b = np.asarray(tree_b[name], dtype=np.float64)
            assert a.shape == b.shape, (name, a.shape, b.shape)
            scale = np.max(np.abs(b)) if seq_scale is None else seq_scale[k][name]
            diff = np.max(np.abs(a - b))
            if scale == 0:
                assert diff == 0, (name, diff)
                continue
            worst = max(worst, diff / scale)
    return worst


def _scaled(tree):
    """MXNet raw (batch-sum) gradient -> loss units (exact: 1/16 is a power of two)."""
    return {k: np.asarray(v, dtype=np.float64) / BATCH_SIZE for k, v in tree.items()}


def check_mxnet_internal(init, rec_full, rec_updates, reset):
    """Checks on MXNet's own float32 numbers (point 2 of the docstring)."""
    f32 = np.float32
    assert [f["epoch"] for f in rec_full] == list(range(0, NUM_EPOCH, UPDATE_FREQ))
    for name in PARAM_NAMES:
        assert np.array_equal(rec_full[0]["snapshot"][name], init[name]), name
        assert not np.any(rec_full[0]["carried_in"][name]), name
    worst = 0.0
    for j, full in enumerate(rec_full):
        epoch_recs = rec_updates[full["epoch"] * NUM_BATCHES:(full["epoch"] + 1) * NUM_BATCHES]
        prev_mu = rec_full[j - 1]["mu"] if (j > 0 and not reset) else None
        for name in PARAM_NAMES:
            if prev_mu is not None:
                assert np.array_equal(full["carried_in"][name], prev_mu[name]), name
            else:
                assert not np.any(full["carried_in"][name]), name
            # the full pass gives the same gradients as the training pass at w~
            mean_snap = np.mean([r["at_snapshot"][name].astype(np.float64) for r in epoch_recs],
                                axis=0)
            expect = full["carried_in"][name].astype(np.float64) / NUM_BATCHES + mean_snap
            worst = max(worst, max_rel_diff([{name: full["mu"][name]}], [{name: expect}]))
            for r in epoch_recs:
                assert np.array_equal(r["snapshot"][name], full["snapshot"][name]), name
                assert np.array_equal(r["mu"][name], full["mu"][name]), name
            first = epoch_recs[0]
            assert np.array_equal(first["at_w"][name], first["at_snapshot"][name]), name
            assert np.array_equal(first["svrg"][name], first["mu"][name]), name
    for r in rec_updates:
        for name in PARAM_NAMES:
            svrg = (r["at_w"][name] - r["at_snapshot"][name]) + r["mu"][name]
            assert svrg.dtype == f32 and np.array_equal(svrg, r["svrg"][name]), name
            step = r["weights_before"][name].astype(np.float64) - (
                LEARNING_RATE / BATCH_SIZE) * r["svrg"][name].astype(np.float64)
            worst = max(worst, max_rel_diff([{name: r["weights"][name]}], [{name: step}]))
    for a, b in itertools.pairwise(rec_updates):
        for name in PARAM_NAMES:
            assert np.array_equal(a["weights"][name], b["weights_before"][name]), name
    return worst


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def _tolist(tree):
    return {name: np.asarray(tree[name]).tolist() for name in PARAM_NAMES}


def _full_grads_json(rec_full):
    return [{"epoch": f["epoch"], "snapshot": _tolist(f["snapshot"]),
             "carried_in": _tolist(_scaled(f["carried_in"])), **_tolist(_scaled(f["mu"]))}
            for f in rec_full]


def _weights_json(records):
    return [{"epoch": r["epoch"], "batch": r["batch"], **_tolist(r["weights"])} for r in records]


def main():
    logging.getLogger().setLevel(logging.WARNING)
    print("MXNet", mx.__version__, "numpy", np.__version__)
    X, y, init, w_true, b_true = make_data()

    full, updates = run_svrg(X, y, init)
    full_reset, updates_reset = run_svrg(X, y, init, reset_full_grads=True)
    sgd, _ = run_sgd(X, y, init)
    wd_params = {"learning_rate": LEARNING_RATE, "momentum": 0.9, "wd": 0.01}
    wd_runs = {"optimizer_params": wd_params}
    for svrg in (True, False):
        recs, wd_mult = run_sgd(X, y, init, wd_params, svrg=svrg)
        # MXNet 1.x's name rule (SVRGModule's names also hold its "*_full" accumulators)
        wd_mult = {k: v for k, v in wd_mult.items() if k in PARAM_NAMES}
        assert wd_mult == {"fc_bias": 0.0}, wd_mult
        recs_all, _ = run_sgd(X, y, init, wd_params, svrg=svrg, name_rule=False)
        visible = max_rel_diff([r["weights"] for r in recs], [r["weights"] for r in recs_all])
        print(f"wd rule ({'SVRGModule' if svrg else 'Module'}): weights {visible:.2e} away "
              "from every parameter decayed")
        assert visible > MIN_VISIBLE_DIFF, visible
        wd_runs["wd_mult_set_by_mxnet"] = wd_mult
        wd_runs["svrg" if svrg else "sgd"] = _weights_json(recs)
        wd_runs.setdefault("rule_visible", {})["svrg" if svrg else "sgd"] = float(f"{visible:.3g}")

    # 2. MXNet's own numbers are consistent with the rule.
    d_int = check_mxnet_internal(init, full, updates, reset=False)
    d_int_reset = check_mxnet_internal(init, full_reset, updates_reset, reset=True)
    print(f"MXNet internal consistency (float32): svrg {d_int:.2e} | reset {d_int_reset:.2e}")
    assert d_int <= FLOAT32_TOL and d_int_reset <= FLOAT32_TOL, (d_int, d_int_reset)

    # 1. Independent float64 replay.
    np_full, np_updates = replay(X, y, init, "mxnet")
    np_full_tb, np_updates_tb = replay(X, y, init, "textbook")
    _, np_sgd = replay(X, y, init, "sgd")

    def weights(recs):
        return [r["weights"] for r in recs]

    def field(recs, key, scale=False):
        return [_scaled(r[key]) if scale else r[key] for r in recs]

    d_w = max_rel_diff(weights(updates), weights(np_updates))
    d_mu = max_rel_diff(field(full, "mu", True), field(np_full, "mu"))
    d_snap = max_rel_diff(field(full, "snapshot"), field(np_full, "snapshot"))
    d_g = max(max_rel_diff(field(updates, k, True), field(np_updates, k))
              for k in ("at_w", "at_snapshot"))
    # g = (g_w - g_snap) + mu can cancel (its bias entry gets down to 4e-3), so
    # measure its error against the size of the terms it is made from.
    term_scale = [{name: max(np.max(np.abs(r[k][name])) / BATCH_SIZE
                             for k in ("at_w", "at_snapshot", "mu"))
                   for name in PARAM_NAMES} for r in updates]
    d_g = max(d_g, max_rel_diff(field(updates, "svrg", True), field(np_updates, "svrg"),
                                term_scale))
    d_reset = max(max_rel_diff(weights(updates_reset), weights(np_updates_tb)),
                  max_rel_diff(field(full_reset, "mu", True), field(np_full_tb, "mu")))
    d_sgd = max_rel_diff(weights(sgd), weights(np_sgd))
    print(f"float64 numpy replay vs MXNet: weights {d_w:.2e} | mu {d_mu:.2e} | "
          f"snapshots {d_snap:.2e} | batch grads {d_g:.2e} | reset variant {d_reset:.2e} | "
          f"plain SGD {d_sgd:.2e}")
    for d in (d_w, d_mu, d_snap, d_g, d_reset, d_sgd):
        assert d <= SELF_CHECK_TOL, d

    # 3. The carry-over and SVRG itself make a visible difference.
    d_carry = max_rel_diff(weights(updates), weights(updates_reset))
    d_tb = max_rel_diff(weights(updates), weights(np_updates_tb))
    d_vs_sgd = max_rel_diff(weights(updates), weights(sgd))
    d_mu_carry = max_rel_diff(field(full, "mu"), field(full_reset, "mu"))
    print(f"MXNet SVRG vs reset variant: weights {d_carry:.2e}, mu {d_mu_carry:.2e} | "
          f"vs textbook replay {d_tb:.2e} | vs plain SGD {d_vs_sgd:.2e}")
    assert updates[NUM_BATCHES * UPDATE_FREQ - 1]["weights"]["fc_weight"].tolist() == \
        updates_reset[NUM_BATCHES * UPDATE_FREQ - 1]["weights"]["fc_weight"].tolist()
    for d in (d_carry, d_tb, d_vs_sgd, d_mu_carry):
        assert d > MIN_VISIBLE_DIFF, d
    last = updates[-1]["weights"]
    print(f"final weights: svrg {last['fc_weight'][0]} {last['fc_bias']} | "
          f"sgd {sgd[-1]['weights']['fc_weight'][0]} {sgd[-1]['weights']['fc_bias']} | "
          f"w_true {np.round(w_true, 4)} b_true {b_true}")

    data = {
        "generator": GENERATOR,
        "mxnet_version": mx.__version__,
        "loss": LOSS,
        "update_rule": UPDATE_RULE,
        "full_grad_rule": FULL_GRAD_RULE,
        "update_freq": UPDATE_FREQ,
        "learning_rate": LEARNING_RATE,
        "batch_size": BATCH_SIZE,
        "num_batches_per_epoch": NUM_BATCHES,
        "num_epoch": NUM_EPOCH,
        "rescale_grad": 1.0 / BATCH_SIZE,
        "X": X.tolist(),
        "y": y.tolist(),
        "w_true": w_true.tolist(),
        "b_true": b_true,
        "init": _tolist(init),
        "full_grads": _full_grads_json(full),
        "weights": _weights_json(updates),
        "batch_grads": [{"epoch": r["epoch"], "batch": r["batch"],
                         **{k: _tolist(_scaled(r[k])) for k in ("at_w", "at_snapshot", "svrg")}}
                        for r in updates],
        "sgd_weights": _weights_json(sgd),
        "svrg_reset": {"note": RESET_NOTE, "full_grads": _full_grads_json(full_reset),
                       "weights": _weights_json(updates_reset)},
        "wd_runs": wd_runs,
    }
    with open(OUT_PATH, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"wrote {GENERATOR[:-len('make_mxnet_svrg.py')]}mxnet_svrg.json "
          f"({os.path.getsize(OUT_PATH)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
