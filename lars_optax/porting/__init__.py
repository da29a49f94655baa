r"""Ports from other libraries: one constructor per peer, in the peer's own words.

Each constructor takes the peer's own argument names and defaults, so a port
is the peer's call with its prefix changed, and each is a short
``optax.chain`` of the library's public links. Every one is checked against
the peer's own code (``tests/reference/make_peers.py`` and
``make_peers_tf.py`` ran the peers; docs/porting.md lists the measured error
of each, with a constant rate and with a warm-up schedule):

* :func:`timm_lars`, :func:`timm_lamb` -- timm's ``Lars`` and ``Lamb``
  classes (one parameter group); :func:`timm_optimizer` --
  ``create_optimizer_v2``, with timm's no-decay group, for ``"lars"``,
  ``"larc"``, ``"nlars"``, ``"nlarc"``, ``"lamb"``, ``"lambc"``, ``"lambw"``,
  ``"clamb"`` and ``"cadamw"``;
* :func:`torch_sparse_adam` -- ``torch.optim.SparseAdam``;
* :func:`keras_lamb` -- ``keras.optimizers.Lamb`` (Keras 3);
* :func:`optax_lars`, :func:`optax_lamb` -- ``optax.lars`` and ``optax.lamb``
  (the same numbers, with ``stacked``, ``axis_name``, ``lr_mult`` and the
  ratio logging of :func:`lars_optax.trust_ratios`);
* :func:`byol_lars` -- BYOL's ``lars``; :func:`simclr_lars` -- SimCLR's
  ``LARSOptimizer``; :func:`albert_lamb` -- ALBERT's ``LAMBOptimizer``.

Each peer has its module (``_timm``, ``_torch``, ``_keras``, ``_optax``,
``_tf_research``; what they share in ``_shared``). Besides the peer's arguments
each takes the library's shared keyword-only options (``lr_mult``,
``multi_precision``, ``axis_name``, ``stacked``, and ``group_by_shape`` for the
LARS and LAMB ports; see docs/optimizers.md's common arguments).

>>> import lars_optax
>>> tx = lars_optax.porting.timm_optimizer("lars", lr=0.1, weight_decay=1e-4, momentum=0.9)
>>> tx = lars_optax.porting.optax_lars(0.1, weight_decay=1e-4, momentum=0.9)
"""

from lars_optax.porting._keras import keras_lamb
from lars_optax.porting._optax import optax_lamb, optax_lars
from lars_optax.porting._tf_research import albert_lamb, byol_lars, simclr_lars
from lars_optax.porting._timm import timm_lamb, timm_lars, timm_optimizer
from lars_optax.porting._torch import torch_sparse_adam

__all__ = [
    "albert_lamb",
    "byol_lars",
    "keras_lamb",
    "optax_lamb",
    "optax_lars",
    "simclr_lars",
    "timm_lamb",
    "timm_lars",
    "timm_optimizer",
    "torch_sparse_adam",
]
