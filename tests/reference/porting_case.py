"""The one random case every peer fixture is made on (NumPy only).

``make_peers.py`` (timm, torch.optim, Keras 3, optax, BYOL) and
``make_peers_tf.py`` (SimCLR, ALBERT) import this module to build the same
params, gradients and learning rates, and ``tests/test_reference_peers.py``
imports it to build them again without any peer installed. Every number comes
from ``numpy.random.RandomState`` with a fixed seed, whose stream NumPy keeps
stable across versions.

The tree has Haiku-style names (``module/leaf``) and covers the cases where
the rules differ: kernels whose trust ratio is clipped by LARC and kernels
whose ratio is not, 1-d leaves (biases and norm parameters, the "no decay"
group of timm, BYOL and SimCLR), a weight whose gradient is zero at every
step (a frozen layer), and two leaves whose weights start at zero (the
ratio's fallback to 1).
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

import numpy as np

SEED = 20261125
STEPS = 12

# name: (shape, weight scale (0: zeros; "ones": 1 + 0.1 N), gradient scale (0: zeros))
LEAVES = {
    "conv/w": ((3, 3, 2, 4), 0.5, 0.05),
    "conv/b": ((4,), 0.1, 0.1),
    "batch_norm/scale": ((4,), "ones", 0.02),
    "batch_norm/offset": ((4,), 0.0, 0.05),
    "linear/w": ((6, 5), 0.3, 0.5),
    "linear/b": ((5,), 0.1, 0.1),
    "frozen/w": ((3, 4), 0.5, 0.0),
    "zero_init/w": ((4, 3), 0.0, 0.2),
}

# Embedding rows for torch.optim.SparseAdam (each step touches a few rows).
EMBED_SHAPE = (10, 3)
EMBED_ROWS = [[1, 4], [4, 7, 8], [0], [2, 4, 9], [7], [1, 3, 5], [8, 9], [4], [0, 6],
              [2, 3], [5, 7, 9], [1]]

# The warm-up schedule of the "warmup" runs, as factors of the base rate:
# optax.warmup_cosine_decay_schedule(0.1 * base, base, warmup_steps=4,
# decay_steps=12, end_value=0.1 * base), called with the count 0, 1, ..., 11.
WARMUP_STEPS = 4


def lr_factors() -> list[float]:
  """The warm-up-then-cosine factors of steps 0..STEPS-1 (float64)."""
  out = []
  for t in range(STEPS):
    if t < WARMUP_STEPS:
      out.append(0.1 + 0.9 * t / WARMUP_STEPS)
    else:
      frac = (t - WARMUP_STEPS) / (STEPS - WARMUP_STEPS)
      out.append(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
  return out


def _rng() -> np.random.RandomState:
  return np.random.RandomState(SEED)


def initial_params() -> dict[str, np.ndarray]:
  """``{name: float32 array}``, in the order of :data:`LEAVES`."""
  rng = _rng()
  out = {}
  for name, (shape, w_scale, _) in LEAVES.items():
    noise = rng.standard_normal(shape)
    if w_scale == "ones":
      out[name] = (1.0 + 0.1 * noise).astype(np.float32)
    else:
      out[name] = (w_scale * noise).astype(np.float32)
  return out


def gradients() -> list[dict[str, np.ndarray]]:
  """One ``{name: float32 array}`` per step."""
  rng = _rng()
  rng.standard_normal(sum(math.prod(shape) for shape, _, _ in LEAVES.values()))  # the params'
  steps = []
  for _ in range(STEPS):
    steps.append({name: (g_scale * rng.standard_normal(shape)).astype(np.float32)
                  for name, (shape, _, g_scale) in LEAVES.items()})
  return steps


def embedding_case() -> tuple[np.ndarray, list[tuple[list[int], np.ndarray]]]:
  """The SparseAdam case: a float32 table and, per step, (rows, their gradient rows)."""
  rng = np.random.RandomState(SEED + 1)
  table = rng.standard_normal(EMBED_SHAPE).astype(np.float32)
  grads = [(rows, rng.standard_normal((len(rows), EMBED_SHAPE[1])).astype(np.float32))
           for rows in EMBED_ROWS]
  return table, grads


def nested(flat: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
  """``{"conv/w": x}`` -> ``{"conv": {"w": x}}`` (Haiku's params layout)."""
  out: dict[str, dict[str, np.ndarray]] = {}
  for name, x in flat.items():
    module, leaf = name.split("/")
    out.setdefault(module, {})[leaf] = x
  return out


def flat(tree: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """The inverse of :func:`nested`, in the order of :data:`LEAVES`."""
  return {name: np.asarray(tree[name.split("/")[0]][name.split("/")[1]]) for name in LEAVES}


def checksum() -> float:
  """A number that changes if the case does (written to the fixtures, checked by the test)."""
  total = sum(float(np.sum(np.abs(x), dtype=np.float64)) for x in initial_params().values())
  for g in gradients():
    total += sum(float(np.sum(np.abs(x), dtype=np.float64)) for x in g.values())
  table, grads = embedding_case()
  total += float(np.sum(np.abs(table), dtype=np.float64))
  total += sum(float(np.sum(np.abs(x), dtype=np.float64)) for _, x in grads)
  return total


def write_fixture(out: str, generator: str, versions: dict[str, str],
                  hyperparameters: dict[str, Any], rows: dict[str, dict[str, Any]]) -> None:
  """Writes a generator's rows (``{key: {"peer": str, "constant"|"warmup": {name: array}}}``)
  as JSON, with the case's checksum and learning-rate factors."""
  data = {"generator": generator, "versions": versions, "checksum": checksum(),
          "lr_factors": lr_factors(), "hyperparameters": hyperparameters,
          "rows": {key: {"peer": row["peer"],
                         **{mode: {n: [float(x) for x in np.ravel(row[mode][n])]
                                   for n in row[mode]} for mode in ("constant", "warmup")}}
                   for key, row in rows.items()}}
  pathlib.Path(out).write_text(json.dumps(data, indent=1) + "\n")
  print(f"wrote {len(rows)} rows to {out}")
