"""What LARS costs on a TPU, from XLA's own cost model, without a TPU.

The steps are compiled ahead of time for a TPU topology (default ``v5e:2x2``)
with ``libtpu``'s compiler, through
``jax.experimental.topologies.get_topology_desc(..., platform="tpu")``. The
compiled HLO carries, for every top-level op (fusion, convolution,
collective, ...), the compiler's ``estimated_cycles``; the script sums them.
Two things are reported, each against an sgd-momentum step:

1. the optimizer step alone (``update`` + ``optax.apply_updates``) on the
   ResNet-50 parameter tree of ``resnet50_tree.py`` (float32, one chip);
2. a whole bf16 ResNet-50 (v1.5, Flax linen) train step, data parallel over
   the topology's chips with a per-chip batch of 128: forward, backward, the
   gradient all-reduce and the optimizer step.

These are cost-model estimates, not measured times: what XLA's TPU compiler
expects its schedule to cost. Nothing runs on a TPU.

    pip install ".[tpu-cost-model]"    # libtpu (a large wheel); not needed otherwise
    python benchmarks/tpu_cost_model.py                       # v5e 2x2
    python benchmarks/tpu_cost_model.py --topology v5e:2x2 --batch 128 --json out.json

Run it without the project installed with ``PYTHONPATH=.`` from the
repository root. Without ``libtpu`` it exits with status 1 and says what to
install.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resnet50_tree import resnet50_shapes

import lars_optax

LR = 0.1
WD = 1e-4
INSTALL = 'pip install ".[tpu-cost-model]"   (or: pip install "jax[tpu]")'
_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')


def optimizers(flax_names: bool) -> dict[str, Callable[[], optax.GradientTransformation]]:
  """name -> factory, sgd-momentum first. Both LARS skip biases and norm params."""
  if flax_names:  # Flax names: Conv_0/kernel, BatchNorm_0/scale, Dense_0/bias
    skip, keep = lars_optax.masks.FLAX_SKIP, ~lars_optax.masks.FLAX_SKIP
    ours = lambda: lars_optax.lars(LR, momentum=0.9, wd=WD, skip="flax")
  else:  # MXNet names (resnet50_tree): ..._gamma, ..._beta, fc_bias
    skip, keep = lars_optax.masks.MXNET_SKIP, ~lars_optax.masks.MXNET_SKIP
    ours = lambda: lars_optax.lars(LR, momentum=0.9, wd=WD)
  del skip
  result = {
      "optax.sgd(momentum=0.9)": lambda: optax.sgd(LR, momentum=0.9),
      "optax.lars": lambda: optax.lars(LR, weight_decay=WD, momentum=0.9,
                                       weight_decay_mask=keep, trust_ratio_mask=keep),
      "lars_optax.lars": ours,
  }
  if not flax_names:  # benchmarks/step_time.py's settings: no weight decay, optax.lars unmasked
    result["optax.lars (no wd, every leaf)"] = lambda: optax.lars(LR, momentum=0.9)
    result["lars_optax.lars (no wd)"] = lambda: lars_optax.lars(LR, momentum=0.9)
  return result


def _progress(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def estimated_cycles(compiled: Any) -> int:
  """The sum of XLA's per-op ``estimated_cycles`` in a compiled TPU executable."""
  text = compiled.as_text()
  found = _CYCLES.findall(text)
  if not found:
    raise RuntimeError("the compiled HLO has no estimated_cycles: is this a TPU executable? "
                       "(the backend_config format may have changed in this libtpu)")
  return sum(int(c) for c in found)


def tpu_devices(topology: str) -> list[Any]:
  """The devices of an ahead-of-time TPU topology, or a clear SystemExit."""
  if importlib.util.find_spec("libtpu") is None:
    raise SystemExit(f"tpu_cost_model: libtpu is not installed, and it is needed to compile "
                     f"for a TPU without one. Install it with: {INSTALL}")
  # Without a TPU VM's metadata, libtpu warns about host names; these quiet it.
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  from jax.experimental import topologies
  try:
    return list(topologies.get_topology_desc(topology, platform="tpu").devices)
  except Exception as e:  # any failure here gets the same advice
    raise SystemExit(f"tpu_cost_model: jax.experimental.topologies.get_topology_desc("
                     f"{topology!r}, platform='tpu') failed: {type(e).__name__}: {e}. "
                     f"libtpu must match jax {jax.__version__}: {INSTALL}") from e


def _abstract(tree: Any, sharding: Any) -> Any:
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree)


def optimizer_step_cycles(devices: Sequence[Any]) -> dict[str, int]:
  """Cycles of ``update`` + ``apply_updates`` on the ResNet-50 tree, one chip."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  rep = NamedSharding(Mesh(list(devices[:1]), ("data",)), PartitionSpec())
  params = {name: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=rep)
            for name, shape in resnet50_shapes().items()}
  result = {}
  for name, factory in optimizers(flax_names=False).items():
    tx = factory()
    state = _abstract(jax.eval_shape(tx.init, params), rep)

    def step(params, state, grads, tx=tx):
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state

    start = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile()
    result[name] = estimated_cycles(compiled)
    _progress(f"optimizer step, {name}: compiled in {time.perf_counter() - start:.0f} s")
  return result


def resnet50(num_classes: int = 1000, stages: Sequence[int] = (3, 4, 6, 3)) -> Any:
  """ResNet-50 v1.5 in Flax linen: bfloat16 compute, float32 params.

  ``stages``: bottleneck blocks per stage (fewer for a quick smoke test).
  """
  import flax.linen as nn

  conv = functools.partial(nn.Conv, use_bias=False, dtype=jnp.bfloat16)
  norm = functools.partial(nn.BatchNorm, momentum=0.9, epsilon=1e-5, dtype=jnp.bfloat16)

  class Bottleneck(nn.Module):
    filters: int
    strides: int

    @nn.compact
    def __call__(self, x, train):
      y = nn.relu(norm(use_running_average=not train)(conv(self.filters, (1, 1))(x)))
      y = conv(self.filters, (3, 3), (self.strides, self.strides))(y)
      y = nn.relu(norm(use_running_average=not train)(y))
      y = norm(use_running_average=not train, scale_init=nn.initializers.zeros)(
          conv(4 * self.filters, (1, 1))(y))
      if x.shape != y.shape:
        x = norm(use_running_average=not train)(
            conv(4 * self.filters, (1, 1), (self.strides, self.strides))(x))
      return nn.relu(x + y)

  class ResNet50(nn.Module):
    @nn.compact
    def __call__(self, x, train=True):
      x = conv(64, (7, 7), (2, 2), padding=[(3, 3), (3, 3)])(x)
      x = nn.relu(norm(use_running_average=not train)(x))
      x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")
      for i, blocks in enumerate(stages):
        for j in range(blocks):
          x = Bottleneck(64 * 2 ** i, 2 if i > 0 and j == 0 else 1)(x, train)
      x = jnp.mean(x, axis=(1, 2))
      return nn.Dense(num_classes, dtype=jnp.bfloat16)(x)

  return ResNet50()


def train_step(model: Any, tx: optax.GradientTransformation) -> Callable[..., tuple]:
  """``(params, batch_stats, state, images, labels) -> (params, batch_stats, state, loss)``:
  forward, backward and the optimizer step of a Flax model with batch norm."""
  def step(params, batch_stats, state, images, labels):
    def loss_fn(params):
      logits, updated = model.apply({"params": params, "batch_stats": batch_stats}, images,
                                    mutable=["batch_stats"])
      loss = optax.softmax_cross_entropy_with_integer_labels(
          logits.astype(jnp.float32), labels).mean()
      return loss, updated["batch_stats"]
    (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), batch_stats, state, loss
  return step


def train_step_cycles(devices: Sequence[Any], per_chip_batch: int) -> dict[str, int]:
  """Cycles of a bf16 ResNet-50 train step, data parallel over ``devices``."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  mesh = Mesh(list(devices), ("data",))
  rep = NamedSharding(mesh, PartitionSpec())
  batch_sh = NamedSharding(mesh, PartitionSpec("data"))
  batch = per_chip_batch * len(devices)
  model = resnet50()
  images = jax.ShapeDtypeStruct((batch, 224, 224, 3), jnp.bfloat16, sharding=batch_sh)
  labels = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=batch_sh)
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0),
                                                jnp.zeros((1, 224, 224, 3), jnp.bfloat16)))
  params = _abstract(variables["params"], rep)
  batch_stats = _abstract(variables["batch_stats"], rep)
  result = {}
  for name, factory in optimizers(flax_names=True).items():
    tx = factory()
    state = _abstract(jax.eval_shape(tx.init, params), rep)

    step = train_step(model, tx)
    start = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=(0, 1, 2)).lower(
        params, batch_stats, state, images, labels).compile()
    result[name] = estimated_cycles(compiled)
    _progress(f"train step, {name}: compiled in {time.perf_counter() - start:.0f} s")
  return result


def format_table(title: str, cycles: dict[str, int]) -> str:
  base = next(iter(cycles.values()))
  rows = [f"| `{name}` | {c:,} | {c / base:.2f}x | {100 * (c / base - 1):+.1f}% |"
          for name, c in cycles.items()]
  return "\n".join([f"{title}\n", "| optimizer | estimated cycles | / sgd-momentum | over sgd |",
                    "|---|---:|---:|---:|", *rows])


def main(argv: Sequence[str] | None = None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--topology", default="v5e:2x2", help="TPU topology (default: %(default)s)")
  ap.add_argument("--batch", type=int, default=128, help="per-chip batch (default: %(default)s)")
  ap.add_argument("--chips", type=int, default=None,
                  help="data-parallel chips for the train step (default: all of the topology)")
  ap.add_argument("--skip-train-step", action="store_true",
                  help="only the optimizer step (each train step compiles for minutes)")
  ap.add_argument("--json", help="also write the figures to this JSON file")
  args = ap.parse_args(argv)
  devices = tpu_devices(args.topology)
  kind = getattr(devices[0], "device_kind", "TPU")
  print(f"{kind}, topology {args.topology} ({len(devices)} chips); jax {jax.__version__}, "
        f"optax {optax.__version__}; XLA's estimated cycles (a cost model, not a measurement)\n")
  result: dict[str, Any] = {"topology": args.topology, "jax": jax.__version__,
                            "optax": optax.__version__, "per_chip_batch": args.batch}
  result["optimizer_step"] = optimizer_step_cycles(devices)
  print(format_table("Optimizer step alone (ResNet-50 tree, float32, one chip):",
                     result["optimizer_step"]))
  if not args.skip_train_step:
    chips = devices[:args.chips] if args.chips else devices
    result["train_step_chips"] = len(chips)
    result["train_step"] = train_step_cycles(chips, args.batch)
    print()
    print(format_table(f"bf16 ResNet-50 train step, per-chip batch {args.batch}, "
                       f"data parallel over {len(chips)} chip(s):", result["train_step"]))
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1)
  return result


if __name__ == "__main__":
  main()
