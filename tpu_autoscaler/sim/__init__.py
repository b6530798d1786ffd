"""The simulated cluster on a virtual clock, on the control plane of `controlplane/`:
GKE provisioning, Ray nodes as Ray derives them from each pod's environment and the
work they run, the GCS view of both, a workload, and the autoscaler's rounds. A
package beside the core, used by tests, benchmarks and the CLI."""
