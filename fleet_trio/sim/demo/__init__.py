"""``fleet-trio demo``: a whole fleet on one box, no GPU, no configuration (docs/demo.md).

One process, one ``trio.run``: the simulated rc controller, a ``fleet-trio worker`` with two
fake devices, a ``fleet-trio node`` with two example task types, the simulated fleet
dispatcher, and fake GPUs (directories, see ``fleet_trio.gpu.fake``). Jobs are real child
processes. Everything the demo needs (node and worker YAML, the job scripts of ``jobs/``, a
verify hook) is written into a fresh temporary directory, so it runs from an installed wheel.

A scripted story then runs step by step; each step states the outcome it expects, observes
what actually happened (through the controller's records, the dispatcher's polls, the node's
job table or ``/proc``) and the demo exits 1 when any observation differs. Live output of
every job is followed over the real websocket tails and printed with the job's name in front.

Each module's docstring says what it holds. :mod:`~.command` (the parser) is light: the CLI
imports it alone, and nothing is re-exported here.
"""
