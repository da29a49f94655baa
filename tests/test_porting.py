"""What every porting constructor shares: arguments named at construction in the peer's
words, what users pass (numpy, JAX and bfloat16 scalars, bfloat16 params, float16
with masters), ``inject_hyperparams``, constants beyond the params' dtype.

``tests/test_reference_peers.py`` checks every row of docs/porting.md against the
peer's own numbers; ``tests/test_porting_<peer>.py`` test each peer's rules.
"""

from __future__ import annotations



import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from porting_runs import P, run_steps


@pytest.mark.parametrize("call, error, match", [
    (lambda: P.timm_optimizer("adamw"), ValueError, "^opt: expected one of lars, larc"),
    (lambda: P.timm_optimizer("lars", trust_coef=0.1), TypeError,
     "^trust_coef: timm's 'lars' optimizer takes no such argument; it takes"),
    (lambda: P.timm_optimizer("cadamw", momentum_dtype=1), TypeError, "^momentum_dtype"),
    (lambda: P.timm_optimizer("lamb", weight_decay=0.1, no_weight_decay="pos_embed"),
     TypeError, "^no_weight_decay: expected a list"),
    (lambda: P.timm_lars(0.1, nesterov=True), ValueError, "^nesterov: Nesterov momentum needs"),
    (lambda: P.timm_lars(0.1, momentum=0.9, dampening=1.5), ValueError, "^dampening"),
    (lambda: P.timm_lars(-0.1), ValueError, "^lr"),
    (lambda: P.torch_sparse_adam(lr=-1), ValueError, "^lr: must be >= 0"),
    (lambda: P.torch_sparse_adam(eps=-1.0), ValueError, "^eps: must be >= 0"),
    (lambda: P.timm_lars(0.1, trust_coeff=-1.0), ValueError, "^trust_coeff"),
    (lambda: P.timm_lars(0.1, trust_clip=1), TypeError, "^trust_clip: expected a bool"),
    (lambda: P.timm_lamb(betas=(0.9,)), TypeError, "^betas: expected a pair"),
    (lambda: P.timm_lamb(betas=(0.9, 1.5)), ValueError, r"^betas\[1\]"),
    (lambda: P.timm_lamb(max_grad_norm=0.0), ValueError, "^max_grad_norm"),
    (lambda: P.timm_lamb(caution="yes"), TypeError, "^caution: expected a bool"),
    (lambda: P.keras_lamb(beta_1=1.0), ValueError, "^beta_1"),
    (lambda: P.keras_lamb(exclude_from_weight_decay="bias"), TypeError,
     "^exclude_from_weight_decay"),
    (lambda: P.optax_lars(0.1, trust_coefficient=-1.0), ValueError, "^trust_coefficient"),
    (lambda: P.optax_lamb(0.1, eps_root=-1.0), ValueError, "^eps_root"),
    (lambda: P.byol_lars(0.1, weight_decay_filter=3), TypeError, "^weight_decay_filter"),
    (lambda: P.simclr_lars(0.1, exclude_from_weight_decay="bias"), TypeError,
     "^exclude_from_weight_decay: expected a list"),
    (lambda: P.simclr_lars(0.1, exclude_from_weight_decay=["(bias"]), ValueError,
     "^exclude_from_weight_decay: not a valid regular expression"),
    (lambda: P.albert_lamb(0.1, weight_decay_rate=-1.0), ValueError, "^weight_decay_rate"),
    (lambda: P.torch_sparse_adam(betas=(1.0, 0.9)), ValueError, r"^betas\[0\]"),
])
def test_bad_arguments_are_named_at_construction(call, error, match):
  with pytest.raises(error, match=match):
    call()


@pytest.mark.op_by_op
@pytest.mark.parametrize("scalar", [float, np.float32, jnp.float32, jnp.bfloat16],
                         ids=["python", "numpy", "jax", "bfloat16"])
@pytest.mark.parametrize("make", [
    lambda s: P.timm_lars(s(0.25), momentum=s(0.75), dampening=s(0.5), trust_coeff=s(0.125),
                          weight_decay=s(0.0625), trust_clip=True),
    lambda s: P.timm_lamb(s(0.125), weight_decay=s(0.0625), betas=(s(0.75), s(0.875)),
                          decoupled_decay=True, caution=True, trust_clip=True,
                          grad_averaging=False),
    lambda s: P.optax_lamb(s(0.125), weight_decay=s(0.0625), eps_root=s(2.0**-20)),
    lambda s: P.optax_lars(s(0.25), weight_decay=s(0.0625), momentum=s(0.75), nesterov=True),
], ids=["timm_lars", "timm_lamb", "optax_lamb", "optax_lars"])
def test_scalars_of_any_kind_give_the_same_step(make, scalar):
  ours, _ = run_steps(make(scalar))
  ref, _ = run_steps(make(float))
  chex.assert_trees_all_close(ours, ref, rtol=1e-6)


@pytest.mark.op_by_op
@pytest.mark.parametrize("tx", [
    P.timm_lars(np.float32(0.1), momentum=np.float32(0.9), dampening=0.1, weight_decay=1e-3),
    P.timm_optimizer("nlarc", lr=0.1, weight_decay=1e-3),
    P.timm_lamb(np.float32(0.01), decoupled_decay=True, caution=True),
    P.keras_lamb(0.01, weight_decay=0.01),
    P.optax_lars(0.1, weight_decay=1e-3),
], ids=["timm_lars_dampened", "timm_nlarc", "timm_lamb_decoupled_cautious", "keras_lamb",
        "optax_lars"])
def test_bfloat16_params_keep_their_dtype_and_state(tx):
  params = {"w": jnp.ones((2, 3), jnp.bfloat16)}
  state = tx.init(params)
  updates, new_state = jax.jit(tx.update)(params, state, params)
  assert updates["w"].dtype == jnp.bfloat16
  chex.assert_trees_all_equal_dtypes(new_state, state)


@pytest.mark.op_by_op
@pytest.mark.parametrize("make, kwargs", [
    (P.optax_lars, {"learning_rate": 0.1, "weight_decay": 1e-3, "nesterov": True}),
    (P.timm_lars, {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 1e-3,
                   "trust_clip": True}),
    (P.timm_lamb, {"lr": 0.01, "caution": True, "decoupled_decay": True}),
    (P.keras_lamb, {"learning_rate": 0.01, "weight_decay": 0.01}),
], ids=["optax_lars", "timm_lars", "timm_lamb", "keras_lamb"])
def test_inject_hyperparams_gives_the_same_steps(make, kwargs):
  injected, _ = run_steps(optax.inject_hyperparams(make)(**kwargs))
  plain, _ = run_steps(make(**kwargs))
  chex.assert_trees_all_close(injected, plain, rtol=1e-6)


@pytest.mark.op_by_op
@pytest.mark.parametrize("make", [
    lambda **kw: P.timm_optimizer("nlarc", lr=0.1, weight_decay=1e-3, **kw),
    lambda **kw: P.timm_lamb(0.01, decoupled_decay=True, **kw),
    lambda **kw: P.optax_lamb(0.01, weight_decay=1e-3, **kw),
    lambda **kw: P.simclr_lars(0.1, weight_decay=1e-3, classic_momentum=False, **kw),
], ids=["timm_nlarc", "timm_lambw", "optax_lamb", "simclr_popular"])
def test_float16_params_with_float32_masters_follow_the_float32_run(make):
  masters, _ = run_steps(make(multi_precision=True), dtype=jnp.float16)
  assert masters["w"].dtype == jnp.float16
  ref, _ = run_steps(make(), dtype=jnp.float32)
  chex.assert_trees_all_close(jax.tree.map(lambda x: x.astype(jnp.float32), masters), ref,
                              rtol=2e-3, atol=2e-3)


BEYOND_FLOAT32 = [
    (P.timm_lars, {"lr": 0.1, "weight_decay": 1e-4}, "trust_coeff"),
    (P.timm_lars, {"weight_decay": 1e-4}, "eps"),
    (P.timm_lamb, {}, "eps"),
    (P.optax_lars, {"learning_rate": 0.1}, "trust_coefficient"),
    (P.optax_lamb, {"learning_rate": 0.1}, "eps_root"),
    (P.keras_lamb, {}, "epsilon"),
    (P.albert_lamb, {"learning_rate": 0.1}, "weight_decay_rate"),
    (P.simclr_lars, {"learning_rate": 0.1}, "eeta"),
    (P.byol_lars, {"learning_rate": 0.1}, "eta"),
]


@pytest.mark.parametrize("make, kwargs, arg", BEYOND_FLOAT32,
                         ids=[f"{f.__name__}-{a}" for f, _, a in BEYOND_FLOAT32])
def test_a_constant_beyond_the_params_dtype_is_named_in_the_peers_words(make, kwargs, arg):
  """Checked once, by the constructor's first link, under the peer's name."""
  tx = make(**kwargs, **{arg: 1e39})
  with pytest.raises(ValueError, match=rf"^{arg}: 1e\+39 is beyond the range of float32"):
    tx.init({"w": jnp.ones((2, 2))})
