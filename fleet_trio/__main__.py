from fleet_trio.cli import main

raise SystemExit(main())
