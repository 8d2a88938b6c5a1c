"""Harbor backend: Harbor task directories, Harbor's agents and sandbox providers, our capture.

Harbor itself is the optional extra `harbor` (pinned 0.26.0); nothing here imports it at module
level except the modules that subclass its types (agents, local_env).
"""

import os

# Harbor imports LiteLLM, which otherwise fetches a model price table from the internet at import
# (and retries with sleeps when offline); the bundled copy is enough for us.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
