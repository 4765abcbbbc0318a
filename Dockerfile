# minipulsar: one image for every process of the geo demo (etcd servers,
# bookies, brokers, the one-shot geo-setup); see docker-compose.yml, generated
# from deploy/geo.toml by `minipulsar geo compose > docker-compose.yml`.
# Installs the package without the Spark extra (and without the demo data),
# and Debian's etcd-server for the metadata and configuration stores.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# etcd (Debian's etcd-server, as scripts/setup.sh installs on the host)
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends etcd-server \
    && rm -rf /var/lib/apt/lists/* \
    && etcd --version

# dependencies first (their layer is reused while only the sources change)
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && python -m pip install -r /tmp/requirements.txt

COPY README.md ./
COPY proto ./proto
COPY bookie ./bookie
COPY broker ./broker
COPY client ./client
COPY deploy ./deploy
RUN python -m pip install --no-deps . && minipulsar --help > /dev/null

# broker gRPC, broker HTTP /metrics, bookie, etcd client and peer
EXPOSE 6600 8080 3181 2379 2380
CMD ["minipulsar", "--help"]
