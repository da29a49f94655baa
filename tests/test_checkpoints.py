"""Optimizer states survive checkpoints: orbax-checkpoint and flax.serialization.

For ``lars`` (momentum: a ``ScaleByLarsTrustRatioState`` and an
``MXNetMomentumState``), ``adam``, ``signum``, ``sgd(multi_precision=True)`` on
bfloat16 params, ``svrg(lars)`` after ``svrg_refresh`` and
``skip_nonfinite(lars)`` after skipped NaN steps:

* the state is a pytree of arrays inside tuples, NamedTuples, dicts, lists,
  ``None``, ``optax.EmptyState`` and ``optax.MaskedNode`` only (nothing a
  checkpointer cannot write);
* a checkpoint written mid-run with ``ocp.StandardCheckpointer``,
  ``flax.serialization.to_bytes`` or ``to_state_dict`` restores, into the
  structure of a fresh ``tx.init``, to a bit-identical state;
* training resumed from it gives bit-identical params and state to the
  uninterrupted run.

The restore template of ``svrg`` must be a refreshed state:
``SVRGState.snapshot`` and ``full_grad`` are ``None`` before the first
``svrg_refresh`` and trees like the params after it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax

ocp = pytest.importorskip("orbax.checkpoint", reason="orbax-checkpoint is not installed")
serialization = pytest.importorskip("flax.serialization", reason="flax is not installed")

STEPS = 6
RESUME_AT = 3  # the checkpoint is written after steps 0, 1 and 2
SVRG_REFRESH_AT = (0, 4)  # before these steps: one before, one after the checkpoint
NAN_AT = (1, 4)  # skip_nonfinite: NaN gradients at these steps


def _data(n=32, d=4, k=3, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(np.float32)
  w = rng.normal(size=(d, k)).astype(np.float32)
  y = (x @ w + 0.5 + 0.1 * rng.normal(size=(n, k))).astype(np.float32)
  return [(jnp.asarray(x[i:i + 8]), jnp.asarray(y[i:i + 8])) for i in range(0, n, 8)]


BATCHES = _data()


def _params(kernel_dtype=jnp.float32, bias_dtype=jnp.float32):
  rng = np.random.default_rng(1)
  return {
      "dense": {"kernel": jnp.asarray(rng.normal(size=(4, 3)), kernel_dtype),
                "bias": jnp.zeros(3, bias_dtype)},
      "norm": {"scale": jnp.ones(3, kernel_dtype)},
  }


def _loss(params, batch):
  x, y = batch
  p = jax.tree.map(lambda a: a.astype(jnp.float32), params)
  pred = (x @ p["dense"]["kernel"] + p["dense"]["bias"]) * p["norm"]["scale"]
  return 0.5 * jnp.mean((pred - y) ** 2)


@dataclasses.dataclass(frozen=True)
class Case:
  make_tx: Callable[[], optax.GradientTransformation]
  params: Callable[[], Any] = _params
  svrg: bool = False
  nan_at: tuple[int, ...] = ()


CASES = {
    "lars": Case(lambda: lars_optax.lars(0.1, momentum=0.9, eta=1.0, wd=1e-4, skip="flax")),
    "adam": Case(lambda: lars_optax.mxnet.adam(0.01, wd=1e-4)),
    "signum": Case(lambda: lars_optax.signum(0.01, momentum=0.9, wd_lh=1e-4)),
    # bfloat16 kernel and scale get float32 masters; the float32 bias a MaskedNode.
    "sgd_multi_precision": Case(
        lambda: lars_optax.mxnet.sgd(0.1, momentum=0.9, wd=1e-4, multi_precision=True),
        params=lambda: _params(jnp.bfloat16, jnp.float32)),
    # The PRNG key is state: a restored run draws the same noise. (A large rescale_grad
    # makes the drift, lr/2 * s * g, outweigh the noise, sqrt(lr), so the loss falls.)
    "sgld": Case(lambda: lars_optax.mxnet.sgld(1e-4, rescale_grad=1000.0, wd=1e-4, key=3)),
    "dcasgd": Case(lambda: lars_optax.mxnet.dcasgd(0.1, momentum=0.9, lamda=0.5)),
    "svrg": Case(lambda: lars_optax.svrg.svrg(lars_optax.lars(0.1, momentum=0.9, eta=1.0,
                                                         skip="flax")), svrg=True),
    # Every field of the dense-exact state: last steps, the decay log pair and rows.
    "sparse_adamw": Case(lambda: lars_optax.sparse.adamw(
        optax.cosine_decay_schedule(0.01, 10), weight_decay=0.1)),
    # Every rate a schedule: no constant to keep (orbax saves no zero-size array), and
    # SGD's per-row sum of the rates to come.
    "sparse_adam_schedule": Case(lambda: lars_optax.sparse.adam(
        optax.warmup_cosine_decay_schedule(0.0, 0.01, 3, 10))),
    "sparse_sgd_schedule": Case(lambda: lars_optax.sparse.sgd(
        optax.cosine_decay_schedule(0.1, 10), momentum=0.9)),
    "skip_nonfinite": Case(lambda: lars_optax.skip_nonfinite(
        lars_optax.lars(0.1, momentum=0.9, eta=1.0, skip="flax")), nan_at=NAN_AT),
}


def _template_state(case: Case, tx, params):
  """A state with the structure of the one being restored (values do not matter)."""
  state = tx.init(params)
  if case.svrg:  # snapshot and full_grad become trees at the first refresh
    state = lars_optax.svrg.refresh(state, params, jax.tree.map(jnp.zeros_like, params))
  return state


def _make_step(case: Case, tx):
  svrg_grads = lars_optax.svrg.value_and_grads(_loss, jit=False)

  @jax.jit
  def step(params, state, batch, poison):
    if case.svrg:
      _, grads, snap_grads = svrg_grads(params, lars_optax.svrg.snapshot(state), batch)
      extra = {"snapshot_grads": snap_grads}
    else:
      grads, extra = jax.grad(_loss)(params, batch), {}
    grads = jax.tree.map(lambda g: jnp.where(poison, jnp.asarray(jnp.nan, g.dtype), g), grads)
    updates, state = tx.update(grads, state, params, **extra)
    return optax.apply_updates(params, updates), state

  return step


def _run(case: Case, step, params, state, start, stop):
  for i in range(start, stop):
    if case.svrg and i in SVRG_REFRESH_AT:
      mu = lars_optax.svrg.full_gradient(_loss, params, BATCHES)
      state = lars_optax.svrg.refresh(state, params, mu)
    params, state = step(params, state, BATCHES[i % len(BATCHES)], jnp.asarray(i in case.nan_at))
  return params, state


def _walk(node, path="state"):
  """Asserts that ``node`` holds only checkpointable containers and array leaves."""
  if node is None or isinstance(node, (optax.EmptyState, optax.MaskedNode)):
    return
  if isinstance(node, (jax.Array, np.ndarray)):
    return
  if isinstance(node, tuple):  # plain tuples (optax.chain) and NamedTuples
    names = getattr(node, "_fields", range(len(node)))
    for name, child in zip(names, node):
      _walk(child, f"{path}.{name}")
    return
  if isinstance(node, list):
    for i, child in enumerate(node):
      _walk(child, f"{path}[{i}]")
    return
  if isinstance(node, dict):
    for key, child in node.items():
      assert isinstance(key, str), f"{path}: non-string dict key {key!r}"
      _walk(child, f"{path}[{key!r}]")
    return
  pytest.fail(f"{path}: unexpected node {type(node).__name__}: {node!r}")


def _assert_bit_identical(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  chex.assert_trees_all_equal_dtypes(a, b)
  chex.assert_trees_all_equal(a, b)


# --------------------------------------------------------------------------
# Checkpointers: save(tree, directory) and restore(template, directory)
# --------------------------------------------------------------------------


def _orbax_roundtrip(tree, template, directory):
  path = directory / "orbax"
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(path, tree)
    checkpointer.wait_until_finished()  # StandardCheckpointer saves asynchronously
    return checkpointer.restore(path, template)


def _flax_bytes_roundtrip(tree, template, directory):
  directory.mkdir(parents=True, exist_ok=True)
  path = directory / "state.msgpack"
  path.write_bytes(serialization.to_bytes(tree))
  return serialization.from_bytes(template, path.read_bytes())


def _flax_state_dict_roundtrip(tree, template, directory):
  del directory
  state_dict = serialization.to_state_dict(tree)
  _assert_only_dicts_and_arrays(state_dict)
  # As stored by any dict-of-arrays format: host numpy copies.
  state_dict = jax.tree.map(np.asarray, state_dict)
  return serialization.from_state_dict(template, state_dict)


def _assert_only_dicts_and_arrays(node, path="state_dict"):
  if node is None or isinstance(node, (jax.Array, np.ndarray)):
    return
  assert isinstance(node, dict), f"{path}: {type(node).__name__} in a state dict"
  for key, child in node.items():
    _assert_only_dicts_and_arrays(child, f"{path}[{key!r}]")


CHECKPOINTERS = {
    "orbax": _orbax_roundtrip,
    "flax_bytes": _flax_bytes_roundtrip,
    "flax_state_dict": _flax_state_dict_roundtrip,
}


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------


@pytest.mark.op_by_op
@pytest.mark.parametrize("case_name", list(CASES))
def test_state_is_arrays_in_plain_containers(case_name):
  case = CASES[case_name]
  tx, params = case.make_tx(), case.params()
  state = tx.init(params)
  _walk(state)
  params, state = _run(case, _make_step(case, tx), params, state, 0, RESUME_AT)
  _walk(state)
  assert jax.tree.structure(state) == jax.tree.structure(_template_state(case, tx, params))


@pytest.mark.parametrize("checkpointer", list(CHECKPOINTERS))
@pytest.mark.parametrize("case_name", list(CASES))
def test_resume_from_checkpoint_is_bit_identical(case_name, checkpointer, tmp_path):
  case = CASES[case_name]
  tx, params0 = case.make_tx(), case.params()
  step = _make_step(case, tx)

  full_params, full_state = _run(case, step, params0, tx.init(params0), 0, STEPS)

  params, state = _run(case, step, params0, tx.init(params0), 0, RESUME_AT)
  saved = {"params": params, "opt_state": state}
  template = {"params": case.params(), "opt_state": _template_state(case, tx, case.params())}
  restored = CHECKPOINTERS[checkpointer](saved, template, tmp_path)
  _assert_bit_identical(restored, saved)

  params, state = _run(case, step, restored["params"], restored["opt_state"], RESUME_AT, STEPS)
  _assert_bit_identical(params, full_params)
  _assert_bit_identical(state, full_state)
  assert _loss(full_params, BATCHES[0]) < _loss(params0, BATCHES[0])


@pytest.mark.parametrize("checkpointer", list(CHECKPOINTERS))
def test_restored_states_keep_their_meaning(checkpointer, tmp_path):
  """The helpers that read a state work on a restored one, and the counters survive."""
  # LARS trust ratios, by name.
  case = CASES["skip_nonfinite"]
  tx, params = case.make_tx(), case.params()
  params, state = _run(case, _make_step(case, tx), params, tx.init(params), 0, RESUME_AT)
  restored = CHECKPOINTERS[checkpointer](state, tx.init(case.params()), tmp_path / "a")
  ratios = lars_optax.trust_ratios(restored, params)
  assert {n for n, r in ratios.items() if r == 1.0} == {"dense/bias", "norm/scale"}
  assert ratios["dense/kernel"] != 1.0
  assert int(restored.total_notfinite) == 1  # the NaN step 1 was skipped and counted

  # multi_precision masters, bit for bit.
  case = CASES["sgd_multi_precision"]
  tx, params = case.make_tx(), case.params()
  params, state = _run(case, _make_step(case, tx), params, tx.init(params), 0, RESUME_AT)
  restored = CHECKPOINTERS[checkpointer](state, tx.init(case.params()), tmp_path / "b")
  masters = lars_optax.master_params(restored, params)
  assert masters["dense"]["kernel"].dtype == jnp.float32
  assert masters["dense"]["bias"].dtype == jnp.float32
  _assert_bit_identical(masters, lars_optax.master_params(state, params))


@pytest.mark.parametrize("checkpointer", list(CHECKPOINTERS))
def test_svrg_state_before_the_first_refresh(checkpointer, tmp_path):
  """A state whose snapshot and full gradient are still None round-trips too."""
  tx = CASES["svrg"].make_tx()
  state = tx.init(_params())
  assert state.snapshot is None and state.full_grad is None
  restored = CHECKPOINTERS[checkpointer](state, tx.init(_params()), tmp_path)
  assert restored.snapshot is None and restored.full_grad is None
  _assert_bit_identical(restored, state)
