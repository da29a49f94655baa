"""Everything row-sparse: lazy steps that touch only the rows in the gradient.

MXNet sends an embedding table's gradient as a ``row_sparse`` array: the ids of
the rows a batch used and their gradient rows. With ``lazy_update=True`` an
optimizer then reads and writes only those rows, so a step costs
O(rows touched), not O(table). This namespace brings that to JAX with
:class:`jax.experimental.sparse.BCOO`, the ecosystem's sparse array:

* a gradient leaf may be a row-sparse BCOO, ``BCOO((values, indices),
  shape=param.shape)`` with ``values`` of shape ``(K, *param.shape[1:])`` and
  ``indices`` of shape ``(K, 1)`` (``n_batch == 0``, ``n_sparse == 1``, dense
  trailing dimensions). Repeated indices are summed;
* :func:`lazy_update`, ``lars_optax.mxnet.adam(lazy_update=True)``,
  ``mxnet.sgd(lazy_update=True)`` and ``mxnet.create(..., lazy_update=True)`` take such
  leaves: they gather the K rows of the param and of every params-shaped
  state buffer, run the inner transformation on them and scatter them back.
  The update of a sparse leaf is row-sparse too, of the gradient's type (a
  :class:`RowSparseUpdate`, or a plain BCOO for a plain BCOO, so that
  :func:`optax.apply_if_finite` matches it), and
  ``optax.apply_updates(params, updates)`` adds it with a scatter, in O(K).
  Under ``jit`` with donated params and state, nothing the size of the table
  is allocated (XLA turns ``params + densified plain BCOO`` into the same
  scatter). :func:`dense_updates` returns it as an array, for
  ``eqx.apply_updates``;
* :func:`adam`, :func:`adamw` and :func:`sgd` are optax's rules on such
  gradients with the dense step's numbers at a lazy step's cost: a touched
  row is first brought along the steps it skipped, and :func:`catch_up`
  brings every row (or a batch's rows) to the current step
  (:mod:`lars_optax.sparse.exact`);
* :func:`value_and_grad` gives such gradients for unchanged models
  (Flax, Haiku, Equinox): it differentiates with respect to the rows a batch
  looks up, never the whole table;
* :func:`psum` sums gradient trees with row-sparse leaves over a
  ``pmap``/``shard_map`` axis (data parallelism).

docs/sparse.md opens with a whole training loop (any model: Flax, nnx, Haiku,
Equinox) and shows each piece below in code that its test runs as written.
With the train step jitted with ``donate_argnums=(0, 1)``, the table, Adam's
moments and the step are updated in place.

Out-of-range indices (negative or > the number of rows) in a row-sparse
gradient raise a ValueError naming the leaf: at once outside ``jit``, at run
time under ``jit`` (a host callback in a ``lax.cond``, called only on error).
The index equal to the number of rows marks padding, as in BCOO's own padded
arrays (:func:`value_and_grad` pads with it). A generic optax
transformation or ``jax.tree.map`` walks into a BCOO and changes its indices:
use this namespace's :func:`clip_by_global_norm`, :func:`multi_steps`, :func:`tree_add`
and :func:`apply_updates`: optax's names are right here, since the namespace says
why they exist (each does what its optax namesake does to the dense gradient).

Inner transformations must be *row-wise*: every row of their output may depend
only on the same row of the gradient, params and state (Adam, SGD, momentum,
clipping by value, weight decay). A LARS trust ratio or a global-norm clip
needs the whole leaf; lazy_update checks the traced computation and raises a
ValueError naming the leaf instead of returning a different answer.
"""

from lars_optax.sparse._grad import value_and_grad
from lars_optax.sparse._psum import psum
from lars_optax.sparse._rows import is_row_sparse
from lars_optax.sparse._types import RowSparseUpdate, row_sparse
from lars_optax.sparse.exact import CatchUpState, adam, adamw, catch_up, sgd
from lars_optax.sparse.lazy import lazy_update, present_rows
from lars_optax.sparse.optax_compat import (
    MultiStepsState,
    apply_updates,
    clip_by_global_norm,
    dense_updates,
    multi_steps,
    tree_add,
)

__all__ = [
    "CatchUpState",
    "MultiStepsState",
    "RowSparseUpdate",
    "adam",
    "adamw",
    "apply_updates",
    "catch_up",
    "clip_by_global_norm",
    "dense_updates",
    "is_row_sparse",
    "lazy_update",
    "multi_steps",
    "present_rows",
    "psum",
    "row_sparse",
    "sgd",
    "tree_add",
    "value_and_grad",
]
