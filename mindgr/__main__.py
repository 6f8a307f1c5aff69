import sys

from mindgr.cli import main

sys.exit(main())
