"""The task tree: named nested scopes (services, role, jobs), the shutdown coordinator, signals.

See ``docs/task-tree.md`` and design.md §3. The package exports what its two modules export
(their ``__all__``), from one place each.
"""

from fleet_trio.nursery import signals, tree
from fleet_trio.nursery.signals import *  # noqa: F403
from fleet_trio.nursery.tree import *  # noqa: F403

__all__ = [*signals.__all__, *tree.__all__]
