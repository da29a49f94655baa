"""``sparse.adam``, ``adamw`` and ``sgd`` given a whole model: the train step's compile and
step time against the same step with ``optax.adam`` (``adamw``, ``sgd``).

The model is an unrolled Flax linen transformer (``--blocks`` blocks of self-attention
and an MLP, layer norms, an untied output layer) over a token table. The optax step
takes ``jax.value_and_grad`` of the whole model; the dense-exact step brings the
batch's rows up to date (``catch_up(rows=...)``), takes the table's gradient as
row-sparse rows (``sparse.value_and_grad``) and steps the whole model with one
optimizer, ``sparse="embedding"`` naming the table: every other leaf takes optax's
step and keeps no rows. Each step is jit-compiled with params and state donated; the
compile time (lowering included) is the median of ``--compiles`` compiles per row, and
the step time the median of ``--rounds`` steps; compiles and steps alike interleave the
rows in a new random order each round.

    python benchmarks/sparse_whole_model.py              # markdown table on stdout
    python benchmarks/sparse_whole_model.py --quick      # a smoke test: 2 blocks

Only ratios are meaningful on a shared CPU; absolute times only on a GPU.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import lars_optax


class Block(nn.Module):
  hidden: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    y = nn.SelfAttention(num_heads=4, qkv_features=self.hidden)(nn.LayerNorm()(x))
    x = x + y
    y = nn.Dense(self.hidden)(nn.gelu(nn.Dense(4 * self.hidden)(nn.LayerNorm()(x))))
    return x + y


class Model(nn.Module):
  vocab: int
  hidden: int
  blocks: int

  @nn.compact
  def __call__(self, ids: jax.Array) -> jax.Array:
    x = nn.Embed(self.vocab, self.hidden)(ids)
    for _ in range(self.blocks):
      x = Block(self.hidden)(x)
    return nn.Dense(self.vocab)(nn.LayerNorm()(x))


def pairs(schedule: optax.Schedule) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
  """name -> (the optax optimizer, the dense-exact one given the whole model)."""
  return {
      "adam": (lambda: optax.adam(schedule),
               lambda: lars_optax.sparse.adam(schedule, sparse="embedding")),
      "adamw": (lambda: optax.adamw(schedule, weight_decay=1e-2),
                lambda: lars_optax.sparse.adamw(schedule, weight_decay=1e-2,
                                                sparse="embedding")),
      "sgd": (lambda: optax.sgd(schedule, momentum=0.9),
              lambda: lars_optax.sparse.sgd(schedule, momentum=0.9, sparse="embedding")),
  }


def make_step(model: Model, tx: optax.GradientTransformation, exact: bool) -> Callable:
  def loss_fn(params, ids):
    logits = model.apply({"params": params}, ids[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:]).mean()

  grad_fn = (lars_optax.sparse.value_and_grad(loss_fn, sparse="embedding") if exact
             else jax.value_and_grad(loss_fn))

  def step(params, state, ids):
    if exact:
      params, state = lars_optax.sparse.catch_up(tx, params, state,
                                                 rows={"embedding": ids})
    loss, grads = grad_fn(params, ids)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  return jax.jit(step, donate_argnums=(0, 1))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--blocks", type=int, default=12)
  ap.add_argument("--hidden", type=int, default=128)
  ap.add_argument("--vocab", type=int, default=8192)
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--seq", type=int, default=64)
  ap.add_argument("--rounds", type=int, default=20)
  ap.add_argument("--compiles", type=int, default=3, help="compiles per row (the median)")
  ap.add_argument("--only", nargs="*", help="optimizers to run (adam, adamw, sgd)")
  ap.add_argument("--quick", action="store_true", help="2 blocks, 3 rounds: a smoke test")
  args = ap.parse_args(argv)
  if args.quick:
    args.blocks, args.rounds, args.compiles = 2, 3, 1
  model = Model(args.vocab, args.hidden, args.blocks)
  rng = np.random.default_rng(0)

  def batch() -> jax.Array:
    return jnp.asarray(rng.zipf(1.2, size=(args.batch, args.seq + 1)) % args.vocab, jnp.int32)

  params0 = model.init(jax.random.key(0), batch()[:, :-1])["params"]
  schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-3, 10, 1000)
  runs: dict[str, dict[str, Any]] = {}
  for name, (plain, exact) in pairs(schedule).items():
    if args.only and name not in args.only:
      continue
    for label, factory, is_exact in ((f"optax.{name}", plain, False),
                                     (f"sparse.{name}(sparse='embedding')", exact, True)):
      runs[label] = {"factory": factory, "exact": is_exact, "compiles": [], "times": [],
                     "pair": name}
  order = list(runs)
  ids = batch()
  for c in range(args.compiles):  # each row compiled anew each time, in a new order
    random.Random(1000 + c).shuffle(order)
    for label in order:
      run = runs[label]
      tx = run["factory"]()
      params = jax.tree.map(jnp.copy, params0)
      state = tx.init(params)
      fn = make_step(model, tx, run["exact"])
      start = time.perf_counter()
      compiled = fn.lower(params, state, ids).compile()
      run["compiles"].append(time.perf_counter() - start)
      run.update(fn=compiled, p=params, s=state)
  for run in runs.values():
    run["p"], run["s"], _ = run["fn"](run["p"], run["s"], ids)
    jax.block_until_ready(run["p"])
    run["compile_s"] = statistics.median(run["compiles"])
  for r in range(args.rounds):
    random.Random(r).shuffle(order)
    ids = batch()
    for label in order:
      run = runs[label]
      start = time.perf_counter()
      run["p"], run["s"], _ = run["fn"](run["p"], run["s"], ids)
      jax.block_until_ready(run["p"])
      run["times"].append(time.perf_counter() - start)
  rows = []
  for label, run in runs.items():
    base = runs[f"optax.{run['pair']}"]
    step, base_step = statistics.median(run["times"]), statistics.median(base["times"])
    rows.append({"optimizer": label, "compile_s": run["compile_s"],
                 "compile_ratio": run["compile_s"] / base["compile_s"],
                 "step_ms": step * 1e3, "step_ratio": step / base_step})
  device = jax.devices()[0]
  result = {"device": f"{device.platform}: {device.device_kind}", "jax": jax.__version__,
            "leaves": len(jax.tree.leaves(params0)), "blocks": args.blocks,
            "hidden": args.hidden, "vocab": args.vocab, "rounds": args.rounds,
            "compiles": args.compiles, "rows": rows}
  print(format_table(result))
  return result


def format_table(result: dict[str, Any]) -> str:
  head = (f"{result['device']}, jax {result['jax']}: {result['blocks']} blocks, hidden "
          f"{result['hidden']}, a {result['vocab']}-token table, {result['leaves']} leaves; "
          f"medians of {result['compiles']} compile{'s' * (result['compiles'] > 1)} and "
          f"{result['rounds']} steps a row")
  lines = [head, "",
           "| train step | compile (s) | vs optax | step (ms) | vs optax |",
           "|---|---:|---:|---:|---:|"]
  for r in result["rows"]:
    lines.append(f"| `{r['optimizer']}` | {r['compile_s']:.2f} | {r['compile_ratio']:.2f}x | "
                 f"{r['step_ms']:.2f} | {r['step_ratio']:.2f}x |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
