"""The simulated cluster: Kubernetes objects as KubeRay and the TPU webhook make
them, Ray nodes as Ray derives them from each pod's environment, and the GCS view
of both. A package beside the core, used by tests, benchmarks and the CLI."""
