import sys

from vitbench.cli.main import main

sys.exit(main())
