"""One of two processes that run docs/sparse.md's recipe on a table split across both.

``python two_process_recipe.py PROCESS PORT``: each process has 4 CPU devices and holds
4 of the table's 8 blocks; the recipe is ``sparse_recipe.py``'s (a table beside a tanh
tower, ``sparse.adam`` with warm-up + cosine, ``catch_up(rows=)``, 300 Zipfian steps),
under ``jit`` with automatic axes. It prints, for the blocks and the tower it holds:

* teacher-forced: the largest difference over the 300 steps between one step of the
  split layout, from one device's state at that step, and one device's next step;
* free-running: the largest difference between the split run's params after a full
  ``catch_up`` and dense ``optax.adam`` on one device;

each over the largest move. ``tests/test_distributed.py`` runs two of them.
"""
import sys

import jax

process, port = int(sys.argv[1]), sys.argv[2]
jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process)

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402

import lars_optax  # noqa: E402
import sparse_recipe as recipe  # noqa: E402

mesh = Mesh(np.array(jax.devices()), ("x",))  # both processes' devices


def put(tree):
  """Host arrays, the same in both processes, as global arrays split as ``specs`` says."""
  return jax.tree.map(
      lambda x, spec: jax.make_array_from_callback(
          np.shape(x), NamedSharding(mesh, spec), lambda idx: np.asarray(np.asarray(x)[idx])),
      tree, recipe.specs(tree))


def worst(got, want):
  """The largest difference on the blocks this process holds."""
  return max(float(np.max(np.abs(np.asarray(s.data) - np.asarray(w)[s.index])))
             for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want))
             for s in g.addressable_shards)


params, ids, ys = recipe.data()
trajectory = recipe.one_device()
move = recipe.largest_move(trajectory[-1][0], trajectory[0][0])
step = jax.jit(recipe.train_step())
forced = 0.0
for i in range(recipe.STEPS):
  forced = max(forced, worst(step(*put(trajectory[i]), ids[i], ys[i])[0], trajectory[i + 1][0]))
blocks = step(*put(trajectory[0]), ids[0], ys[0])[0]["table"].addressable_shards
print(f"process {process}: {len(blocks)} local blocks of {blocks[0].data.shape}", flush=True)
print(f"process {process} teacher-forced: max error {forced / move}", flush=True)

p, s = recipe.run(step, put(params), put(recipe.TX.init(params)), ids, ys)
p, _ = jax.jit(lambda p, s: lars_optax.sparse.catch_up(recipe.TX, p, s))(p, s)
want = recipe.dense_adam()
free = worst(p, want) / recipe.largest_move(want, params)
print(f"process {process} free-running: max error {free}", flush=True)
