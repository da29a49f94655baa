"""lars_optax: large-batch and sign-based optimizers for JAX, as optax chains.

Ports of Apache MXNet's LARS, Signum/signSGD, Adam and SGD and of TensorFlow's
LARS, reproduced number for number, built from small public transformations
that compose with the rest of optax.
"""

from lars_optax import masks
from lars_optax.lazy import lazy_update, present_rows
from lars_optax.masks import (
    EQUINOX_SKIP,
    FLAX_SKIP,
    HAIKU_SKIP,
    MXNET_SKIP,
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
from lars_optax.nonfinite import skip_nonfinite
from lars_optax.optimizers import adam, lamb, lans, lars, sgd, signsgd, signum, tf_lars
from lars_optax.precision import (
    LOW_PRECISION,
    MultiPrecisionState,
    master_params,
    multi_precision,
)
from lars_optax.registry import create, mxnet_schedule, register, registered
from lars_optax.sparse import (
    RowSparseUpdate,
    is_row_sparse,
    row_sparse,
    sparse_psum,
    sparse_value_and_grad,
)
from lars_optax.svrg import (
    SVRGState,
    full_gradient,
    svrg,
    svrg_due,
    svrg_refresh,
    svrg_snapshot,
    svrg_value_and_grads,
)
from lars_optax.transforms import (
    LowPrecisionWarning,
    MXNetMomentumState,
    ScaleByLambTrustRatioState,
    ScaleByLansState,
    ScaleByLarsTrustRatioState,
    add_decayed_weights_per_leaf,
    check_inputs,
    lars_trust_ratio,
    mxnet_momentum,
    normalize_per_leaf,
    scale_by_lamb_adam,
    scale_by_lamb_trust_ratio,
    scale_by_lans,
    scale_by_lars_trust_ratio,
    scale_by_mxnet_adam,
    scale_per_leaf,
    trust_ratios,
)

__version__ = "0.1.0"

__all__ = [
    "EQUINOX_SKIP",
    "FLAX_SKIP",
    "HAIKU_SKIP",
    "LOW_PRECISION",
    "MXNET_SKIP",
    "LowPrecisionWarning",
    "MXNetMomentumState",
    "Mask",
    "MultiPrecisionState",
    "RowSparseUpdate",
    "SVRGState",
    "ScaleByLambTrustRatioState",
    "ScaleByLansState",
    "ScaleByLarsTrustRatioState",
    "adam",
    "add_decayed_weights_per_leaf",
    "by_leaf_name",
    "by_ndim",
    "by_predicate",
    "by_regex",
    "by_substring",
    "by_suffix",
    "check_inputs",
    "create",
    "full_gradient",
    "is_row_sparse",
    "lamb",
    "lans",
    "lars",
    "lars_trust_ratio",
    "lazy_update",
    "leaf_names",
    "masks",
    "master_params",
    "multi_precision",
    "mxnet_momentum",
    "mxnet_schedule",
    "named_leaves",
    "normalize_per_leaf",
    "present_rows",
    "register",
    "registered",
    "row_sparse",
    "scale_by_lamb_adam",
    "scale_by_lamb_trust_ratio",
    "scale_by_lans",
    "scale_by_lars_trust_ratio",
    "scale_by_mxnet_adam",
    "scale_per_leaf",
    "sgd",
    "signsgd",
    "signum",
    "skip_nonfinite",
    "sparse_psum",
    "sparse_value_and_grad",
    "svrg",
    "svrg_due",
    "svrg_refresh",
    "svrg_snapshot",
    "svrg_value_and_grads",
    "tf_lars",
    "trust_ratios",
]
