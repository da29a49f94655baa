"""``lars_optax.porting.keras_lamb``: Keras 3's LAMB, its base arguments and exclusions."""

from __future__ import annotations


import warnings

import chex
import jax
import jax.numpy as jnp
import pytest

from porting_runs import P


def test_keras_lamb_takes_the_base_optimizers_arguments_and_refuses_what_has_no_port():
  """#52 item 3: Keras's clips are ported (the fixtures check their numbers), ``name``
  and the EMA settings without ``use_ema`` change nothing, and what cannot be ported is
  refused with the optax way to do it."""
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}}
  grads = jax.tree.map(lambda p: 3.0 * p, params)
  plain = P.keras_lamb(0.01).update(grads, P.keras_lamb(0.01).init(params), params)[0]
  named = P.keras_lamb(0.01, name="lamb", ema_momentum=0.9, ema_overwrite_frequency=3)
  chex.assert_trees_all_close(named.update(grads, named.init(params), params)[0], plain)
  with pytest.raises(ValueError, match=r"^clipnorm, global_clipnorm: Keras takes only one"):
    P.keras_lamb(clipnorm=1.0, global_clipnorm=1.0)
  with pytest.raises(ValueError, match=r"^clipvalue: must be > 0"):
    P.keras_lamb(clipvalue=0.0)
  with pytest.raises(ValueError, match=r"^use_ema: .*optax\.incremental_update"):
    P.keras_lamb(use_ema=True)
  with pytest.raises(ValueError, match=r"^loss_scale_factor: scale the loss"):
    P.keras_lamb(loss_scale_factor=128.0)
  with pytest.raises(ValueError, match=r"^gradient_accumulation_steps: must be an int >= 2"):
    P.keras_lamb(gradient_accumulation_steps=1)
  with pytest.raises(TypeError, match=r"^gradient_accumulation_steps: expected an int"):
    P.keras_lamb(gradient_accumulation_steps=True)
  with pytest.raises(TypeError, match=r"^name: expected a string"):
    P.keras_lamb(name=3)


def test_keras_exclude_from_weight_decay_takes_name_parts():
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}}
  zeros = jax.tree.map(jnp.zeros_like, params)
  tx = P.keras_lamb(0.1, weight_decay=0.5, exclude_from_weight_decay=["bias"])
  updates, _ = tx.update(zeros, tx.init(params), params)
  chex.assert_trees_all_close(updates, {"dense": {"kernel": -0.05 * jnp.ones((2, 2)),
                                                  "bias": jnp.zeros(2)}})


def test_keras_exclude_names_that_match_no_leaf_are_named_at_init():
  """#58 item 12: a Keras script's gamma and beta are not a Flax model's names; Keras
  skips such a name silently (its numbers are kept: the leaf decays), but init says
  which names matched nothing."""
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)},
            "layer_norm": {"scale": jnp.ones(2)}}
  zeros = jax.tree.map(jnp.zeros_like, params)
  tx = P.keras_lamb(0.1, weight_decay=0.5, exclude_from_weight_decay=["gamma", "beta", "bias"])
  with pytest.warns(UserWarning, match=r"^exclude_from_weight_decay: no parameter name "
                                       r"contains 'gamma', and none contains 'beta' "):
    state = tx.init(params)
  updates, _ = tx.update(zeros, state, params)
  chex.assert_trees_all_close(updates["layer_norm"]["scale"], -0.05 * jnp.ones(2))  # decayed
  chex.assert_trees_all_close(updates["dense"]["bias"], jnp.zeros(2))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    P.keras_lamb(0.1, weight_decay=0.5, exclude_from_weight_decay=["bias"]).init(params)
    P.keras_lamb(0.1, weight_decay=0.5, exclude_from_weight_decay=["bias"],
                 gradient_accumulation_steps=2).init(params)
