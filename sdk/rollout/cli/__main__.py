"""`python -m rollout.cli`: the same as the `rollout` console script."""

import sys

from rollout.cli import main

sys.exit(main())
