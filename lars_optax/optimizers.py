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

Recipe: the LARS of BYOL and SimCLR (and of :func:`optax.lars`). Their rule
differs from MXNet's and TF's: weight decay is added to the gradient first
(masked like the ratio), the ratio is taken from the decayed gradient,
:math:`\\rho = \\eta\\|w\\| / \\|g + \\lambda w\\|`, the momentum accumulates
:math:`\\rho(g + \\lambda w)`, and the learning rate multiplies the
momentum from outside (:math:`m_t = \\mu m_{t-1} + \\rho u_t`,
:math:`w_t = w_{t-1} - \\alpha_t m_t`). Biases and norm parameters get neither
decay nor a ratio. It is a chain of public transformations::

  import optax
  import lars_optax

  skip = lars_optax.by_ndim(1)  # biases and norm scales: no decay, ratio 1
  byol_lars = optax.chain(
      lars_optax.check_inputs("byol_lars"),
      lars_optax.add_decayed_weights_per_leaf(1e-6, [(skip, 0.0)]),  # u = g + wd * w
      lars_optax.scale_by_lars_trust_ratio(eta=0.001, skip=skip),    # rho from ||u||
      optax.trace(decay=0.9),                                         # m = mu * m + rho * u
      optax.scale_by_learning_rate(0.2),                              # w -= lr * m
  )

With a constant learning rate this equals ``optax.lars(0.2, weight_decay=1e-6,
weight_decay_mask=keep, trust_coefficient=0.001, trust_ratio_mask=keep,
momentum=0.9)`` with ``keep`` the complement of ``skip`` (optax.lars puts a
scheduled rate inside the momentum); :func:`lars` instead takes the ratio from
:math:`\\|g\\| + \\lambda\\|w\\|` and puts the rate inside the momentum
(MXNet). Use ``skip="flax"`` (or another preset) to select by name.
"""

from __future__ import annotations

from lars_optax.adam_family import adam
from lars_optax.layerwise import lamb, lans, lars, tf_lars
from lars_optax.sgd_family import sgd
from lars_optax.sign import signsgd, signum

__all__ = ["adam", "lamb", "lans", "lars", "sgd", "signsgd", "signum", "tf_lars"]
