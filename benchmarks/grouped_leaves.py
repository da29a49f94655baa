"""Does grouping leaves make a LARS step memory-bound? An experiment on the ResNet-50 tree.

On a GPU a per-leaf step launches kernels per leaf (161 leaves here), and each
LARS leaf also needs its norms before its update. This script times, in one
run, with ``step_time.py``'s method (10 steps per jitted call, donated
buffers, float32):

* per leaf: ``optax.sgd(momentum=0.9)`` and ``lars_optax.lars(momentum=0.9,
  skip=None)`` (a ratio for every leaf, as the grouped step computes);
* grouped: the same two rules on ONE flat buffer holding every leaf (params,
  gradients and momentum each a single vector, as if the model kept its
  params flat). LARS's per-leaf squared norms are one ``segment_sum`` over
  the flat vectors and each entry's ratio is gathered by its leaf index;
  the index is either a stored int32 vector (``seg``) or computed from the
  element's position by a binary search over the leaves' offsets
  (``search``), so that it costs no memory traffic.

Bytes are counted as in ``step_time.py``: ``2 * params + grads + 2 * momentum``.

``--by-shape`` is the second experiment, on ``step_time.py``'s unrolled
transformer-like tree (12 leaves a block): the leaves of one shape are
stacked into one array (``jnp.stack``, 5 shapes here), the optimizer runs on
the stacks with one layer axis each (its ``stacked`` rules: a ratio per
slice, as for a scanned model), keeps its state stacked, and each leaf's
update is read back from its stack. Two ways to read it back:

* sliced: ``u[k]``, a constant offset per leaf. XLA gives every leaf a
  kernel of its own (a different offset each), so the compile time is no
  better than per leaf;
* indexed: ``dynamic_index_in_dim(u, k)`` with ``k`` an int32 scalar kept in
  the state, one per leaf. Every leaf's kernel is then the same and XLA
  compiles it once.

It reports kernels per leaf, compile time and step time against
sgd-momentum's, in one run. A prototype: it ignores per-leaf masks
(``skip``, ``wd_mult``), so it runs LAMB and LARS with a ratio for every leaf.

    python benchmarks/grouped_leaves.py [--rounds 30] [--quick]
    python benchmarks/grouped_leaves.py --by-shape [--blocks 96] [--rounds 10] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resnet50_tree import resnet50_params
from step_time import copy_rate, launches, make_step, time_in_rotation, transformer_tree

import lars_optax

LR, MU, ETA, EPS = 0.1, 0.9, 0.001, 1e-8


def flat_sgd(w, m, g):
  m = MU * m - LR * g
  return w + m, m


def flat_lars(w, m, g, seg, n):
  w2 = jax.ops.segment_sum(w * w, seg, n, indices_are_sorted=True)
  g2 = jax.ops.segment_sum(g * g, seg, n, indices_are_sorted=True)
  wn, gn = jnp.sqrt(w2), jnp.sqrt(g2)
  ok = (wn > 0) & (gn > 0)
  ratio = jnp.where(ok, ETA * wn / jnp.where(ok, gn + EPS, 1.0), 1.0)
  m = MU * m - LR * ratio[seg] * g
  return w + m, m


def timed(fn, args, donate, rounds, steps):
  """Median seconds per step of ``fn`` run ``steps`` times per jitted call."""
  def loop(*a):
    return jax.lax.fori_loop(0, steps, lambda _, c: fn(*c, *a[donate:]), a[:donate])
  f = jax.jit(loop, donate_argnums=tuple(range(donate)))
  state = f(*args)
  jax.block_until_ready(state)
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    state = f(*state, *args[donate:])
    jax.block_until_ready(state)
    times.append((time.perf_counter() - t0) / steps)
  return statistics.median(times)


def stack_by_shape(make_tx, like, indexed: bool = True) -> optax.GradientTransformation:
  """``make_tx(stacked)`` run on ``like``'s leaves stacked by shape and dtype (see
  the module docstring); ``indexed``: each leaf's update is read with an index
  kept in the state, else with a constant slice."""
  leaves, treedef = jax.tree.flatten(like)
  by_key: dict = {}
  for i, x in enumerate(leaves):
    by_key.setdefault((x.shape, jnp.dtype(x.dtype)), []).append(i)
  groups = list(by_key.values())
  names = [f"shape_{j}" for j in range(len(groups))]
  inner = make_tx(dict.fromkeys(names, 1))

  def stack(tree):
    flat = jax.tree.leaves(tree)
    # The barrier keeps each stack one copy: fused into its readers, a
    # concatenation of a hundred operands is slow to compile and to run.
    return jax.lax.optimization_barrier(
        {n: jnp.stack([flat[i] for i in idx]) for n, idx in zip(names, groups)})

  def init(params):
    index = tuple(tuple(jnp.int32(k) for k in range(len(idx))) for idx in groups)
    return inner.init(stack(params)), (index if indexed else ())

  def update(grads, state, params=None):
    inner_state, index = state
    u, inner_state = inner.update(stack(grads), inner_state, stack(params))
    out = [None] * len(leaves)
    for j, (n, idx) in enumerate(zip(names, groups)):
      for k, i in enumerate(idx):
        out[i] = (jax.lax.dynamic_index_in_dim(u[n], index[j][k], keepdims=False)
                  if indexed else u[n][k])
    return treedef.unflatten(out), (inner_state, index)

  return optax.GradientTransformation(init, update)


def by_shape(args) -> str:
  """The ``--by-shape`` experiment (see the module docstring)."""
  params = transformer_tree(args.blocks, args.hidden)
  grads = jax.tree.map(lambda p: 0.3 * p + 0.01, params)
  n = len(params)
  lamb = lambda stacked=None: lars_optax.lamb(1e-3, wd=0.01, stacked=stacked)
  lars = lambda stacked=None: lars_optax.lars(LR, momentum=MU, skip=None,
                                              stacked=stacked)
  rows = {
      "per leaf: optax.sgd(momentum=0.9)": lambda: optax.sgd(LR, momentum=MU),
      "per leaf: optax.lamb": lambda: optax.lamb(1e-3, weight_decay=0.01),
      "per leaf: lars_optax.lamb(wd)": lamb,
      "by shape, sliced: lamb(wd)": lambda: stack_by_shape(lamb, params, indexed=False),
      "by shape, indexed: lamb(wd)": lambda: stack_by_shape(lamb, params),
      "per leaf: lars_optax.lars(skip=None)": lars,
      "by shape, indexed: lars(skip=None)": lambda: stack_by_shape(lars, params),
  }
  # The stacked steps are the per-leaf ones: two steps agree to float32 rounding.
  for per_leaf, grouped in [(lamb(), stack_by_shape(lamb, params)),
                            (lars(), stack_by_shape(lars, params))]:
    outs = []
    for tx in (per_leaf, grouped):
      p, s = params, tx.init(params)
      for _ in range(2):
        p, s = make_step(tx)(jax.tree.map(jnp.copy, p), s, grads)
      outs.append(p)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7), *outs)

  runs = {}
  for name, fac in rows.items():
    jax.clear_caches()
    tx = fac()
    t0 = time.perf_counter()
    one = make_step(tx).lower(params, jax.eval_shape(tx.init, params), grads).compile()
    compile_s = time.perf_counter() - t0
    tx = fac()
    p = jax.tree.map(jnp.copy, params)
    s = tx.init(p)
    fn = make_step(tx, args.steps_per_call).lower(p, s, grads).compile()
    p, s = fn(p, s, grads)
    jax.block_until_ready(p)
    runs[name] = {"fn": fn, "p": p, "s": s, "times": [], "compile_s": compile_s,
                  "kernels": launches(one.as_text()) / n}
  time_in_rotation(runs, grads, args.rounds, args.steps_per_call)
  base = runs[next(iter(runs))]
  base_step = statistics.median(base["times"])
  lamb_step = statistics.median(runs["per leaf: optax.lamb"]["times"])
  dev = jax.devices()[0]
  lines = [(f"Unrolled transformer-like tree, {args.blocks} blocks of 12 leaves ({n} leaves, "
            f"hidden size {args.hidden}); {dev.platform}: {dev.device_kind}; jax "
            f"{jax.__version__}; step: median of {args.rounds} calls of "
            f"{args.steps_per_call} steps, per step; compile: lowering and XLA compile, once."),
           "", ("| step | kernels / leaf | compile (s) | compile / sgd-m | step (ms) "
                "| step / sgd-m | step / optax.lamb |"),
           "|---|---:|---:|---:|---:|---:|---:|"]
  for name, run in runs.items():
    step = statistics.median(run["times"])
    lines.append(f"| {name} | {run['kernels']:.2f} | {run['compile_s']:.2f} | "
                 f"{run['compile_s'] / base['compile_s']:.2f} | {step * 1e3:.3f} | "
                 f"{step / base_step:.2f} | {step / lamb_step:.2f} |")
  report = "\n".join(lines)
  print(report)
  return report


def main(argv=None) -> str:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rounds", type=int, default=30)
  ap.add_argument("--steps-per-call", type=int, default=10)
  ap.add_argument("--quick", action="store_true",
                  help="the tree's first 20 leaves, 3 rounds of 2 steps: a smoke test")
  ap.add_argument("--by-shape", action="store_true",
                  help="the second experiment: a transformer-like tree's leaves stacked by "
                       "shape")
  ap.add_argument("--blocks", type=int, default=96,
                  help="--by-shape: blocks of 12 leaves (default: %(default)s)")
  ap.add_argument("--hidden", type=int, default=128,
                  help="--by-shape: the blocks' hidden size (default: %(default)s)")
  args = ap.parse_args(argv)
  if args.quick:
    args.rounds, args.steps_per_call = 3, 2
    args.blocks, args.hidden = 2, 16
  if args.by_shape:
    return by_shape(args)
  steps = args.steps_per_call

  params = resnet50_params()
  if args.quick:
    params = dict(list(params.items())[:20])
  grads = jax.tree.map(lambda p: 0.3 * p + 0.01, params)
  leaves = jax.tree.leaves(params)
  sizes = np.array([x.size for x in leaves])
  n_params, n_leaves = int(sizes.sum()), len(leaves)
  offsets = jnp.asarray(np.cumsum(sizes)[:-1], jnp.int32)
  seg = jnp.asarray(np.repeat(np.arange(n_leaves), sizes), jnp.int32)
  w = jnp.concatenate([x.ravel() for x in leaves])
  g = jnp.concatenate([x.ravel() for x in jax.tree.leaves(grads)])

  def by_search(w, m, g, offsets):
    pos = jax.lax.iota(jnp.int32, w.size)
    return flat_lars(w, m, g, jnp.searchsorted(offsets, pos, side="right", method="scan"),
                     n_leaves)

  # The grouped LARS step is the per-leaf one: check one step before timing.
  tx = lars_optax.lars(LR, momentum=MU, skip=None)
  updates, _ = tx.update(grads, tx.init(params), params)
  ref = jnp.concatenate([(p + u).ravel() for p, u in zip(leaves, jax.tree.leaves(updates))])
  np.testing.assert_allclose(flat_lars(w, jnp.zeros_like(w), g, seg, n_leaves)[0], ref,
                             rtol=1e-5, atol=1e-7)

  results = {}
  for name, tx in [("per leaf: optax.sgd(momentum=0.9)", optax.sgd(LR, momentum=MU)),
                   ("per leaf: lars_optax.lars(momentum=0.9, skip=None)",
                    lars_optax.lars(LR, momentum=MU, skip=None))]:
    step = make_step(tx, steps)
    p = jax.tree.map(jnp.copy, params)
    state = (p, tx.init(p))
    state = step(*state, grads)
    jax.block_until_ready(state)
    times = []
    for _ in range(args.rounds):
      t0 = time.perf_counter()
      state = step(*state, grads)
      jax.block_until_ready(state)
      times.append((time.perf_counter() - t0) / steps)
    results[name] = statistics.median(times)
  zeros = jnp.zeros_like(w)
  results["grouped: sgd-momentum"] = timed(flat_sgd, (w + 0, zeros + 0, g), 2, args.rounds,
                                           steps)
  results["grouped: LARS, stored leaf index"] = timed(
      lambda w, m, g, seg: flat_lars(w, m, g, seg, n_leaves), (w + 0, zeros + 0, g, seg), 2,
      args.rounds, steps)
  results["grouped: LARS, leaf index by binary search"] = timed(
      by_search, (w + 0, zeros + 0, g, offsets), 2, args.rounds, steps)

  rate = copy_rate(1 << 30 if not args.quick else 1 << 26, max(args.rounds, 5), steps) / 1e9
  nbytes = 5 * n_params * 4
  dev = jax.devices()[0]
  tree = "ResNet-50 tree" + (" (its first 20 leaves)" if args.quick else "")
  lines = [(f"{tree}, {n_leaves} leaves, {n_params:,} float32 params; "
            f"{dev.platform}: {dev.device_kind}; jax {jax.__version__}; median of "
            f"{args.rounds} calls of {steps} steps, per step; copy rate {rate:.0f} GB/s."), "",
           "| step | ms | GB/s | of copy rate |", "|---|---:|---:|---:|"]
  for name, t in results.items():
    lines.append(f"| {name} | {t * 1e3:.3f} | {nbytes / t / 1e9:.0f} | "
                 f"{nbytes / t / 1e9 / rate:.0%} |")
  report = "\n".join(lines)
  print(report)
  return report


if __name__ == "__main__":
  main()
