# The service alone, as production runs it: `python -m service serve`.
# Stage 1 builds the wheel (package data included: the top-level config/,
# content/ and templates/, mapped into the package, static, Lua); the runtime
# image installs only that wheel, no source tree, and its dependencies exactly
# as requirements.lock pins and hashes them (`make lock`).
FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY service ./service
COPY config ./config
COPY content ./content
COPY templates ./templates
RUN pip wheel --no-deps --wheel-dir /wheels . \
    && cp requirements.lock /wheels/

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    STUDIO_HOST=0.0.0.0 \
    STUDIO_PORT=8080 \
    STUDIO_MEDIA_DIR=/data/media

# /data/media keeps media when no bucket is set (compose sets one: SeaweedFS);
# mount a volume there shared by app and worker to run without one.
# Every dependency pinned and checked against its hash, prebuilt wheels only;
# then the service's wheel, which brings nothing else in.
# Bytecode is compiled here, for the level every process runs at
# (PYTHONOPTIMIZE=2, below): the base image ships its standard library without
# any, and nothing may write it at run time (PYTHONDONTWRITEBYTECODE, a
# read-only /usr/local for the studio user), so each process would otherwise
# compile every module it imports, each time it starts.
COPY --from=build /wheels /wheels
RUN pip install --require-hashes --only-binary=:all: -r /wheels/requirements.lock \
    && pip install --no-deps /wheels/*.whl \
    && rm -rf /wheels \
    && python -m compileall -q -j0 -o 2 /usr/local/lib/python3.11 \
    && useradd --system --uid 10001 --no-create-home studio \
    && mkdir -p /data/media && chown studio /data/media

# No docstrings or asserts in memory: `serve` holds 2.3 MB less (bench/memory.py).
ENV PYTHONOPTIMIZE=2

WORKDIR /app
USER studio
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status != 200)"]
CMD ["python", "-m", "service", "serve"]
