"""The ``fleet-trio worker`` configuration: the rc ``/etc/rc/worker.yaml``, read unchanged.

- :mod:`~fleet_trio.worker.config.model`: the settings (attrs classes, defaults, the listen
  guard, ``CUDA_VISIBLE_DEVICES`` and the hook environment);
- :mod:`~fleet_trio.worker.config.loader`: the YAML, typed as Go's yaml.v3 types it, and the
  keyed errors.
"""

from fleet_trio.worker.config import loader, model
from fleet_trio.worker.config.loader import *  # noqa: F403  (the package's API: both modules')
from fleet_trio.worker.config.model import *  # noqa: F403

__all__ = [*model.__all__, *loader.__all__]
