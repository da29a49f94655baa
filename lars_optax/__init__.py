"""lars_optax: large-batch and sign-based optimizers for JAX, as optax chains.

The top level holds the library's own optimizers and their links: MXNet's
LARS (:func:`lars`, the namesake; it differs from :func:`optax.lars`, see its
docstring), TensorFlow's LARS (:func:`tf_lars`), LAMB, LANS, Signum and
signSGD, the trust-ratio, momentum and decay links they are chained from, the
wrappers (:func:`multi_precision`, :func:`skip_nonfinite`) and the name-based
masks. Every other name here that optax also has follows optax's rule with
optax's defaults.

Each origin has its namespace:

* :mod:`lars_optax.mxnet` -- MXNet 2.0's whole registry under MXNet's names
  (``mxnet.adam``, ``mxnet.sgd``, ..., ``mxnet.create``, ``mxnet.lr_scheduler``);
* :mod:`lars_optax.sparse` -- row-sparse gradients and lazy steps
  (``sparse.value_and_grad``, ``sparse.lazy_update``, and the row-sparse
  companions of optax's ``clip_by_global_norm``, ``multi_steps``, ``apply_updates``);
* :mod:`lars_optax.porting` -- one constructor per peer (timm, torch.optim,
  Keras, optax, BYOL, SimCLR, ALBERT), in the peer's own words;
* :mod:`lars_optax.svrg` -- SVRG;
* :mod:`lars_optax.masks` and :mod:`lars_optax.stacked` -- the mask builders and
  presets, and the stacked-layer rules (``stacked.from_metadata``).
"""

from lars_optax import masks, mxnet, porting, sparse, stacked, svrg
from lars_optax._lamb import lamb, scale_by_lamb_adam
from lars_optax._lans import (
    NormalizePerLeafState,
    ScaleByLansState,
    lans,
    normalize_per_leaf,
    scale_by_lans,
)
from lars_optax._lars import lars, tf_lars
from lars_optax.masks import (
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
from lars_optax._momentum import (
    DampenedTraceState,
    MXNetMomentumState,
    dampened_trace,
    mxnet_momentum,
)
from lars_optax.nonfinite import skip_nonfinite
from lars_optax.precision import MultiPrecisionState, master_params, multi_precision
from lars_optax.sign import signsgd, signum
from lars_optax._transforms import (
    AddDecoupledWeightDecayState,
    LowPrecisionWarning,
    PerLeafState,
    ScaleByCautionState,
    add_decayed_weights_per_leaf,
    add_decoupled_weight_decay,
    check_inputs,
    scale_by_caution,
    scale_per_leaf,
)
from lars_optax._trust_ratio import (
    ScaleByLambTrustRatioState,
    ScaleByLarsTrustRatioState,
    TrustClipState,
    lars_trust_ratio,
    scale_by_lamb_trust_ratio,
    scale_by_lars_trust_ratio,
    trust_ratios,
)

__version__ = "0.1.0"

__all__ = [
    "AddDecoupledWeightDecayState",
    "DampenedTraceState",
    "LowPrecisionWarning",
    "MXNetMomentumState",
    "Mask",
    "MultiPrecisionState",
    "NormalizePerLeafState",
    "PerLeafState",
    "ScaleByCautionState",
    "ScaleByLambTrustRatioState",
    "ScaleByLansState",
    "ScaleByLarsTrustRatioState",
    "TrustClipState",
    "add_decayed_weights_per_leaf",
    "add_decoupled_weight_decay",
    "by_leaf_name",
    "by_ndim",
    "by_predicate",
    "by_regex",
    "by_substring",
    "by_suffix",
    "check_inputs",
    "dampened_trace",
    "lamb",
    "lans",
    "lars",
    "lars_trust_ratio",
    "leaf_names",
    "masks",
    "master_params",
    "multi_precision",
    "mxnet",
    "mxnet_momentum",
    "named_leaves",
    "normalize_per_leaf",
    "porting",
    "scale_by_caution",
    "scale_by_lamb_adam",
    "scale_by_lamb_trust_ratio",
    "scale_by_lans",
    "scale_by_lars_trust_ratio",
    "scale_per_leaf",
    "signsgd",
    "signum",
    "skip_nonfinite",
    "sparse",
    "stacked",
    "svrg",
    "tf_lars",
    "trust_ratios",
]
