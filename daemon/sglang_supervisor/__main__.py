from sglang_supervisor.cli import main

raise SystemExit(main())
