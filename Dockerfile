# The one tidegate image: `tidegate operator`, `tidegate scaler`, `tidegate admission`, ...
#   docker build -t REGISTRY/tidegate:0.1.0 . && docker push REGISTRY/tidegate:0.1.0  (tidegate publishes no image)
# Stage 1 installs the wheel and its dependencies into a venv (all have manylinux wheels, so no
# compiler is needed); stage 2 copies only that venv onto the same pinned base and runs as 65532.

FROM python:3.11.14-slim-trixie AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/tidegate
# .dockerignore admits only pyproject.toml, README.md and the package folders.
COPY . .
RUN /opt/tidegate/bin/pip install --no-compile . \
    && /opt/tidegate/bin/python -m compileall -q /opt/tidegate/lib \
    && /opt/tidegate/bin/pip uninstall -y pip

FROM python:3.11.14-slim-trixie
LABEL org.opencontainers.image.title="tidegate" \
      org.opencontainers.image.description="Admission control and reject-rate autoscaling for LLM inference on Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
# The base image's own pip/setuptools are build tools: the final stage does not need them.
RUN python -m pip uninstall -y pip setuptools wheel
COPY --from=builder /opt/tidegate /opt/tidegate
ENV PATH="/opt/tidegate/bin:${PATH}" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
WORKDIR /tmp
# 8081: admission sidecar, 9090: scaler gRPC, 9091: scaler metrics, 8080: operator liveness,
# 8082: operator metrics (the chart's operator.metricsPort).
EXPOSE 8080 8081 8082 9090 9091
ENTRYPOINT ["tidegate"]
CMD ["--help"]
