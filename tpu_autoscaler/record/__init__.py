"""`record`: a running cluster's history as a workload trace. `history.py` holds what
was read, `trace.py` turns it into a trace; the reading is `adapters/ray/history.py`."""
