"""HLO instruction counts of every optimizer's compiled step at its defaults.

One jitted step (``update`` + ``optax.apply_updates``) of each optimizer of
MXNet's registry (``create(name)``), of ``tf_lars`` and of the porting
constructors (at their peers' defaults), on the first 40 leaves
of the ResNet-50 tree, compiled for this machine's backend; prints
``name count`` per line, and with ``--json PATH`` writes them. Run it on two
checkouts to show that a change leaves the compiled steps as they were:

    python benchmarks/hlo_counts.py --json before.json   # on the old checkout
    python benchmarks/hlo_counts.py --json after.json    # on the new one

It finds ``create`` where either layout keeps it (``lars_optax.mxnet.create``
or, before the namespaces, ``lars_optax.create``).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from resnet50_tree import resnet50_params

import lars_optax


def _registry():
  return getattr(lars_optax, "mxnet", lars_optax)


def optimizers() -> dict:
  reg = _registry()
  out = {name: (lambda name=name: reg.create(name)) for name in reg.registered()}
  out["tf_lars"] = lambda: lars_optax.tf_lars(0.1)
  porting = getattr(lars_optax, "porting", None)
  if porting is not None:  # each peer's constructor at the peer's defaults
    out.update({
        "porting.timm_lars": lambda: porting.timm_lars(0.1),
        "porting.timm_lamb": porting.timm_lamb,
        "porting.torch_sparse_adam": porting.torch_sparse_adam,
        "porting.keras_lamb": porting.keras_lamb,
        "porting.optax_lars": lambda: porting.optax_lars(0.1),
        "porting.optax_lamb": lambda: porting.optax_lamb(1e-3),
        "porting.byol_lars": lambda: porting.byol_lars(0.1),
        "porting.simclr_lars": lambda: porting.simclr_lars(0.1),
        "porting.albert_lamb": lambda: porting.albert_lamb(1e-3),
    })
  return out


def hlo_count(tx, params) -> int:
  """The number of instructions in the compiled HLO of one step."""

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  state = tx.init(params)
  text = jax.jit(step).lower(params, state, params).compile().as_text()
  return sum(1 for line in text.splitlines()
             if " = " in line and not line.lstrip().startswith("//"))


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json", help="write {name: count} here")
  parser.add_argument("--leaves", type=int, default=40)
  args = parser.parse_args(argv)
  full = resnet50_params(0, jnp.float32)
  params = dict(sorted(full.items())[:args.leaves])
  counts = {}
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for name, make in sorted(optimizers().items()):
      counts[name] = hlo_count(make(), params)
      print(name, counts[name], flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(counts, f, indent=1, sort_keys=True)
  return counts


if __name__ == "__main__":
  main()
