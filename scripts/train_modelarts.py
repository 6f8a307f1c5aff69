"""ModelArts boot file: `--data_url` / `--train_url` plus mindgr train arguments (see mindgr.parallel.modelarts
and docs/distributed.md). Runs anywhere: without moxing both URLs are local paths."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # code dir uploaded as-is

from mindgr.parallel.modelarts import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
