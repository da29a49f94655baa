"""Stacked (scanned) layers: which leaves hold a stack of layers, and per-layer norms.

Large models keep their repeated blocks *stacked*: every parameter of the L
blocks is one array with a leading layer axis, and the forward pass scans over
it (Flax linen ``nn.scan(..., variable_axes={"params": 0})``, nnx ``nnx.vmap``
+ ``nnx.scan``, Haiku ``hk.layer_stack``, Equinox ``eqx.filter_vmap`` +
``lax.scan``). A leaf ``blocks/Dense_0/kernel`` of shape ``(L, D, D)`` is L
layers. The layer-wise rules (LARS, LAMB, LANS and their per-leaf
normalisation) must then take one norm per layer, not one over the stack.

Every layer-wise optimizer and building block takes a ``stacked`` argument
(:data:`StackedLike`) that names the leaves holding a stack and how many
leading axes are layer axes (``k``):

* a mask, anything ``skip`` accepts (``masks.by_regex(r"^blocks/")``, a bool
  pytree, a callable): one leading layer axis on the leaves it selects;
* ``{leaf name: k}`` or ``[(mask, k)]`` rules: ``k`` leading layer axes (e.g.
  stages x layers);
* :func:`from_metadata` (the default, :data:`FROM_METADATA`): read from Flax
  metadata. Linen ``nn.Partitioned``/``nn.LogicallyPartitioned`` boxes and nnx
  Variables whose partition names start with ``"layers"``, the name that
  ``nn.scan(..., metadata_params={nn.PARTITION_NAME: "layers"})`` and
  ``nnx.vmap(..., transform_metadata={nnx.PARTITION_NAME: "layers"})`` insert,
  have one layer axis per leading ``"layers"`` entry. Without such metadata,
  nothing is stacked;
* None: no leaf is stacked.

Each slice along the layer axes is then treated exactly as a separate
parameter of the unrolled model: it gets its own norms, its own trust ratio,
its own bounds and its own fallback to 1. Masks (``skip``, ``lr_mult`` and
``wd_mult`` rules) judge one layer: ``by_ndim(1)`` selects a stacked bias of
shape ``(L, D)``. Everything global stays global: the step count, schedules
and ``optax.clip_by_global_norm``.

The layer axes are resolved once, in ``init`` (where nnx passes Variables
with their metadata), and kept in the state (:func:`layer_markers`), so
``update`` sees them even when it gets bare arrays (``nnx.Optimizer``).

>>> import jax.numpy as jnp
>>> import lars_optax
>>> params = {"blocks": {"kernel": jnp.ones((4, 8, 8)), "bias": jnp.zeros((4, 8))},
...           "head": jnp.ones((8, 2))}
>>> lars_optax.stacked.layer_axes(params, stacked=lars_optax.by_regex("^blocks/"))
{'blocks/bias': 1, 'blocks/kernel': 1, 'head': 0}
"""

from __future__ import annotations

from lars_optax import _stacked
from lars_optax._stacked import (
    FromMetadata,
    from_metadata,
    layer_axes,
)

PARTITION_NAME = _stacked.PARTITION_NAME
"""The partition name Flax's scan/vmap insert for the layer axis in the examples."""

FROM_METADATA = _stacked.FROM_METADATA
"""The default ``stacked``: leaves whose Flax partition names start with ``"layers"``."""

StackedLike = _stacked.StackedLike
"""What a ``stacked`` argument takes: :func:`from_metadata`, a mask (one layer
axis on the leaves it selects), ``{leaf name: k}`` or ``[(mask, k)]`` rules, or
None (nothing stacked)."""

AxisNameLike = _stacked.AxisNameLike
"""A mesh axis for every leaf (a str, or None), or per leaf: ``{leaf name: axis}`` or
``[(mask, axis)]`` rules (the first rule that selects a leaf wins); unlisted leaves None."""

__all__ = [
    "FROM_METADATA",
    "PARTITION_NAME",
    "AxisNameLike",
    "FromMetadata",
    "StackedLike",
    "from_metadata",
    "layer_axes",
]
