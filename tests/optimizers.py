"""One table of every public optimizer: a small canonical configuration each, and what
it can do. Tests draw their optimizers from here (``tests/test_optimizer_table.py``
checks that it lists every public one).

``make(**kw)`` builds the optimizer with the table's configuration and ``kw`` on top;
:func:`canonical_params` is the one tree every row steps on, and :func:`step` the row's
jitted step on it, compiled once per worker for every file that takes one.
Capability flags:

* ``complex``: takes complex params (with optax's numbers; test_dtypes.py);
* ``stacked``, ``group_by_shape``: takes that keyword (read from the signature);
* ``lazy``: has a lazy step of its origin, where the rows absent from a gradient keep
  their params and state (``lazy_update=True``, or it is one: torch's SparseAdam); the
  dense-exact ``sparse`` optimizers are not lazy (their rows catch up);
* ``row_sparse``: takes row-sparse gradients (a ``BCOO`` or ``RowSparseUpdate``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax

mx, sparse, porting = lars_optax.mxnet, lars_optax.sparse, lars_optax.porting


@dataclasses.dataclass(frozen=True)
class Optimizer:
  name: str  # as the user calls it, from its namespace
  fn: Callable[..., Any]
  args: tuple = ()
  kwargs: dict = dataclasses.field(default_factory=dict)
  complex: bool = False
  lazy: bool = False
  row_sparse: bool = False

  def make(self, **kw: Any) -> Any:
    return self.fn(*self.args, **{**self.kwargs, **kw})

  @property
  def stacked(self) -> bool:
    return "stacked" in inspect.signature(self.fn).parameters

  @property
  def group_by_shape(self) -> bool:
    return "group_by_shape" in inspect.signature(self.fn).parameters

  @property
  def first(self) -> str:
    """The first parameter's name (the learning rate, or timm's ``opt``)."""
    return next(iter(inspect.signature(self.fn).parameters))


def _o(name: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Optimizer:
  flags = {k: kw.pop(k) for k in ("complex", "lazy", "row_sparse") if k in kw}
  return Optimizer(name, fn, args, kw, **flags)


TABLE = [
    _o("lars", lars_optax.lars, 0.1, momentum=0.9, wd=1e-3),
    _o("tf_lars", lars_optax.tf_lars, 0.1, momentum=0.9, weight_decay=1e-3),
    _o("lamb", lars_optax.lamb, 0.01, wd=1e-2, complex=True),
    _o("lans", lars_optax.lans, 0.01, wd=1e-2),
    _o("signum", lars_optax.signum, 0.01, momentum=0.9, wd=1e-3),
    _o("signsgd", lars_optax.signsgd, 0.01, wd=1e-3),
    _o("mxnet.adam", mx.adam, 0.01, wd=1e-3, complex=True, lazy=True, row_sparse=True),
    _o("mxnet.sgd", mx.sgd, 0.1, momentum=0.9, wd=1e-3, complex=True, lazy=True,
       row_sparse=True),
    _o("mxnet.nag", mx.nag, 0.1, momentum=0.9, complex=True),
    _o("mxnet.adamw", mx.adamw, 0.01, wd=1e-2),
    _o("mxnet.adamax", mx.adamax, 0.01),
    _o("mxnet.nadam", mx.nadam, 0.01),
    _o("mxnet.adabelief", mx.adabelief, 0.01),
    _o("mxnet.ftml", mx.ftml, 0.01),
    _o("mxnet.adagrad", mx.adagrad, 0.01, row_sparse=True),
    _o("mxnet.groupadagrad", mx.groupadagrad, 0.01, row_sparse=True),
    _o("mxnet.rmsprop", mx.rmsprop, 0.01),
    _o("mxnet.adadelta", mx.adadelta, 1.0),
    _o("mxnet.ftrl", mx.ftrl, 0.1, row_sparse=True),
    _o("mxnet.dcasgd", mx.dcasgd, 0.1, momentum=0.9),
    _o("mxnet.sgld", mx.sgld, 0.01, key=0),
    _o("sparse.adam", sparse.adam, 1e-2, row_sparse=True),
    _o("sparse.adamw", sparse.adamw, 1e-2, weight_decay=1e-2, row_sparse=True),
    _o("sparse.sgd", sparse.sgd, 0.1, momentum=0.9, row_sparse=True),
    _o("porting.timm_optimizer", porting.timm_optimizer, "lamb", lr=1e-2, weight_decay=1e-2),
    _o("porting.timm_lars", porting.timm_lars, 0.1, momentum=0.9, weight_decay=1e-4),
    _o("porting.timm_lamb", porting.timm_lamb, 1e-2, weight_decay=1e-2),
    _o("porting.torch_sparse_adam", porting.torch_sparse_adam, 1e-2, complex=True, lazy=True,
       row_sparse=True),
    _o("porting.keras_lamb", porting.keras_lamb, 1e-2),
    _o("porting.optax_lars", porting.optax_lars, 0.1, weight_decay=1e-4, momentum=0.9),
    _o("porting.optax_lamb", porting.optax_lamb, 1e-2, weight_decay=1e-2),
    _o("porting.byol_lars", porting.byol_lars, 0.1, weight_decay=1e-6),
    _o("porting.simclr_lars", porting.simclr_lars, 0.1, weight_decay=1e-6),
    _o("porting.albert_lamb", porting.albert_lamb, 1e-2, weight_decay_rate=1e-2),
]

BY_NAME = {o.name: o for o in TABLE}


def lazy_step(o: Optimizer, **kw: Any) -> Any:
  """``o``'s lazy (row-sparse) step: ``lazy_update=True`` where it takes that flag."""
  assert o.lazy, o.name
  takes_flag = "lazy_update" in inspect.signature(o.fn).parameters
  return o.make(**({"lazy_update": True} if takes_flag else {}), **kw)


# One row per family: MXNet's LARS, TF's LARS, LAMB, MXNet's lazy Adam, the dense-exact
# sparse Adam and a port. A matrix that checks, row by row, a mechanism every optimizer
# shares runs these rows in the default tier and the others in the slow one (tiered).
FAMILIES = ("lars", "tf_lars", "lamb", "mxnet.adam", "sparse.adam", "porting.timm_lamb")


def tiered(names: list[str]) -> list[Any]:
  """``names`` as pytest parameters: the families' rows as they are, the others slow."""
  return [n if n in FAMILIES else pytest.param(n, marks=pytest.mark.slow) for n in names]


LAZY = [o.name for o in TABLE if o.lazy]
ROW_SPARSE = [o.name for o in TABLE if o.row_sparse]
COMPLEX = [o.name for o in TABLE if o.complex]


def canonical_params() -> dict[str, Any]:
  """The one tree the table's rows step on: a dense layer and a table (6 rows)."""
  rng = np.random.default_rng(0)
  return {"dense": {"kernel": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
                    "bias": jnp.asarray(rng.normal(size=(4,)), jnp.float32)},
          "embed": jnp.asarray(rng.normal(size=(6, 4)), jnp.float32)}


def canonical_grads(params: Any) -> Any:
  return jax.tree.map(lambda p: 0.1 * jnp.cos(p), params)


@functools.cache
def step(name: str) -> tuple[Any, Callable[..., Any]]:
  """``(tx, step)``: the row's optimizer in its canonical configuration and its jitted
  step ``step(params, state, grads) -> (params, state, updates)``, one per worker."""
  tx = BY_NAME[name].make()

  @jax.jit
  def run(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, updates

  return tx, run
