"""`python -m tpu_autoscaler`: the same commands as the `tpu-autoscaler` script."""

import sys

from tpu_autoscaler.cli import main

sys.exit(main())
