"""One registry of hyperparameters: benchmark presets and method variants (DomainBed style).

A run's config = ``PRESETS[preset]`` deep-merged with ``METHODS[method]`` and then the user's
overrides, then validated by :class:`eada.config.ExperimentConfig`. Everything a benchmark
table uses is here, so a reader can see every number in one place.

Toy protocol (paper Fig. 5; the paper leaves these open, fixed ONCE here for every method):
two isotropic Gaussians (std 1) with means (-3.5, 0) and (3.5, 0), 500 points each; target =
the source points rotated by 90 degrees; a single fully-connected layer; the paper's optimiser
(Adadelta, lr 0.1), batch 32, gamma 0.01, alpha1 0.5; 40 epochs with rounds at the end of
epochs 10, 20 and 30, 2% of the target a round; the paper's alignment loss on ``F``
(``train.alignment: paper``). ``toy-calibrated`` is the same protocol with the source model
trained when the first round selects (Adadelta lr 1.0, chosen by the paper's Fig. 5(a): the
target's free energy above the source's on every seed) on the toy whose open parameters
``benchmarks/toy_calibration.py`` chose so that Source-only and Random land on the paper's 52.0
and 8.5 % target error; ``eada demo`` runs it by default.

SURF presets ``surf/S-T``: the 12 Office-Caltech10 SURF pairs on the protocol of
``configs/office_caltech10_surf.yaml`` (one preset a pair, so one ``eada bench`` grid takes them
all).

Digits protocol (LeNet from scratch; fixed once for every method): Adam lr 1e-3, batch 64,
gamma 0.01, alpha1 0.5, 7 epochs with a round of 1% of the target at the end of epochs 1-5, so
the accuracy after round r is measured after one more epoch of training with its labels and the
5% result after two. One epoch = max(#source, #target) batches. EADA's alignment loss: the
default variant (``train.alignment: normalized``, BENCHMARKS.md).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eada.config import ExperimentConfig


PRESETS: dict[str, dict[str, Any]] = {
    "toy": {
        "name": "toy",
        "data": {
            "kind": "toy",
            "n_per_class": 500,
            "separation": 7.0,
            "std": 1.0,
            "rotation_deg": 90.0,
        },
        "model": {"name": "linear"},
        "optim": {"name": "adadelta", "lr": 0.1},
        # the paper's Fig. 5: its L_fea (on F), pinned (the default is the normalized variant)
        "train": {
            "epochs": 40,
            "batch_size": 32,
            "gamma": 0.01,
            "alignment": "paper",
            "fea_gate": "none",  # the paper's loss, trained from the first step
        },
        "active": {
            "strategy": "eada",
            "rounds_at": [10, 20, 30],
            "budget_per_round": 0.02,
            "alpha1": 0.5,
        },
    },
}

# The toy as the paper shows it (Fig. 5(a): the source model trained when the first round
# selects) and calibrated to the paper's two baselines (Source-only 52.0, Random 8.5 % target
# error): benchmarks/toy_calibration.py chose the learning rate by the first round's evidence
# alone (eada.demo.source_trained: the target's free energy above the source's and the boundary
# within eada.demo.TRAINED_MAX_ANGLE degrees of the source's optimum, on every seed; Adadelta
# lr 0.1, the paper's rate for images, leaves the boundary up to 174 degrees off), then the
# separation and rotation running Source-only and Random only, over seeds 0-9. Everything else
# is the toy preset's; `eada demo` runs this one by default.
PRESETS["toy-calibrated"] = {
    **copy.deepcopy(PRESETS["toy"]),
    "name": "toy-calibrated",
    "data": {
        "kind": "toy",
        "n_per_class": 500,
        "separation": 4.0,
        "std": 1.0,
        "rotation_deg": 93.0,
    },
    "optim": {"name": "adadelta", "lr": 1.0},
}
#: The toy presets, the calibrated one first (`eada demo --preset`).
TOY_PRESETS: tuple[str, ...] = ("toy-calibrated", "toy")

_DIGITS_COMMON: dict[str, Any] = {
    "model": {"name": "lenet"},
    "optim": {"name": "adam", "lr": 0.001},
    "train": {"epochs": 7, "batch_size": 64, "gamma": 0.01, "eval_every": 1},
    "active": {
        "strategy": "eada",
        "rounds_at": [1, 2, 3, 4, 5],
        "budget_per_round": 0.01,
        "alpha1": 0.5,
    },
}

_DIGIT_TASKS = {
    # name: (source, target, source_split, target_split, heldout_split, channels, size)
    "mnist-usps": ("mnist", "usps", "all", "train", "test", 1, 28),
    "usps-mnist": ("usps", "mnist", "all", "all", None, 1, 28),
    "mnist-mnistm": ("mnist", "mnist_m", "all", "all", None, 3, 28),
}

for _name, (_s, _t, _ss, _ts, _hs, _ch, _sz) in _DIGIT_TASKS.items():
    PRESETS[f"digits/{_name}"] = {
        "name": f"digits/{_name}",
        "data": {
            "kind": "digits",
            "source": _s,
            "target": _t,
            "source_split": _ss,
            "target_split": _ts,
            "heldout_split": _hs,
            "channels": _ch,
            "image_size": _sz,
        },
        **copy.deepcopy(_DIGITS_COMMON),
    }

# The 12 Office-Caltech10 SURF pairs (800-d bag-of-words features, 10 classes; Gong et al.
# 2012) as presets: configs/office_caltech10_surf.yaml (its protocol: an MLP of 256 units,
# Adadelta 0.1, 50 epochs, rounds of 1% at the end of epochs 10-18) with the pair's files, read
# from ../shared/data/office_caltech10_surf (as the digits' root; --set data.source=... or
# --data-root elsewhere), e.g. surf/C-A = Caltech10 -> amazon.
SURF_DOMAINS = {"C": "Caltech10", "A": "amazon", "W": "webcam", "D": "dslr"}
SURF_ROOT = "../shared/data/office_caltech10_surf"
for _s, _sname in SURF_DOMAINS.items():
    for _t, _tname in SURF_DOMAINS.items():
        if _s != _t:
            PRESETS[f"surf/{_s}-{_t}"] = {
                "name": f"surf/{_s}-{_t}",
                "data": {
                    "kind": "features",
                    "source": f"{SURF_ROOT}/{_sname}_SURF_L10.mat",
                    "target": f"{SURF_ROOT}/{_tname}_SURF_L10.mat",
                    "features_key": "fts",
                    "labels_key": "labels",
                    "normalize": "l1_zscore",
                },
                "model": {"name": "mlp", "hidden": [256]},
                "optim": {"name": "adadelta", "lr": 0.1},
                "train": {"epochs": 50, "batch_size": 32, "gamma": 0.01},
                "active": {
                    "strategy": "eada",
                    "rounds_at": [10, 12, 14, 16, 18],
                    "budget_per_round": 0.01,
                    "alpha1": 0.5,
                },
            }
#: The SURF pairs' presets, in the leaderboard's order.
SURF_PRESETS: tuple[str, ...] = tuple(
    f"surf/{p}"
    for p in ("C-A", "C-W", "C-D", "A-C", "A-W", "A-D", "W-C", "W-A", "W-D", "D-C", "D-A", "D-W")
)

METHODS: dict[str, dict[str, Any]] = {
    "source_only": {"active": {"strategy": "none"}, "train": {"gamma": 0.0}},
    "random": {"active": {"strategy": "random"}, "train": {"gamma": 0.0}},
    "eada": {"active": {"strategy": "eada"}},
    # ablations (paper Fig. 4b): EADA selection without the alignment loss, and the converse.
    # w/o L_fea is paired: L_fea weighted 0 on EADA's own batches (train.fea_gate: zero), so only
    # the loss term changes (train.gamma: 0 would draw no unlabeled batch: other source batches)
    "eada_no_fea": {"active": {"strategy": "eada"}, "train": {"fea_gate": "zero"}},
    "random_fea": {"active": {"strategy": "random"}},
    "eada_no_f": {"active": {"strategy": "mvsm"}},
    "eada_no_u": {"active": {"strategy": "free_energy"}},
    # an option, not the default: EADA's step 1 on the centred free energy F - mean_y E
    # (docs/results/toy.md, "The two-class common mode")
    "eada_centered": {"active": {"strategy": "eada_centered"}},
}
# the paper's baselines (Tables 1-2): plain NLL training (no L_fea), their own query strategy
# and, where their papers train extra components, those too (eada.train.aux)
_BASELINES = {
    "entropy": "Entropy",
    "margin": "BvSB",
    "least_confidence": "Least confidence",
    "coreset": "CoreSet",
    "badge": "BADGE",
    "waal": "WAAL",
    "aada": "AADA",
    "dbal": "DBAL",
    "tqs": "TQS",
    "clue": "CLUE",
}
for _m in _BASELINES:
    METHODS[_m] = {"active": {"strategy": _m}, "train": {"gamma": 0.0}}

# methods after EADA (issue 24). DUC: the evidential component is the whole classifier loss
# (the trainer's own NLL and L_fea weights are 0); kappa = 10 as in every run of the authors'
# script_cls.sh (their defaults.py says 2); beta 1.0 and lambda 0.05 their defaults.
METHODS["duc"] = {
    "active": {
        "strategy": "duc",
        "params": {"kappa": 10, "duc_beta": 1.0, "duc_lambda": 0.05},
    },
    "train": {"gamma": 0.0, "delta_s": 0.0, "delta_t": 0.0},
}
# LADA's LAS with the authors' defaults (LADA.S_K 10, S_M 10, S_PROP_ITER 1, S_PROP_COEF 1.0),
# plain NLL training (their "ft" solver)
METHODS["las"] = {
    "active": {
        "strategy": "las",
        "params": {"neighbours": 10, "oversample": 10, "prop_iter": 1, "prop_coef": 1.0},
    },
    "train": {"gamma": 0.0},
}
# LAS with MME as its adaptation solver (their solver/MMEsolver.py: ADA.UNSUP_WT = 0.1)
METHODS["las_mme"] = {
    "active": {
        "strategy": "las",
        "params": {"aux_components": ["adversarial_entropy"], "aux_weight": 0.1},
    },
    "train": {"gamma": 0.0},
}

# LAS with LADA's anchor-set augmentation, random (RAA) or local (LAA): their
# solver/PAAsolver.py with LADA.A_K 10, A_TH 0.9; the anchor batch is the labeled-target term
for _m, _component in (("las_raa", "random_anchors"), ("las_laa", "local_anchors")):
    METHODS[_m] = {
        "active": {
            "strategy": "las",
            "params": {
                "aux_components": [_component],
                "anchor_neighbours": 10,
                "anchor_threshold": 0.9,
            },
        },
        "train": {"gamma": 0.0, "delta_t": 0.0},
    }

# LAS with MCC or CDAC as its semi-supervised solver (their solver/MCCsolver.py,
# solver/CDACsolver.py; issue 32). MCC's temperature 2.5 is the MCC paper's (LADA's code divides by
# MODEL.TEMP = 0.05: configs/lada_*.yaml set it); CDAC takes its own optimiser step a batch.
METHODS["las_mcc"] = {
    "active": {"strategy": "las", "params": {"aux_components": ["class_confusion"]}},
    "train": {"gamma": 0.0},
}
METHODS["las_cdac"] = {
    "active": {"strategy": "las", "params": {"aux_components": ["adaptive_clustering"]}},
    "train": {"gamma": 0.0},
}

# LAS with LADA's DANN solver (a discriminator on the logits + conditional entropy)
METHODS["las_dann"] = {
    "active": {"strategy": "las", "params": {"aux_components": ["logit_discriminator"]}},
    "train": {"gamma": 0.0},
}

METHOD_LABELS = {
    "source_only": "Source-only",
    "random": "Random",
    "eada": "EADA",
    "eada_no_fea": "EADA w/o L_fea",
    "random_fea": "Random + L_fea",
    "eada_no_f": "EADA w/o F",
    "eada_no_u": "EADA w/o U",
    "eada_centered": "EADA (centred F)",
    **_BASELINES,
    "duc": "DUC",
    "las": "LADA (LAS)",
    "las_mme": "LADA (LAS + MME)",
    "las_raa": "LADA (LAS + RAA)",
    "las_laa": "LADA (LAS + LAA)",
    "las_mcc": "LAS + MCC",
    "las_cdac": "LAS + CDAC",
    "las_dann": "LAS + DANN (LADA's)",
}


REFERENCE_METHODS = {"target_supervised": "Fully supervised target"}
"""Methods that are not active DA (a bound to compare with), with their table labels."""


BUILTIN_METHODS = frozenset(METHODS)
"""The methods eada defines (a plugin's method may not take one of these names)."""


def register_method(
    name: str,
    *,
    strategy: str,
    components: tuple[str, ...] | list[str] = (),
    params: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
    label: str | None = None,
    _module: str | None = None,
) -> dict[str, Any]:
    """Register a method preset: a strategy, the training components it trains and settings,
    under a name that ``eada bench --methods`` and ``eada run --method`` accept.

    Args:
        name: the method's name; a built-in method's name is refused.
        strategy: a registered strategy (``none``: no target labels).
        components: training components (``active.params.aux_components``); empty: the
            strategy's defaults.
        params: further ``active.params`` (validated like a config's: an unknown key is an
            error naming the accepted ones).
        settings: other config changes as nested sections, e.g.
            ``{"train": {"gamma": 0.0}}`` (plain NLL training, as the baselines).
        label: its name in tables (default: ``name``).

    Returns:
        The method's config changes (what :data:`METHODS` holds for it).

    Raises:
        ValueError: a taken name, an unknown strategy or component, or an unknown setting.
    """
    import sys

    from eada import plugins
    from eada.strategies import check_params, is_strategy
    from eada.strategies.components import component_params, get_component

    module = _module or str(sys._getframe(1).f_globals.get("__name__", ""))
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a method name must be an identifier, got {name!r}")
    if name in REFERENCE_METHODS or name in BUILTIN_METHODS:
        raise ValueError(plugins.collision_message("method", name, "eada.hparams", module))
    old = plugins.provider("method", name)
    if name in METHODS and old is not None and old.module != plugins.describe_module(module).module:
        raise ValueError(plugins.collision_message("method", name, old.module, module))
    if strategy != "none" and not is_strategy(strategy):
        raise ValueError(f"method {name!r}: unknown strategy {strategy!r}")
    for c in components:
        get_component(c)
    active_params = dict(params or {})
    if components:
        active_params["aux_components"] = list(components)
    try:
        check_params(strategy, active_params, also=component_params())
    except ValueError as err:
        raise ValueError(f"method {name!r}: {err}") from None
    settings = copy.deepcopy(settings or {})
    if not isinstance(settings, dict) or not all(isinstance(v, dict) for v in settings.values()):
        raise ValueError(
            f"method {name!r}: settings must map config sections to dicts, e.g. "
            "{'train': {'gamma': 0.0}}"
        )
    active = {**settings.pop("active", {}), "strategy": strategy}
    if active_params:
        active["params"] = active_params
    METHODS[name] = {"active": active, **settings}
    METHOD_LABELS[name] = label or name
    plugins.register_origin("method", name, module)
    return METHODS[name]


def get_method(name: str) -> dict[str, Any]:
    """The config changes of method ``name`` (a plugin's too: a name that is not built in is
    looked for in the installed plugins' entry points, ``eada.methods``).

    Raises:
        ValueError: unknown method, listing the known ones.
    """
    if name not in METHODS:
        from eada import plugins

        plugins.load_entry_points("method")
    if name not in METHODS:
        from eada.strategies import is_strategy

        if name not in REFERENCE_METHODS and is_strategy(name):
            return strategy_method(name)
        known = ", ".join([*METHODS, *REFERENCE_METHODS])
        raise ValueError(f"unknown method {name!r} (nor a strategy's name); known: {known}")
    return METHODS[name]


def strategy_method(strategy: str) -> dict[str, Any]:
    """The method of a strategy that no method names: the strategy with plain NLL training
    (``train.gamma: 0``, no alignment loss) and its default training components, as the
    paper's baselines run (so ``eada bench --methods my_strategy`` runs a plugin's strategy
    as a baseline)."""
    return {"active": {"strategy": strategy}, "train": {"gamma": 0.0}}


def method_label(method: str) -> str:
    """The table label of a method (``METHOD_LABELS`` or a reference method)."""
    return REFERENCE_METHODS.get(method) or METHOD_LABELS.get(method, method)


def variant_label(overrides: list[str]) -> str:
    """Short label of a sweep variant: ``active.alpha1=0.25`` -> ``alpha1=0.25``."""
    return ", ".join(
        o.split("=", 1)[0].rsplit(".", 1)[-1] + "=" + o.split("=", 1)[1] for o in overrides
    )


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with ``update`` merged in recursively (``update`` wins)."""
    out = copy.deepcopy(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def preset_dict(preset: str, method: str | None = None) -> dict[str, Any]:
    """The raw (unvalidated) config of ``preset`` with ``method``'s changes applied."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(sorted(PRESETS))}")
    raw = copy.deepcopy(PRESETS[preset])
    if method is not None:
        raw = deep_merge(raw, get_method(method))
    return raw


def preset_config(
    preset: str, method: str | None = None, seed: int = 0, overrides: list[str] | None = None
) -> ExperimentConfig:
    """A validated config: preset + method + ``key=value`` overrides, with ``seed``."""
    from eada.config import apply_overrides, parse_config

    raw = preset_dict(preset, method)
    raw["seed"] = seed
    apply_overrides(raw, overrides or [])
    return parse_config(raw, f"preset {preset!r}" + (f" with method {method!r}" if method else ""))
