"""Private: the one place every optimizer is assembled, the core's, MXNet's, TensorFlow's
and the ports' alike.

:func:`finish` chains the input checks before the optimizer's links (the layer-wise
ones built per leaf or stacked by shape, ``group_by_shape``) and wraps the chain for
lazy updates, row-sparse gradients and master weights; the rate's links
(:func:`learning_rate_part`, :func:`lr_mult_part`) are every optimizer's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optax

from lars_optax import _grouping
from lars_optax import _utils as utils
from lars_optax import _masks as masks
from lars_optax import _stacked as stacked_mod
from lars_optax.precision import multi_precision as _multi_precision
from lars_optax.sparse.lazy import lazy_update as _lazy_update
from lars_optax.sparse.lazy import on_row_sparse as _on_row_sparse
from lars_optax._transforms import unchecked_check_inputs, unchecked_scale_per_leaf


def warn_float16_squares(tx: optax.GradientTransformationExtraArgs,
                         name: str) -> optax.GradientTransformationExtraArgs:
  """``tx`` whose ``init`` warns (``LowPrecisionWarning``) for float16 params.

  For the rules that accumulate squared gradients in the params' dtype
  (RMSProp, AdaGrad, AdaDelta, FTRL): in float16 the squares overflow and the
  weight freezes. The state is ``tx``'s own (nothing is added to it).
  """
  def init_fn(params):
    utils.warn_float16(params, name, problem=utils.OVERFLOWS)
    return tx.init(params)

  return optax.GradientTransformationExtraArgs(init_fn, tx.update)


def learning_rate_part(learning_rate: Any) -> optax.GradientTransformation:
  """``-learning_rate`` (a constant or a schedule), in the updates' dtype."""
  return utils.keep_dtypes(optax.scale_by_learning_rate(learning_rate), learning_rate)


def lr_mult_part(lr_mult: masks.LeafValues,
                 stacked: stacked_mod.StackedLike = stacked_mod.FROM_METADATA) -> list:
  """``lr_mult``'s per-leaf scale, or nothing without it."""
  return [] if lr_mult is None else [unchecked_scale_per_leaf(lr_mult, arg_name="lr_mult",
                                                              stacked=stacked)]


def finish(parts: Sequence[Any], name: str, *, layer_wise: Callable[..., list] | None = None,
           group_by_shape: bool = False, masks_by_arg: Mapping[str, Any] | None = None,
           values_by_arg: Mapping[str, Any] | None = None, stacked: Any = None,
           lazy: bool = False, multi_precision: bool = False,
           names: Sequence[tuple[str, masks.MaskLike, str | None]] = (),
           complex_params: bool = False, squares: bool = False, row_sparse: bool = False,
           row_sparse_check: Callable[[list[str], Any], None] | None = None
           ) -> optax.GradientTransformationExtraArgs:
  """``optax.chain(check_inputs, *parts, *layer-wise links)``, wrapped for lazy updates,
  row-sparse gradients and master weights.

  ``layer_wise``: builds the layer-wise links after ``parts`` from ``masks_by_arg``,
  ``values_by_arg`` and ``stacked``, per leaf or (``group_by_shape``) on the leaves
  stacked by shape. ``init`` warns when the params look stacked and ``stacked`` was
  left at its default (:data:`lars_optax.stacked.FROM_METADATA`; None, the default
  here, warns for nothing). The optimizer's arguments are checked against the params
  at ``init`` by their declarations (:func:`lars_optax._links.optimizer`); ``names``:
  the masks it builds from them (``(argument, mask, hint)``, e.g. TensorFlow's
  ``skip_list`` as a mask), whose names must each match a leaf. ``complex_params``:
  the rule is defined on complex params (see
  :data:`lars_optax._validation.COMPLEX_OPTIMIZERS`). ``squares``: the rule
  accumulates squared gradients in the params' dtype, so ``init`` warns for float16
  params (without ``multi_precision``, whose master weights are float32).
  ``row_sparse``: the optimizer takes row-sparse (BCOO) gradients as MXNet's
  ``row_sparse`` kernel of it does, without a ``lazy_update`` flag (see
  :func:`lars_optax.sparse.lazy.on_row_sparse`, which calls ``row_sparse_check``).
  """
  if layer_wise is not None:
    parts = [*parts, *_grouping.maybe_by_shape(
        group_by_shape, layer_wise, masks_by_arg=dict(masks_by_arg or {}),
        values_by_arg=dict(values_by_arg or {}), stacked=stacked)]
  tx = optax.chain(unchecked_check_inputs(name, names=names, complex_params=complex_params),
                   *parts)
  if squares:
    tx = warn_float16_squares(tx, name)
  if lazy:
    tx = _lazy_update(tx)
  elif row_sparse:
    tx = _on_row_sparse(tx, name, check=row_sparse_check)
  if multi_precision:
    tx = _multi_precision(tx)
  return stacked_mod.warn_unstacked(tx, stacked, name)
