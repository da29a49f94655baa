"""SVRG against MXNet 1.9.1's ``SVRGModule`` on its linear-regression setting.

The values come from ``tests/reference/make_mxnet_svrg.py`` (MXNet 1.9.1 in a
virtual environment of its own): 160 samples, batches of 16, 6 epochs,
``update_freq=2``, plain SGD with lr 0.025 inside, the loss being the batch mean
of ``0.5 * (x @ w + b - y)**2``.

MXNet 1.9.1 never zeroes its full-gradient accumulator, so from the second
snapshot on its mu is ``mu_prev / num_batches + mean_b grad L_b(w_snap)``
instead of the textbook mean. ``lars_optax`` computes the textbook mu. The tests
therefore

* replay MXNet's actual trajectory with the library's building blocks, feeding
  ``svrg_refresh`` MXNet's carried-over mu (which shows the wrapper's per-batch
  rule is MXNet's), and
* compare the library's own loop (``full_gradient`` + ``svrg_refresh``) with
  the same MXNet run patched to zero the accumulator (``svrg_reset``: textbook
  SVRG), over the whole 60 updates.

Tolerance: relative 1e-5 of each leaf's largest entry (float32).
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax

REF = json.loads((pathlib.Path(__file__).parent / "reference" / "mxnet_svrg.json").read_text())
RTOL = 1e-5


def _loss(params, batch):
  x, y = batch
  pred = x @ params["fc_weight"][0] + params["fc_bias"][0]
  return 0.5 * jnp.mean((pred - y) ** 2)


def _batches():
  x = np.asarray(REF["X"], np.float32)
  y = np.asarray(REF["y"], np.float32)
  bs = REF["batch_size"]
  return [(x[i:i + bs], y[i:i + bs]) for i in range(0, len(x), bs)]


def _init():
  return {k: jnp.asarray(np.asarray(v), jnp.float32) for k, v in REF["init"].items()}


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)


def _run(carry_over: bool, inner=None):
  """Runs the SVRG loop; returns the params after each update and each mu."""
  batches = _batches()
  tx = lars_optax.svrg.svrg(inner or optax.sgd(REF["learning_rate"]))
  grads_fn = lars_optax.svrg.value_and_grads(_loss)
  update = jax.jit(tx.update)
  params = _init()
  state = tx.init(params)
  history, mus = [], []
  for epoch in range(REF["num_epoch"]):
    if lars_optax.svrg.due(epoch, update_freq=REF["update_freq"]):
      mu = lars_optax.svrg.full_gradient(_loss, params, batches)
      if carry_over and state.full_grad is not None:  # docs/optimizers.md's snippet
        mu = jax.tree.map(lambda m, prev: m + prev / len(batches), mu, state.full_grad)
      mus.append(mu)
      state = lars_optax.svrg.refresh(state, params, mu)
    for batch in batches:
      _, g, g_snap = grads_fn(params, lars_optax.svrg.snapshot(state), batch)
      updates, state = update(g, state, params, snapshot_grads=g_snap)
      params = optax.apply_updates(params, updates)
      history.append(params)
  return history, mus


@pytest.mark.quick
@pytest.mark.parametrize("carry_over, expected", [
    (True, REF), (False, REF["svrg_reset"])], ids=["mxnet_as_is", "textbook_svrg"])
def test_trajectory_matches_mxnet(carry_over, expected):
  history, mus = _run(carry_over)
  assert len(history) == len(expected["weights"]) == 60
  for ours, ref in zip(mus, expected["full_grads"]):
    for k in ("fc_weight", "fc_bias"):
      assert _rel(ours[k], ref[k]) <= RTOL, (ref["epoch"], k, _rel(ours[k], ref[k]))
  for ours, ref in zip(history, expected["weights"]):
    for k in ("fc_weight", "fc_bias"):
      err = _rel(ours[k], ref[k])
      assert err <= RTOL, f"epoch {ref['epoch']} batch {ref['batch']} {k}: {err:.2e}"


def test_per_batch_gradients_match_mxnet():
  """svrg_value_and_grads gives MXNet's two gradients at the recorded weights."""
  batches = _batches()
  grads_fn = lars_optax.svrg.value_and_grads(_loss)
  prev = REF["init"]
  snaps = {f["epoch"]: f["snapshot"] for f in REF["full_grads"]}
  snap = None
  for rec, w in zip(REF["batch_grads"], REF["weights"]):
    snap = snaps.get(rec["epoch"], snap) if rec["batch"] == 0 else snap
    params = {k: jnp.asarray(np.asarray(v), jnp.float32) for k, v in prev.items()}
    snap_params = {k: jnp.asarray(np.asarray(v), jnp.float32) for k, v in snap.items()}
    _, g, g_snap = grads_fn(params, snap_params, batches[rec["batch"]])
    for k in ("fc_weight", "fc_bias"):
      assert _rel(g[k], rec["at_w"][k]) <= RTOL
      assert _rel(g_snap[k], rec["at_snapshot"][k]) <= RTOL
    prev = {k: w[k] for k in ("fc_weight", "fc_bias")}


def _run_sgd(tx):
  """Plain SGD through a ``Module``: the params after each update."""
  params = _init()
  state = tx.init(params)
  grad = jax.jit(jax.grad(_loss))
  history = []
  for _ in range(REF["num_epoch"]):
    for batch in _batches():
      updates, state = tx.update(grad(params, batch), state, params)
      params = optax.apply_updates(params, updates)
      history.append(params)
  return history


def _worst(history, expected):
  return max(_rel(ours[k], ref[k]) for ours, ref in zip(history, expected, strict=True)
             for k in ("fc_weight", "fc_bias"))


def test_plain_sgd_matches_mxnets_module():
  """The same loss and data with optax.sgd reproduce MXNet's plain-SGD run."""
  assert _worst(_run_sgd(optax.sgd(REF["learning_rate"])), REF["sgd_weights"]) <= RTOL


# MXNet 1.x's Module gives wd_mult 0 to every name ending in neither _weight nor
# _gamma (docs/porting.md): the rule as a wd_mult rule, on MXNet's names.
MODULE_WD_RULE = [(~lars_optax.masks.by_suffix("_weight", "_gamma").optional(), 0.0)]


@pytest.mark.parametrize("module", ["svrg", "sgd"])
def test_mxnet1_module_weight_decay_rule(module):
  """With momentum and ``wd``, SVRGModule and Module decay ``fc_weight`` only."""
  runs = REF["wd_runs"]
  assert runs["wd_mult_set_by_mxnet"] == {"fc_bias": 0.0}
  kw = runs["optimizer_params"]

  def history(wd_mult):
    inner = lars_optax.mxnet.sgd(kw["learning_rate"], momentum=kw["momentum"], wd=kw["wd"],
                                 wd_mult=wd_mult)
    return _run(True, inner)[0] if module == "svrg" else _run_sgd(inner)

  assert _worst(history(MODULE_WD_RULE), runs[module]) <= RTOL
  assert _worst(history(None), runs[module]) > 100 * RTOL  # every leaf decayed: MXNet 2.0
