"""The app's routes by subject, each an APIRouter (or, for what is not FastAPI's, an ASGI wrapper)
that server/app.py assembles: rollout.py POST /rollout, catalog.py the harnesses, their tasks and
the endpoint catalog, health.py the front page, /metrics and what /health reports, errors.py how
errors answer, capture.py the capture proxy's mount at /capture."""
