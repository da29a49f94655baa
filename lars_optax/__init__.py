"""lars_optax: large-batch and sign-based optimizers for JAX, as optax chains.

Ports of Apache MXNet's and TensorFlow's LARS, reproduced number for number,
built from small public transformations that compose with the rest of optax.
"""

from lars_optax import masks
from lars_optax.masks import (
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
from lars_optax.optimizers import lars, tf_lars
from lars_optax.transforms import (
    MXNetMomentumState,
    ScaleByLarsTrustRatioState,
    lars_trust_ratio,
    mxnet_momentum,
    scale_by_lars_trust_ratio,
    trust_ratios,
)

__version__ = "0.1.0"

__all__ = [
    "FLAX_SKIP",
    "HAIKU_SKIP",
    "MXNET_SKIP",
    "MXNetMomentumState",
    "Mask",
    "ScaleByLarsTrustRatioState",
    "by_leaf_name",
    "by_ndim",
    "by_predicate",
    "by_regex",
    "by_substring",
    "by_suffix",
    "lars",
    "lars_trust_ratio",
    "leaf_names",
    "masks",
    "mxnet_momentum",
    "named_leaves",
    "scale_by_lars_trust_ratio",
    "tf_lars",
    "trust_ratios",
]
