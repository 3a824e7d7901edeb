# syntax=docker/dockerfile:1
# fencing-guard: lease server, guard and CLI in one image.
#
#   docker build -t fencing-guard .
#   docker run -d --name fencing -v fencing-data:/var/lib/fencing \
#       -p 50051:50051 -p 50052:50052 fencing-guard                  # fencing serve on SQLite
#
# The counters and fences live in /var/lib/fencing: keep it on a named volume. A
# container replaced without it starts every counter at 1 again (tokens repeat, and
# a stale owner's write is accepted); fencing serve logs a WARNING on a new data dir.
#
# Stage 1 installs the project and its runtime dependencies (all wheels: grpcio,
# psycopg[binary], redis, hiredis) into a virtualenv; stage 2 is a clean slim image
# with only that virtualenv, no compiler or build tools, running as a non-root user.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/fencing
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY fencing ./fencing
COPY fencingctl ./fencingctl
COPY serving ./serving
COPY lease_server ./lease_server
COPY guard ./guard
COPY chaos ./chaos
COPY console ./console
# constraints.txt pins every runtime dependency (scripts/gen_constraints.py), so the
# same source builds the same image.
RUN /opt/fencing/bin/pip install -c constraints.txt ".[postgres,redis]"

FROM python:3.11-slim
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin fencing \
    && mkdir -p /var/lib/fencing \
    && chown fencing:fencing /var/lib/fencing
COPY --from=build /opt/fencing /opt/fencing
ENV PATH=/opt/fencing/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    FENCING_DATA_DIR=/var/lib/fencing
WORKDIR /var/lib/fencing
USER 10001:10001
# Declared after the chown above, so a new named volume starts owned by the user.
VOLUME ["/var/lib/fencing"]
EXPOSE 50051 50052 9100
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["fencing", "healthcheck", "127.0.0.1:50051", "127.0.0.1:50052"]
CMD ["fencing", "serve", "--lease-listen", "0.0.0.0:50051", "--guard-listen", "0.0.0.0:50052", \
     "--metrics-port", "9100", "--metrics-host", "0.0.0.0", "--insecure"]
