"""Produce reference values for LARS as a real Gluon ``Trainer`` runs it (MXNet 2.0.0b1).

The project's tests (``tests/test_reference_mxnet_gluon.py``) port this script's
training loop to JAX and compare their weights with the ones this script writes
to ``tests/reference/mxnet_gluon.json``. The tests read only that JSON file, so
they never need MXNet. This script imports nothing from the project.

How to run it (from the repository root), in a virtual environment of its own
kept out of git:

    python3 -m venv .venv-mx2
    .venv-mx2/bin/pip install "mxnet==2.0.0b1" "numpy<1.24"
    .venv-mx2/bin/python tests/reference/make_mxnet_gluon.py

Running it again gives the same file. Every random number comes from a
``numpy.random.default_rng`` with a fixed seed, and everything runs on one CPU
context. It takes a few seconds.

The training loop
-----------------
A ``gluon.HybridBlock`` ``fc1 = Dense(16, in_units=8)``, ``norm =
LayerNorm(in_channels=16)``, ``relu``, ``fc2 = Dense(4, in_units=16)``, with
fixed starting weights (``Parameter.set_data``). Its collected parameters are
``fc1.weight``, ``fc1.bias``, ``norm.gamma``, ``norm.beta``, ``fc2.weight`` and
``fc2.bias``. 64 examples with 8 features and a class label in 0..3, in 4
batches of 16, taken in order, 100 steps (25 passes). Each step is Gluon's:

    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)   # one per example
    loss.backward()                                              # the sum's gradient
    trainer.step(16)                                             # rescale_grad = 1/16

``net.fc1.weight.lr_mult = 0.5`` is set on the parameter, as Gluon does it.

The optimizer is LARS with ``learning_rate=0.1, momentum=0.9, eta=0.001,
wd=1e-4`` and ``PolyScheduler(max_update=100, base_lr=0.1, pwr=2,
warmup_steps=10, warmup_begin_lr=0.001)``, in two cases:

* ``trainer``: ``gluon.Trainer(net.collect_params(), "lars", {...})``, the usual
  call. The Trainer builds the optimizer with ``param_dict`` (index ->
  Parameter) and no ``param_idx2name``, so MXNet's LARS names each parameter by
  its index (``str(index)``) and its name rule (skip ``*gamma``, ``*beta``,
  ``*bias``) skips nothing: every leaf gets a trust ratio.
* ``trainer_given_names``: ``gluon.Trainer(params, opt)`` with ``opt =
  mx.optimizer.create("lars", param_idx2name={i: name}, ...)``, the names being
  ``collect_params()``'s keys, numbered in their sorted order as the Trainer
  numbers the parameters (in ``collect_params()``'s own order the names land on
  the wrong parameters). Then LARS skips ``norm.gamma``, ``norm.beta``,
  ``fc1.bias`` and ``fc2.bias`` by name, as with the Module API.

The script also checks, and records under ``"checked"``, what the port relies on:

* the two cases differ (the name rule matters here);
* with a Trainer, ``trainer.optimizer.set_lr_mult({...})`` changes nothing,
  keyed by name or by index: MXNet reads a Trainer's multipliers from
  ``Parameter.lr_mult`` (``param_dict``) first;
* every parameter is decayed: a Gluon ``Parameter``'s ``wd_mult`` is 1 unless
  set, and MXNet 2.0 has no name rule for weight decay.

Output format::

    {"generator", "mxnet_version", "data": {"x", "y", "batch_size"},
     "init": name -> weights, "kwargs", "scheduler": {"type", "kwargs"},
     "lr_mult", "steps", "recorded_steps",
     "cases": [{"name", "skips", "weights": [name -> weights after each
                recorded step]}, ...],
     "checked": {...}}

Weights are written as the shortest decimals that give back the exact float32
values. Dense weights have MXNet's layout ``(units, in_units)``.
"""

import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_mxnet_schedules import _short, _tolist  # the same JSON spelling of float32

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxnet_gluon.json")
GENERATOR = "tests/reference/make_mxnet_gluon.py"

KWARGS = {"learning_rate": 0.1, "momentum": 0.9, "eta": 0.001, "wd": 1e-4}
SCHEDULER = {"max_update": 100, "base_lr": 0.1, "pwr": 2, "warmup_steps": 10,
             "warmup_begin_lr": 0.001}
LR_MULT = {"fc1.weight": 0.5}
BATCH_SIZE, NUM_EXAMPLES, STEPS = 16, 64, 100
RECORDED = (1, 10, 50, 100)


class Net(gluon.HybridBlock):

  def __init__(self):
    super().__init__()
    self.fc1 = gluon.nn.Dense(16, in_units=8)
    self.norm = gluon.nn.LayerNorm(in_channels=16)
    self.fc2 = gluon.nn.Dense(4, in_units=16)

  def forward(self, x):
    return self.fc2(mx.npx.relu(self.norm(self.fc1(x))))


def make_data():
  gen = np.random.default_rng(1207)
  x = gen.standard_normal((NUM_EXAMPLES, 8)).astype(np.float32)
  teacher = gen.standard_normal((8, 4))
  y = np.argmax(x @ teacher + 0.5 * gen.standard_normal((NUM_EXAMPLES, 4)), axis=1)
  init = {
      "fc1.weight": 0.35 * gen.standard_normal((16, 8)),
      "fc1.bias": 0.1 * gen.standard_normal(16),
      "norm.gamma": 1.0 + 0.1 * gen.standard_normal(16),
      "norm.beta": 0.1 * gen.standard_normal(16),
      "fc2.weight": 0.25 * gen.standard_normal((4, 16)),
      "fc2.bias": 0.1 * gen.standard_normal(4),
  }
  return x, y.astype(np.int64), {k: v.astype(np.float32) for k, v in init.items()}


def make_net(init):
  net = Net()
  net.initialize()
  params = net.collect_params()
  assert list(params) == list(init), list(params)
  for name, value in init.items():
    params[name].set_data(mx.np.array(value))
  for name, mult in LR_MULT.items():
    params[name].lr_mult = mult  # Gluon's way: on the Parameter
  return net, params


def train(x, y, init, given_names=False, set_lr_mult=None):
  """Trains with a Gluon Trainer; returns the weights after each recorded step."""
  net, params = make_net(init)
  sched = mx.lr_scheduler.PolyScheduler(**SCHEDULER)
  if given_names:
    # A Trainer numbers the parameters in the sorted order of their names.
    opt = mx.optimizer.create("lars", param_idx2name=dict(enumerate(sorted(params))),
                              lr_scheduler=sched, **KWARGS)
    trainer = gluon.Trainer(params, opt)
  else:
    trainer = gluon.Trainer(params, "lars", dict(KWARGS, lr_scheduler=sched))
  if set_lr_mult is not None:
    trainer.optimizer.set_lr_mult(set_lr_mult)
  loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
  history = []
  for step in range(1, STEPS + 1):
    b = (step - 1) % (NUM_EXAMPLES // BATCH_SIZE)
    xb = mx.np.array(x[b * BATCH_SIZE:(b + 1) * BATCH_SIZE])
    yb = mx.np.array(y[b * BATCH_SIZE:(b + 1) * BATCH_SIZE])
    with autograd.record():
      loss = loss_fn(net(xb), yb)
    loss.backward()
    trainer.step(BATCH_SIZE)
    if step in RECORDED:
      history.append({k: p.data().asnumpy().copy() for k, p in params.items()})
  assert trainer.optimizer.num_update == STEPS
  return history, trainer.optimizer


def _max_diff(a, b):
  return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def main():
  print("MXNet", mx.__version__, "numpy", np.__version__)
  x, y, init = make_data()
  plain, opt = train(x, y, init)
  named, _ = train(x, y, init, given_names=True)
  assert opt.idx2name == {} and set(opt.param_dict) == set(range(len(init)))
  assert all(p.wd_mult == 1.0 for p in opt.param_dict.values())

  difference = _max_diff(plain[-1], named[-1])
  print(f"skipping by name or not: weights differ by {difference:.3g} after {STEPS} steps")
  assert difference > 1e-2, difference
  ignored = []
  for keys in (LR_MULT, {0: 0.5}):  # by name, by index
    with_mult, _ = train(x, y, init, set_lr_mult=keys)
    ignored.append(_max_diff(with_mult[-1], plain[-1]) == 0.0)
  assert all(ignored), ignored
  print("trainer.optimizer.set_lr_mult: no effect under a Trainer")

  skipped = [n for n in init if n.endswith(("gamma", "beta", "bias"))]
  data = {
      "generator": GENERATOR, "mxnet_version": mx.__version__,
      "data": {"x": _short(x), "y": y.tolist(), "batch_size": BATCH_SIZE},
      "init": _tolist(init), "kwargs": KWARGS,
      "scheduler": {"type": "PolyScheduler", "kwargs": SCHEDULER},
      "lr_mult": LR_MULT, "steps": STEPS, "recorded_steps": list(RECORDED),
      "cases": [
          {"name": "trainer", "skips": [], "weights": [_tolist(w) for w in plain]},
          {"name": "trainer_given_names", "skips": skipped,
           "weights": [_tolist(w) for w in named]},
      ],
      "checked": {
          "names_matter": float(f"{difference:.3g}"),
          "set_lr_mult_ignored_by_trainer": True,
          "every_parameter_decayed": True,
      },
  }
  with open(OUT_PATH, "w") as f:
    json.dump(data, f, separators=(",", ":"))
    f.write("\n")
  print("wrote", GENERATOR.replace("make_", "").replace(".py", ".json"))


if __name__ == "__main__":
  main()
