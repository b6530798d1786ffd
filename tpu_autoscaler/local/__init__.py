"""`tpu-autoscaler local`: a real Ray head with a simulated Kubernetes control plane."""
