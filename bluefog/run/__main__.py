"""``python -m bluefog.run -np N python train.py``: the same as the ``bfrun`` command."""

import sys

from bluefog.run.bfrun import main

sys.exit(main())
