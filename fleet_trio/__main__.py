from fleet_trio.launch import entry

raise SystemExit(entry())
