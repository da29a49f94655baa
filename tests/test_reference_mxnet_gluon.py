"""The port of a real Gluon ``Trainer`` LARS loop against MXNet 2.0.0b1's own run.

The values come from ``tests/reference/make_mxnet_gluon.py`` (MXNet in a virtual
environment of its own): a small Dense -> LayerNorm -> relu -> Dense network,
the loss summed over each batch of 16 as Gluon's ``loss.backward()`` does,
``trainer.step(16)``, LARS with momentum and a warmed-up ``PolyScheduler``, and
``fc1.weight.lr_mult = 0.5``, for 100 steps. Here the same loop runs in JAX
through ``lars_optax.mxnet.create("lars", ...)``, as docs/porting.md's Gluon
recipe writes it:

* the usual ``gluon.Trainer(params, "lars", {...})`` gives MXNet's optimizer no
  names, so its LARS skips nothing: the port passes ``skip=None``;
* a Trainer given an optimizer created with ``param_idx2name`` skips
  ``*gamma``/``*beta``/``*bias`` by name: the port keeps the default ``skip``.

Tolerance: each leaf's largest difference over its own largest move from the
start, at every recorded step, 2e-5 (float32; the network's forward pass is
computed by two libraries, and 100 steps of LARS compound its rounding).
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax

REF = json.loads((pathlib.Path(__file__).parent / "reference" / "mxnet_gluon.json").read_text())
CASES = {c["name"]: c for c in REF["cases"]}
RTOL = 2e-5  # of each leaf's largest move (4.3e-6 measured)


def _forward(p, x):  # Gluon's Dense (weight (units, in_units)) and LayerNorm (eps 1e-5)
  h = x @ p["fc1.weight"].T + p["fc1.bias"]
  mean = h.mean(-1, keepdims=True)
  var = ((h - mean) ** 2).mean(-1, keepdims=True)
  h = (h - mean) / jnp.sqrt(var + 1e-5) * p["norm.gamma"] + p["norm.beta"]
  return jax.nn.relu(h) @ p["fc2.weight"].T + p["fc2.bias"]


def _summed_loss(p, x, y):  # SoftmaxCrossEntropyLoss per example; backward() sums
  logp = jax.nn.log_softmax(_forward(p, x))
  return -jnp.take_along_axis(logp, y[:, None], axis=1).sum()


def _port(**skip):
  """docs/porting.md's Gluon recipe with this run's arguments."""
  bs = REF["data"]["batch_size"]
  sched = lars_optax.mxnet.lr_scheduler.PolyScheduler(**REF["scheduler"]["kwargs"])
  return lars_optax.mxnet.create("lars", **REF["kwargs"], lr_scheduler=sched,
                                 rescale_grad=1.0 / bs,    # trainer.step(batch_size)
                                 lr_mult=REF["lr_mult"],  # param.lr_mult
                                 **skip)


def _run(tx):
  x = jnp.asarray(np.asarray(REF["data"]["x"], np.float32))
  y = jnp.asarray(REF["data"]["y"], jnp.int32)
  bs = REF["data"]["batch_size"]
  batches = [(x[i:i + bs], y[i:i + bs]) for i in range(0, len(x), bs)]
  params = {k: jnp.asarray(np.asarray(v, np.float32)) for k, v in REF["init"].items()}
  state = tx.init(params)

  @jax.jit
  def step(params, state, xb, yb):
    updates, state = tx.update(jax.grad(_summed_loss)(params, xb, yb), state, params)
    return optax.apply_updates(params, updates), state

  history = {}
  for n in range(1, REF["steps"] + 1):
    params, state = step(params, state, *batches[(n - 1) % len(batches)])
    if n in REF["recorded_steps"]:
      history[n] = params
  return [history[n] for n in REF["recorded_steps"]]


def _errors(history, case):
  """Per leaf: the largest difference over the leaf's largest move, over the steps."""
  init = {k: np.asarray(v, np.float64) for k, v in REF["init"].items()}
  errors = {}
  for ours, theirs in zip(history, case["weights"]):
    for k, w in theirs.items():
      w = np.asarray(w, np.float64)
      move = max(np.abs(np.asarray(t[k], np.float64) - init[k]).max() for t in case["weights"])
      err = np.abs(np.asarray(ours[k], np.float64) - w).max() / move
      errors[k] = max(errors.get(k, 0.0), err)
  return errors


@pytest.mark.parametrize("case, skip", [("trainer", {"skip": None}),
                                        ("trainer_given_names", {})],
                         ids=["trainer_skips_nothing", "names_given_skip_by_name"])
def test_gluon_trainer_recipe_matches_mxnet(case, skip):
  assert CASES[case]["skips"] == ([] if skip else ["fc1.bias", "norm.gamma", "norm.beta",
                                                   "fc2.bias"])
  errors = _errors(_run(_port(**skip)), CASES[case])
  assert max(errors.values()) <= RTOL, errors


def test_mxnet_default_skip_is_not_a_trainers_run():
  """The name rule matters here: the default ``skip`` is far from a plain Trainer."""
  errors = _errors(_run(_port()), CASES["trainer"])
  assert max(errors.values()) > 100 * RTOL, errors
