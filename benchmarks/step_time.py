"""Times one optimizer step on a ResNet-50-shaped parameter tree.

One jit-compiled step = ``opt.update`` + ``optax.apply_updates`` with params and
optimizer state donated. All optimizers run in the same process, interleaved
round by round (so a noisy neighbour hits them all alike); the table gives the
median step time, its ratio to ``optax.sgd(momentum=0.9)`` measured in the same
run, its ratio to the optax peer (``PEERS``: ``optax.lars`` for LARS rows,
``optax.adam`` for Adam rows, ...), and the median compile time and its ratio.

    python benchmarks/step_time.py            # markdown table on stdout
    python benchmarks/step_time.py --rounds 50 --json out.json

Only ratios are meaningful on a shared CPU; absolute times only on a GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from resnet50_tree import resnet50_params

import lars_optax

LR = 0.1


# lars_optax function -> the optax optimizer it is compared with (a row of optimizers()).
PEERS = {"lars": "optax.lars", "tf_lars": "optax.lars", "adam": "optax.adam",
         "adamw": "optax.adamw", "adamax": "optax.adamax", "nadam": "optax.nadam",
         "adabelief": "optax.adabelief"}


def optimizers() -> dict[str, Callable[[], optax.GradientTransformation]]:
  """name -> factory, the baseline first."""
  return {
      "optax.sgd(momentum=0.9)": lambda: optax.sgd(LR, momentum=0.9),
      "optax.lars": lambda: optax.lars(LR),
      "lars_optax.lars(momentum=0.9)": lambda: lars_optax.lars(LR, momentum=0.9),
      "lars_optax.lars(momentum=0.9, wd, rescale_grad, clip_gradient)":
          lambda: lars_optax.lars(LR, momentum=0.9, wd=1e-4, rescale_grad=1 / 256,
                                  clip_gradient=1.0),
      "lars_optax.tf_lars": lambda: lars_optax.tf_lars(LR),
      "lars_optax.tf_lars(use_nesterov, skip_list)":
          lambda: lars_optax.tf_lars(LR, use_nesterov=True, skip_list=["bias", "_bn_"]),
      "lars_optax.signum": lambda: lars_optax.signum(LR),
      "lars_optax.signum(wd, wd_lh, rescale_grad, clip_gradient)":
          lambda: lars_optax.signum(LR, wd=1e-4, wd_lh=1e-4, rescale_grad=1 / 256,
                                    clip_gradient=1.0),
      "optax.adam": lambda: optax.adam(1e-3),
      "lars_optax.adam": lambda: lars_optax.adam(1e-3),
      "lars_optax.adam(wd, rescale_grad, clip_gradient)":
          lambda: lars_optax.adam(1e-3, wd=1e-4, rescale_grad=1 / 256, clip_gradient=1.0),
      "lars_optax.adam(lazy_update=True)": lambda: lars_optax.adam(1e-3, lazy_update=True),
      "optax.adamw": lambda: optax.adamw(1e-3, weight_decay=1e-2),
      "lars_optax.adamw(wd)": lambda: lars_optax.adamw(1e-3, wd=1e-2),
      "optax.adamax": lambda: optax.adamax(2e-3),
      "lars_optax.adamax": lambda: lars_optax.adamax(2e-3),
      "optax.nadam": lambda: optax.nadam(1e-3),
      "lars_optax.nadam": lambda: lars_optax.nadam(1e-3),
      "optax.adabelief": lambda: optax.adabelief(1e-3),
      "lars_optax.adabelief": lambda: lars_optax.adabelief(1e-3),
      "lars_optax.ftml": lambda: lars_optax.ftml(2.5e-3),
  }


def make_step(opt: optax.GradientTransformation):
  def step(params, state, grads):
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state
  return jax.jit(step, donate_argnums=(0, 1))


def compile_time(factory, params, grads, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    jax.clear_caches()
    opt = factory()
    state = jax.eval_shape(opt.init, params)
    t0 = time.perf_counter()
    make_step(opt).lower(params, state, grads).compile()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def format_table(result: dict) -> str:
  """The results as a markdown table (ratios against the same run's peers)."""
  by_name = {r["optimizer"]: r for r in result["rows"]}
  lines = [
      (f"ResNet-50 tree: {result['leaves']} leaves, {result['parameters']:,} float32 "
       f"parameters; {result['device']}; jax {result['jax']}, optax {result['optax']}; "
       f"median of {result['rounds']} steps."), "",
      ("| optimizer | step (ms) | step / sgd-momentum | step / peer "
       "| compile (s) | compile / sgd-momentum |"),
      "|---|---:|---:|---:|---:|---:|"]
  for r in result["rows"]:
    short = r["optimizer"].split("(")[0].rsplit(".", 1)[-1]
    peer = by_name.get(PEERS.get(short, ""), {}).get("step_ms")
    vs_peer = f"{r['step_ms'] / peer:.2f}" if peer else "-"
    lines.append(f"| `{r['optimizer']}` | {r['step_ms']:.2f} | {r['step_ratio']:.2f} | "
                 f"{vs_peer} | {r['compile_s']:.2f} | {r['compile_ratio']:.2f} |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rounds", type=int, default=30, help="timed steps per optimizer")
  ap.add_argument("--compiles", type=int, default=3, help="compiles per optimizer")
  ap.add_argument("--only", nargs="*", help="substrings selecting optimizers")
  ap.add_argument("--json", help="also write the results here")
  args = ap.parse_args(argv)

  params = resnet50_params()
  grads = jax.tree.map(lambda p: 0.3 * p + 0.01, params)
  n_leaves = len(jax.tree.leaves(params))
  n_params = sum(p.size for p in jax.tree.leaves(params))
  facs = optimizers()
  if args.only:
    base = next(iter(facs))
    facs = {k: f for k, f in facs.items()
            if k == base or any(s in k for s in args.only)}

  runs = {}
  for name, fac in facs.items():
    opt = fac()
    p = jax.tree.map(jnp.copy, params)
    s = opt.init(p)
    compiled = make_step(opt).lower(p, s, grads).compile()
    p, s = compiled(p, s, grads)  # warm-up
    jax.block_until_ready((p, s))
    runs[name] = {"fn": compiled, "p": p, "s": s, "times": []}
  for _ in range(args.rounds):
    for run in runs.values():
      t0 = time.perf_counter()
      p, s = run["fn"](run["p"], run["s"], grads)
      jax.block_until_ready((p, s))
      run["times"].append(time.perf_counter() - t0)
      run["p"], run["s"] = p, s
  for run in runs.values():
    del run["p"], run["s"], run["fn"]
  gc.collect()
  ctimes = {name: compile_time(fac, params, grads, args.compiles)
            for name, fac in facs.items()}

  base = next(iter(runs))
  b_step = statistics.median(runs[base]["times"])
  b_comp = ctimes[base]
  device = jax.devices()[0]
  result = {
      "device": f"{device.platform}: {device.device_kind}",
      "cpu_count": jax.local_device_count() if device.platform != "cpu" else None,
      "jax": jax.__version__, "optax": optax.__version__,
      "python": platform.python_version(),
      "leaves": n_leaves, "parameters": n_params, "rounds": args.rounds,
      "rows": [],
  }
  for name, run in runs.items():
    step = statistics.median(run["times"])
    result["rows"].append({
        "optimizer": name, "step_ms": step * 1e3, "step_ratio": step / b_step,
        "compile_s": ctimes[name], "compile_ratio": ctimes[name] / b_comp})

  print(format_table(result))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2)
  return result


if __name__ == "__main__":
  main()
