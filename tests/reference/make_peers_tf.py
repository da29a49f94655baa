"""Produce the SimCLR and ALBERT porting fixtures by running their optimizers in TensorFlow.

Writes ``tests/reference/peers_tf.json``, which ``tests/test_reference_peers.py``
reads (the tests never need TensorFlow). The case comes from
``porting_case.py`` beside this file, as for ``make_peers.py``.

How to run it (from the repository root; TensorFlow 2.15 runs SimCLR's
``tf2/lars_optimizer.py`` and ALBERT's TF1 ``lamb_optimizer.py`` unmodified):

    python3 -m venv .venv-tf
    .venv-tf/bin/pip install "tensorflow-cpu==2.15.1"
    .venv-tf/bin/python tests/reference/make_peers_tf.py

The optimizers are imported from ``../shared/peers/`` (copies of
google-research/simclr ``tf2/lars_optimizer.py`` and google-research/albert
``lamb_optimizer.py``); pass another directory with ``--peers``.

Variables are named like the case's leaves (``conv/w``, ``batch_norm/scale``),
and both peers exclude ``batch_norm`` and the biases (``/b``) from weight
decay and from the trust ratio by their own regular expressions. Each row
runs 12 steps with a constant rate and with the warm-up-then-cosine rate
(a ``tf.Variable`` assigned before each step).
"""

from __future__ import annotations

import argparse
import pathlib
import sys


HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import porting_case as case  # noqa: E402

LARS_LR, LARS_ETA, LARS_WD, MOMENTUM = 0.1, 0.02, 5e-3, 0.9
LAMB_LR, LAMB_WD = 0.01, 0.01
EXCLUDE = ["batch_norm", "/b:", "/b$"]  # TF2 variable names end in ":0"; TF1's are stripped


def _lrs(base, schedule):
  return [base * f for f in case.lr_factors()] if schedule else [base] * case.STEPS


def simclr_rows():
  import tensorflow as tf
  from simclr_lars_optimizer import LARSOptimizer

  def run(schedule, **kw):
    lr = tf.Variable(LARS_LR, dtype=tf.float32)
    variables = {n: tf.Variable(x, name=n) for n, x in case.initial_params().items()}
    opt = LARSOptimizer(lambda: lr, momentum=MOMENTUM, weight_decay=LARS_WD,
                        exclude_from_weight_decay=EXCLUDE, eeta=LARS_ETA, **kw)
    for rate, grads in zip(_lrs(LARS_LR, schedule), case.gradients()):
      lr.assign(rate)
      opt.apply_gradients([(tf.constant(grads[n]), variables[n]) for n in variables])
    return {n: variables[n].numpy() for n in variables}

  rows = {
      "simclr_lars": ({}, ("LARSOptimizer(lr, momentum=0.9, weight_decay, "
                          "exclude_from_weight_decay, eeta) (classic_momentum=True)")),
      "simclr_lars_nesterov": ({"use_nesterov": True}, "... use_nesterov=True"),
      "simclr_lars_popular": ({"classic_momentum": False}, "... classic_momentum=False"),
      "simclr_lars_popular_nesterov": ({"classic_momentum": False, "use_nesterov": True},
                                       "... classic_momentum=False, use_nesterov=True"),
  }
  return {key: {"peer": f"SimCLR tf2/lars_optimizer.py {desc}",
                "constant": run(False, **kw), "warmup": run(True, **kw)}
          for key, (kw, desc) in rows.items()}


def albert_rows():
  import tensorflow.compat.v1 as tf1
  from albert_lamb_optimizer import LAMBOptimizer

  def run(schedule):
    graph = tf1.Graph()
    with graph.as_default():
      lr = tf1.placeholder(tf1.float32, [])
      variables = {n: tf1.get_variable(n, initializer=x)
                   for n, x in case.initial_params().items()}
      grads = {n: tf1.placeholder(tf1.float32, x.shape)
               for n, x in case.initial_params().items()}
      opt = LAMBOptimizer(lr, weight_decay_rate=LAMB_WD, exclude_from_weight_decay=EXCLUDE)
      step = opt.apply_gradients([(grads[n], variables[n]) for n in variables])
      with tf1.Session(graph=graph) as sess:
        sess.run(tf1.global_variables_initializer())
        for rate, g in zip(_lrs(LAMB_LR, schedule), case.gradients()):
          sess.run(step, {lr: rate, **{grads[n]: g[n] for n in grads}})
        return dict(zip(variables, sess.run(list(variables.values()))))

  return {"albert_lamb": {"peer": "ALBERT lamb_optimizer.py LAMBOptimizer(lr, "
                                  "weight_decay_rate=0.01, exclude_from_weight_decay)",
                          "constant": run(False), "warmup": run(True)}}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--peers", default=str(HERE.parents[2] / "shared" / "peers"),
                      help="directory holding simclr_lars_optimizer.py, albert_lamb_optimizer.py")
  parser.add_argument("--out", default=str(HERE / "peers_tf.json"))
  args = parser.parse_args()
  sys.path.insert(0, args.peers)
  import importlib.metadata as md
  rows = {**simclr_rows(), **albert_rows()}
  case.write_fixture(args.out, "tests/reference/make_peers_tf.py",
                     {p: md.version(p) for p in ("tensorflow-cpu", "numpy")},
                     {"lars_lr": LARS_LR, "lars_eta": LARS_ETA, "lars_wd": LARS_WD,
                      "momentum": MOMENTUM, "lamb_lr": LAMB_LR, "lamb_wd": LAMB_WD,
                      "exclude": EXCLUDE}, rows)


if __name__ == "__main__":
  main()
