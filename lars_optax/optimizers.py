"""The optimizers users call, and the conventions they share.

Each optimizer lives in the module of its family, beside the transformations
it is chained from; this module keeps their old import path
(``lars_optax.optimizers.lars`` and so on) and the conventions below. All of
them are importable from ``lars_optax``.

* :func:`lars` -- MXNet's ``mx.optimizer.LARS`` (argument names and defaults),
  in :mod:`lars_optax.layerwise`.
* :func:`tf_lars` -- TensorFlow's ``tf.contrib.opt.LARSOptimizer``, in
  :mod:`lars_optax.layerwise`.
* :func:`signum` and :func:`signsgd` -- MXNet's ``mx.optimizer.Signum``, in
  :mod:`lars_optax.sign`.
* :func:`adam` -- MXNet's ``mx.optimizer.Adam`` (epsilon outside the bias
  correction, optional lazy updates), in :mod:`lars_optax.adam_family`.
* :func:`sgd` -- MXNet's ``mx.optimizer.SGD`` (learning rate inside the
  momentum buffer), in :mod:`lars_optax.sgd_family`.
* :func:`lamb` and :func:`lans` -- MXNet's ``mx.optimizer.LAMB`` and
  ``mx.optimizer.LANS`` (layer-wise trust ratio on Adam's update, with name
  masks and bounds on the weight norm), in :mod:`lars_optax.layerwise`.

The other families: :mod:`lars_optax.adam_family` (AdamW, Adamax, Nadam,
AdaBelief, FTML), :mod:`lars_optax.sgd_family` (NAG, DCASGD, SGLD) and
:mod:`lars_optax.adagrad_family` (AdaGrad, GroupAdaGrad, RMSProp, AdaDelta,
FTRL).

The MXNet-flavoured ones share MXNet's optimizer-base arguments: ``wd``,
``rescale_grad``, ``clip_gradient``, per-leaf ``lr_mult`` and ``wd_mult``
(looked up by leaf name, see :data:`lars_optax.masks.LeafValues`) and
``multi_precision`` (float32 master weights for float16/bfloat16 params, see
:func:`lars_optax.multi_precision`). :func:`lars_optax.create` builds them by
name, MXNet style.

Every optimizer checks its inputs. Hyperparameters are checked when it is
built (a ValueError or TypeError that starts with the argument's name and
states the accepted range); Python, numpy and JAX scalars (bfloat16 ones too)
are accepted alike and never change the dtypes of updates and state. ``init``
rejects a constant hyperparameter that the params' dtype cannot hold
(``learning_rate=1e39`` for float32 params, ``1e5`` for float16), integer,
boolean and complex params, and names in
``skip``/``skip_list``/``lr_mult``/``wd_mult`` that match no parameter (see
:class:`lars_optax.masks.Mask`). ``update(grads, state, params)`` rejects
non-float gradients and gradients whose tree or shapes differ from the params
(naming the leaf), and casts a gradient of another float dtype to its
parameter's, so that state and updates keep the parameter dtypes. These
checks are the first link of every chain, :func:`lars_optax.check_inputs`.
As in optax, params that sit where the gradients hold None are ignored, so
Equinox's ``update(grads, state, model)`` works with the whole model.

Non-finite gradients: a NaN or an infinity never makes a LARS trust ratio NaN
(it falls back to 1), but it does reach the weights. To skip such steps, wrap
the optimizer:

>>> import lars_optax
>>> tx = lars_optax.skip_nonfinite(lars_optax.lars(0.1, momentum=0.9))

A skipped step leaves the params and every state buffer unchanged and is
counted in ``state.total_notfinite`` (:func:`lars_optax.skip_nonfinite`).
``optax.apply_if_finite(tx, max_consecutive_errors)`` does the same for the
optimizers without ``multi_precision``.

Recipes: the LARS of BYOL, SimCLR and :func:`optax.lars` are :func:`lars`
calls. All three take the ratio from the decayed update (``update_norm=True``,
``epsilon=0.0``); BYOL applies the learning rate after the momentum buffer
(``lr_in_momentum=False``), SimCLR and optax inside it (the default). The
flavours of timm, torch.optim, Keras 3 and ALBERT, each with its measured error
against the peer's own code, are in ``docs/porting.md``.
"""

from __future__ import annotations

from lars_optax.adam_family import adam
from lars_optax.layerwise import lamb, lans, lars, tf_lars
from lars_optax.sgd_family import sgd
from lars_optax.sign import signsgd, signum

__all__ = ["adam", "lamb", "lans", "lars", "sgd", "signsgd", "signum", "tf_lars"]
