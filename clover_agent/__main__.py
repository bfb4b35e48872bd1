from clover_agent.cli import main

raise SystemExit(main())
