"""Every public optimizer's unit checks, drawn from ``tests/optimizers.py``'s table: it
builds, takes two steps on the table's tree with the row's shared jitted step (finite
updates in the params' structure and dtypes; ``numeric``, so not in the inner loop),
refuses a bad first argument by name when built and non-float params by the leaf's
name, and the table lists every public optimizer (``pytest -m unit``)."""

from __future__ import annotations

import inspect
import math

import chex
import jax
import jax.numpy as jnp
import pytest
import optimizers
from optimizers import BY_NAME, TABLE

import lars_optax


NAMESPACES = {"": lars_optax, "mxnet.": lars_optax.mxnet, "sparse.": lars_optax.sparse,
              "porting.": lars_optax.porting}
# Public functions that take a learning rate (or an optimizer) first but are links of a
# chain or wrappers, not optimizers (their own tests are in their family's module).
LINKS = {"mxnet_momentum", "mxnet.add_langevin_noise", "mxnet.ftrl_proximal",
         "mxnet.scale_by_ftml", "sparse.multi_steps"}


def _public_optimizers() -> set[str]:
  found, seen = set(), set()
  for prefix, ns in NAMESPACES.items():
    for name in ns.__all__:
      fn = getattr(ns, name)
      if not inspect.isfunction(fn) or id(fn) in seen:
        continue
      seen.add(id(fn))
      first = next(iter(inspect.signature(fn).parameters), None)
      if first in ("learning_rate", "lr", "opt") and f"{prefix}{name}" not in LINKS:
        found.add(f"{prefix}{name}")
  return found


def test_the_table_lists_every_public_optimizer():
  assert set(BY_NAME) == _public_optimizers()
  assert len(BY_NAME) == len(TABLE)  # one row each


@pytest.mark.numeric
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_two_jitted_steps_give_finite_updates_shaped_as_the_params(name):
  tx, step = optimizers.step(name)
  params = optimizers.canonical_params()
  grads = optimizers.canonical_grads(params)
  state = tx.init(params)
  for _ in range(2):
    params, state, updates = step(params, state, grads)
  chex.assert_trees_all_equal_shapes_and_dtypes(updates, params)
  chex.assert_tree_all_finite(updates)
  assert any(float(jnp.abs(u).max()) > 0 for u in jax.tree.leaves(updates)), name


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_a_nan_learning_rate_is_refused_by_name_when_built(name):
  o = BY_NAME[name]
  rate = "lr" if "lr" in inspect.signature(o.fn).parameters else o.first
  if o.first == "opt":  # timm_optimizer: the rate is its keyword
    call = lambda: o.make(lr=math.nan)
  else:
    call = lambda: o.fn(math.nan, *o.args[1:], **o.kwargs)
  with pytest.raises(ValueError, match=rf"\b{rate}\b"):
    call()


@pytest.mark.parametrize("name", sorted(BY_NAME))
@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint8, jnp.bool_])  # complex: test_dtypes.py
def test_non_float_params_are_refused_at_init_by_the_leafs_name(name, dtype):
  params = {"w": jnp.ones((4, 2)), "layer": {"bad": jnp.ones((2,), dtype)}}
  with pytest.raises(TypeError, match="'layer/bad'"):
    BY_NAME[name].make().init(params)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_non_float_params_are_refused_at_update_by_the_leafs_name(name):
  tx = BY_NAME[name].make()
  state = tx.init(optimizers.canonical_params())
  bad = {**optimizers.canonical_params(), "embed": jnp.ones((6, 4), jnp.int32)}
  with pytest.raises(TypeError, match="'embed'"):
    tx.update(bad, state, bad)
