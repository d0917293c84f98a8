# The control plane image: web (granian, serving the WSGI app), worker and beat share it.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 REGATTA_STATE_DIR=/var/lib/regatta
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends libpq5 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY worker_image ./worker_image
COPY controlplane ./controlplane
COPY accounts ./accounts
COPY clusters ./clusters
COPY jobs ./jobs
COPY checkpoints ./checkpoints
COPY notifications ./notifications
COPY frontend ./frontend
COPY cli ./cli
COPY manage.py ./
# No torch: consolidating a model and the preflight collective run in the
# worker image; the control plane reads checkpoints through the worker
# package's torch-free storage modules.
RUN pip install './worker_image[s3]' . \
    && python manage.py collectstatic --noinput
RUN useradd --system --uid 10001 regatta && mkdir -p /var/lib/regatta && chown regatta /var/lib/regatta
USER regatta
EXPOSE 8000
CMD ["granian", "--interface", "wsgi", "--no-ws", "--host", "0.0.0.0", "--port", "8000", \
     "--workers", "4", "--blocking-threads", "4", "--respawn-failed-workers", \
     "--factory", "controlplane.wsgi:serve"]
