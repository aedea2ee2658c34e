from llmledger.cli import main

raise SystemExit(main())
