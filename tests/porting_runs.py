"""Small runs shared by the porting tests (``tests/test_porting*.py``)."""

import jax
import jax.numpy as jnp
import optax

import lars_optax

P = lars_optax.porting


def run_steps(tx, steps=4, dtype=jnp.float32):
  params = {"w": jnp.array([[1.0, -2.0], [0.5, 3.0]], dtype), "b": jnp.array([0.1, -0.2], dtype)}
  state = tx.init(params)
  step = jax.jit(tx.update)
  for k in range(steps):
    g = {"w": jnp.array([[0.3, -0.1], [0.0, 0.4]], dtype) * (k + 1),
         "b": jnp.array([0.5, -0.5], dtype)}
    updates, state = step(g, state, params)
    params = optax.apply_updates(params, updates)
  return params, state


def random_run(tx, steps=5):
  key = jax.random.key(0)
  params = {"dense": {"kernel": jax.random.normal(key, (4, 3)), "bias": jnp.full((3,), 0.2)},
            "norm": {"scale": jnp.ones((3,))}}
  state = tx.init(params)
  for i in range(steps):
    g = jax.tree.map(lambda p, i=i: jax.random.normal(jax.random.fold_in(key, i + 1), p.shape),
                     params)
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
  return params
