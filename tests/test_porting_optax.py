"""``lars_optax.porting.optax_lars`` and ``optax_lamb``: optax's numbers, optax's mask
forms, scanned stacks."""

from __future__ import annotations



import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax
from porting_runs import P, random_run, run_steps


def _keep(params):
  return jax.tree.map(lambda x: x.ndim > 1, params)


@pytest.mark.parametrize("mask", ["callable", "pytree", "true"])
@pytest.mark.parametrize("nesterov", [False, True])
def test_optax_lars_equals_optax_lars_with_each_mask_form(mask, nesterov):
  sched = optax.warmup_cosine_decay_schedule(0.01, 0.5, 2, 5, 0.05)
  params = random_run(optax.identity(), steps=0)
  form = {"callable": _keep, "pytree": _keep(params), "true": True}[mask]
  kw = {"weight_decay": 1e-3, "weight_decay_mask": form, "trust_coefficient": 0.01,
        "trust_ratio_mask": form, "momentum": 0.9, "nesterov": nesterov}
  chex.assert_trees_all_close(random_run(P.optax_lars(sched, **kw)),
                              random_run(optax.lars(sched, **kw)), rtol=2e-6, atol=1e-7)


def test_optax_lamb_equals_optax_lamb():
  sched = optax.linear_schedule(0.01, 0.1, 3)
  kw = {"weight_decay": 0.01, "mask": _keep, "eps_root": 1e-3, "b1": 0.8}
  chex.assert_trees_all_close(random_run(P.optax_lamb(sched, **kw)),
                              random_run(optax.lamb(sched, **kw)), rtol=2e-6, atol=1e-7)


def _stacked_run(tx, params, steps=4):
  """``steps`` updates of a stacked tree (boxes and Variables kept) with random gradients."""
  key = jax.random.key(3)
  state = tx.init(params)
  for i in range(steps):
    g = jax.tree.map(lambda p, i=i: jax.random.normal(jax.random.fold_in(key, i), p.shape),
                     params)
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
  return jax.tree.leaves(params)


def _linen_layers_stack():
  """Params as linen's nn.scan with metadata_params={nn.PARTITION_NAME: "layers"} boxes
  them: a stack of 4 layers, and a head."""
  nn = pytest.importorskip("flax.linen")
  key = jax.random.key(1)
  box = lambda shape, names, k: nn.Partitioned(
      jax.random.normal(jax.random.fold_in(key, k), shape), names=names)
  return {"blocks": {"Dense_0": {"kernel": box((4, 8, 8), ("layers", None, "mlp"), 0),
                                 "bias": box((4, 8), ("layers", "mlp"), 1)}},
          "head": {"kernel": jax.random.normal(key, (8, 3)), "bias": jnp.zeros(3)}}


def _nnx_layers_stack():
  """nnx.state of an nnx.vmap stack of 4 layers whose Variables carry 'layers'."""
  nnx = pytest.importorskip("flax.nnx")

  class Model(nnx.Module):
    def __init__(self, rngs):
      @nnx.split_rngs(splits=4)
      @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
      def make(rngs):
        return nnx.Linear(8, 8, rngs=rngs, kernel_init=nnx.with_partitioning(
            nnx.initializers.lecun_normal(), (None, "mlp")), bias_init=nnx.with_partitioning(
                nnx.initializers.normal(0.1), ("mlp",)))

      self.blocks = make(rngs)
      self.head = nnx.Linear(8, 3, rngs=rngs)

  from jax.sharding import Mesh  # partition names need a mesh that knows them
  with jax.set_mesh(Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("layers", "mlp"))):
    return nnx.state(Model(nnx.Rngs(0)), nnx.Param)


@pytest.mark.parametrize("stack", ["linen_boxes", "nnx_variables"])
@pytest.mark.parametrize("name", ["optax_lars", "optax_lamb"])
def test_optax_drop_ins_equal_optax_on_a_scanned_stack_and_warn_at_init(name, stack):
  """#52 item 1: on a stack with 'layers' metadata the drop-ins take optax's one ratio
  per stack by default (they ended 0.31 and 0.25 of the move away from optax with the
  per-layer default), and init says so; stacked=FROM_METADATA gives one per layer."""
  params = (_linen_layers_stack if stack == "linen_boxes" else _nnx_layers_stack)()
  ours, peer = {"optax_lars": (P.optax_lars, optax.lars),
                "optax_lamb": (P.optax_lamb, optax.lamb)}[name]
  kw = {"weight_decay": 1e-3}
  with pytest.warns(UserWarning, match=rf"^stacked: \['blocks/.*carry Flax 'layers' "
                                       rf"partition metadata.*{name} takes one trust ratio "
                                       r"per stack, as optax\.la[mr][bs] does"):
    got = _stacked_run(ours(0.1, **kw), params)
  want = _stacked_run(peer(0.1, **kw), params)
  chex.assert_trees_all_close(got, want, rtol=2e-6, atol=1e-6)
  per_layer = _stacked_run(ours(0.1, stacked=lars_optax.stacked.FROM_METADATA, **kw), params)
  # One ratio per layer: the stacked kernel takes other steps (by 5% of its move at least).
  (k,) = [i for i, a in enumerate(want) if a.ndim == 3]
  start = jax.tree.leaves(params)[k]
  gap, move = jnp.max(jnp.abs(per_layer[k] - want[k])), jnp.max(jnp.abs(want[k] - start))
  assert gap > 0.05 * move, (gap, move)


def test_optax_lars_logs_ratios_and_takes_stacked_and_lr_mult():
  tx = P.optax_lars(0.1, weight_decay=1e-3, lr_mult={"w": 0.5}, stacked=None)
  params, state = run_steps(tx, steps=2)
  ratios = lars_optax.trust_ratios(state, params)
  assert set(ratios) == {"w", "b"} and all(float(r) > 0 for r in ratios.values())


def test_optax_drop_ins_take_a_weight_decay_schedule_and_check_it():
  """optax's lars and lamb take ``weight_decay`` as a schedule (the fixtures check the
  numbers); a negative constant is still an error naming it."""
  sched = optax.linear_schedule(1e-3, 1e-4, 10)
  for make in (P.optax_lars, P.optax_lamb):
    params = random_run(make(0.1, weight_decay=sched), steps=2)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params))
    with pytest.raises(ValueError, match=r"^weight_decay"):
      make(0.1, weight_decay=-1.0)


def test_a_weight_decay_schedule_judges_a_stacked_leaf_as_one_layer():
  """A constant schedule decays the leaves the constant decays: on a stack of layers, the
  optax mask sees one layer (a stacked bias has one axis there, and is not decayed)."""
  key = jax.random.key(0)
  params = {"blocks": {"kernel": jax.random.normal(key, (4, 3, 3)),
                       "bias": jax.random.normal(jax.random.fold_in(key, 1), (4, 3))},
            "head": jax.random.normal(jax.random.fold_in(key, 2), (3, 2))}
  grads = jax.tree.map(lambda p: jnp.sin(3.0 * p), params)  # (not along the weights)
  kw = {"mask": _keep, "stacked": lars_optax.by_regex("^blocks/")}

  def run(tx):
    return tx.update(grads, tx.init(params), params)[0]

  chex.assert_trees_all_close(run(P.optax_lamb(0.1, weight_decay=lambda c: 0.5, **kw)),
                              run(P.optax_lamb(0.1, weight_decay=0.5, **kw)), rtol=1e-6)


@pytest.mark.parametrize("name", ["optax_lars", "optax_lamb"])
def test_a_plain_state_restores_into_inject_hyperparams_as_with_optax(name):
  """As with optax.lars and optax.lamb: inject_hyperparams passes weight_decay=0 as an
  array, and the chain keeps the decay link either way, so the states' structures agree."""
  params = {"w": jnp.ones((3, 4)), "b": jnp.ones(4)}
  grads = jax.tree.map(lambda p: 0.1 * p, params)
  make = getattr(P, name)
  plain_tx, injected_tx = make(0.1), optax.inject_hyperparams(make)(learning_rate=0.1)
  plain = plain_tx.init(params)
  injected = injected_tx.init(params)
  assert jax.tree.structure(plain) == jax.tree.structure(injected.inner_state)
  _, plain = plain_tx.update(grads, plain, params)
  restored = injected._replace(inner_state=plain)  # the plain checkpoint, restored
  ours, _ = jax.jit(injected_tx.update)(grads, restored, params)
  expected, _ = plain_tx.update(grads, plain, params)
  chex.assert_trees_all_close(ours, expected, rtol=1e-6)
