from fleet_trio.cli import entry

raise SystemExit(entry())
