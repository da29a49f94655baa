"""Leaf names and name-based masks.

Every leaf of a pytree gets a *name*: its tree path rendered as a string, with
dict keys, attribute names and sequence indices joined by ``/``. A Flax linen
bias is ``Dense_0/bias`` in a ``TrainState``'s params (``params/Dense_0/bias``
in the whole ``model.init(...)`` dict), a Haiku bias ``mlp/~/linear_0/b`` and
a leaf of a flat MXNet-style dict ``fc1_weight``.

A :class:`Mask` is a rule on ``(name, leaf)``. Calling it on a pytree returns a
pytree of Python ``bool`` with the same structure, so it can be passed wherever
optax takes a mask (``optax.masked``, ``optax.add_decayed_weights(mask=...)``)
and to this library's ``skip`` arguments. Masks combine with ``|``, ``&`` and
``~``. Because the result is made of Python bools (decided from names, shapes
and dtypes, all static under ``jit``), masked-out leaves cost nothing at run
time.

Names you give must match: where this library takes a mask, ``init`` raises
an error when a name given to :func:`by_suffix`, :func:`by_substring`,
:func:`by_regex` or :func:`by_leaf_name` matches no leaf (see :class:`Mask`;
presets and :meth:`Mask.optional` masks are exempt).

Presets name the parameters that the original optimizers exclude from the LARS
trust ratio: :data:`MXNET_SKIP` (names ending in ``gamma``, ``beta`` or
``bias``), :data:`FLAX_SKIP` (norm ``scale``/``bias`` and every ``bias``) and
:data:`HAIKU_SKIP` (``b``, ``scale``, ``offset``).
"""

from __future__ import annotations

from lars_optax import _masks
from lars_optax._masks import (
    Mask,
    by_leaf_name,
    by_ndim,
    by_predicate,
    by_regex,
    by_substring,
    by_suffix,
    leaf_names,
    named_leaves,
)

everything = _masks.everything
"""Selects every leaf."""

nothing = _masks.nothing
"""Selects no leaf."""

MXNET_SKIP = _masks.MXNET_SKIP
"""MXNet LARS: names ending in ``gamma``, ``beta`` or ``bias`` keep ratio 1."""

FLAX_SKIP = _masks.FLAX_SKIP
"""Flax: every ``bias`` and the ``scale`` of norm layers."""

HAIKU_SKIP = _masks.HAIKU_SKIP
"""Haiku: linear/conv ``b`` and the ``scale``/``offset`` of norm layers."""

EQUINOX_SKIP = _masks.EQUINOX_SKIP
"""Equinox: every ``bias``, and the 1-d ``weight`` of norm layers (LayerNorm,
GroupNorm, RMSNorm, BatchNorm name their scale ``weight``, like a kernel; kernels
are at least 2-d). A norm over several axes (``LayerNorm((C, H, W))``) has a
multi-dimensional weight: add it with :func:`by_regex` if you use one."""

PRESETS = _masks.PRESETS
"""Presets by name, accepted wherever a mask is (``skip="flax"``)."""

MaskLike = _masks.MaskLike
"""A preset name (``"mxnet"``, ``"flax"``, ``"haiku"``, ``"equinox"``), a :class:`Mask`, a
callable ``tree -> bool pytree``, a bool pytree, or None (no leaf)."""

LeafValues = _masks.LeafValues
"""Per-leaf numbers (MXNet's ``lr_mult`` / ``wd_mult``), looked up by leaf name.

Either a dict ``{leaf name: value}`` (every key must name a leaf; inside
:func:`optax.masked`, a leaf that the mask hides from the optimizer counts,
as it keeps its name), or a
sequence of ``(mask, value)`` rules, where ``mask`` is anything a ``skip``
argument accepts (a :class:`Mask`, a preset name, ...) and the first rule that
selects a leaf gives its value; a rule's mask built from names must match some
leaf, as a ``skip`` mask must (checked in ``init``). Leaves that no entry names keep the default
(1 for a multiplier). None: every leaf keeps the default.

For a stacked leaf (a stack of L layers, see :mod:`lars_optax.stacked`), the
layer-wise optimizers (``lars``, ``lamb``, ``lans``) and the per-leaf
transformations also take a numpy array of L values (shape ``shape[:k]`` for
``k`` layer axes): one value per layer, as if each layer of the unrolled
model had its own (layer-wise learning-rate decay), e.g.
``lr_mult={"blocks/kernel": 0.8 ** np.arange(L)[::-1]}``.
"""

__all__ = [
    "EQUINOX_SKIP",
    "FLAX_SKIP",
    "HAIKU_SKIP",
    "MXNET_SKIP",
    "PRESETS",
    "LeafValues",
    "Mask",
    "MaskLike",
    "by_leaf_name",
    "by_ndim",
    "by_predicate",
    "by_regex",
    "by_substring",
    "by_suffix",
    "everything",
    "leaf_names",
    "named_leaves",
    "nothing",
]
