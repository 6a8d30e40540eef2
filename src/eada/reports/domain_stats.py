"""The source-vs-target statistics the report draws, recorded during a run by a trainer callback.

Their home is :mod:`eada.train.domain_stats` (the recorder is a trainer callback like those of
:mod:`eada.train.logging`, and :func:`eada.experiment.run_once` adds one by default); the names
stay importable from here for the report code and older imports.
"""

from eada.train.domain_stats import (
    STATS_VERSION,
    DomainStatsRecorder,
    mmd2_rbf,
    proxy_a_distance,
)

__all__ = ["STATS_VERSION", "DomainStatsRecorder", "mmd2_rbf", "proxy_a_distance"]
