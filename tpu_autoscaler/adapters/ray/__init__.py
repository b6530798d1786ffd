"""Ray at the edge: the GCS (read state, drain, report), Ray's state read into the
core model, Ray 2.60's own autoscaler as a baseline, and the policy behind Ray's
provider and scheduler interfaces for users who keep Ray's loop."""
