from pubsub_filter.cli import main

raise SystemExit(main())
