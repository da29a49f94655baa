"""Apache MXNet 2.0's optimizer registry, rule for rule, under MXNet's names.

Every optimizer of ``mx.optimizer`` with MXNet's argument names, defaults and
update rules (``wd``, ``rescale_grad``, ``clip_gradient``, ``lr_mult``,
``wd_mult``, ``multi_precision``, ``lazy_update``), each a plain
``optax.chain`` of public transformations. Several share a name with optax
but follow MXNet's rule (``adam`` puts ε outside the bias correction,
``adagrad`` starts its accumulator at 0, ``nadam`` uses MXNet's momentum
schedule), which is why they live here: the prefix says whose rule it is.

:func:`create` builds any of them by MXNet's name, as ``mx.optimizer.create``
does, and :mod:`lars_optax.mxnet.lr_scheduler` holds ``mx.lr_scheduler``'s
schedulers. ``lars``, ``lamb``, ``lans`` and ``signum``/``signsgd`` are the
same objects as :func:`lars_optax.lars` and the others at the top level.

>>> import lars_optax
>>> tx = lars_optax.mxnet.create("adam", learning_rate=1e-3, wd=1e-4)
>>> tx = lars_optax.mxnet.adam(1e-3, wd=1e-4)  # the same optimizer
"""

from lars_optax._lamb import lamb
from lars_optax._lans import lans
from lars_optax._lars import lars
from lars_optax.mxnet import lr_scheduler
from lars_optax.mxnet._adagrad_family import (
    FtrlProximalState,
    ScaleByGroupAdagradState,
    adadelta,
    adagrad,
    clip_params,
    ftrl,
    ftrl_proximal,
    groupadagrad,
    rmsprop,
    scale_by_group_adagrad,
    scale_by_mxnet_adagrad,
)
from lars_optax.mxnet._adam_family import adabelief, adam, adamax, adamw, ftml, nadam
from lars_optax.mxnet._adam_links import (
    ScaleByAdamMomentsState,
    ScaleByBiasCorrectionState,
    ScaleByFTMLState,
    ScaleByNadamState,
    scale_by_adam_moments,
    scale_by_bias_correction,
    scale_by_ftml,
    scale_by_mxnet_adam,
    scale_by_mxnet_adamax,
    scale_by_mxnet_belief,
    scale_by_mxnet_nadam,
)
from lars_optax.mxnet.registry import BASE_ARGS, create, mxnet_schedule, register, registered
from lars_optax.mxnet._sgd_family import (
    AddLangevinNoiseState,
    DelayCompensationState,
    add_delay_compensation,
    add_langevin_noise,
    dcasgd,
    nag,
    sgd,
    sgld,
)
from lars_optax.sign import signsgd, signum

__all__ = [
    "BASE_ARGS",
    "AddLangevinNoiseState",
    "DelayCompensationState",
    "FtrlProximalState",
    "ScaleByAdamMomentsState",
    "ScaleByBiasCorrectionState",
    "ScaleByFTMLState",
    "ScaleByGroupAdagradState",
    "ScaleByNadamState",
    "adabelief",
    "adadelta",
    "adagrad",
    "adam",
    "adamax",
    "adamw",
    "add_delay_compensation",
    "add_langevin_noise",
    "clip_params",
    "create",
    "dcasgd",
    "ftml",
    "ftrl",
    "ftrl_proximal",
    "groupadagrad",
    "lamb",
    "lans",
    "lars",
    "lr_scheduler",
    "mxnet_schedule",
    "nadam",
    "nag",
    "register",
    "registered",
    "rmsprop",
    "scale_by_adam_moments",
    "scale_by_bias_correction",
    "scale_by_ftml",
    "scale_by_group_adagrad",
    "scale_by_mxnet_adagrad",
    "scale_by_mxnet_adam",
    "scale_by_mxnet_adamax",
    "scale_by_mxnet_belief",
    "scale_by_mxnet_nadam",
    "sgd",
    "sgld",
    "signsgd",
    "signum",
]
