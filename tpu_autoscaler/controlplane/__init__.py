"""The Kubernetes side of the world as the simulator and local mode share it: an
object store with the API server's rules, KubeRay v1.7.0's operator, the GKE TPU
webhook, a TPU container's environment, and the event queue they run on."""
