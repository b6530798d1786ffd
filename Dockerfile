# tpu-autoscaler image: Ray 2.60.0 plus this package, for the `autoscaler` container
# KubeRay adds to the head pod. See docs/install.md.
#
# The tag carries `-py311`: the untagged rayproject/ray images use Python 3.10 (Ray's
# docker/ray/README.md), and this package requires Python >= 3.11.
ARG RAY_IMAGE=rayproject/ray:2.60.0-py311
FROM ${RAY_IMAGE}

# Only what `pip install` needs. Owned by the base image's user (ray, uid 1000, gid
# 100), which is also the user this image runs as: setuptools writes build files
# into the source directory.
COPY --chown=1000:100 pyproject.toml README.md /tmp/tpu-autoscaler/
COPY --chown=1000:100 tpu_autoscaler /tmp/tpu-autoscaler/tpu_autoscaler

# ray[default] 2.60.x is already installed in the base image, so pip keeps it.
# The checks fail the build if the image would run as root or the entry point is missing.
RUN test "$(id -u)" != 0 \
    && pip install --no-cache-dir /tmp/tpu-autoscaler \
    && rm -rf /tmp/tpu-autoscaler \
    && tpu-autoscaler --version \
    && python -c "import ray; assert ray.__version__.startswith('2.60.'), ray.__version__"

# No USER line (the base image's non-root user stays in effect) and no ENTRYPOINT:
# KubeRay sets the container's command and args (autoscalerOptions.command/args).
