"""The dense-exact optimizers' envelope: sparse.sgd and sparse.adam against float64.

Five rows of a (5, 4) table are touched every 1, 7, 600, 3,001 and 10,000 steps
of a 10,050-step run, so that the longest gap is 10,000 steps. Each cell (a
momentum or a (b1, b2) pair, a gradient size, a schedule) trains
``lars_optax.sparse.sgd`` or ``sparse.adam``, brings every row up to date with
``sparse.catch_up``, and compares the table with the same run in float64
(NumPy, with the float32 values of the hyperparameters), beside float32
``optax.sgd``/``optax.adam``'s own error against that run. Errors are over the
largest move in the table. A cell is met when the error is at most 1e-5 or 3x
optax's own, whichever is larger (the bound of docs/sparse.md's envelope).

    python benchmarks/sparse_envelope.py            # every cell, as docs/sparse.md tables
    python benchmarks/sparse_envelope.py --quick    # a few cells

All the cells of one optimizer run in one compiled program (``lax.scan`` over the
steps). ``tests/test_sparse_exact.py`` runs the cells at the envelope's edges.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental.sparse import BCOO

import lars_optax

GAPS = np.array([1, 7, 600, 3001, 10_000], np.int32)  # row r is touched every GAPS[r] steps
STEPS = 10_050
EPS = 1e-8


def schedules(peak: float) -> dict[str, Any]:
  return {
      "constant": peak,
      "warm-up + cosine": optax.warmup_cosine_decay_schedule(0.0, peak, 500, STEPS),
      "step decay": lambda count: peak * 0.5 ** (count // 2000),
  }


class Cell(NamedTuple):
  """One configuration: ``rule`` is "sgd" (``a`` the momentum, ``b`` Nesterov) or
  "adam" (``a``, ``b`` the betas); ``scale`` the gradients' size; ``schedule`` a name."""

  rule: str
  a: float
  b: Any
  scale: float
  schedule: str

  def label(self) -> str:
    if self.rule == "sgd":
      return f"sgd mu={self.a} {'nesterov' if self.b else 'plain'} {self.schedule}"
    return f"adam b1={self.a} b2={self.b} g/eps={self.scale / EPS:g} {self.schedule}"


def _lr(cell: Cell) -> Any:
  return schedules(0.1 if cell.rule == "sgd" else 1e-3)[cell.schedule]


def _makers(cell: Cell) -> tuple[Callable[[], Any], Callable[[], Any]]:
  lr = _lr(cell)
  if cell.rule == "sgd":
    return (lambda: lars_optax.sparse.sgd(lr, momentum=cell.a, nesterov=cell.b),
            lambda: optax.sgd(lr, momentum=cell.a, nesterov=cell.b))
  return (lambda: lars_optax.sparse.adam(lr, b1=cell.a, b2=cell.b, eps=EPS),
          lambda: optax.adam(lr, b1=cell.a, b2=cell.b, eps=EPS))


def _grads_at(t: jax.Array, scale: float) -> tuple[jax.Array, jax.Array, jax.Array]:
  rows = jnp.arange(len(GAPS))
  touched = (t % GAPS) == 0
  values = jnp.sin(0.37 * t.astype(jnp.float32) + rows[:, None] + jnp.arange(4)[None]) * scale
  return jnp.where(touched, rows, len(GAPS)), values, touched


def _run(tx: optax.GradientTransformation, sparse: bool, scale: float) -> tuple[Any, Any]:
  params = {"t": jnp.ones((len(GAPS), 4))}

  def body(carry, t):
    params, state = carry
    ids, values, touched = _grads_at(t, scale)
    g = (BCOO((values, ids[:, None]), shape=params["t"].shape) if sparse
         else jnp.where(touched[:, None], values, 0.0))
    updates, state = tx.update({"t": g}, state, params)
    return (optax.apply_updates(params, updates), state), None

  (params, state), _ = jax.lax.scan(body, (params, tx.init(params)), jnp.arange(STEPS))
  return params, state


def run_cells(cells: Sequence[Cell]) -> list[tuple[np.ndarray, np.ndarray]]:
  """Per cell: the table after sparse.* + catch_up, and after float32 optax (one program)."""
  @jax.jit
  def run():
    out = []
    for cell in cells:
      make, make_optax = _makers(cell)
      tx = make()
      params, state = _run(tx, True, cell.scale)
      params, _ = lars_optax.sparse.catch_up(tx, params, state)
      want, _ = _run(make_optax(), False, cell.scale)
      out.append((params["t"], want["t"]))
    return out
  return [(np.asarray(a), np.asarray(b)) for a, b in run()]


def float64_run(cell: Cell) -> np.ndarray:
  """The cell's dense run in float64 (the hyperparameters' float32 values)."""
  lr = _lr(cell)
  rates = np.asarray(jax.vmap(lambda c: jnp.asarray(lr(c) if callable(lr) else lr,
                                                    jnp.float32))(jnp.arange(STEPS)), np.float64)
  _, values, touched = jax.vmap(lambda t: _grads_at(t, cell.scale))(
      jnp.arange(STEPS, dtype=jnp.int32))
  grads = np.where(np.asarray(touched)[..., None], np.asarray(values, np.float64), 0.0)
  w = np.ones(grads.shape[1:])
  if cell.rule == "sgd":
    mu = float(np.float32(cell.a))
    b = np.zeros_like(w)
    for t in range(STEPS):
      b = mu * b + grads[t]
      w = w - rates[t] * (grads[t] + mu * b if cell.b else b)
    return w
  b1, b2, eps = (float(np.float32(x)) for x in (cell.a, cell.b, EPS))
  m, v = np.zeros_like(w), np.zeros_like(w)
  for t in range(STEPS):
    m = b1 * m + (1 - b1) * grads[t]
    v = b2 * v + (1 - b2) * grads[t] ** 2
    w = w - rates[t] * (m / (1 - b1 ** (t + 1))) / (np.sqrt(v / (1 - b2 ** (t + 1))) + eps)
  return w


def errors(cells: Sequence[Cell]) -> list[tuple[float, float]]:
  """Per cell: (sparse.* error, float32 optax's error), against float64, over the largest
  move in the table."""
  out = []
  for cell, (got, optax32) in zip(cells, run_cells(cells)):
    want = float64_run(cell)
    moved = np.abs(want - 1.0).max()
    out.append((float(np.abs(got - want).max() / moved),
                float(np.abs(optax32 - want).max() / moved)))
  return out


def met(err: float, own: float) -> bool:
  return err <= max(1e-5, 3 * own)


SGD_CELLS = [Cell("sgd", mu, nesterov, 0.1, name) for mu in (0.9, 0.99, 0.999)
             for nesterov in (False, True) for name in schedules(0.1)]
ADAM_CELLS = [Cell("adam", b1, b2, g * EPS, name) for b1 in (0.9, 0.99)
              for b2 in (0.999, 0.9999, 0.999999) for g in (1e-2, 1.0, 1e2, 1e4)
              for name in schedules(1e-3)]


def refused(b1: float, b2: float) -> str | None:
  """Why ``sparse.adam(b1=b1, b2=b2)`` is refused when built, or None."""
  try:
    lars_optax.sparse.adam(1e-3, b1=b1, b2=b2)
  except ValueError as e:
    return str(e).split("b1: ", 1)[1].split(". Use")[0]
  return None


def main(argv: list[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="a few cells (a smoke run)")
  args = parser.parse_args(argv)
  sgd = SGD_CELLS[:2] if args.quick else SGD_CELLS
  adam = ADAM_CELLS[:2] if args.quick else ADAM_CELLS
  gaps = ", ".join(f"{g:,}" for g in GAPS)
  lines = [(f"{STEPS:,} steps, rows touched every {gaps} steps; JAX {jax.__version__} on "
            f"{jax.default_backend()}. Errors against float64 over the largest move; met: "
            "<= max(1e-5, 3x float32 optax's own)."), ""]
  for title, cells in (("SGD", sgd), ("Adam", adam)):
    lines += [f"{title}:", "", "| cell | sparse | float32 optax | |", "|---|---:|---:|---|"]
    for cell, (err, own) in zip(cells, errors(cells)):
      lines.append(f"| {cell.label()} | {err:.1e} | {own:.1e} | "
                   f"{'met' if met(err, own) else 'MISSED'} |")
    lines.append("")
  lines += ["Refused when built (Adam, b1 = 0.999):", ""]
  for b2 in (0.999, 0.9999, 0.999999):
    lines.append(f"- b2={b2}: {refused(0.999, b2)}")
  report = "\n".join(lines)
  print(report)
  return report


if __name__ == "__main__":
  main()
