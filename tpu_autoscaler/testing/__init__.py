"""Builders for tests, benchmarks and the example files, not product code: no module
of the product imports this package. `scenarios.py` makes snapshot files from a few
lines of description; `python -m tpu_autoscaler.testing.scenarios DIR` writes the
files under `examples/snapshots/`."""
