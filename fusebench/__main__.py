import sys

from fusebench.cli import main

sys.exit(main())
