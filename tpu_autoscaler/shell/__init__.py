"""The imperative shell around the pure policy: one round (read, plan, drain, guarded
patch), what it announces, and the `run` process that repeats it."""
