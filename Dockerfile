# syntax=docker/dockerfile:1
#
# pubsub-filter: a small, non-root image with the project installed in a venv.
#
#   make image      # docker build --build-arg VERSION=<filter/pubsub_filter/_version.py> -t pubsub-filter:<version> .
#   docker run --rm -p 8080:8080 -v "$PWD/filter.yaml:/etc/pubsub-filter/filter.yaml:ro" pubsub-filter
#
# The config is read from $PUBSUB_FILTER_CONFIG (mounted from Secret Manager on Cloud
# Run); the push endpoint listens on $PORT (Cloud Run sets it; default 8080).

# The base image of both stages. A tag moves when Debian or CPython ship a patch; for a
# build that is the same every time, pin it by digest (infra/README.md, "Pin the base image"):
#   --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest>
# `docker buildx imagetools inspect python:3.11.13-slim-bookworm` prints the digest.
# checkov:skip=CKV_DOCKER_7:the base is PYTHON_IMAGE, a versioned tag by default and pinned by digest at build time
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# --- build: the pinned dependencies, then a wheel of the project, into /opt/venv --------
FROM ${PYTHON_IMAGE} AS builder

# The package's version (filter/pubsub_filter/_version.py), passed by `make image` and infra/cloudbuild.yaml:
# the build fails below unless it is the version of the wheel, so the label cannot lie.
ARG VERSION

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src

# The dependencies first, keyed on requirements.lock alone: an edit to the code or the docs
# reuses this layer (grpcio and the rest are not reinstalled), and every build of a commit
# gets the same versions. Only the runtime dependencies with the gcp extra (the Firestore and
# BigQuery clients, which a bare `pip install pubsub-filter` leaves out): no test extra, no
# build tools in the venv. pip byte-compiles what it installs, so a cold start does not
# compile every import (the runtime sets PYTHONDONTWRITEBYTECODE and cannot write there anyway).
COPY requirements.lock ./
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --compile --no-deps -r requirements.lock

# Then the project itself, with --no-deps: its dependencies are the lock's, and `pip check`
# fails the build if the lock no longer satisfies pyproject.toml. Then its gcp extra (the
# Firestore and BigQuery backends), from the packages already there alone (--no-index): a
# client the lock lacks fails the build rather than being fetched unpinned.
COPY pyproject.toml README.md LICENSE ./
COPY filter ./filter
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && /opt/venv/bin/pip install --no-cache-dir --compile --no-deps /wheels/pubsub_filter-*.whl \
    && /opt/venv/bin/pip check \
    && built="$(/opt/venv/bin/pubsub-filter --version)" \
    && if [ "$built" != "pubsub-filter ${VERSION}" ]; then \
         echo "VERSION=${VERSION} but the wheel says '$built': build with make image" >&2; exit 1; fi \
    && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels "pubsub-filter[gcp]==${VERSION}" \
    && /opt/venv/bin/pip uninstall --yes pip setuptools

# --- runtime: python slim + the venv, nothing else ---------------------------------------
FROM ${PYTHON_IMAGE}

ARG PYTHON_IMAGE
ARG VERSION
LABEL org.opencontainers.image.title="pubsub-filter" \
      org.opencontainers.image.description="Pub/Sub sidecar that forwards a message only when its content changed" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

ENV PATH="/opt/venv/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PORT=8080 \
    PUBSUB_FILTER_CONFIG=/etc/pubsub-filter/filter.yaml

# A fixed, unprivileged uid/gid (10001) so platforms can check runAsNonRoot. The working
# directory is the only writable place: the embedded SQLite state and outbox go there
# when the config uses them.
RUN groupadd --gid 10001 filter \
    && useradd --no-log-init --uid 10001 --gid filter --home-dir /var/lib/pubsub-filter \
       --no-create-home --shell /usr/sbin/nologin filter \
    && mkdir -p /etc/pubsub-filter /var/lib/pubsub-filter \
    && chown filter:filter /var/lib/pubsub-filter

COPY --from=builder /opt/venv /opt/venv

WORKDIR /var/lib/pubsub-filter
USER 10001:10001
EXPOSE 8080

# /healthz answers without touching the store. Cloud Run ignores HEALTHCHECK and uses
# the probes Terraform sets; this serves `docker run` and compose. A pull worker run from
# this image (different CMD) should be started with --no-healthcheck.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8080'), timeout=4)"]

# Exec form: pubsub-filter is PID 1 and receives SIGTERM directly (the whole stop fits in
# server.shutdown_budget, 8 s by default, then it exits 0).
ENTRYPOINT ["pubsub-filter"]
CMD ["serve"]
