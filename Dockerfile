# harness-env as a Hugging Face Space (or any container host): one port, $PORT (default 7860).
# Set HARNESS_ENV_TOKEN (a Space secret) - the server refuses a public address without one -, or
# HARNESS_ENV_ALLOW_UNAUTHENTICATED=1 when something in front of it already checks access.
# Layers from the least to the most often changed: system packages, the Python dependencies (from
# pyproject.toml and uv.lock only), then the source: a code change rebuilds the last layer only.
FROM python:3.12-slim-bookworm

# npm brings the harness CLIs (and Node 22, which `harness-env install` fetches as a package when
# the system Node is older); bubblewrap isolates rollouts where the container allows namespaces;
# Chromium renders svg_icon submissions (grading and the agent's preview). uv is pinned.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap socat nodejs npm git ca-certificates procps chromium fonts-dejavu-core \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir uv==0.13.9

# A Space runs the container as uid 1000: everything the server writes is under its HOME.
RUN useradd --create-home --uid 1000 user && install -d -o user -g user /home/user/app
USER user
ENV HOME=/home/user \
    PATH=/home/user/app/.venv/bin:$PATH \
    HARNESS_ENV_TOOLS_DIR=/home/user/tools \
    UV_CACHE_DIR=/home/user/.cache/uv \
    NPM_CONFIG_CACHE=/home/user/.npm \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    PORT=7860
WORKDIR /home/user/app

# The dependencies alone (what `./dev serve` installs: the server and Harbor extras, no dev group).
COPY --chown=user pyproject.toml uv.lock .python-version ./
RUN uv sync --locked --no-install-project --no-dev --extra server --extra harbor && uv cache clean

# The project itself, installed as its wheel (not editable, as tests/test_wheel_install.py installs it),
# then the pinned harness CLIs from their pins (each harness class's `pin`, gathered by core/toolchain.py) through `harness-env install`.
COPY --chown=user . .
RUN uv sync --locked --no-editable --no-dev --extra server --extra harbor \
    && uv cache clean \
    && harness-env install \
    && npm cache clean --force

EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PORT', '7860'), timeout=5)"
CMD ["sh", "-c", "exec harness-env serve --host 0.0.0.0 --port ${PORT:-7860}"]
