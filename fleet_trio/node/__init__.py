"""``fleet-trio node``: the node side of the fleet-dispatcher CONTRACT v2 (spec/node.md).

- :mod:`fleet_trio.node.jobs`: the job table (sans-IO) and store (trio shell, janitor, the
  task tree's drain hooks);
- :mod:`fleet_trio.node.journal`: the job journal (SQLite, group commits);
- :mod:`fleet_trio.node.recovery`: what a restarted node does with its journal;
- :mod:`fleet_trio.node.linger`: the poll linger after the drain;
- :mod:`fleet_trio.node.wire`: wire types, dispatch parsing, exact messages;
- :mod:`fleet_trio.node.config`: the node YAML, identity, the listen guard;
- :mod:`fleet_trio.node.tasks`: the YAML task registry and the executor;
- :mod:`fleet_trio.node.app`: the quart-trio app (three routes);
- :mod:`fleet_trio.node.server`: ``serve_node`` wired into the task tree.

See docs/node.md.
"""
