"""`python -m rlfleet ...`: the same command as the `rlfleet` console script."""

import sys

from rlfleet.cli import main

if __name__ == "__main__":
    sys.exit(main())
