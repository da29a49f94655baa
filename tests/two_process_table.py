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


def train(tx, params, exact):
  def step(p, s, i, y):
    if exact:
      p, s = lars_optax.sparse.catch_up(tx, p, s, rows={"table": i})
    _, g = grad_fn(p, i, y)
    u, s = tx.update(g, s, p)
    return lars_optax.sparse.apply_updates(p, u), s

  state, f = tx.init(params), jax.jit(step)
  for i, y in zip(ids, ys):
    params, state = f(params, state, i, y)
  if exact:
    params, _ = jax.jit(lambda p, s: lars_optax.sparse.catch_up(tx, p, s))(params, state)
  return params


mesh = Mesh(np.array(jax.devices()), ("rows",))  # both processes' devices
rows = NamedSharding(mesh, P("rows", None))
RUNS = [("lazy_adam", lambda: lars_optax.mxnet.adam(0.01, lazy_update=True), False),
        ("sparse.adam", lambda: lars_optax.sparse.adam(0.01), True)]
for name, make, exact in RUNS:
  local = jax.local_devices()[0]
  one = train(make(), jax.device_put({"table": table, "w": np.ones(16, np.float32)}, local), exact)
  split = {"table": jax.make_array_from_callback(table.shape, rows, lambda idx: table[idx]),
           "w": jax.device_put(np.ones(16, np.float32), NamedSharding(mesh, P()))}
  got = train(make(), split, exact)
  whole = np.asarray(one["table"])
  err = max(float(np.max(np.abs(np.asarray(s.data) - whole[s.index])))
            for s in got["table"].addressable_shards)
  print(f"process {process} {name}: {len(got['table'].addressable_shards)} local blocks "
        f"of {got['table'].addressable_shards[0].data.shape}, max error {err}", flush=True)
