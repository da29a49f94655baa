"""``lars_optax.porting``'s BYOL, SimCLR and ALBERT constructors, and docs/optimizers.md's
recipes with them."""

from __future__ import annotations

import pathlib


import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax
from lars_optax import masks
from porting_runs import P, run_steps


def test_byol_filter_gets_byols_path_tuple():
  seen = []

  def keep_kernels(path, value):
    seen.append(path)
    return path[-1] != "bias"

  tx = P.byol_lars(0.1, weight_decay=0.5, weight_decay_filter=keep_kernels)
  params = {"mlp/~/linear_0": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}}
  tx.init(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  assert ("mlp/~/linear_0", "kernel") in seen
  assert float(jnp.abs(updates["mlp/~/linear_0"]["bias"]).max()) == 0.0
  assert float(jnp.abs(updates["mlp/~/linear_0"]["kernel"]).max()) > 0.0


def test_simclr_layer_adaptation_defaults_to_the_weight_decay_exclusions():
  params = {"dense": {"kernel": jnp.ones((2, 2))}, "batch_norm": {"scale": jnp.ones(2)}}
  grads = jax.tree.map(lambda p: 0.1 * jnp.ones_like(p), params)
  tx = P.simclr_lars(0.1, weight_decay=1e-3, exclude_from_weight_decay=["batch_norm"])
  _, state = tx.update(grads, tx.init(params), params)
  ratios = lars_optax.trust_ratios(state, params)
  assert float(ratios["batch_norm/scale"]) == 1.0
  assert float(ratios["dense/kernel"]) != 1.0


def test_simclr_popular_momentum_takes_the_ratio_of_the_buffer():
  # Without weight decay and with one step, the buffer is the gradient: the same ratio.
  classic = P.simclr_lars(0.1, classic_momentum=True)
  popular = P.simclr_lars(0.1, classic_momentum=False)
  a, _ = run_steps(classic, steps=1)
  b, _ = run_steps(popular, steps=1)
  chex.assert_trees_all_close(a, b, rtol=1e-6)
  a, _ = run_steps(classic, steps=3)
  b, _ = run_steps(popular, steps=3)
  assert float(jnp.max(jnp.abs(a["w"] - b["w"]))) > 1e-4


def test_albert_lamb_has_no_bias_correction():
  ours, _ = run_steps(P.albert_lamb(0.01))
  mxnet, _ = run_steps(lars_optax.lamb(0.01, bias_correction=False))
  chex.assert_trees_all_close(ours, mxnet, rtol=1e-6)


def _ndim_filter(path, value):
  """A BYOL-style filter: True (apply) for the leaves of more than one dimension."""
  return np.ndim(value) > 1


def _byol_lars(learning_rate, weight_decay=1e-2, eta=0.01, momentum=0.9):
  return P.byol_lars(learning_rate, weight_decay=weight_decay, momentum=momentum, eta=eta,
                     weight_decay_filter=_ndim_filter, lars_adaptation_filter=_ndim_filter)


def _byol_problem():
  rng = np.random.default_rng(7)
  params = {"conv": {"kernel": rng.normal(size=(3, 4)), "bias": rng.normal(size=4)},
            "BatchNorm_0": {"scale": 1.0 + 0.1 * rng.normal(size=4)},
            "head": rng.normal(size=(4, 2))}
  grads = [jax.tree.map(lambda x: rng.normal(size=np.shape(x)), params) for _ in range(5)]
  return params, grads


def _byol_numpy(params, grads, lr, weight_decay=1e-2, eta=0.01, momentum=0.9):
  """BYOL's LARS in float64 NumPy: u = g + wd*w, rho = eta*|w|/|u|, m = mu*m + rho*u, w -= lr*m."""
  w = {k: np.asarray(v, np.float64) for k, v in masks.named_leaves(params)}
  m = {k: np.zeros_like(v) for k, v in w.items()}
  for t, g_tree in enumerate(grads):
    g = dict(masks.named_leaves(g_tree))
    for k in w:
      adapted = w[k].ndim > 1
      u = g[k] + (weight_decay * w[k] if adapted else 0.0)
      wn, un = np.linalg.norm(w[k]), np.linalg.norm(u)
      rho = eta * wn / un if (adapted and wn > 0 and un > 0) else 1.0
      m[k] = momentum * m[k] + rho * u
      w[k] = w[k] - lr(t) * m[k]
  return w


def test_byol_lars_recipe_equals_a_float64_numpy_rule():
  params64, grads64 = _byol_problem()
  schedule = optax.exponential_decay(0.5, transition_steps=1, decay_rate=0.8)
  tx = _byol_lars(schedule)
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params64)
  state = tx.init(params)
  step = jax.jit(tx.update)
  for g in grads64:
    updates, state = step(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g), state,
                          params)
    params = optax.apply_updates(params, updates)
  expected = _byol_numpy(params64, grads64, lambda t: float(schedule(t)))
  for name, value in masks.named_leaves(params):
    np.testing.assert_allclose(value, expected[name], rtol=2e-5, atol=1e-6, err_msg=name)


def test_byol_lars_recipe_equals_optax_lars_with_a_constant_learning_rate():
  """optax.lars puts the learning rate before the momentum: equal for a constant rate."""
  params64, grads64 = _byol_problem()
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params64)
  keep = jax.tree.map(lambda x: np.ndim(x) > 1, params)
  ours = _byol_lars(0.3)
  ref = optax.lars(0.3, weight_decay=1e-2, weight_decay_mask=keep, trust_coefficient=0.01,
                   trust_ratio_mask=keep, momentum=0.9)
  p_ours, p_ref = params, params
  s_ours, s_ref = ours.init(params), ref.init(params)
  for g64 in grads64:
    g = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g64)
    u, s_ours = ours.update(g, s_ours, p_ours)
    p_ours = optax.apply_updates(p_ours, u)
    u, s_ref = ref.update(g, s_ref, p_ref)
    p_ref = optax.apply_updates(p_ref, u)
  chex.assert_trees_all_close(p_ours, p_ref, rtol=1e-5, atol=1e-6)


def _docs_recipe():
  """The BYOL/SimCLR recipe block of docs/optimizers.md, run: its namespace."""
  page = (pathlib.Path(__file__).parent.parent / "docs" / "optimizers.md").read_text()
  section = page.split("### Recipe: BYOL-, SimCLR- and optax-style LARS")[1]
  code = section.split("```python\n")[1].split("```")[0]
  namespace: dict = {}
  exec(code, namespace)
  return namespace


def _run32(tx, params64, grads64, steps):
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params64)
  state = tx.init(params)
  update = jax.jit(tx.update)
  for t in range(steps):
    g = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), grads64[t % len(grads64)])
    updates, state = update(g, state, params)
    params = optax.apply_updates(params, updates)
  return params


def test_docs_byol_recipe_is_byols_rule_with_its_warmup_schedule():
  ns = _docs_recipe()
  params64, grads64 = _byol_problem()
  grads64 = grads64 * 3  # 15 steps: through the warm-up and into the decay
  ours = _run32(ns["byol_lars"], params64, grads64, len(grads64))
  expected = _byol_numpy(params64, grads64, lambda t: float(ns["schedule"](t)),
                         weight_decay=1.5e-6, eta=0.001)
  for name, value in masks.named_leaves(ours):
    np.testing.assert_allclose(value, expected[name], rtol=2e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("name", ["simclr_lars", "optax_lars"])
def test_docs_simclr_and_optax_recipes_are_optax_lars_with_its_warmup_schedule(name):
  ns = _docs_recipe()
  params64, grads64 = _byol_problem()
  grads64 = grads64 * 3
  keep = jax.tree.map(lambda x: np.ndim(x) > 1, params64)
  ref = optax.lars(ns["schedule"], weight_decay=1e-6, weight_decay_mask=keep,
                   trust_coefficient=0.001, trust_ratio_mask=keep, momentum=0.9)
  chex.assert_trees_all_close(_run32(ns[name], params64, grads64, len(grads64)),
                              _run32(ref, params64, grads64, len(grads64)), rtol=1e-6, atol=1e-7)


def test_byols_rate_after_the_buffer_is_far_from_optax_lars_with_a_schedule():
  """Where the rate meets the buffer shows once it changes: BYOL's against optax's."""
  ns = _docs_recipe()
  params64, grads64 = _byol_problem()
  keep = jax.tree.map(lambda x: np.ndim(x) > 1, params64)
  ref = optax.lars(ns["schedule"], weight_decay=1e-6, weight_decay_mask=keep,
                   trust_coefficient=0.001, trust_ratio_mask=keep, momentum=0.9)
  a = _run32(ns["byol_lars"], params64, grads64 * 3, 15)
  b = _run32(ref, params64, grads64 * 3, 15)
  p0 = jax.tree.map(np.asarray, params64)
  moved = max(float(np.max(np.abs(np.asarray(x) - y))) for x, y in
              zip(jax.tree.leaves(b), jax.tree.leaves(p0)))
  gap = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in
            zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert gap > 0.1 * moved
