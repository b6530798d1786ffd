"""What the commands exit with: 2 for bad input (every problem named), never a traceback."""

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
