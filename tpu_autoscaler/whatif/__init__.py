"""What-if capacity planning: a grid of cluster and provisioning settings x seeds run
through the simulator (as Ray tasks, resumable), summarised per setting with the
Pareto front of idle chip-hours against p95 wait."""
