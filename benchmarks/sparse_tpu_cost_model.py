"""What a lazy Adam step on an embedding table costs on a TPU, from XLA's cost model.

Compiled ahead of time for a TPU topology (default ``v5e:2x2``, one chip used)
with ``libtpu``, as in ``tpu_cost_model.py``; the compiled HLO's
``estimated_cycles`` are summed and the compiled temporary memory is read.
For a ``rows x width`` float32 table and a gradient in ``touched`` rows
(params and state donated):

* a bare ``table.at[rows].add(values)`` (the floor for any row update);
* ``lars_optax.mxnet.adam(lazy_update=True)`` + ``optax.apply_updates`` on a
  :class:`lars_optax.sparse.RowSparseUpdate` gradient and on a plain BCOO one (its
  update is a plain BCOO, which XLA folds into the same scatter);
* ``lars_optax.sparse.dense_updates`` of it, applied over the updates as
  ``eqx.apply_updates`` applies them.

These are cost-model estimates, not measured times. Nothing runs on a TPU.

    pip install ".[tpu-cost-model]"
    python benchmarks/sparse_tpu_cost_model.py --widths 64 128
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.experimental.sparse import BCOO

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpu_cost_model import estimated_cycles, tpu_devices

import lars_optax


def variants() -> dict[str, tuple[str, Callable[[], Any], bool]]:
  """name -> (gradient kind, optimizer factory, apply over the updates)."""
  lazy = lambda: lars_optax.mxnet.adam(1e-3, lazy_update=True)
  return {
      "adam(lazy_update=True), RowSparseUpdate gradient": ("row_sparse", lazy, False),
      "adam(lazy_update=True), plain BCOO gradient": ("bcoo", lazy, False),
      "dense_updates(adam(lazy_update=True)), applied as eqx.apply_updates does":
          ("bcoo", lambda: lars_optax.sparse.dense_updates(lazy()), True),
  }


def step_costs(devices: Sequence[Any], rows: int, width: int, touched: int) -> dict[str, tuple]:
  """name -> (estimated cycles, temporary bytes) of each variant's compiled step."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  rep = NamedSharding(Mesh(list(devices[:1]), ("data",)), PartitionSpec())

  def spec(tree):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), tree)

  table = jax.ShapeDtypeStruct((rows, width), jnp.float32, sharding=rep)
  idx = jax.ShapeDtypeStruct((touched,), jnp.int32, sharding=rep)
  vals = jax.ShapeDtypeStruct((touched, width), jnp.float32, sharding=rep)

  def cost(compiled):
    return estimated_cycles(compiled), int(compiled.memory_analysis().temp_size_in_bytes)

  out = {"table.at[rows].add(values)": cost(jax.jit(
      lambda t, i, v: t.at[i].add(v, mode="drop"), donate_argnums=0).lower(
          table, idx, vals).compile())}
  for name, (kind, factory, updates_first) in variants().items():
    tx = factory()
    params = {"table": table}

    def grads(kind=kind):
      values, rows_ = jnp.zeros((touched, width)), jnp.zeros((touched, 1), jnp.int32)
      cls = lars_optax.sparse.RowSparseUpdate if kind == "row_sparse" else BCOO
      return {"table": cls((values, rows_), shape=(rows, width), unique_indices=True)}

    def step(params, state, grads, tx=tx, updates_first=updates_first):
      updates, state = tx.update(grads, state, params)
      if updates_first:
        return jax.tree.map(lambda u, p: p + u, updates, params), state
      return optax.apply_updates(params, updates), state

    state = spec(jax.eval_shape(tx.init, params))
    out[name] = cost(jax.jit(step, donate_argnums=(0, 1)).lower(
        params, state, spec(jax.eval_shape(grads))).compile())
  return out


def main(argv: Sequence[str] | None = None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--topology", default="v5e:2x2", help="TPU topology (default: %(default)s)")
  ap.add_argument("--rows", type=int, default=1_000_000)
  ap.add_argument("--widths", type=int, nargs="+", default=[64, 128])
  ap.add_argument("--touched", type=int, default=1024)
  args = ap.parse_args(argv)
  devices = tpu_devices(args.topology)
  print(f"{getattr(devices[0], 'device_kind', 'TPU')}, topology {args.topology}, one chip; "
        f"jax {jax.__version__}; XLA's estimated cycles (a cost model, not a measurement)\n")
  result = {}
  for width in args.widths:
    costs = step_costs(devices, args.rows, width, args.touched)
    result[width] = costs
    print(f"{args.rows:,} x {width} float32 table, gradient in {args.touched:,} rows:\n")
    print("| step | estimated cycles | temporary memory |\n|---|---:|---:|")
    for name, (cycles, temp) in costs.items():
      print(f"| `{name}` | {cycles:,} | {temp / 1e6:,.1f} MB |")
    print()
  return result


if __name__ == "__main__":
  main()
