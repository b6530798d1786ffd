import sys

from tpu_autoscaler.cli import main

sys.exit(main())
