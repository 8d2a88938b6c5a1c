# harness-env as a Hugging Face Space (or any container host): one port, $PORT (default 7860).
# Set HARNESS_ENV_TOKEN (a Space secret) - the server refuses a public address without one -, or
# HARNESS_ENV_ALLOW_UNAUTHENTICATED=1 when something in front of it already checks access.
FROM python:3.12-slim-bookworm

# npm brings the harness CLIs (and Node 22, which `harness-env install` fetches as a package when
# the system Node is older); bubblewrap isolates rollouts where the container allows namespaces;
# Chromium renders svg_icon submissions (grading and the agent's preview).
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap socat nodejs npm git ca-certificates procps chromium fonts-dejavu-core \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir uv

RUN useradd --create-home --uid 1000 user
USER user
ENV HOME=/home/user \
    PATH=/home/user/app/.venv/bin:$PATH \
    HARNESS_ENV_TOOLS_DIR=/home/user/tools \
    UV_PYTHON_DOWNLOADS=never \
    PORT=7860
WORKDIR /home/user/app

COPY --chown=user . .
# The pinned harness versions come from one table (core/toolchain.py PINS) through `harness-env install`.
RUN uv sync --locked --no-dev --extra server --extra harbor && harness-env install

EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PORT', '7860'), timeout=5)"
CMD ["sh", "-c", "exec harness-env serve --host 0.0.0.0 --port ${PORT:-7860}"]
