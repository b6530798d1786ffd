"""The RayCluster as users write it: the model, reading it from a file, and the
worker groups' slice shapes with every problem named by field."""
