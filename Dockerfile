# One image for every Tidegate process; docker-compose.yml picks the subcommand.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tidegate ./tidegate
COPY agent ./agent
COPY controlplane ./controlplane
COPY router ./router
COPY simulator ./simulator
COPY fleetsim ./fleetsim
RUN pip install --no-cache-dir .
ENTRYPOINT ["tidegate"]
