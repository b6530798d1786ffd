"""The pure core: the model of slices, demand and a cluster snapshot, and the policy
that turns a snapshot into a plan. Nothing here imports Ray, Kubernetes or the shell."""
