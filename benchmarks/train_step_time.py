"""Times a whole bf16 ResNet-50 train step (Flax linen) with each optimizer.

The model is ``tpu_cost_model.resnet50`` (ResNet-50 v1.5: bfloat16 compute,
float32 params, batch norm), the step is forward, backward and the optimizer
step (``update`` + ``optax.apply_updates``), jit-compiled with params, batch
statistics and optimizer state donated. Optimizers (both LARS skip biases and
norm params and decay the rest by 1e-4): ``optax.sgd(momentum=0.9)``,
``optax.lars`` and ``lars_optax.lars(skip="flax")``. They run in one process,
interleaved round by round; the table gives medians.

What the optimizer costs, two ways:

* the train step's time over sgd-momentum's (the TPU cost model of
  ``tpu_cost_model.py`` gives +0.7% for ``lars_optax.lars``);
* the optimizer step alone (``update`` + ``apply_updates`` on the model's
  params, one step per call, timed the same way) as a share of the whole
  train step. One call per step includes the host's dispatch of every
  params, gradient and state buffer (milliseconds for a few hundred leaves on
  a GPU), so this share is an upper bound; ``step_time.py`` runs several steps
  per call to leave the dispatch out.

    python benchmarks/train_step_time.py                 # batch 256, 224x224
    python benchmarks/train_step_time.py --batch 128 --rounds 50 --json out.json
    python benchmarks/train_step_time.py --quick         # tiny model: a smoke test

Absolute times mean something only on an accelerator; on a CPU, use
``--quick`` to check that it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpu_cost_model import optimizers, resnet50, train_step

import lars_optax  # noqa: F401  (the optimizers come from tpu_cost_model)


def _timed(fn: Callable[..., tuple], args: tuple, donate: int) -> Callable[[], float]:
  """A closure running ``fn`` once on its own (donated) buffers; returns seconds."""
  state = {"args": args}

  def once() -> float:
    t0 = time.perf_counter()
    out = fn(*state["args"])
    jax.block_until_ready(out)
    elapsed = time.perf_counter() - t0
    state["args"] = (*out[:donate], *state["args"][donate:])
    return elapsed

  return once


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--batch", type=int, default=256, help="images per step")
  ap.add_argument("--image", type=int, default=224, help="image height and width")
  ap.add_argument("--rounds", type=int, default=30, help="timed steps per optimizer")
  ap.add_argument("--json", help="also write the figures here")
  ap.add_argument("--quick", action="store_true",
                  help="a one-block, one-stage net, batch 2, 32x32 images, 10 classes, 2 rounds: "
                       "a smoke test")
  args = ap.parse_args(argv)
  stages: tuple[int, ...] = (3, 4, 6, 3)
  classes = 1000
  if args.quick:
    stages, classes, args.batch, args.image, args.rounds = (1,), 10, 2, 32, 2

  model = resnet50(classes, stages=stages)
  key_x, key_y = jax.random.split(jax.random.key(0))
  images = jax.random.normal(key_x, (args.batch, args.image, args.image, 3), jnp.bfloat16)
  labels = jax.random.randint(key_y, (args.batch,), 0, classes)
  variables = jax.jit(model.init, static_argnames="train")(
      jax.random.key(1), images[:1], train=False)
  n_params = sum(x.size for x in jax.tree.leaves(variables["params"]))

  runs: dict[str, dict[str, Any]] = {}
  for name, factory in optimizers(flax_names=True).items():
    tx = factory()

    def opt_step(params, state, grads, tx=tx):
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state

    copy = lambda tree: jax.tree.map(jnp.copy, tree)
    params, stats = copy(variables["params"]), copy(variables["batch_stats"])
    t0 = time.perf_counter()
    train = jax.jit(train_step(model, tx), donate_argnums=(0, 1, 2)).lower(
        params, stats, tx.init(params), images, labels).compile()
    compile_s = time.perf_counter() - t0
    grads = jax.tree.map(lambda p: 1e-3 * jnp.ones_like(p), params)
    alone = jax.jit(opt_step, donate_argnums=(0, 1)).lower(
        params, tx.init(params), grads).compile()
    runs[name] = {
        "train": _timed(train, (params, stats, tx.init(params), images, labels), 3),
        "alone": _timed(alone, (copy(params), tx.init(params), grads), 2),
        "compile_s": compile_s, "train_times": [], "alone_times": []}
    for _ in range(2):  # warm-up
      runs[name]["train"](), runs[name]["alone"]()

  for _ in range(args.rounds):
    for run in runs.values():
      run["train_times"].append(run["train"]())
    for run in runs.values():
      run["alone_times"].append(run["alone"]())

  device = jax.devices()[0]
  result: dict[str, Any] = {
      "device": f"{device.platform}: {device.device_kind}", "jax": jax.__version__,
      "optax": optax.__version__, "batch": args.batch, "image": args.image,
      "stages": list(stages), "parameters": n_params, "rounds": args.rounds, "rows": []}
  base = None
  for name, run in runs.items():
    train_ms = statistics.median(run["train_times"]) * 1e3
    alone_ms = statistics.median(run["alone_times"]) * 1e3
    base = base or train_ms
    result["rows"].append({"optimizer": name, "train_ms": train_ms, "alone_ms": alone_ms,
                           "vs_sgd": train_ms / base - 1, "share": alone_ms / train_ms,
                           "compile_s": run["compile_s"]})
  print(format_table(result))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2)
  return result


def format_table(result: dict[str, Any]) -> str:
  net = "ResNet-50" if result["stages"] == [3, 4, 6, 3] else f"ResNet, stages {result['stages']}"
  lines = [
      (f"bf16 {net} train step (Flax linen, {result['parameters']:,} float32 params), "
       f"batch {result['batch']} at {result['image']}x{result['image']}; {result['device']}; "
       f"jax {result['jax']}, optax {result['optax']}; median of {result['rounds']} steps."),
      "",
      ("| optimizer | train step (ms) | vs sgd-momentum | optimizer step alone, one call (ms) "
       "| share of the train step (at most) |"),
      "|---|---:|---:|---:|---:|"]
  for r in result["rows"]:
    lines.append(f"| `{r['optimizer']}` | {r['train_ms']:.2f} | {r['vs_sgd']:+.1%} | "
                 f"{r['alone_ms']:.3f} | {r['share']:.1%} |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
