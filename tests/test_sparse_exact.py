"""lars_optax.sparse.adam, adamw, sgd and catch_up: optax's numbers on row-sparse gradients.

The reference is optax itself: its ``adam``, ``adamw`` and ``sgd`` on the dense
gradient (zeros on the absent rows). Over a Zipfian id stream in which some
rows wait more than 400 steps, the dense-exact lazy step followed by
:func:`lars_optax.sparse.catch_up` equals it to 1e-5 of how far the weights
moved (the largest move in the table), for every row, with a constant rate
and with warm-up + cosine, under ``jit`` with donated buffers.
"""

import io
import pickle

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import serialization
from jax.experimental.sparse import BCOO

import lars_optax

ROWS, DIM, BATCH, STEPS = 2000, 8, 64, 500
TOL = 1e-5  # of the largest move in the table
SCHEDULE = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 50, STEPS)


def _stream(steps=STEPS, rows=ROWS, batch=BATCH, seed=0):
  rng = np.random.default_rng(seed)
  ids = ((rng.zipf(1.2, size=(steps, batch)) - 1) % rows).astype(np.int32)
  values = (rng.normal(size=(steps, batch, DIM)) * 1e-2).astype(np.float32)
  w0 = (rng.normal(size=(rows, DIM)) * 0.1).astype(np.float32)
  return ids, values, w0


IDS, VALUES, W0 = _stream()


def _longest_wait(ids):
  """The most steps any touched row went untouched between touches (or until the end)."""
  last, longest = {}, 0
  for step, batch in enumerate(ids):
    for r in set(batch.tolist()):
      longest = max(longest, step - last.get(r, step))
      last[r] = step
  return max(longest, *(len(ids) - s for s in last.values()))


def _train(tx, sparse, steps=STEPS, params=None, state=None, start=0):
  params = {"t": jnp.asarray(W0), "b": jnp.ones(3)} if params is None else params
  state = tx.init(params) if state is None else state

  def step(params, state, ids, values):
    table = (BCOO((values, ids[:, None]), shape=(ROWS, DIM)) if sparse
             else jnp.zeros((ROWS, DIM)).at[ids].add(values))
    grads = {"t": table, "b": values[:3, 0]}
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  f = jax.jit(step, donate_argnums=(0, 1))
  for i in range(start, start + steps):
    params, state = f(params, state, jnp.asarray(IDS[i]), jnp.asarray(VALUES[i]))
  return params, state


def _assert_close_to(got, want, w0=W0):
  moved = float(jnp.abs(want["t"] - w0).max())
  err = np.abs(np.asarray(got["t"]) - np.asarray(want["t"])).max(axis=1)  # per row
  assert err.max() <= TOL * moved, (err.max() / moved, int(err.argmax()))
  for key in set(got) - {"t"}:
    chex.assert_trees_all_close(got[key], want[key], rtol=1e-5, atol=1e-6)


def _times10(lr):
  return (lambda count: 10 * lr(count)) if callable(lr) else 10 * lr


TWINS = {
    "adam": (lambda lr: lars_optax.sparse.adam(lr), lambda lr: optax.adam(lr)),
    "adam-nesterov": (lambda lr: lars_optax.sparse.adam(lr, nesterov=True),
                      lambda lr: optax.adam(lr, nesterov=True)),
    "adamw": (lambda lr: lars_optax.sparse.adamw(lr, weight_decay=0.1),
              lambda lr: optax.adamw(lr, weight_decay=0.1)),
    "sgd-momentum": (lambda lr: lars_optax.sparse.sgd(_times10(lr), momentum=0.9),
                     lambda lr: optax.sgd(_times10(lr), momentum=0.9)),
    "sgd-nesterov": (lambda lr: lars_optax.sparse.sgd(_times10(lr), momentum=0.9, nesterov=True),
                     lambda lr: optax.sgd(_times10(lr), momentum=0.9, nesterov=True)),
}


def test_the_stream_has_rows_that_wait_more_than_400_steps():
  assert _longest_wait(IDS) > 400


@pytest.mark.parametrize("lr", [1e-2, SCHEDULE], ids=["constant", "warmup-cosine"])
@pytest.mark.parametrize("name", list(TWINS))
def test_after_catch_up_every_row_equals_the_optax_twin_on_the_dense_gradient(name, lr):
  ours, twin = TWINS[name]
  tx = ours(lr)
  params, state = _train(tx, sparse=True)
  params, state = lars_optax.sparse.catch_up(tx, params, state)
  want, want_state = _train(twin(lr), sparse=False)
  _assert_close_to(params, want)
  # The state's inner part is the twin's state for these params.
  got_bufs = [x for x in jax.tree.leaves(state.inner) if np.shape(x) == (ROWS, DIM)]
  want_bufs = [x for x in jax.tree.leaves(want_state) if np.shape(x) == (ROWS, DIM)]
  assert len(got_bufs) == len(want_bufs) >= 1
  for g, w in zip(got_bufs, want_bufs):
    chex.assert_trees_all_close(g, w, rtol=2e-5, atol=1e-9)


@pytest.mark.parametrize("mask", [{"t": False, "b": True}, {"t": True, "b": False},
                                  lambda p: {"t": True, "b": False}],
                         ids=["table-undecayed", "table-decayed", "callable"])
def test_adamw_mask_leaves_the_masked_leaves_undecayed_as_optax(mask):
  tx = lars_optax.sparse.adamw(SCHEDULE, weight_decay=0.5, mask=mask)
  params, state = _train(tx, sparse=True, steps=120)
  params, _ = lars_optax.sparse.catch_up(tx, params, state)
  want, _ = _train(optax.adamw(SCHEDULE, weight_decay=0.5, mask=mask), sparse=False, steps=120)
  _assert_close_to(params, want)


def test_a_row_away_for_many_steps_moves_as_under_the_dense_step():
  """Without catch_up the lazy table differs from the dense one; with it, it does not."""
  tx = lars_optax.sparse.adam(1e-2)
  params, state = _train(tx, sparse=True, steps=100)
  want, _ = _train(optax.adam(1e-2), sparse=False, steps=100)
  assert float(jnp.abs(params["t"] - want["t"]).max()) > 1e-3  # the rows left behind
  caught, _ = lars_optax.sparse.catch_up(tx, params, state)
  _assert_close_to(caught, want)


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd-momentum"])
def test_dense_gradients_take_the_optax_step(name):
  ours, twin = TWINS[name]
  got, _ = _train(ours(SCHEDULE), sparse=False, steps=20)
  want, _ = _train(twin(SCHEDULE), sparse=False, steps=20)
  chex.assert_trees_all_close(got, want, rtol=1e-6, atol=1e-7)


def test_a_dense_step_after_sparse_steps_brings_every_row_up_to_date_first():
  tx = lars_optax.sparse.adamw(SCHEDULE, weight_decay=0.1)
  params, state = _train(tx, sparse=True, steps=30)
  params, state = _train(tx, sparse=False, steps=5, params=params, state=state, start=30)
  want, _ = _train(optax.adamw(SCHEDULE, weight_decay=0.1), sparse=False, steps=35)
  _assert_close_to(params, want)


def test_a_dense_step_after_sparse_steps_on_leaves_of_both_decays_is_optax_adamw():
  """Several leaves behind at once, of three shapes and on both sides of AdamW's mask: the
  dense step brings every row of each up to date, each with its own decay."""
  mask = {"t": True, "u": False, "v": True, "b": False}
  tx = lars_optax.sparse.adamw(SCHEDULE, weight_decay=0.1, mask=mask)
  twin = optax.adamw(SCHEDULE, weight_decay=0.1, mask=mask)
  shapes = {"t": (ROWS, DIM), "u": (300,), "v": (50, 2)}
  rng = np.random.default_rng(1)
  params = {"t": jnp.asarray(W0), "u": jnp.asarray(rng.normal(size=300), jnp.float32),
            "v": jnp.asarray(rng.normal(size=(50, 2)), jnp.float32), "b": jnp.ones(3)}

  def grads(i, sparse):
    out = {"b": jnp.asarray(VALUES[i, :3, 0])}
    for k, shape in shapes.items():
      ids = jnp.asarray(IDS[i] % shape[0])
      values = jnp.asarray(VALUES[i][:, :shape[1]] if len(shape) > 1 else VALUES[i, :, 0])
      out[k] = (BCOO((values, ids[:, None]), shape=shape) if sparse
                else jnp.zeros(shape).at[ids].add(values))
    return out

  def run(tx, sparse_steps):
    @jax.jit
    def step(p, state, g):
      updates, state = tx.update(g, state, p)
      return optax.apply_updates(p, updates), state

    p, state = params, tx.init(params)
    for i in range(35):
      p, state = step(p, state, grads(i, i < sparse_steps))
    return p

  got, want = run(tx, 30), run(twin, 0)
  _assert_close_to(got, want)


def test_training_continues_exactly_after_catch_up():
  tx = lars_optax.sparse.adam(SCHEDULE)
  params, state = _train(tx, sparse=True, steps=60)
  params, state = lars_optax.sparse.catch_up(tx, params, state)
  params, state = _train(tx, sparse=True, steps=60, params=params, state=state, start=60)
  params, _ = lars_optax.sparse.catch_up(tx, params, state)
  want, _ = _train(optax.adam(SCHEDULE), sparse=False, steps=120)
  _assert_close_to(params, want)


def test_catch_up_of_some_rows_brings_those_rows_as_catch_up_of_all():
  tx = lars_optax.sparse.adamw(SCHEDULE)
  params, state = _train(tx, sparse=True, steps=50)
  ids = jnp.array([1052, 3, 3, ROWS, 1999])  # a repeat and the padding id
  some, some_state = lars_optax.sparse.catch_up(tx, params, state, rows={"t": ids})
  every, _ = lars_optax.sparse.catch_up(tx, params, state)
  picked = np.array([1052, 3, 1999])
  chex.assert_trees_all_close(some["t"][picked], every["t"][picked], rtol=1e-6, atol=1e-8)
  others = np.setdiff1d(np.arange(ROWS), picked)
  chex.assert_trees_all_equal(some["t"][others], params["t"][others])
  assert set(np.asarray(some_state.last_step["t"])[picked].tolist()) == {50}


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_catch_up_reads_ids_as_table_indexing_does(jit):
  """-1 is the last row, as table[-1] reads it; an id past an end is the row there."""
  tx = lars_optax.sparse.adam(0.1)
  params = {"t": jnp.ones((10, 2))}
  state = tx.init(params)
  for rows in ([0, 9], [3], [3], [3]):  # rows 0 and 9 move, then fall behind
    g = BCOO((jnp.ones((len(rows), 2)), jnp.array(rows)[:, None]), shape=(10, 2))
    updates, state = tx.update({"t": g}, state, params)
    params = optax.apply_updates(params, updates)
  every, _ = lars_optax.sparse.catch_up(tx, params, state)
  assert not np.allclose(every["t"][np.array([0, 9])], params["t"][np.array([0, 9])])
  fn = lambda p, s, i: lars_optax.sparse.catch_up(tx, p, s, rows={"t": i})
  fn = jax.jit(fn) if jit else fn
  for ids, picked in (([-1], 9), ([-10], 0), ([15], 9), ([-13], 0)):
    some, _ = fn(params, state, jnp.asarray(ids, jnp.int32))
    chex.assert_trees_all_close(some["t"][picked], every["t"][picked], rtol=1e-6)


@pytest.mark.parametrize("route", ["masked", "multi_transform", "partition"])
def test_catch_up_of_every_row_inside_a_router_equals_the_dense_run(route):
  """The usual way to route a table and dense layers: the state holds MaskedNodes."""
  labels = {"t": "s", "b": "d"}

  def routed(sparse_tx):
    if route == "masked":
      return optax.chain(optax.masked(sparse_tx, {"t": True, "b": False}),
                         optax.masked(optax.sgd(0.1), {"t": False, "b": True}))
    make = optax.multi_transform if route == "multi_transform" else optax.partition
    return make({"s": sparse_tx, "d": optax.sgd(0.1)}, labels)

  exact = lars_optax.sparse.adam(SCHEDULE)
  params, state = _train(routed(exact), sparse=True, steps=60)
  params, _ = lars_optax.sparse.catch_up(exact, params, state)
  want, _ = _train(routed(optax.adam(SCHEDULE)), sparse=False, steps=60)
  _assert_close_to(params, want)


def test_catch_up_twice_changes_nothing_and_runs_under_jit():
  tx = lars_optax.sparse.sgd(0.1, momentum=0.9)
  params, state = _train(tx, sparse=True, steps=40)
  once = jax.jit(lambda p, s: lars_optax.sparse.catch_up(tx, p, s))(params, state)
  twice = lars_optax.sparse.catch_up(tx, *once)
  chex.assert_trees_all_equal(once, twice)


def test_adamw_with_a_constant_rate_keeps_one_int32_per_row_and_nothing_else():
  params = {"t": jnp.zeros((ROWS, DIM))}
  for tx in (lars_optax.sparse.adam(SCHEDULE), lars_optax.sparse.adamw(1e-3),
             lars_optax.sparse.sgd(0.1, momentum=0.9)):
    state = tx.init(params)
    twin_bytes = sum(x.nbytes for x in jax.tree.leaves(state.inner))
    extra = sum(x.nbytes for x in jax.tree.leaves(state)) - twin_bytes
    # last_step, the step count, and the constant rates (a schedule has none)
    rates = sum(x.nbytes for x in jax.tree.leaves(state.rates))  # (a MaskedNode: none)
    assert extra == ROWS * 4 + 4 + rates <= ROWS * 4 + 12
  state = lars_optax.sparse.adamw(SCHEDULE).init(params)  # a schedule: + one float32 per row
  assert state.row_log_decay["t"].shape == (ROWS,)
  state = lars_optax.sparse.sgd(SCHEDULE, momentum=0.9).init(params)  # so for SGD
  assert state.row_future["t"].shape == (ROWS,)
  assert isinstance(state.row_log_decay["t"], optax.MaskedNode)


def test_the_compiled_step_has_no_table_sized_temporary():
  rows, dim = 100_000, 64
  tx = lars_optax.sparse.adamw(SCHEDULE)
  params = {"t": jnp.zeros((rows, dim))}
  state = tx.init(params)
  grads = {"t": BCOO((jnp.ones((256, dim)), jnp.arange(256)[:, None]), shape=(rows, dim))}

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, grads).compile()
  mem = compiled.memory_analysis()
  # The temporaries scale with the rows in the gradient (256 here), times the window.
  assert mem.temp_size_in_bytes < rows * dim * 4 // 20, mem.temp_size_in_bytes
  copies = [line for line in compiled.as_text().splitlines()
            if " copy(" in line and f"[{rows}" in line]
  assert not copies, copies  # last_step and the table are updated in place
  assert mem.alias_size_in_bytes >= 3 * rows * dim * 4  # table and moments in place


def test_a_dense_step_copies_no_param_sized_buffer_through_the_catch_up_branch():
  """Dense leaves are caught up in a branch taken only when a row is behind; only the
  weights' drift leaves it (the moments are decayed outside, in the step's pass)."""
  params = {"w": jnp.ones((512, 512))}
  tx = lars_optax.sparse.adam(1e-3)

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, tx.init(params), params).compile()
  # The drift (one param's size) and the window's per-row sums (512 rows x 132 steps, a few
  # float32 arrays of them); a second param-sized buffer would be 1 MB more.
  assert compiled.memory_analysis().temp_size_in_bytes <= 512 * 512 * 4 + 4 * 512 * 132 * 4


# --------------------------------------------------------------------------
# With the rest of lars_optax.sparse and the wrappers
# --------------------------------------------------------------------------


def _bag_loss(params, ids, y):
  return jnp.mean((params["t"][ids].mean(axis=1) @ params["w"] - y) ** 2)


def _bag_data(steps, seed=1):
  rng = np.random.default_rng(seed)
  ids = ((rng.zipf(1.3, size=(steps, 16, 4)) - 1) % 500).astype(np.int32)
  return ids, rng.normal(size=(steps, 16)).astype(np.float32)


def _bag_params():
  return {"t": jnp.asarray(np.random.default_rng(2).normal(size=(500, DIM)) * 0.1, jnp.float32),
          "w": jnp.ones(DIM)}


def _bag_run(adam, tx, twin, steps, catch_rows=True):
  """Trains the bag model with ``tx`` (sparse gradients) and ``twin`` (dense ones)."""
  ids, ys = _bag_data(steps)
  grad_fn = lars_optax.sparse.value_and_grad(_bag_loss, sparse="t")
  params, state = _bag_params(), tx.init(_bag_params())
  want, want_state = _bag_params(), twin.init(_bag_params())

  @jax.jit
  def step(params, state, ids, y):
    if catch_rows:  # the forward pass reads the batch's rows as the dense run has them
      params, state = lars_optax.sparse.catch_up(adam, params, state, rows={"t": ids})
    _, grads = grad_fn(params, ids, y)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  @jax.jit
  def twin_step(params, state, ids, y):
    grads = jax.grad(_bag_loss)(params, ids, y)
    updates, state = twin.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for i in range(steps):
    params, state = step(params, state, ids[i], ys[i])
    want, want_state = twin_step(want, want_state, ids[i], ys[i])
  params, state = lars_optax.sparse.catch_up(adam, params, state)
  return params, want


def test_a_model_whose_batches_catch_up_their_rows_first_trains_as_the_dense_run():
  adam = lars_optax.sparse.adamw(SCHEDULE, weight_decay=0.1)
  got, want = _bag_run(adam, adam, optax.adamw(SCHEDULE, weight_decay=0.1), 60)
  _assert_close_to(got, want, _bag_params()["t"])
  # Without it, the forward pass reads stale rows, and the run is another one.
  got, want = _bag_run(adam, adam, optax.adamw(SCHEDULE, weight_decay=0.1), 60,
                       catch_rows=False)
  assert float(jnp.abs(got["t"] - want["t"]).max()) > 100 * TOL


def test_the_table_alone_given_to_sparse_adam_beside_optax_adam_trains_as_the_dense_run():
  """docs/sparse.md: sparse.adam steps the table only and optax.adam the rest
  (optax.multi_transform); catch_up takes the table's optimizer and the chain's state.
  The run is dense optax.adam's, as with sparse.adam on every leaf."""
  adam = lars_optax.sparse.adam(SCHEDULE)
  tx = optax.multi_transform({"table": adam, "tower": optax.adam(SCHEDULE)},
                             {"t": "table", "w": "tower"})
  got, want = _bag_run(adam, tx, optax.adam(SCHEDULE), 60)
  _assert_close_to(got, want, _bag_params()["t"])


NAMED = {  # the optimizers with the table named, and optax's
    "adamw": (lambda lr, **k: lars_optax.sparse.adamw(lr, weight_decay=0.1, **k),
              lambda lr: optax.adamw(lr, weight_decay=0.1)),
    "sgd-momentum": (lambda lr, **k: lars_optax.sparse.sgd(lr, momentum=0.9, **k),
                     lambda lr: optax.sgd(lr, momentum=0.9)),
    "adam": (lambda lr, **k: lars_optax.sparse.adam(lr, **k), lambda lr: optax.adam(lr)),
}


@pytest.mark.parametrize("name", ["adamw", "sgd-momentum"])
def test_the_whole_model_with_the_table_named_trains_as_the_dense_run(name):
  """docs/sparse.md's whole-model example: sparse="t" names the table, and every
  other leaf takes optax's own step and keeps no rows."""
  make, twin = NAMED[name]
  lr = _times10(SCHEDULE) if name.startswith("sgd") else SCHEDULE
  tx = make(lr, sparse="t")
  got, want = _bag_run(tx, tx, twin(lr), 60)
  _assert_close_to(got, want, _bag_params()["t"])
  state = tx.init(_bag_params())
  assert isinstance(state.last_step["w"], optax.MaskedNode)
  assert state.last_step["t"].shape == (_bag_params()["t"].shape[0],)


@pytest.mark.parametrize("name", list(NAMED))
def test_leaves_not_named_by_sparse_take_the_optax_step_to_the_bit(name):
  make, twin = NAMED[name]
  params = {"t": jnp.asarray(W0), "b": jnp.ones(3)}
  txs = [make(SCHEDULE, sparse=False), make(SCHEDULE, sparse="t")]
  want_tx = twin(SCHEDULE)
  states, want_state = [tx.init(params) for tx in txs], want_tx.init(params)
  for i in range(3):
    grads = {"t": jnp.full_like(params["t"], 0.01 * (i + 1)), "b": jnp.full(3, 0.1)}
    want, want_state = want_tx.update(grads, want_state, params)
    for k, tx in enumerate(txs):
      got, states[k] = tx.update(grads, states[k], params)
      chex.assert_trees_all_equal(got["b"], want["b"])
      if k == 0:  # (with no leaf named, every leaf)
        chex.assert_trees_all_equal(got["t"], want["t"])


def test_sparse_names_the_leaves_that_take_row_sparse_gradients_and_tells_what_it_misses():
  params = {"t": jnp.asarray(W0), "b": jnp.ones(3)}
  grads = {"t": BCOO((jnp.ones((2, DIM)), jnp.array([[1], [5]])), shape=(ROWS, DIM)),
           "b": jnp.ones(3)}
  tx = lars_optax.sparse.adam(1e-2, sparse="b")
  with pytest.raises(ValueError, match=r"sparse\.adam: sparse: the leaf 't' has a row-sparse"):
    tx.update(grads, tx.init(params), params)
  with pytest.raises(ValueError, match=r"sparse\.adamw: sparse: .*selects no leaf"):
    lars_optax.sparse.adamw(1e-2, sparse="table").init(params)
  with pytest.raises(TypeError, match=r"sparse\.sgd: sparse: expected a mask"):
    lars_optax.sparse.sgd(1e-2, sparse=3)
  # A mask works as value_and_grad's does; the named leaf takes its rows.
  tx = lars_optax.sparse.adam(1e-2, sparse=lars_optax.masks.by_leaf_name("t"))
  updates, _ = tx.update(grads, tx.init(params), params)
  assert lars_optax.sparse.is_row_sparse(updates["t"])


def test_with_value_and_grad_clip_by_global_norm_and_multi_steps():
  adam = lars_optax.sparse.adam(1e-2)
  tx = lars_optax.sparse.multi_steps(
      optax.chain(lars_optax.sparse.clip_by_global_norm(0.05), adam),
      every_k_schedule=3, sparse="t", nse=64)
  twin = optax.MultiSteps(optax.chain(optax.clip_by_global_norm(0.05), optax.adam(1e-2)),
                          every_k_schedule=3)
  got, want = _bag_run(adam, tx, twin, 30)
  _assert_close_to(got, want, _bag_params()["t"])


def test_nnx_optimizer_with_catch_up_of_the_batch_rows_trains_as_dense_adam():
  from flax import nnx

  class Bag(nnx.Module):
    def __init__(self, rngs):
      self.embed = nnx.Embed(50, 4, rngs=rngs)
      self.out = nnx.Linear(4, 1, rngs=rngs)

    def __call__(self, ids):
      return self.out(self.embed(ids).mean(axis=1))[:, 0]

  y = jnp.array([0.5, -1.0])

  graphdef = nnx.graphdef(Bag(nnx.Rngs(0)))
  loss = lambda p, ids: jnp.mean((nnx.merge(graphdef, p)(ids) - y) ** 2)
  grad_fn = jax.jit(lambda p, ids: lars_optax.sparse.value_and_grad(loss, sparse="embedding")(
      p, ids)[1])

  def sparse_grads(model, ids):
    return grad_fn(nnx.state(model, nnx.Param), ids)

  model, dense = Bag(nnx.Rngs(0)), Bag(nnx.Rngs(0))
  tx = lars_optax.sparse.adam(0.1)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  dense_optimizer = nnx.Optimizer(dense, optax.adam(0.1), wrt=nnx.Param)

  caught = jax.jit(lambda p, s, rows: lars_optax.sparse.catch_up(tx, p, s, rows=rows))

  def catch_up(rows=None):  # nnx keeps the state in variables: catch up their values
    params = nnx.as_pure(nnx.state(model, nnx.Param))
    params, state = caught(params, nnx.as_pure(optimizer.opt_state), rows)
    nnx.update(model, params)
    nnx.update(optimizer.opt_state, nnx.state(state))

  ids = jnp.array([[1, 2, 2], [7, 1, 49]], jnp.int32)
  for batch in (ids, (ids + 3) % 50, ids, (ids * 7) % 50):
    catch_up({"embedding": batch})
    optimizer.update(model, sparse_grads(model, batch))
    dense_loss = lambda m, batch=batch: jnp.mean((m(batch) - y) ** 2)
    dense_optimizer.update(dense, nnx.grad(dense_loss)(dense))
  catch_up()
  chex.assert_trees_all_close(nnx.state(model, nnx.Param), nnx.state(dense, nnx.Param),
                              rtol=1e-5, atol=1e-6)


def test_multi_precision_float16_table_with_float32_masters():
  adam = lars_optax.sparse.adam(1e-2)
  tx = lars_optax.multi_precision(adam)
  twin = lars_optax.multi_precision(optax.adam(1e-2))
  params = {"t": jnp.asarray(W0, jnp.float16), "b": jnp.ones(3, jnp.float16)}
  got, state = _train(tx, sparse=True, steps=80, params=jax.tree.map(jnp.copy, params))
  got, state = lars_optax.sparse.catch_up(adam, got, state)
  want, want_state = _train(twin, sparse=False, steps=80, params=params)
  assert got["t"].dtype == jnp.float16
  masters = lars_optax.master_params(state, got)["t"]
  want_masters = lars_optax.master_params(want_state, want)["t"]
  moved = float(jnp.abs(want_masters - W0).max())
  assert float(jnp.abs(masters - want_masters).max()) <= TOL * moved
  chex.assert_trees_all_equal(got["t"], masters.astype(jnp.float16))


def test_skip_nonfinite_skips_a_nan_step_and_the_rest_is_exact():
  adam = lars_optax.sparse.adam(1e-2)
  tx = lars_optax.skip_nonfinite(adam)
  params = {"t": jnp.asarray(W0), "b": jnp.ones(3)}
  state = tx.init(params)

  @jax.jit
  def step(params, state, ids, values):
    grads = {"t": BCOO((values, ids[:, None]), shape=(ROWS, DIM)), "b": values[:3, 0]}
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for i in range(30):
    values = VALUES[i] * (np.nan if i == 7 else 1.0)
    params, state = step(params, state, jnp.asarray(IDS[i]), jnp.asarray(values))
  params, state = lars_optax.sparse.catch_up(adam, params, state)
  kept = [i for i in range(30) if i != 7]
  want = {"t": jnp.asarray(W0), "b": jnp.ones(3)}
  twin = optax.adam(1e-2)
  want_state = twin.init(want)
  for i in kept:
    grads = {"t": jnp.zeros((ROWS, DIM)).at[IDS[i]].add(VALUES[i]), "b": VALUES[i][:3, 0]}
    u, want_state = twin.update(grads, want_state, want)
    want = optax.apply_updates(want, u)
  _assert_close_to(params, want)


@pytest.mark.parametrize("fmt", [
    "flax-bytes", pytest.param("pickle", marks=pytest.mark.slow)])  # (40 + 40 steps each)
def test_a_checkpoint_taken_mid_run_restores_and_continues_exactly(fmt):
  tx = lars_optax.sparse.adamw(SCHEDULE, weight_decay=0.1)
  params, state = _train(tx, sparse=True, steps=40)
  through, through_state = _train(tx, sparse=True, steps=40, params=params, state=state,
                                  start=40)
  params, state = _train(tx, sparse=True, steps=40)
  template = tx.init(params)
  if fmt == "flax-bytes":
    restored = serialization.from_bytes(template, serialization.to_bytes(state))
  else:
    buf = io.BytesIO()
    pickle.dump(jax.tree.map(np.asarray, state), buf)
    restored = pickle.loads(buf.getvalue())
  params = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), params)
  resumed, resumed_state = _train(tx, sparse=True, steps=40, params=params, state=restored,
                                  start=40)
  if jax.default_backend() == "cpu":
    chex.assert_trees_all_equal(resumed, through)
    chex.assert_trees_all_equal(resumed_state, through_state)
  else:  # a GPU sums repeated ids with atomics, in no fixed order: equal to rounding
    chex.assert_trees_all_close(resumed, through, rtol=1e-5, atol=1e-7)
    chex.assert_trees_all_close(resumed_state, through_state, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("lr", [np.float32(1e-2), jnp.asarray(1e-2), jnp.bfloat16(1e-2)],
                         ids=["numpy", "jax", "bfloat16"])
def test_learning_rates_of_every_scalar_type(lr):
  tx = lars_optax.sparse.adam(lr)
  got, state = _train(tx, sparse=True, steps=20)
  got, _ = lars_optax.sparse.catch_up(tx, got, state)
  want, _ = _train(optax.adam(lr), sparse=False, steps=20)
  _assert_close_to(got, want)


def test_bfloat16_first_moments_agree_to_bfloat16_precision():
  tx = lars_optax.sparse.adam(1e-2, mu_dtype=jnp.bfloat16)
  got, state = _train(tx, sparse=True, steps=40)
  got, state = lars_optax.sparse.catch_up(tx, got, state)
  want, _ = _train(optax.adam(1e-2, mu_dtype=jnp.bfloat16), sparse=False, steps=40)
  assert state.inner[0].mu["t"].dtype == jnp.bfloat16
  moved = float(jnp.abs(want["t"] - W0).max())
  assert float(jnp.abs(got["t"] - want["t"]).max()) <= 1e-2 * moved


@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 devices (see conftest.py)")
@pytest.mark.parametrize("make", [
    lambda: lars_optax.sparse.adam(0.1),
    lambda: lars_optax.sparse.sgd(optax.linear_schedule(0.1, 0.01, 10), momentum=0.9),
    lambda: lars_optax.sparse.adamw(optax.linear_schedule(0.1, 0.01, 10)),
], ids=["adam", "sgd-schedule", "adamw-schedule"])
def test_split_dense_leaves_inside_shard_map_equal_one_device(make):
  """The up-to-date branch keeps the split type of the rows (check_vma: equal branch types)."""
  import functools

  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  tx = make()
  params = {"w": jnp.arange(32.0).reshape(8, 4) / 10, "r": jnp.array([1.0, -2.0, 3.0])}
  grads = jax.tree.map(lambda x: 0.3 * x + 0.1, params)
  spec = {"w": P("x"), "r": P()}

  def steps(p, g):
    state = tx.init(p)
    for _ in range(3):
      updates, state = tx.update(g, state, p)
      p = optax.apply_updates(p, updates)
    return p

  sharded = jax.jit(functools.partial(
      jax.shard_map, mesh=Mesh(np.array(jax.devices()[:4]), ("x",)), in_specs=(spec, spec),
      out_specs=spec)(steps))
  chex.assert_trees_all_close(sharded(params, grads), steps(params, grads), rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------
# The envelope (docs/sparse.md): gaps up to 10,000 steps against float64, and small
# gradients against optax
# --------------------------------------------------------------------------


def _envelope_module():
  import importlib.util
  import pathlib

  path = pathlib.Path(__file__).parent.parent / "benchmarks" / "sparse_envelope.py"
  spec = importlib.util.spec_from_file_location("sparse_envelope", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


ENVELOPE = _envelope_module()
# Every SGD cell; Adam at the envelope's edges (b1 = 0.99, the extreme b2, the smallest and
# largest gradients, each schedule).
EDGE_CELLS = [*ENVELOPE.SGD_CELLS, *(ENVELOPE.Cell("adam", b1, b2, g * ENVELOPE.EPS, name)
                                     for b1, b2, g, name in (
    (0.99, 0.999, 1e-2, "step decay"), (0.99, 0.999, 1.0, "warm-up + cosine"),
    (0.99, 0.999999, 1e4, "constant"), (0.9, 0.9999, 1.0, "step decay"),
    (0.99, 0.9999, 1e2, "constant"), (0.9, 0.999999, 1e-2, "warm-up + cosine")))]


# The default tier's few (the other 20 cells, about 30 s in their one program, are the slow
# tier's): SGD's extremes and Adam's largest b2 at both ends of the gradients.
FEW_CELLS = [ENVELOPE.SGD_CELLS[0], ENVELOPE.SGD_CELLS[-1], EDGE_CELLS[-4], EDGE_CELLS[-1]]


@pytest.fixture(scope="module")
def envelope_few():
  """The few cells in one compiled program: (sparse error, float32 optax's), vs float64."""
  return dict(zip(FEW_CELLS, ENVELOPE.errors(FEW_CELLS)))


@pytest.fixture(scope="module")
def envelope_rest():
  """The other edge cells (the slow tier's) in one compiled program, as :func:`envelope_few`."""
  rest = [c for c in EDGE_CELLS if c not in FEW_CELLS]
  return dict(zip(rest, ENVELOPE.errors(rest)))


@pytest.mark.parametrize("cell", [
    c if c in FEW_CELLS else pytest.param(c, marks=pytest.mark.slow) for c in EDGE_CELLS],
    ids=[c.label() for c in EDGE_CELLS])
def test_the_catch_up_meets_the_envelope_over_10000_step_gaps(request, cell):
  """Within 1e-5 of the largest move of the float64 run, or 3x float32 optax's own error:
  SGD for any schedule and momentum up to 0.999 (exactly), Adam at b1 up to 0.99."""
  envelope = request.getfixturevalue("envelope_few" if cell in FEW_CELLS else "envelope_rest")
  err, own = envelope[cell]
  assert ENVELOPE.met(err, own), (err, own)


@pytest.mark.parametrize("scale", [1e-6, 1e-4], ids=["g~1e-6", "g~1e-4"])
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.99, 0.999), (0.99, 0.9999)],
                         ids=["b1=0.9", "b1=0.99", "b1=0.99-b2=0.9999"])
def test_adam_with_small_gradients_and_b1_099_is_within_1e5_of_optax(betas, scale):
  """The Zipfian stream with |g| ~ 1e-6 (|g|/eps ~ 100) to 1e-4: each run's two-node rule
  keeps the catch-up within 2.3e-6 of the largest move (one node a run was 4.8e-4)."""
  ids, values = jnp.asarray(IDS[:300]), jnp.asarray(VALUES[:300] * (scale / 1e-2))
  b1, b2 = betas

  def train(tx, sparse):
    params = {"t": jnp.asarray(W0), "b": jnp.ones(3)}
    state = tx.init(params)

    @jax.jit
    def step(params, state, i):
      table = (BCOO((values[i], ids[i][:, None]), shape=(ROWS, DIM)) if sparse
               else jnp.zeros((ROWS, DIM)).at[ids[i]].add(values[i]))
      updates, state = tx.update({"t": table, "b": values[i][:3, 0]}, state, params)
      return optax.apply_updates(params, updates), state

    params, state = jax.lax.fori_loop(0, len(ids), lambda i, c: step(*c, i), (params, state))
    return params, state

  tx = lars_optax.sparse.adam(SCHEDULE, b1=b1, b2=b2)
  params, state = train(tx, True)
  params, _ = lars_optax.sparse.catch_up(tx, params, state)
  want, _ = train(optax.adam(SCHEDULE, b1=b1, b2=b2), False)
  _assert_close_to(params, want)


def test_adam_refuses_a_b1_whose_skipped_steps_matter_past_the_window():
  with pytest.raises(ValueError, match=r"sparse.adam: b1: b1 / sqrt\(b2\) is 0.9995.*after "
                     r"27,618 steps, more than the 2,048.*Use b1 <= 0.99"):
    lars_optax.sparse.adam(1e-3, b1=0.999)
  with pytest.raises(ValueError, match=r"window: 2,048 is shorter than the 27,618"):
    lars_optax.sparse.adam(1e-3, b1=0.999, window=2048)  # (its tail would not be Adam's)
  lars_optax.sparse.adam(1e-3, b1=0.99, b2=0.9999)  # 1,382 steps: within the window


def test_sgd_with_a_schedule_refuses_a_momentum_whose_sum_has_no_end_in_sight():
  with pytest.raises(ValueError, match=r"sparse.sgd: momentum: 0.99995 with a schedule is above "
                     r"0.99992.*constant learning rate"):
    lars_optax.sparse.sgd(optax.linear_schedule(0.1, 0.0, 10), momentum=0.99995)
  lars_optax.sparse.sgd(optax.linear_schedule(0.1, 0.0, 10), momentum=0.9999)
  lars_optax.sparse.sgd(0.1, momentum=0.99999)  # a constant rate: exact for any momentum


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


def test_a_learning_rate_set_from_outside_each_step_is_refused_under_jit():
  tx = optax.inject_hyperparams(lars_optax.sparse.adam)(learning_rate=1e-2)
  params = {"t": jnp.zeros((10, 2))}
  grads = {"t": BCOO((jnp.ones((1, 2)), jnp.zeros((1, 1), jnp.int32)), shape=(10, 2))}
  with pytest.raises(ValueError, match=r"sparse.adam: learning_rate is traced: sparse.adam "
                     r"does not run under optax.inject_hyperparams in jit"):
    jax.jit(tx.update)(grads, tx.init(params), params)
  dense = {"t": grads["t"].todense()}  # (so on dense gradients too)
  with pytest.raises(ValueError, match=r"learning_rate is traced"):
    jax.jit(tx.update)(dense, tx.init(params), params)
  # The ways out it names: a schedule, and the plain lazy step set from outside.
  for way_out in (lars_optax.sparse.adam(optax.linear_schedule(1e-2, 1e-3, 100)),
                  lars_optax.sparse.lazy_update(
                      optax.inject_hyperparams(optax.adam)(learning_rate=1e-2))):
    updates, _ = jax.jit(way_out.update)(grads, way_out.init(params), params)
    moved = lars_optax.sparse.apply_updates(params, updates)["t"] != params["t"]
    assert bool(moved[0].all()) and not bool(moved[1:].any())


@pytest.mark.parametrize("make", [
    lambda lr: lars_optax.sparse.adam(lr), lambda lr: lars_optax.sparse.sgd(lr, momentum=0.9),
    lambda lr: lars_optax.sparse.adamw(lr, weight_decay=0.1),
], ids=["adam", "sgd", "adamw"])
def test_a_schedule_injected_eagerly_is_refused_at_the_second_step(make):
  """inject_hyperparams rebuilds the optimizer each step with that step's rate."""
  tx = optax.inject_hyperparams(make)(lr=optax.linear_schedule(1e-2, 1e-3, 100))
  params = {"t": jnp.zeros((10, 2))}
  grads = {"t": BCOO((jnp.ones((1, 2)), jnp.zeros((1, 1), jnp.int32)), shape=(10, 2))}
  state = tx.init(params)
  _, state = tx.update(grads, state, params)  # the rate it was made with
  with pytest.raises(ValueError, match=r"learning_rate: the constant learning rate or weight "
                     r"decay changed between steps.*pass an optax schedule"):
    tx.update(grads, state, params)
  constant = optax.inject_hyperparams(make)(lr=1e-2)  # the same rate each step: taken
  state = constant.init(params)
  for _ in range(3):
    _, state = constant.update(grads, state, params)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_step_count_at_int32s_maximum_is_refused(jit):
  """#58 item 4: at 2**31 - 1 the count stops (optax.safe_increment), and every row
  touched afterwards would skip the steps it misses (0.36 of its move lost)."""
  tx = lars_optax.sparse.adam(1e-2)
  params = {"t": jnp.zeros((4, 2))}
  state = tx.init(params)
  grads = {"t": lars_optax.sparse.row_sparse(jnp.ones((1, 2)), rows=jnp.array([1]),
                                             num_rows=4)}
  update = jax.jit(tx.update) if jit else tx.update
  near = state._replace(count=jnp.int32(2 ** 31 - 2))
  _, after = update(grads, near, params)  # the last step that can be numbered
  assert int(after.count) == 2 ** 31 - 1
  with pytest.raises(Exception, match=r"sparse\.adam: count: the state's step count is "
                                      r"2,147,483,647, int32's maximum"):
    jax.block_until_ready(update(grads, after, params))


def test_adamw_refuses_a_decay_that_flips_the_weights_sign():
  """optax.adamw multiplies each weight by 1 - lr * wd: <= 0 has no catch-up (was NaN)."""
  with pytest.raises(ValueError, match=r"sparse.adamw: weight_decay: learning_rate \* "
                     r"weight_decay is 1.5, >= 1"):
    lars_optax.sparse.adamw(1.5, weight_decay=1.0)
  tx = lars_optax.sparse.adamw(optax.linear_schedule(0.5, 3.0, 5), weight_decay=0.5)
  params = {"t": jnp.ones((4, 2))}
  grads = {"t": BCOO((jnp.ones((1, 2)), jnp.zeros((1, 1), jnp.int32)), shape=(4, 2))}
  state, step = tx.init(params), jax.jit(tx.update)
  with pytest.raises(Exception, match=r"is 1 at this step, >= 1"):
    for _ in range(6):
      jax.block_until_ready(step(grads, state, params))
      _, state = step(grads, state, params)


@pytest.mark.parametrize("mask", [-1.0, "x", "flax", jnp.ones(2), np.array([True, False])])
def test_adamw_refuses_what_is_not_an_optax_mask_when_built(mask):
  with pytest.raises(TypeError, match=r"sparse.adamw: mask: expected optax's mask"):
    lars_optax.sparse.adamw(1e-3, mask=mask)


def test_adamw_names_a_mask_that_does_not_fit_the_params_at_init():
  params = {"t": jnp.ones((3, 2)), "b": jnp.ones(2)}
  with pytest.raises(ValueError, match=r"sparse.adamw: mask: a bool pytree must have the "
                     r"params' structure"):
    lars_optax.sparse.adamw(1e-3, mask={"t": True}).init(params)
  with pytest.raises(TypeError, match=r"sparse.adamw: mask: expected a bool per leaf"):
    lars_optax.sparse.adamw(1e-3, mask={"t": 1.0, "b": True}).init(params)


@pytest.mark.parametrize("make, dtype, arg", [
    (lambda: lars_optax.sparse.adam(1e39), jnp.float32, "learning_rate"),
    (lambda: lars_optax.sparse.adam(1e5), jnp.float16, "learning_rate"),
    (lambda: lars_optax.sparse.sgd(1e5, momentum=0.9), jnp.float16, "learning_rate"),
    (lambda: lars_optax.sparse.adamw(1e-6, weight_decay=1e5), jnp.float16, "weight_decay"),
    (lambda: lars_optax.sparse.adam(1e-3, eps=1e5), jnp.float16, "eps"),
])
def test_a_constant_beyond_the_params_dtype_is_refused_at_init(make, dtype, arg):
  with pytest.raises(ValueError, match=rf"sparse.\w+: {arg}: .* is beyond the range of "
                     rf"{jnp.dtype(dtype).name}"):
    make().init({"t": jnp.ones((3, 2), dtype)})


@pytest.mark.parametrize("make", [
    lambda: lars_optax.sparse.adam(1e-3, weight_decay=1e-4),
    lambda: lars_optax.sparse.sgd(1e-3, momentum=0.9, wd=1e-4),
], ids=["adam-weight_decay", "sgd-wd"])
def test_coupled_l2_decay_is_refused_with_the_reason(make):
  with pytest.raises(TypeError, match=r"coupled L2 decay.*no catch-up form"):
    make()


def test_other_errors_name_the_argument():
  with pytest.raises(ValueError, match=r"sparse.adam: eps_root must be 0"):
    lars_optax.sparse.adam(1e-3, eps_root=1e-8)
  with pytest.raises(TypeError):
    lars_optax.sparse.adam(1e-3, 0.9)  # b1 is keyword-only
  with pytest.raises(ValueError, match=r"sparse.sgd: momentum"):
    lars_optax.sparse.sgd(1e-3, momentum=1.5)
  with pytest.raises(ValueError, match=r"sparse.adamw: window"):
    lars_optax.sparse.adamw(1e-3, window=0)
  with pytest.raises(TypeError, match=r"beta1: adam\(\) has no argument 'beta1'; it takes optax"):
    lars_optax.sparse.adam(1e-3, beta1=0.9)
  params = {"t": jnp.zeros((4, 2))}
  with pytest.raises(TypeError, match=r"catch_up: tx must be lars_optax.sparse.adam"):
    lars_optax.sparse.catch_up(optax.adam(1e-3), params, optax.adam(1e-3).init(params))
  tx = lars_optax.sparse.adam(1e-3)
  with pytest.raises(ValueError, match=r"catch_up: state holds 0 CatchUpState"):
    lars_optax.sparse.catch_up(tx, params, optax.adam(1e-3).init(params))
  with pytest.raises(ValueError, match=r"catch_up: rows: 'table' names no leaf"):
    lars_optax.sparse.catch_up(tx, params, tx.init(params), rows={"table": jnp.arange(2)})
  with pytest.raises(ValueError, match=r"sparse.adam: gradient 't' has shape"):
    grads = {"t": BCOO((jnp.ones((1, 3)), jnp.zeros((1, 1), jnp.int32)), shape=(4, 3))}
    tx.update(grads, tx.init(params), params)


# --------------------------------------------------------------------------
# docs/sparse.md: the toy recommender
# --------------------------------------------------------------------------


def _docs_block(marker):
  import pathlib
  import re

  text = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "sparse.md").read_text()
  blocks = re.findall(r"```python\n(.*?)```", text, re.S)
  (block,) = [b for b in blocks if marker in b]
  return block


# A 400-step recipe of three runs: the slow tier's. The default tier's check of a model that
# reads its table as the dense run: test_a_model_whose_batches_catch_up_their_rows_first_...
@pytest.mark.slow
def test_the_docs_toy_recommender_runs_and_dense_exact_matches_dense_adam(capsys):
  namespace = {"__name__": "__docs__"}
  exec(compile(_docs_block("true_table"), "docs/sparse.md", "exec"), namespace)
  results = namespace["results"]
  (dense_loss, _, dense), (lazy_loss, _, _), (exact_loss, _, exact) = results.values()
  moved = float(jnp.abs(dense["table"]).max())
  # A coupled run (the gradients read the table) carries float32 noise forward: 1e-4.
  assert float(jnp.abs(exact["table"] - dense["table"]).max()) <= 10 * TOL * moved
  assert exact_loss == pytest.approx(dense_loss, rel=1e-4)
  assert abs(lazy_loss - dense_loss) > 0.02 * dense_loss  # the lazy run is another one
  print(capsys.readouterr().out)


def test_the_docs_nnx_recipe_runs():
  import textwrap

  namespace = {"__name__": "__docs__"}
  exec(compile(textwrap.dedent(_docs_block("nnx.as_pure")), "docs/sparse.md", "exec"), namespace)
  state = namespace["optimizer"].opt_state
  assert set(np.asarray(state.last_step["embedding"][...])[[3, 17]].tolist()) == {0}


@pytest.mark.slow  # (a benchmark's quick run)
def test_the_benchmark_quick_run_reports_the_targets():
  import importlib.util
  import pathlib

  path = pathlib.Path(__file__).parent.parent / "benchmarks" / "sparse_embedding.py"
  spec = importlib.util.spec_from_file_location("sparse_embedding_exact", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  report = module.main(["--exact", "--quick", "--rounds", "1"])  # 20,000 rows
  assert "| lars_optax.sparse.adam (dense-exact, the default runs) |" in report
  assert "- extra memory one int32 per row (80,008 bytes): met" in report  # + the rate
  assert "- no table-sized temporary: met" in report


def test_a_batchs_padding_slots_read_as_up_to_date():
  """The step gathers a batch's unique rows, its padding slots (index: the row count)
  reading the last row. Those slots read as up to date, so that the step after
  catch_up(rows=) on a batch with repeated ids skips the catch-up (it recomputed the
  whole batch's factors every step for the last row's gap: half the step's time)."""
  from lars_optax.sparse import _catch_up_state as surgery

  rule = lars_optax.sparse.adam(1e-3).update.catch_up_rule
  param = jnp.arange(8.0).reshape(4, 2)
  bufs = {"mu": jnp.full((4, 2), 0.1), "nu": jnp.full((4, 2), 0.01)}
  leaf = surgery._Leaf("t", None, param, bufs, jnp.array([5, 0, 5, 3], jnp.int32),
                       optax.MaskedNode())
  s, _, w0, w1, b1 = surgery._gather_up(rule, leaf, jnp.array([0, 2, 4, 4]), jnp.int32(5),
                                        None, False)
  chex.assert_trees_all_equal(s, jnp.array([5, 5, 5, 5], jnp.int32))
  chex.assert_trees_all_equal(w1, w0)  # nothing to catch up: the branch was skipped
  chex.assert_trees_all_equal(b1["mu"], jnp.full((4, 2), 0.1))


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
def test_float32_row_sparse_gradients_of_a_bfloat16_table_keep_the_state_bfloat16(name):
  """As every optimizer casts a gradient of another float dtype to its param's: the
  state keeps its dtypes (a jitted step is not traced again), and the step equals the
  one given bfloat16 rows."""
  tx = getattr(lars_optax.sparse, name)(1e-2)
  params = {"t": jnp.ones((4, 2), jnp.bfloat16), "b": jnp.ones((2,), jnp.bfloat16)}
  def grads(dtype):
    return {"t": lars_optax.sparse.row_sparse(jnp.full((1, 2), 0.5, dtype), rows=jnp.array([1]),
                                              num_rows=4),
            "b": jnp.full((2,), 0.25, dtype)}
  state = tx.init(params)
  updates, after = jax.jit(tx.update)(grads(jnp.float32), state, params)
  chex.assert_trees_all_equal_dtypes(state, after)
  want, _ = jax.jit(tx.update)(grads(jnp.bfloat16), state, params)
  chex.assert_trees_all_equal(updates, want)
