"""Produce reference values for MXNet 2.0.0b1's learning-rate schedulers.

The project's tests (``tests/test_schedules.py``) compare
``lars_optax.mxnet.lr_scheduler`` against the numbers this script writes to
``tests/reference/mxnet_schedules.json``. The tests read only that JSON file,
so they never need MXNet. This script imports nothing from the project; the
optimizer runs reuse the parameter tree and gradients of its companion
``make_mxnet_optimizers.py`` (same directory): 7 leaves, 12 steps, every
gradient zero at step 5.

How to run it (from the repository root; run with MXNet 2.0.0b1 installed:
``pip install mxnet==2.0.0b1 'numpy<1.24'``, in a virtual environment of its own
kept out of git):

    python3 -m venv .venv-mx2
    .venv-mx2/bin/pip install "mxnet==2.0.0b1" "numpy<1.24"
    .venv-mx2/bin/python tests/reference/make_mxnet_schedules.py

Running it again gives the same file. It takes a few seconds.

It writes three kinds of cases:

* ``schedules``: one fresh ``mx.lr_scheduler.<scheduler>(**kwargs)`` per case,
  called once per update with ``num_update = 1, 2, ..., num_updates`` in order,
  as MXNet's optimizer calls it during training (MXNet's Factor and MultiFactor
  schedulers keep state between calls). Every run goes past ``max_update``
  where the scheduler has one. ``rates[i]`` is the rate at ``num_update = i + 1``,
  as a Python float (MXNet computes the rate in float64).
* ``runs``: ``mx.optimizer.create(optimizer, lr_scheduler=<scheduler>,
  param_idx2name={...}, **kwargs)`` and an updater from
  ``mx.optimizer.get_updater``, run for 12 steps (one updater call with every
  parameter per step, as gluon's Trainer does) in float32; ``weights[k]`` are
  the weights after step ``k + 1``. Some cases give ``learning_rate`` other
  than the scheduler's ``base_lr``: MXNet's optimizer then sets the
  scheduler's ``base_lr`` to it (a fresh scheduler object per run).
* ``lamb_paths``: LAMB run twice on the same data, once with MXNet's default
  multi-tensor path (``aggregate_num=4``, ``multi_lamb_update`` /
  ``multi_mp_lamb_update``) and once with its single-tensor kernels
  (``aggregate_num=1``: ``lamb_update_phase1``/``phase2``). The two differ
  (the largest relative difference of the weights is printed and stored);
  the tests pin which one this library follows. They differ most on the
  zero-initialised leaf.

Output format::

    {"generator": "tests/reference/make_mxnet_schedules.py",
     "mxnet_version": mx.__version__,
     "schedules": [{"name", "scheduler", "kwargs", "rates"}, ...],
     "runs": [{"name", "optimizer", "kwargs", "begin_num_update",
               "scheduler": {"type", "kwargs"}, "dtype", "params",
               "grads", "weights"}, ...],
     "lamb_paths": [{"name", "dtype", "kwargs", "params", "grads",
                     "weights_default", "weights_single",
                     "difference": leaf -> max over steps of
                                   max|single - default| / max|default|}, ...]}

Weights are written as the shortest decimals that give back the exact
float32 or float16 values; rates as Python's ``repr`` of the float.
"""

import json
import os
import sys

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_mxnet_optimizers import make_data  # the shared data

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxnet_schedules.json")
GENERATOR = "tests/reference/make_mxnet_schedules.py"

# (name, scheduler, kwargs, num_updates). Every argument of every scheduler
# appears at a value other than its default somewhere, both warm-up modes for
# each, and every run with a max_update continues past it.
SCHEDULES = [
    # --- FactorScheduler(step, factor=1, stop_factor_lr=1e-8, base_lr=0.01, warm-up)
    ("factor_defaults", "FactorScheduler", {"step": 5}, 40),
    ("factor_decay", "FactorScheduler", {"step": 3, "factor": 0.7, "base_lr": 0.1}, 60),
    ("factor_step_1_to_stop", "FactorScheduler",
     {"step": 1, "factor": 0.9, "base_lr": 1.0}, 200),  # reaches the default stop, 1e-8
    ("factor_stop", "FactorScheduler",
     {"step": 2, "factor": 0.5, "stop_factor_lr": 1e-3, "base_lr": 0.1}, 40),
    ("factor_base_below_stop", "FactorScheduler",
     {"step": 4, "factor": 0.9, "stop_factor_lr": 0.05, "base_lr": 0.02}, 30),
    ("factor_zero", "FactorScheduler",
     {"step": 3, "factor": 0.0, "stop_factor_lr": 1e-4, "base_lr": 0.5}, 20),
    ("factor_warmup_linear", "FactorScheduler",
     {"step": 4, "factor": 0.8, "base_lr": 0.3, "warmup_steps": 10,
      "warmup_begin_lr": 0.01}, 60),
    ("factor_warmup_constant", "FactorScheduler",
     {"step": 7, "factor": 0.6, "stop_factor_lr": 0.02, "base_lr": 0.3, "warmup_steps": 9,
      "warmup_begin_lr": 0.05, "warmup_mode": "constant"}, 60),
    ("factor_warmup_default_begin", "FactorScheduler",
     {"step": 5, "factor": 0.5, "base_lr": 0.2, "warmup_steps": 6}, 30),
    # --- MultiFactorScheduler(step, factor=1, base_lr=0.01, warm-up)
    ("multifactor_defaults", "MultiFactorScheduler", {"step": [4]}, 12),
    ("multifactor", "MultiFactorScheduler",
     {"step": [3, 7, 12], "factor": 0.5, "base_lr": 0.2}, 30),
    ("multifactor_warmup_linear", "MultiFactorScheduler",
     {"step": [2, 9, 15], "factor": 0.3, "base_lr": 0.1, "warmup_steps": 5,
      "warmup_begin_lr": 0.001}, 30),
    ("multifactor_warmup_constant", "MultiFactorScheduler",
     {"step": [10, 20, 21, 40], "factor": 0.1, "base_lr": 1.0, "warmup_steps": 8,
      "warmup_begin_lr": 0.02, "warmup_mode": "constant"}, 50),
    # --- PolyScheduler(max_update, base_lr=0.01, pwr=2, final_lr=0, warm-up)
    ("poly_defaults", "PolyScheduler", {"max_update": 20}, 30),
    ("poly_linear_final", "PolyScheduler",
     {"max_update": 25, "base_lr": 0.1, "pwr": 1, "final_lr": 0.01}, 40),
    ("poly_pwr_half", "PolyScheduler", {"max_update": 16, "base_lr": 0.4, "pwr": 0.5}, 25),
    ("poly_pwr_3", "PolyScheduler",
     {"max_update": 30, "base_lr": 0.2, "pwr": 3, "final_lr": 0.001}, 40),
    ("poly_pwr_0", "PolyScheduler", {"max_update": 10, "base_lr": 0.3, "pwr": 0}, 15),
    ("poly_max_update_1", "PolyScheduler", {"max_update": 1, "base_lr": 0.3}, 5),
    ("poly_warmup_linear", "PolyScheduler",
     {"max_update": 30, "base_lr": 0.5, "pwr": 2, "final_lr": 0.05, "warmup_steps": 8,
      "warmup_begin_lr": 0.01}, 45),
    ("poly_warmup_constant", "PolyScheduler",
     {"max_update": 24, "base_lr": 0.5, "pwr": 1.5, "warmup_steps": 5,
      "warmup_begin_lr": 0.1, "warmup_mode": "constant"}, 35),
    ("poly_long", "PolyScheduler",
     {"max_update": 1000, "base_lr": 0.1, "pwr": 2, "warmup_steps": 50}, 1010),
    # --- CosineScheduler(max_update, base_lr=0.01, final_lr=0, warm-up)
    ("cosine_defaults", "CosineScheduler", {"max_update": 20}, 30),
    ("cosine_final", "CosineScheduler", {"max_update": 17, "base_lr": 0.3, "final_lr": 0.01}, 25),
    ("cosine_max_update_1", "CosineScheduler", {"max_update": 1, "base_lr": 0.3}, 5),
    ("cosine_warmup_linear", "CosineScheduler",
     {"max_update": 40, "base_lr": 0.4, "final_lr": 0.02, "warmup_steps": 10,
      "warmup_begin_lr": 0.04}, 50),
    ("cosine_warmup_constant", "CosineScheduler",
     {"max_update": 30, "base_lr": 0.4, "warmup_steps": 6, "warmup_begin_lr": 0.1,
      "warmup_mode": "constant"}, 40),
    ("cosine_long", "CosineScheduler",
     {"max_update": 1000, "base_lr": 0.1, "warmup_steps": 100, "warmup_begin_lr": 0.001},
     1010),
]

# (name, optimizer, optimizer kwargs, begin_num_update, (scheduler, kwargs), seed)
RUNS = [
    ("sgd_factor_warmup", "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}, 0,
     ("FactorScheduler", {"step": 3, "factor": 0.5, "base_lr": 0.1, "warmup_steps": 4,
                          "warmup_begin_lr": 0.01}), 701),
    # learning_rate != base_lr: MXNet's optimizer replaces base_lr (the decays start
    # from 0.2) but the warm-up still climbs to the scheduler's own base_lr (0.05).
    ("sgd_factor_replaced_base_lr", "sgd", {"learning_rate": 0.2, "momentum": 0.9}, 0,
     ("FactorScheduler", {"step": 2, "factor": 0.7, "stop_factor_lr": 0.03, "base_lr": 0.05,
                          "warmup_steps": 3, "warmup_begin_lr": 0.01}), 702),
    ("sgd_multifactor", "sgd", {"learning_rate": 0.2, "momentum": 0.5, "wd": 1e-4}, 0,
     ("MultiFactorScheduler", {"step": [2, 5, 9], "factor": 0.5, "base_lr": 0.05}), 703),
    ("sgd_poly_begin_num_update", "sgd", {"learning_rate": 0.1, "momentum": 0.9}, 3,
     ("PolyScheduler", {"max_update": 12, "base_lr": 0.1, "pwr": 2, "final_lr": 0.001}), 704),
    ("lars_poly_warmup", "lars", {"learning_rate": 0.1, "momentum": 0.9, "eta": 0.01,
                                  "wd": 1e-4}, 0,
     ("PolyScheduler", {"max_update": 10, "base_lr": 0.1, "pwr": 2, "warmup_steps": 3,
                        "warmup_begin_lr": 0.01}), 705),
    # learning_rate != base_lr: MXNet's PolyScheduler and CosineScheduler keep
    # decaying from the base_lr they were built with.
    ("lars_cosine_replaced_base_lr", "lars", {"learning_rate": 0.5, "momentum": 0.9,
                                              "eta": 0.01}, 0,
     ("CosineScheduler", {"max_update": 8, "base_lr": 0.2, "final_lr": 0.01, "warmup_steps": 2,
                          "warmup_begin_lr": 0.05, "warmup_mode": "constant"}), 706),
    ("lars_multifactor_warmup", "lars", {"learning_rate": 0.3, "eta": 0.01, "wd": 1e-3}, 0,
     ("MultiFactorScheduler", {"step": [4, 8], "factor": 0.1, "base_lr": 0.3,
                               "warmup_steps": 3, "warmup_mode": "constant",
                               "warmup_begin_lr": 0.03}), 707),
]

# LAMB on MXNet's two paths: (name, dtype, kwargs, seed).
LAMB_PATHS = [
    ("lamb_wd_bias_correction", "float32",
     {"learning_rate": 0.01, "wd": 0.01, "bias_correction": True}, 801),
    ("lamb_float16_multi_precision", "float16",
     {"learning_rate": 0.01, "wd": 0.01, "bias_correction": True, "multi_precision": True},
     802),
]


def run_schedule(scheduler, kwargs, num_updates):
  sched = getattr(mx.lr_scheduler, scheduler)(**kwargs)
  return [float(sched(n)) for n in range(1, num_updates + 1)]


def run_optimizer(optimizer, kwargs, params, grads, dtype, scheduler=None,
                  begin_num_update=0):
  names = list(params)
  extra = {}
  if scheduler is not None:
    extra["lr_scheduler"] = getattr(mx.lr_scheduler, scheduler[0])(**scheduler[1])
  if begin_num_update:
    extra["begin_num_update"] = begin_num_update
  opt = mx.optimizer.create(optimizer, param_idx2name=dict(enumerate(names)), **kwargs, **extra)
  updater = mx.optimizer.get_updater(opt)
  weights = [mx.nd.array(params[n], dtype=dtype) for n in names]
  history = []
  for grad in grads:
    updater(list(range(len(names))), [mx.nd.array(grad[n], dtype=dtype) for n in names],
            weights)
    history.append({n: w.asnumpy().copy() for n, w in zip(names, weights)})
  return history


def _short(a):
  """Nested lists of the shortest decimals that give back the same float32/float16."""
  a = np.asarray(a)
  flat = [float(np.format_float_scientific(x, unique=True)) for x in a.ravel()]
  return np.array(flat, dtype=np.float64).reshape(a.shape).tolist()


def _tolist(tree):
  return {k: _short(v) for k, v in tree.items()}


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.abs(a - b).max(initial=0.0) / max(np.abs(b).max(initial=0.0), 1e-30)


def main():
  print("MXNet", mx.__version__, "numpy", np.__version__)
  schedules = []
  for name, scheduler, kwargs, num_updates in SCHEDULES:
    rates = run_schedule(scheduler, kwargs, num_updates)
    schedules.append({"name": name, "scheduler": scheduler, "kwargs": kwargs, "rates": rates})
    print(f"{name}: {num_updates} rates, last {rates[-1]:.6g}")

  runs = []
  for name, optimizer, kwargs, begin, scheduler, seed in RUNS:
    params, grads = make_data(seed, "float32", False)
    weights = run_optimizer(optimizer, kwargs, params, grads, "float32", scheduler, begin)
    runs.append({"name": name, "optimizer": optimizer, "kwargs": kwargs,
                 "begin_num_update": begin,
                 "scheduler": {"type": scheduler[0], "kwargs": scheduler[1]},
                 "dtype": "float32", "params": _tolist(params),
                 "grads": [_tolist(g) for g in grads],
                 "weights": [_tolist(w) for w in weights]})
    print(f"{name}: ok")

  lamb = []
  for name, dtype, kwargs, seed in LAMB_PATHS:
    params, grads = make_data(seed, dtype, False)
    default = run_optimizer("lamb", kwargs, params, grads, dtype)  # aggregate_num=4
    single = run_optimizer("lamb", dict(kwargs, aggregate_num=1), params, grads, dtype)
    diff = {n: max(_rel(a[n], b[n]) for a, b in zip(single, default)) for n in params}
    print(f"{name}: single-tensor vs default multi-tensor path, weights "
          + ", ".join(f"{n} {d:.2e}" for n, d in diff.items()))
    lamb.append({"name": name, "dtype": dtype, "kwargs": kwargs, "params": _tolist(params),
                 "grads": [_tolist(g) for g in grads],
                 "weights_default": [_tolist(w) for w in default],
                 "weights_single": [_tolist(w) for w in single],
                 "difference": {n: float(f"{d:.3g}") for n, d in diff.items()}})

  data = {"generator": GENERATOR, "mxnet_version": mx.__version__}
  with open(OUT_PATH, "w") as f:  # one case per line: compact, and diffs stay per case
    f.write(json.dumps(data)[:-1])
    for key, cases in (("schedules", schedules), ("runs", runs), ("lamb_paths", lamb)):
      f.write(f', "{key}": [\n')
      f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in cases))
      f.write("\n]")
    f.write("}\n")
  print(f"wrote tests/reference/{os.path.basename(OUT_PATH)} "
        f"({os.path.getsize(OUT_PATH)} bytes)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
