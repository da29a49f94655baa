"""Times one lazy Adam step on an embedding table with a row-sparse gradient.

A ``rows x 64`` float32 table, a gradient present in ``touched`` rows, one
Adam step (update + apply, jit-compiled, params and state donated):

* MXNet 2.0 ``Adam(lazy_update=True)`` on a ``row_sparse`` gradient, run in a
  subprocess with the Python given by ``--mxnet-python`` (a virtual
  environment with ``mxnet==2.0.0b1`` and ``numpy<1.24``); skipped when that
  Python cannot import mxnet;
* ``optax.adam`` on the dense gradient;
* ``lars_optax.mxnet.adam(lazy_update=True)`` on the dense gradient (the dense lazy
  path);
* ``lars_optax.mxnet.adam(lazy_update=True)`` on a row-sparse BCOO gradient (also
  with repeated rows, and on a float16 table with ``multi_precision=True``'s
  float32 masters), and wrapped in ``lars_optax.sparse.dense_updates`` with the
  update applied as ``eqx.apply_updates`` applies it;

and a whole train step of an embedding-bag model (``batch x bag`` ids, mean of
their rows, a linear layer, squared error): gradients from
``lars_optax.sparse.value_and_grad`` plus the sparse lazy Adam step, against
``jax.value_and_grad`` plus ``optax.adam``.

    python benchmarks/sparse_embedding.py --mxnet-python .venv-mx2/bin/python
    python benchmarks/sparse_embedding.py --rows 10000000 --sparse-only
    python benchmarks/sparse_embedding.py --quick     # a small smoke run
    python benchmarks/sparse_embedding.py --companions   # checks, clipping, multi_steps
    python benchmarks/sparse_embedding.py --exact   # dense-exact lazy Adam (sparse.adam)
    python benchmarks/sparse_embedding.py --realistic   # sparse.adam after 2,000 steps

``--realistic`` runs each optimizer 2,000 Zipfian steps first (1,024 ids a step on a
1M x 64 table), so that the rows' gaps are a training run's, then times
``catch_up(rows=ids)`` + update against the plain lazy step, with a constant rate and
with warm-up + cosine; and a full ``catch_up`` (every row) of a 1M x 32 table after
those 2,000 steps against one dense ``optax.adam`` step.

``--companions`` times, on the same table and gradient, the sparse Adam step
with its run-time index checks left out (the cost of the checks), and
``lars_optax.sparse.clip_by_global_norm`` chained before it (target: within 1.5x of
the plain step); and compares ``lars_optax.sparse.multi_steps``' compiled temporary
memory (``memory_analysis()``, donated buffers) for the table and one 10x
smaller (target: independent of the table's size).

All variants run in one process: the dense (O(table)) ones interleaved round
by round, then the sparse (O(rows)) ones, so that the dense steps' sweeps over
memory do not evict the sparse steps' rows; the table gives medians. On a
shared machine the absolute times are noisy: compare ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import re
import statistics
import subprocess
import textwrap
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental.sparse import BCOO

import lars_optax

LR = 1e-3

MXNET_SCRIPT = textwrap.dedent("""
    import json, sys, time
    import mxnet as mx
    import numpy as np
    rows, dim, touched, rounds = (int(a) for a in sys.argv[1:5])
    lr = float(sys.argv[5])
    rng = np.random.default_rng(0)
    weight = mx.nd.array(rng.standard_normal((rows, dim), dtype=np.float32))
    idx = np.sort(rng.choice(rows, touched, replace=False))
    values = rng.normal(size=(touched, dim)).astype(np.float32)
    grad = mx.nd.sparse.row_sparse_array((values, idx), shape=(rows, dim))
    updater = mx.optimizer.get_updater(mx.optimizer.Adam(learning_rate=lr, lazy_update=True))
    times = []
    for r in range(rounds + 3):
        t = time.perf_counter()
        updater(0, grad, weight)
        mx.nd.waitall()
        if r >= 3:
            times.append(time.perf_counter() - t)
    print(json.dumps(times))
""")


def mxnet_times(python: str, rows: int, dim: int, touched: int, rounds: int) -> list | str:
  """MXNet's step times, or why they are missing."""
  try:
    out = subprocess.run([python, "-c", MXNET_SCRIPT, str(rows), str(dim), str(touched),
                          str(rounds), repr(LR)], capture_output=True, text=True, timeout=1800)
  except (OSError, subprocess.TimeoutExpired) as e:
    return f"not run ({type(e).__name__})"
  if out.returncode != 0:
    last = (out.stderr.strip().splitlines() or ["?"])[-1]
    return f"not run ({last[:80]})"
  return json.loads(out.stdout.strip().splitlines()[-1])


def _optimizer_step(tx: optax.GradientTransformation, updates_first: bool = False) -> Callable:
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    if updates_first:  # as eqx.apply_updates applies: over the updates, p + u
      return jax.tree.map(lambda u, p: p + u, updates, params), state
    return optax.apply_updates(params, updates), state

  return jax.jit(step, donate_argnums=(0, 1))


class Case:
  """A jitted ``step(params, state, *args)`` with its own donated buffers."""

  def __init__(self, name: str, step: Callable, params, state, args, dense: bool = False):
    self.name, self.step, self.params, self.state, self.args = name, step, params, state, args
    self.dense = dense  # O(table) per step
    self.times: list[float] = []
    out = step(params, state, *args)  # compile and warm up
    jax.block_until_ready(out)
    self.params, self.state = out[0], out[1]

  def run(self) -> None:
    t = time.perf_counter()
    out = self.step(self.params, self.state, *self.args)
    jax.block_until_ready(out)
    self.times.append(time.perf_counter() - t)
    self.params, self.state = out[0], out[1]


def optimizer_cases(rows: int, dim: int, touched: int, sparse_only: bool) -> list[Case]:
  rng = np.random.default_rng(0)
  idx = np.sort(rng.choice(rows, touched, replace=False)).astype(np.int32)
  values = rng.normal(size=(touched, dim)).astype(np.float32)
  # An MXNet row_sparse array holds each row once; a BCOO says so with
  # unique_indices=True. Without it the step first sums duplicates (a sort).
  sparse_g = {"table": BCOO((jnp.asarray(values), jnp.asarray(idx)[:, None]),
                            shape=(rows, dim), unique_indices=True)}
  dup_g = {"table": BCOO((jnp.asarray(values), jnp.asarray(idx)[:, None]), shape=(rows, dim))}

  def params():
    return {"table": jnp.asarray(rng.standard_normal((rows, dim), dtype=np.float32))}

  cases = []
  lazy = lars_optax.mxnet.adam(LR, lazy_update=True)
  if not sparse_only:
    dense_g = {"table": sparse_g["table"].todense()}
    p = params()
    cases.append(Case("optax.adam, dense gradient", _optimizer_step(optax.adam(LR)), p,
                      optax.adam(LR).init(p), (dense_g,), dense=True))
    p = params()
    cases.append(Case("lars_optax.mxnet.adam(lazy_update=True), dense gradient",
                      _optimizer_step(lazy), p, lazy.init(p), (dense_g,), dense=True))
  if not sparse_only:
    p = params()
    cases.append(Case("lars_optax.mxnet.adam(lazy_update=True), BCOO gradient, duplicates summed",
                      _optimizer_step(lazy), p, lazy.init(p), (dup_g,)))
    # A float16 table with float32 masters (MXNet's multi_precision=True).
    mp = lars_optax.mxnet.adam(LR, lazy_update=True, multi_precision=True)
    p16 = jax.tree.map(lambda x: x.astype(jnp.float16), params())
    g16 = {"table": BCOO((jnp.asarray(values, jnp.float16), jnp.asarray(idx)[:, None]),
                         shape=(rows, dim), unique_indices=True)}
    cases.append(Case("lars_optax.mxnet.adam(lazy_update=True, multi_precision=True), float16 "
                      "table, BCOO gradient (unique_indices=True)",
                      _optimizer_step(mp), p16, mp.init(p16), (g16,)))
  # dense_updates: the update as an array, applied over the updates (Equinox's idiom).
  dense_lazy = lars_optax.sparse.dense_updates(lazy)
  p = params()
  cases.append(Case("lars_optax.sparse.dense_updates(adam(lazy_update=True)), same gradient, "
                    "applied as eqx.apply_updates does",
                    _optimizer_step(dense_lazy, updates_first=True), p, dense_lazy.init(p),
                    (sparse_g,)))
  p = params()
  cases.append(Case("lars_optax.mxnet.adam(lazy_update=True), BCOO gradient (unique_indices=True)",
                    _optimizer_step(lazy), p, lazy.init(p), (sparse_g,)))
  # (the headline sparse step stays last: the table's ratios are to it)
  return cases


def train_cases(rows: int, dim: int, batch: int, bag: int,
                sparse_only: bool) -> list[Case]:
  """An embedding bag: mean of the ids' rows, a linear layer, squared error."""
  rng = np.random.default_rng(1)
  ids = jnp.asarray(rng.integers(0, rows, (batch, bag)), jnp.int32)
  y = jnp.asarray(rng.normal(size=batch), jnp.float32)

  def params():
    return {"table": jnp.asarray(rng.standard_normal((rows, dim), dtype=np.float32) * 0.01),
            "w": jnp.asarray(rng.normal(size=(dim,)), jnp.float32)}

  def loss(p, ids, y):
    return jnp.mean((p["table"][ids].mean(axis=1) @ p["w"] - y) ** 2)

  def make_step(grad_fn, tx):
    def step(params, state, ids, y):
      _, grads = grad_fn(params, ids, y)
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state

    return jax.jit(step, donate_argnums=(0, 1))

  cases = []
  if not sparse_only:
    p = params()
    cases.append(Case("train step: jax.value_and_grad + optax.adam",
                      make_step(jax.value_and_grad(loss), optax.adam(LR)), p,
                      optax.adam(LR).init(p), (ids, y), dense=True))
  lazy = lars_optax.mxnet.adam(LR, lazy_update=True)
  grad_fn = lars_optax.sparse.value_and_grad(loss, sparse="table", max_rows=batch * bag)
  p = params()
  cases.append(Case("train step: sparse_value_and_grad + lars_optax.mxnet.adam(lazy_update=True)",
                    make_step(grad_fn, lazy), p, lazy.init(p), (ids, y)))
  return cases


def _unchecked(make: Callable) -> Callable:
  """``make()`` traced with lars_optax's run-time index checks left out (for their cost)."""
  from lars_optax import sparse as sparse_mod

  def build(*args):
    checked = sparse_mod.raise_at_run_time
    sparse_mod.raise_at_run_time = lambda *a, **k: 0
    try:
      return make(*args)
    finally:
      sparse_mod.raise_at_run_time = checked

  return build


def companion_cases(rows: int, dim: int, touched: int) -> list[Case]:
  """The sparse step with and without its checks, and after a global-norm clip."""
  rng = np.random.default_rng(0)
  idx = np.sort(rng.choice(rows, touched, replace=False)).astype(np.int32)
  values = rng.normal(size=(touched, dim)).astype(np.float32)
  grads = {"table": lars_optax.sparse.RowSparseUpdate(
      (jnp.asarray(values), jnp.asarray(idx)[:, None]), shape=(rows, dim), unique_indices=True)}

  def case(name, tx, checks=True):
    p = {"table": jnp.asarray(rng.standard_normal((rows, dim), dtype=np.float32))}
    make = (lambda: Case(name, _optimizer_step(tx), p, tx.init(p), (grads,)))
    return make() if checks else _unchecked(make)()

  lazy = lars_optax.mxnet.adam(LR, lazy_update=True)
  return [
      case("sparse Adam step, run-time index checks left out", lazy, checks=False),
      case("sparse Adam step (with the checks)", lazy),
      case("lars_optax.sparse.clip_by_global_norm(1.0) + sparse Adam step",
           optax.chain(lars_optax.sparse.clip_by_global_norm(1.0), lazy)),
  ]


def multi_steps_temp_bytes(rows: int, dim: int, touched: int, k: int = 4) -> int:
  """Compiled temporary bytes of a multi_steps(lazy Adam) step, buffers donated."""
  params = {"table": jnp.zeros((rows, dim), jnp.float32)}
  tx = lars_optax.sparse.multi_steps(lars_optax.mxnet.adam(LR, lazy_update=True),
                                     every_k_schedule=k, sparse="table", nse=touched)
  grads = {"table": lars_optax.sparse.row_sparse(jnp.ones((touched, dim)), rows=jnp.arange(touched),
                                                 num_rows=rows)}

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, tx.init(params), grads).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes)


def companions_report(args: argparse.Namespace) -> str:
  cases = companion_cases(args.rows, args.dim, args.touched)
  for _ in range(args.rounds):
    for case in cases:
      case.run()
  ms = [statistics.median(c.times) * 1e3 for c in cases]
  small_rows = max(args.rows // 10, args.touched * 4 + 1)
  big, small = (multi_steps_temp_bytes(r, args.dim, args.touched) for r in (args.rows, small_rows))
  lines = [
      (f"{args.rows:,} x {args.dim} float32 table, gradient in {args.touched:,} rows "
       f"(unique_indices=True), median of {args.rounds} rounds; JAX {jax.__version__} on "
       f"{jax.default_backend()}."),
      "",
      "| | median step (ms) | vs the step with checks |",
      "|---|---|---|",
      *[f"| {c.name} | {m:.3f} | {m / ms[1]:.2f}x |" for c, m in zip(cases, ms)],
      "",
      (f"multi_steps(adam(lazy_update=True), 4, nse={args.touched}) compiled temporary "
       f"memory: {big:,} bytes with {args.rows:,} rows, {small:,} bytes with "
       f"{small_rows:,} rows (the table: {args.rows * args.dim * 4:,} bytes)."),
      "",
      "Targets:",
      "",
      f"- run-time checks cost {ms[1] - ms[0]:+.3f} ms per step ({ms[1] / ms[0]:.2f}x)",
      (f"- clip + sparse Adam <= 1.5x the sparse step ({ms[2] / ms[1]:.2f}x): "
       f"{'met' if ms[2] <= 1.5 * ms[1] else 'MISSED'}"),
      (f"- multi_steps' temporary memory independent of the table's size: "
       f"{'met' if abs(big - small) < args.rows * args.dim * 4 // 20 else 'MISSED'}"),
  ]
  report = "\n".join(lines)
  print(report)
  return report


def _zipf_batches(rows: int, touched: int, count: int, seed: int = 0) -> list[jax.Array]:
  """``count`` batches of ``touched`` ids drawn from Zipf(1.2): a few rows every step, most
  rows once in thousands of steps."""
  rng = np.random.default_rng(seed)
  return [jnp.asarray((rng.zipf(1.2, size=touched) - 1) % rows, jnp.int32)
          for _ in range(count)]


class ZipfCase(Case):
  """A case whose gradient rows change every round (Zipfian ids)."""

  def __init__(self, name: str, step: Callable, params, state, batches, values,
               dense: bool = False):
    self.batches, self.values, self.round = batches, values, 0
    super().__init__(name, step, params, state, (batches[0], values), dense)

  def run(self) -> None:
    self.round += 1
    self.args = (self.batches[self.round % len(self.batches)], self.values)
    super().run()


def _exact_step(tx: optax.GradientTransformation, rows: int, dim: int, dense: bool = False,
                catch_rows: optax.GradientTransformation | None = None) -> Callable:
  def step(params, state, ids, values):
    if catch_rows is not None:  # the batch's rows brought up to date before the forward pass
      params, state = lars_optax.sparse.catch_up(catch_rows, params, state, rows={"table": ids})
    grad = BCOO((values, ids[:, None]), shape=(rows, dim))
    grads = {"table": grad.todense() if dense else grad}
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return jax.jit(step, donate_argnums=(0, 1))


def exact_error(poles: int | None, steps: int = 500, rows: int = 2000, dim: int = 8) -> float:
  """The largest error of ``sparse.adam(poles=...)`` + ``catch_up`` against dense
  ``optax.adam``, over the largest move in the table, after a 500-step Zipfian run with
  warm-up + cosine (as tests/test_sparse_exact.py)."""
  rng = np.random.default_rng(0)
  ids = (rng.zipf(1.2, size=(steps, 64)) - 1) % rows
  values = (rng.normal(size=(steps, 64, dim)) * 1e-2).astype(np.float32)
  w0 = jnp.asarray(rng.normal(size=(rows, dim)) * 0.1, jnp.float32)
  lr = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 50, steps)
  ours = lars_optax.sparse.adam(lr, poles=poles)
  out = []
  for tx, dense in ((ours, False), (optax.adam(lr), True)):
    f = _exact_step(tx, rows, dim, dense=dense)
    params = {"table": jnp.array(w0, copy=True)}
    state = tx.init(params)
    for i in range(steps):
      params, state = f(params, state, jnp.asarray(ids[i], jnp.int32), jnp.asarray(values[i]))
    if tx is ours:
      params, state = lars_optax.sparse.catch_up(ours, params, state)
    out.append(params["table"])
  return float(jnp.abs(out[0] - out[1]).max() / jnp.abs(out[1] - w0).max())


def exact_report(args: argparse.Namespace) -> str:
  """Dense-exact lazy Adam against the plain lazy step and dense optax.adam (#38)."""
  rows, dim, touched = args.rows, args.dim, args.touched
  batches = _zipf_batches(rows, touched, 64)
  values = jnp.asarray(np.random.default_rng(1).normal(size=(touched, dim)), jnp.float32)
  rng = np.random.default_rng(0)

  def case(name, tx, dense=False, catch_rows=None):
    p = {"table": jnp.asarray(rng.standard_normal((rows, dim), dtype=np.float32))}
    return ZipfCase(name, _exact_step(tx, rows, dim, dense, catch_rows), p, tx.init(p),
                    batches, values, dense)

  exact = lars_optax.sparse.adam(LR)
  cases = [
      case("lars_optax.sparse.lazy_update(optax.adam) (the plain lazy step)",
           lars_optax.sparse.lazy_update(optax.adam(LR))),
      case("lars_optax.sparse.adam (dense-exact, the default runs)", exact),
      case("lars_optax.sparse.adam + catch_up(rows=ids) first", exact, catch_rows=exact),
      *[case(f"lars_optax.sparse.adam(poles={k})", lars_optax.sparse.adam(LR, poles=k))
        for k in (1, 2, 4, 16)],
  ]
  if not args.sparse_only:
    cases.append(case("optax.adam on the dense gradient", optax.adam(LR), dense=True))
  for _ in range(8):  # rows left behind for a while
    for c in cases:
      c.run()
  for c in cases:
    c.times.clear()
  for r in range(args.rounds):  # rotating order: no case always follows the dense one
    for c in cases[r % len(cases):] + cases[:r % len(cases)]:
      c.run()

  def ms(c):
    return statistics.median(c.times) * 1e3

  lazy, base = ms(cases[0]), ms(cases[1])
  params = {"table": jnp.zeros((rows, dim), jnp.float32)}
  state = exact.init(params)
  extra = (sum(x.nbytes for x in jax.tree.leaves(state))
           - sum(x.nbytes for x in jax.tree.leaves(optax.adam(LR).init(params))))
  grads = {"table": BCOO((values, batches[0][:, None]), shape=(rows, dim))}

  def step(params, state, grads):
    updates, state = exact.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  temp = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, grads).compile(
      ).memory_analysis().temp_size_in_bytes
  errors = {k: exact_error(k) for k in (1, 2, 4, 16, None)} if not args.quick else {}
  poles_of = {1: 3, 2: 4, 4: 5, 16: 6, None: 1}
  lines = [
      (f"{rows:,} x {dim} float32 table, {touched:,} Zipf(1.2) ids per step (64 batches in "
       f"turn), one Adam step (update + apply, jit, donated), median of {args.rounds} rounds "
       f"in rotating order; JAX {jax.__version__} on {jax.default_backend()}."),
      "",
      "| | median step (ms) | vs the plain lazy step |",
      "|---|---:|---:|",
      *[f"| {c.name} | {ms(c):.3f} | {ms(c) / lazy:.2f}x |" for c in cases],
      "",
      (f"Extra state: {extra:,} bytes ({extra / rows:.2f} per row). Compiled temporary "
       f"memory of the dense-exact step: {temp:,} bytes (the table: {rows * dim * 4:,})."),
  ]
  if errors:
    lines += ["", ("Frontier (error: largest error over the largest move, 500 Zipfian steps, "
                   "warm-up + cosine, against dense optax.adam):"), "",
              "| poles | error | step (ms) |", "|---:|---:|---:|",
              *[f"| {k or 'default'} | {e:.1e} | {ms(cases[poles_of[k]]):.3f} |"
                for k, e in errors.items()]]
  lines += ["", "Targets:", ""]

  def target(text, ok):
    lines.append(f"- {text}: {'met' if ok else 'MISSED'}")

  target(f"dense-exact step <= 3x the plain lazy step ({base / lazy:.2f}x)", base <= 3 * lazy)
  first = ms(cases[2])
  target(f"with catch_up(rows=ids) first <= 3x the plain lazy step ({first / lazy:.2f}x)",
         first <= 3 * lazy)
  if not args.sparse_only:
    speed = ms(cases[-1]) / base
    target(f"dense-exact step >= 30x faster than dense optax.adam ({speed:.0f}x)", speed >= 30)
  # One int32 per row, the step count and the constant rate (checked each step).
  target(f"extra memory one int32 per row ({extra:,} bytes)", extra <= 4 * rows + 16)
  target("no table-sized temporary", temp < rows * dim * 4 // 20)
  if errors:
    target(f"error <= 1e-5 at the default ({errors[None]:.1e})", errors[None] <= 1e-5)
  report = "\n".join(lines)
  print(report)
  return report


def _rotating_medians(cases: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
  """Each case's median time (ms), the cases run in rotating order round by round."""
  times: dict[str, list[float]] = {k: [] for k in cases}
  keys = list(cases)
  for r in range(rounds):
    for k in keys[r % len(keys):] + keys[:r % len(keys)]:
      start = time.perf_counter()
      jax.block_until_ready(cases[k]())
      times[k].append(time.perf_counter() - start)
  return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def realistic_report(args: argparse.Namespace) -> str:
  """The dense-exact step and a full catch_up at a training run's gaps (#58)."""
  rows, touched, warm = args.rows, args.touched, args.warm
  schedule = optax.warmup_cosine_decay_schedule(0.0, LR, 200, 100_000)
  lines = [(f"JAX {jax.__version__} on {jax.default_backend()}; {warm:,} Zipf(1.2) steps of "
            f"{touched:,} ids first; medians of {args.rounds} rounds in rotating order."), ""]
  rng = np.random.default_rng(0)
  batches = _zipf_batches(rows, touched, 64)
  fresh = _zipf_batches(rows, touched, args.rounds, seed=5)  # ids not seen in the warm-up

  def warmed(tx, dim, exact):
    values = jnp.asarray(rng.normal(size=(touched, dim)) * 1e-2, jnp.float32)
    f = _exact_step(tx, rows, dim, catch_rows=tx if exact else None)
    params = {"table": jnp.zeros((rows, dim), jnp.float32)}
    state = tx.init(params)
    for i in range(warm):
      params, state = f(params, state, batches[i % len(batches)], values)
    return f, [params, state], values

  def stepping(f, held, values):
    turn = iter(range(1 << 30))

    def run():
      held[0], held[1] = f(held[0], held[1], fresh[next(turn) % len(fresh)], values)
      return held[0]
    return run

  lines += ["| rate | dense-exact step (ms) | plain lazy step (ms) | ratio |",
            "|---|---:|---:|---:|"]
  ratios = {}
  for name, lr in (("constant", LR), ("warm-up + cosine", schedule)):
    cases = {k: stepping(*warmed(tx, args.dim, k == "exact")) for k, tx in (
        ("exact", lars_optax.sparse.adam(lr)),
        ("lazy", lars_optax.sparse.lazy_update(optax.adam(lr))))}
    med = _rotating_medians(cases, args.rounds)
    ratios[f"step, {name}"] = med["exact"] / med["lazy"]
    lines.append(f"| {name} | {med['exact']:.2f} | {med['lazy']:.2f} | "
                 f"{med['exact'] / med['lazy']:.2f}x |")
  lines += ["", "| rate | full catch_up (ms) | one dense optax.adam step (ms) | ratio |",
            "|---|---:|---:|---:|"]
  for name, lr in (("constant", LR), ("warm-up + cosine", schedule)):
    tx = lars_optax.sparse.adam(lr)
    _, (params, state), _ = warmed(tx, 32, True)
    dense = optax.adam(lr)
    dense_state, grads = dense.init(params), {"table": jnp.ones_like(params["table"])}
    catch = jax.jit(lambda p, s, tx=tx: lars_optax.sparse.catch_up(tx, p, s))

    def dense_step(p, s, g, dense=dense):
      u, s = dense.update(g, s, p)
      return optax.apply_updates(p, u), s

    step = jax.jit(dense_step)
    med = _rotating_medians({"catch_up": functools.partial(catch, params, state),
                             "dense": functools.partial(step, params, dense_state, grads)},
                            max(3, args.rounds // 4))
    ratios[f"full catch_up, {name}"] = med["catch_up"] / med["dense"]
    lines.append(f"| {name} | {med['catch_up']:.1f} | {med['dense']:.1f} | "
                 f"{med['catch_up'] / med['dense']:.2f}x |")
  lines += ["", "Targets (#58: <= 3x):", ""]
  lines += [f"- {k}: {r:.2f}x, {'met' if r <= 3 else 'MISSED'}" for k, r in ratios.items()]
  report = "\n".join(lines)
  print(report)
  return report


# --------------------------------------------------------------------------
# --devices N: a table split by rows over N devices against one device
# --------------------------------------------------------------------------

_COLLECTIVE = re.compile(r"=\s*(.*?)\s(all-gather|all-reduce|all-to-all|collective-permute|"
                         r"reduce-scatter)(-start)?\(")
_ARRAY = re.compile(r"(f32|s32|u32|f16|bf16|pred|s8|u8)\[([\d,]*)\]")
_BYTES = {"f32": 4, "s32": 4, "u32": 4, "f16": 2, "bf16": 2, "pred": 1, "s8": 1, "u8": 1}


def collective_bytes(hlo: str) -> list[int]:
  """The result size in bytes of each collective of a compiled program (per device)."""
  out = []
  for line in hlo.splitlines():
    m = _COLLECTIVE.search(line)
    if m:
      out.append(sum(_BYTES[t] * math.prod(int(d) for d in dims.split(",") if d)
                     for t, dims in _ARRAY.findall(m.group(1))))
  return out


class _SplitCase(Case):
  """A :class:`Case` whose steps run inside a mesh context (explicit axes)."""

  def __init__(self, name: str, step: Callable, params, state, args, context: Callable):
    self.context = context
    with context():
      self.compiled = step.lower(params, state, *args).compile()
      super().__init__(name, step, params, state, args)

  def run(self) -> None:
    with self.context():
      super().run()


def split_cases(rows: int, dim: int, batch: int, bag: int, devices: int,
                exact: bool) -> list[Callable[[], Case]]:
  """Builders of the train step of :func:`train_cases` (gradients, optimizer, apply) on
  one device and with the table split by rows over ``devices`` devices in three ways:
  ``jit`` with automatic axes, ``jit`` with explicit axes, and ``shard_map`` (the batch
  split over the same devices, global ids). ``exact``: ``sparse.adam`` with
  ``catch_up(rows=)`` first, else lazy Adam. (Builders: at 8M rows two cases at a time
  fit in memory.)"""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  rng = np.random.default_rng(1)
  ids = jnp.asarray(rng.integers(0, rows, (batch, bag)), jnp.int32)
  y = jnp.asarray(rng.normal(size=batch), jnp.float32)
  make = ((lambda: lars_optax.sparse.adam(LR)) if exact
          else (lambda: lars_optax.mxnet.adam(LR, lazy_update=True)))
  label = "sparse.adam + catch_up(rows=)" if exact else "lazy Adam"
  dev = jax.devices()[:devices]

  def params():
    return {"table": np.zeros((rows, dim), np.float32), "w": np.ones(dim, np.float32)}

  def loss(p, ids, y, out_sharding=None):
    got = p["table"][ids] if out_sharding is None else p["table"].at[ids].get(
        out_sharding=out_sharding)
    return jnp.mean((got.mean(axis=1) @ p["w"] - y) ** 2)

  def make_step(grad_fn, tx, axis_name=None):
    def step(params, state, ids, y):
      if exact:
        params, state = lars_optax.sparse.catch_up(tx, params, state, rows={"table": ids},
                                                   axis_name=axis_name)
      _, grads = grad_fn(params, ids, y)
      updates, state = tx.update(grads, state, params)
      return lars_optax.sparse.apply_updates(params, updates), state

    return step

  def put(mesh, tree):  # the table and its buffers split by rows, the rest replicated
    return jax.tree.map(lambda a: jax.device_put(
        a, NamedSharding(mesh, P("rows") if np.shape(a)[:1] == (rows,) else P())), tree)

  def none():
    return contextlib.nullcontext()

  plain = lars_optax.sparse.value_and_grad(loss, sparse="table")
  auto = jax.sharding.Mesh(np.array(dev), ("rows",))
  explicit = jax.make_mesh((devices,), ("rows",), devices=dev,
                           axis_types=(jax.sharding.AxisType.Explicit,))

  def one_device():
    tx = make()
    p = jax.device_put(params(), dev[0])
    step = jax.jit(make_step(plain, tx), donate_argnums=(0, 1))
    return _SplitCase(f"{label}, one device", step, p, tx.init(p), (ids, y), none)

  def automatic():
    tx = make()
    p = put(auto, params())
    step = jax.jit(make_step(plain, tx), donate_argnums=(0, 1))
    return _SplitCase(f"{label}, jit, automatic axes", step, p, put(auto, tx.init(p)),
                      (ids, y), none)

  def explicit_axes():
    tx = make()
    with jax.set_mesh(explicit):
      p = put(explicit, params())
      s = put(explicit, tx.init(p))
    grad_fn = lars_optax.sparse.value_and_grad(functools.partial(loss, out_sharding=P()),
                                               sparse="table")
    return _SplitCase(f"{label}, jit, explicit axes",
                      jax.jit(make_step(grad_fn, tx), donate_argnums=(0, 1)), p, s, (ids, y),
                      lambda: jax.set_mesh(explicit))

  def in_shard_map():
    tx = make()
    grad_fn = lars_optax.sparse.value_and_grad(lambda p, i, y: loss(p, i, y) / devices,
                                               sparse="table", axis_name="rows")
    p = put(auto, params())
    s = put(auto, tx.init(p))
    p_spec = jax.tree.map(lambda a: a.sharding.spec, p)
    s_spec = jax.tree.map(lambda a: a.sharding.spec, s)
    step = jax.jit(jax.shard_map(make_step(grad_fn, tx, "rows"), mesh=auto,
                                 in_specs=(p_spec, s_spec, P("rows"), P("rows")),
                                 out_specs=(p_spec, s_spec)), donate_argnums=(0, 1))
    return _SplitCase(f"{label}, shard_map, batch split too", step, p, s, (ids, y), none)

  return [one_device, automatic, explicit_axes, in_shard_map]


def devices_report(args: argparse.Namespace) -> str:
  """Per table size: the split steps against one device, each pair timed in rotating order
  (two tables at a time fit in memory at 8M rows), their per-device argument bytes and
  their largest collective."""
  n = args.devices
  if jax.device_count() < n:
    raise SystemExit(f"--devices {n}: JAX sees {jax.device_count()} devices.")
  lines = [(f"Train step (gradients, optimizer, apply) of an embedding bag ({args.batch} "
            f"examples x {args.bag} ids), the {args.dim}-wide float32 table split by rows "
            f"over {n} devices against one device; medians of {args.rounds} rounds, each "
            "split step timed in rotating order with the one-device step. JAX "
            f"{jax.__version__} on {jax.default_backend()} ({jax.devices()[0].device_kind})."),
           "",
           ("| table | step | median (ms) | vs one device | per-device arguments (MB) | "
            "largest collective (KB) |"), "|---|---|---:|---:|---:|---:|"]

  def row(rows, case, ratio):
    mem = case.compiled.memory_analysis()
    coll = collective_bytes(case.compiled.as_text())
    return (f"| {rows:,} | {case.name} | {statistics.median(case.times) * 1e3:.3f} | {ratio} | "
            f"{mem.argument_size_in_bytes / 1e6:.1f} | {max(coll, default=0) / 1e3:.1f} |")

  for rows in args.tables:
    for exact in (False,) if args.quick else (False, True):  # (--quick: lazy Adam only)
      one_device, *splits = split_cases(rows, args.dim, args.batch, args.bag, n, exact)
      one = one_device()
      one_times: list[float] = []
      split_rows = []
      for build in splits:
        case = build()
        one.times = []
        for r in range(args.rounds):
          for c in ((one, case) if r % 2 == 0 else (case, one)):
            c.run()
        one_times += one.times
        ratio = statistics.median(case.times) / statistics.median(one.times)
        split_rows.append(row(rows, case, f"{ratio:.2f}x"))
        del case  # (its table's memory, before the next one)
      one.times = one_times
      lines += [row(rows, one, "1"), *split_rows]
      del one
  report = "\n".join(lines)
  print(report)
  return report


def main(argv: list[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rows", type=int, default=1_000_000)
  parser.add_argument("--dim", type=int, default=64)
  parser.add_argument("--touched", type=int, default=1024)
  parser.add_argument("--batch", type=int, default=128, help="train step: examples")
  parser.add_argument("--bag", type=int, default=8, help="train step: ids per example")
  parser.add_argument("--rounds", type=int, default=30)
  parser.add_argument("--mxnet-python", default=None,
                      help="a Python that can import mxnet 2.0 (default: skip MXNet)")
  parser.add_argument("--sparse-only", action="store_true",
                      help="only the sparse step (for tables too big to hold several copies)")
  parser.add_argument("--companions", action="store_true",
                      help="the cost of the run-time checks, clip_by_global_norm + Adam, and "
                           "multi_steps' memory for two table sizes")
  parser.add_argument("--exact", action="store_true",
                      help="dense-exact lazy Adam (lars_optax.sparse.adam) against the plain "
                           "lazy step and dense optax.adam, on Zipfian ids; its memory and "
                           "its error against poles")
  parser.add_argument("--realistic", action="store_true",
                      help="sparse.adam's step and a full catch_up after --warm Zipfian steps, "
                           "against the lazy step and one dense optax.adam step")
  parser.add_argument("--warm", type=int, default=2000,
                      help="with --realistic: the Zipfian steps run first")
  parser.add_argument("--quick", action="store_true",
                      help="a small, fast run (default 20,000 rows, 3 rounds): a smoke test")
  parser.add_argument("--devices", type=int, default=0,
                      help="the train step with the table split by rows over this many "
                           "devices (on CPU, virtual ones), three ways, against one device")
  parser.add_argument("--tables", type=lambda t: [int(x) for x in t.split(",")],
                      default=[1_000_000, 8_000_000],
                      help="with --devices: the table sizes in rows, comma-separated")
  if parser.parse_args(argv).quick:  # small defaults; explicit options still win
    parser.set_defaults(rows=20_000, touched=64, batch=16, bag=4, rounds=3,
                        tables=[16_000, 32_000])
  args = parser.parse_args(argv)
  if args.devices:
    # (Before JAX's first computation; a test's process already has its 8 devices.)
    with contextlib.suppress(RuntimeError):
      jax.config.update("jax_num_cpu_devices", args.devices)
    return devices_report(args)
  if args.companions:
    return companions_report(args)
  if args.exact:
    return exact_report(args)
  if args.realistic:
    return realistic_report(args)

  mx = "not run (no --mxnet-python)"
  if args.mxnet_python:
    mx = mxnet_times(args.mxnet_python, args.rows, args.dim, args.touched, args.rounds)
  opt = optimizer_cases(args.rows, args.dim, args.touched, args.sparse_only)
  train = ([] if args.sparse_only
           else train_cases(args.rows, args.dim, args.batch, args.bag, args.sparse_only))
  # The O(table) steps sweep the caches; the O(rows) steps are timed in rounds
  # of their own (as MXNet's, in its own process), each group interleaved.
  dense = [c for c in opt + train if c.dense]
  light = [c for c in opt + train if not c.dense]
  for group in (dense, light):
    for r in range(args.rounds):
      for case in (group if r % 2 == 0 else group[::-1]):  # no case always runs first
        case.run()

  def ms(times):
    return statistics.median(times) * 1e3

  lines = [
      (f"{args.rows:,} x {args.dim} float32 table, gradient in {args.touched:,} rows, one Adam "
       f"step (update + apply), median of {args.rounds} rounds; JAX {jax.__version__} on "
       f"{jax.default_backend()}."),
      "",
      "| | median step (ms) | vs sparse path |",
      "|---|---|---|",
  ]
  sparse_ms = ms(opt[-1].times)
  if isinstance(mx, list):
    mx_ms: float | None = ms(mx)
    lines.append(f"| MXNet 2.0 Adam(lazy_update=True), row_sparse gradient | {mx_ms:.3f} | "
                 f"{mx_ms / sparse_ms:.2f}x |")
  else:
    mx_ms = None
    lines.append(f"| MXNet 2.0 Adam(lazy_update=True), row_sparse gradient | {mx} | |")
  for case in opt:
    lines.append(f"| {case.name} | {ms(case.times):.3f} | {ms(case.times) / sparse_ms:.2f}x |")
  if train:
    lines += ["", f"Train step of an embedding bag ({args.batch} examples x {args.bag} ids):",
              "", "| | median step (ms) | vs sparse |", "|---|---|---|"]
    train_sparse = ms(train[-1].times)
    for case in train:
      lines.append(f"| {case.name} | {ms(case.times):.3f} | "
                   f"{ms(case.times) / train_sparse:.1f}x |")
  lines += ["", "Targets:", ""]

  def target(text, ok):
    lines.append(f"- {text}: {'met' if ok else 'MISSED'}")

  if mx_ms is not None:
    target(f"sparse step <= 2x MXNet's ({sparse_ms / mx_ms:.2f}x)", sparse_ms <= 2 * mx_ms)
  if not args.sparse_only:
    speed = ms(opt[0].times) / sparse_ms
    target(f"sparse step >= 50x faster than dense optax.adam ({speed:.0f}x)", speed >= 50)
    speed = ms(train[0].times) / train_sparse
    target(f"sparse train step >= 20x faster than the dense one ({speed:.0f}x)", speed >= 20)
  report = "\n".join(lines)
  print(report)
  return report


if __name__ == "__main__":
  main()
