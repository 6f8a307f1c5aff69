"""`python -m mindgr.datasets KIND SRC OUT [--lenient]`: prepare a store from the command line."""
import sys

from .prepare import main

sys.exit(main())
