"""Stacked against unrolled layers: the layer-wise optimizers' step and compile time.

A transformer-like parameter tree of ``--blocks`` blocks (attention qkv/out,
MLP in/out, two layer norms: 12 leaves a block, plus an embedding and a final
norm) is built twice: *unrolled*, one leaf per block and parameter
(``block_7/mlp/in/kernel``), and *stacked*, one leaf per parameter with a
leading layer axis (``blocks/mlp/in/kernel`` of shape ``(L, D, 4D)``), as
``nn.scan`` and friends keep it. For ``lars``, ``lamb`` and ``lans`` it
measures, in one run, with the rounds of all variants interleaved:

* the step (``update`` + ``apply_updates``, jitted, donated buffers; several
  steps per call in a ``fori_loop``, so the host's per-call dispatch of the
  unrolled tree's many buffers is left out) of the unrolled tree, of the
  stacked tree with ``stacked=`` (one norm per layer, equal to the unrolled
  model), and of the stacked tree with ``stacked=None`` (one norm per stack,
  the old behaviour: the cost the per-layer norms are compared with);
* the compile time of the unrolled and of the stacked step.

It prints a markdown table of medians and ratios. ``--tpu TOPOLOGY`` instead
compiles the same steps for a TPU (``jax.experimental.topologies``, needs
``libtpu``: ``pip install ".[tpu-cost-model]"`` in a separate venv) and
reports XLA's own ``estimated_cycles`` (cost-model estimates, nothing runs).

    python benchmarks/stacked_layers.py                    # CPU, 24 blocks, D=256
    python benchmarks/stacked_layers.py --tpu v5e:2x2      # TPU cost model
    python benchmarks/stacked_layers.py --quick            # a smoke run (tests)
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
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lars_optax

STACK = lars_optax.by_regex(r"^blocks/")

OPTIMIZERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "lars": lambda **kw: lars_optax.lars(0.1, momentum=0.9, wd=1e-4, skip="flax", **kw),
    "lamb": lambda **kw: lars_optax.lamb(1e-3, wd=0.01, skip="flax", **kw),
    "lans": lambda **kw: lars_optax.lans(1e-3, wd=0.01, skip="flax", **kw),
}


def block_shapes(d: int) -> dict[str, tuple[int, ...]]:
  """One transformer block's parameters (Flax-style names)."""
  return {"attn/qkv/kernel": (d, 3 * d), "attn/qkv/bias": (3 * d,),
          "attn/out/kernel": (d, d), "attn/out/bias": (d,),
          "mlp/in/kernel": (d, 4 * d), "mlp/in/bias": (4 * d,),
          "mlp/out/kernel": (4 * d, d), "mlp/out/bias": (d,),
          "ln1/scale": (d,), "ln1/bias": (d,), "ln2/scale": (d,), "ln2/bias": (d,)}


def trees(blocks: int, d: int, vocab: int, dtype: Any = jnp.float32) -> tuple[dict, dict]:
  """The unrolled and the stacked trees (flat dicts of ShapeDtypeStructs)."""
  rest = {"embed/embedding": (vocab, d), "final_ln/scale": (d,), "final_ln/bias": (d,)}
  unrolled = {f"block_{i}/{n}": s for i in range(blocks) for n, s in block_shapes(d).items()}
  stacked = {f"blocks/{n}": (blocks, *s) for n, s in block_shapes(d).items()}
  make = lambda shapes: {n: jax.ShapeDtypeStruct(s, dtype) for n, s in {**shapes, **rest}.items()}
  return make(unrolled), make(stacked)


def variants(only: Sequence[str] = tuple(OPTIMIZERS)) -> list[tuple[str, str, str, dict]]:
  """(optimizer, variant, tree, kwargs) for every measured step."""
  out = []
  for name in only:
    out += [(name, "unrolled", "unrolled", {}),
            (name, "stacked", "stacked", {"stacked": STACK}),
            (name, "one norm per stack", "stacked", {"stacked": None})]
  return out


def make_step(tx: optax.GradientTransformation, steps: int) -> Callable:
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  def loop(params, state, grads):
    return jax.lax.fori_loop(0, steps, lambda _, ps: step(*ps, grads), (params, state))

  return jax.jit(loop, donate_argnums=(0, 1))


def _concrete(abstract: dict, seed: int) -> dict:
  # Drawn by NumPy: jax.random would compile a program per shape, again after every
  # jax.clear_caches() below.
  rng = np.random.default_rng(seed)
  return {n: jnp.asarray(0.02 * rng.standard_normal(a.shape), a.dtype)
          for n, a in sorted(abstract.items())}


def measure_cpu(blocks: int, d: int, vocab: int, rounds: int, steps: int,
                compiles: int, only: Sequence[str]) -> dict:
  abstract = dict(zip(("unrolled", "stacked"), trees(blocks, d, vocab)))
  runs = []
  for name, variant, tree, kw in variants(only):
    tx = OPTIMIZERS[name](**kw)
    params, grads = _concrete(abstract[tree], 0), _concrete(abstract[tree], 1)
    compile_s = []
    for _ in range(compiles):
      jax.clear_caches()
      fn = make_step(tx, steps)
      t0 = time.perf_counter()
      compiled = fn.lower(params, jax.eval_shape(tx.init, params), grads).compile()
      compile_s.append(time.perf_counter() - t0)
    state = tx.init(params)
    params, state = compiled(params, state, grads)  # warm-up
    runs.append({"optimizer": name, "variant": variant, "fn": compiled, "args": [params, state],
                 "grads": grads, "times": [], "compile_s": statistics.median(compile_s)})
  for _ in range(rounds):  # interleaved: every variant once per round
    for run in runs:
      t0 = time.perf_counter()
      run["args"] = list(run["fn"](*run["args"], run["grads"]))
      jax.block_until_ready(run["args"])
      run["times"].append((time.perf_counter() - t0) / steps)
  rows = [{"optimizer": r["optimizer"], "variant": r["variant"],
           "step_ms": statistics.median(r["times"]) * 1e3, "compile_s": r["compile_s"]}
          for r in runs]
  return {"device": jax.devices()[0].device_kind, "blocks": blocks, "dim": d,
          "leaves": {t: len(a) for t, a in abstract.items()}, "rounds": rounds,
          "steps_per_call": steps, "jax": jax.__version__, "rows": rows}


def measure_tpu(topology: str, blocks: int, d: int, vocab: int, only: Sequence[str]) -> dict:
  from jax.sharding import Mesh, NamedSharding, PartitionSpec
  from tpu_cost_model import estimated_cycles, tpu_devices

  devices = tpu_devices(topology)
  rep = NamedSharding(Mesh(devices[:1], ("data",)), PartitionSpec())
  abstract = {t: {n: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep) for n, a in tr.items()}
              for t, tr in zip(("unrolled", "stacked"), trees(blocks, d, vocab))}
  rows = []
  for name, variant, tree, kw in variants(only):
    tx = OPTIMIZERS[name](**kw)
    params = abstract[tree]
    state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep),
                         jax.eval_shape(tx.init, params))
    t0 = time.perf_counter()
    compiled = make_step(tx, 1).lower(params, state, params).compile()
    rows.append({"optimizer": name, "variant": variant, "cycles": estimated_cycles(compiled),
                 "compile_s": time.perf_counter() - t0})
    print(f"{name} {variant}: compiled in {rows[-1]['compile_s']:.1f} s", file=sys.stderr)
  return {"device": f"TPU {topology} (one chip, cost model)", "blocks": blocks, "dim": d,
          "jax": jax.__version__, "rows": rows}


def format_table(result: dict) -> str:
  key = "cycles" if "cycles" in result["rows"][0] else "step_ms"
  by = {(r["optimizer"], r["variant"]): r for r in result["rows"]}
  head = (f"{result['blocks']} blocks, D={result['dim']}; {result['device']}; jax "
          f"{result['jax']}")
  if key == "step_ms":
    head += (f"; median of {result['rounds']} interleaved calls of "
             f"{result['steps_per_call']} steps, per step")
  unit = "estimated cycles" if key == "cycles" else "step (ms)"
  lines = [head, "",
           (f"| optimizer | unrolled {unit} | stacked {unit} | stacked / unrolled "
           f"| one norm per stack | per-layer / one norm | compile unrolled (s) "
           f"| compile stacked (s) | compile unrolled / stacked |"),
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  fmt = (lambda x: f"{x:,}") if key == "cycles" else (lambda x: f"{x:.3f}")
  for name in dict.fromkeys(r["optimizer"] for r in result["rows"]):
    u, s, o = (by[(name, v)] for v in ("unrolled", "stacked", "one norm per stack"))
    lines.append(f"| `{name}` | {fmt(u[key])} | {fmt(s[key])} | {s[key] / u[key]:.2f} | "
                 f"{fmt(o[key])} | {s[key] / o[key]:.2f} | {u['compile_s']:.2f} | "
                 f"{s['compile_s']:.2f} | {u['compile_s'] / s['compile_s']:.1f} |")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--blocks", type=int, default=24)
  ap.add_argument("--dim", type=int, default=256)
  ap.add_argument("--vocab", type=int, default=8192)
  ap.add_argument("--rounds", type=int, default=20, help="timed calls per variant")
  ap.add_argument("--steps-per-call", type=int, default=5)
  ap.add_argument("--compiles", type=int, default=3, help="compiles per variant (median)")
  ap.add_argument("--tpu", metavar="TOPOLOGY", help="TPU cost model for this topology")
  ap.add_argument("--only", nargs="*", choices=list(OPTIMIZERS), default=list(OPTIMIZERS))
  ap.add_argument("--quick", action="store_true", help="a small smoke run")
  ap.add_argument("--json", help="also write the figures to this JSON file")
  args = ap.parse_args(argv)
  if args.quick:
    args.blocks, args.dim, args.vocab, args.rounds, args.compiles = 3, 16, 32, 2, 1
    args.steps_per_call, args.only = 1, ["lars"]
  if args.tpu:
    result = measure_tpu(args.tpu, args.blocks, args.dim, args.vocab, args.only)
  else:
    result = measure_cpu(args.blocks, args.dim, args.vocab, args.rounds,
                         args.steps_per_call, args.compiles, args.only)
  print(format_table(result))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=1)
  return result


if __name__ == "__main__":
  main()
