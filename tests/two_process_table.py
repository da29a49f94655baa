"""One of two processes that train a table split by rows across both (jax.distributed).

``python two_process_table.py PROCESS PORT``: each process has 4 CPU devices and
holds 4 of the table's 8 blocks. It trains lazy Adam and ``sparse.adam`` (with
``catch_up(rows=)``) on the split table under ``jit``, and the same on one of its
own devices, and prints each run's largest difference on the rows it holds.
``tests/test_distributed.py`` runs two of them.
"""
import sys

import jax

process, port = int(sys.argv[1]), sys.argv[2]
jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import lars_optax  # noqa: E402

rng = np.random.default_rng(0)  # the same data in both processes
table = rng.normal(size=(1000, 16)).astype(np.float32)
ids = rng.integers(0, 1000, (4, 32, 4)).astype(np.int32)
ys = rng.normal(size=(4, 32)).astype(np.float32)
grad_fn = lars_optax.sparse.value_and_grad(
    lambda p, i, y: jnp.mean((p["table"][i].mean(axis=1) @ p["w"] - y) ** 2), sparse="table")


RUNS = {"lazy_adam": (lars_optax.mxnet.adam(0.01, lazy_update=True), False),
        "sparse.adam": (lars_optax.sparse.adam(0.01), True)}


def train(params):
  """Both optimizers, each on its own copy of ``params``, in one compiled step."""
  def step(p, s, i, y):
    for name, (tx, exact) in RUNS.items():
      if exact:
        p[name], s[name] = lars_optax.sparse.catch_up(tx, p[name], s[name], rows={"table": i})
      _, g = grad_fn(p[name], i, y)
      u, s[name] = tx.update(g, s[name], p[name])
      p[name] = lars_optax.sparse.apply_updates(p[name], u)
    return p, s

  def finish(p, s):  # every row up to date
    return {name: lars_optax.sparse.catch_up(tx, p[name], s[name])[0] if exact else p[name]
            for name, (tx, exact) in RUNS.items()}

  state, f = {name: tx.init(params[name]) for name, (tx, _) in RUNS.items()}, jax.jit(step)
  for i, y in zip(ids, ys):
    params, state = f(params, state, i, y)
  return jax.jit(finish)(params, state)


mesh = Mesh(np.array(jax.devices()), ("rows",))  # both processes' devices
rows = NamedSharding(mesh, P("rows", None))
local = jax.local_devices()[0]
one = train({name: jax.device_put({"table": table, "w": np.ones(16, np.float32)}, local)
             for name in RUNS})
got = train({name: {"table": jax.make_array_from_callback(table.shape, rows,
                                                          lambda idx: table[idx]),
                    "w": jax.device_put(np.ones(16, np.float32), NamedSharding(mesh, P()))}
             for name in RUNS})
for name in RUNS:
  whole = np.asarray(one[name]["table"])
  shards = got[name]["table"].addressable_shards
  err = max(float(np.max(np.abs(np.asarray(s.data) - whole[s.index]))) for s in shards)
  print(f"process {process} {name}: {len(shards)} local blocks of {shards[0].data.shape}, "
        f"max error {err}", flush=True)
