from filter.cli import main

raise SystemExit(main())
