"""What the server offers: GET /harnesses (installed versions), GET /<harness>/tasks (a dataset's
tasks, as a harness that brings its own lists them), GET /catalog (the named endpoints)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query
from fastapi import Path as PathParam

from harness_env.core.registry import HARNESSES
from harness_env.models import DatasetTaskInfo, HarnessInfo
from harness_env.server.service import RolloutService

router = APIRouter()


@router.get("/harnesses", response_model=list[HarnessInfo])
async def harnesses() -> list[HarnessInfo]:
    return RolloutService.list_harnesses()


@router.get("/{harness}/tasks", response_model=list[DatasetTaskInfo])
def harness_tasks(
    harness: str = PathParam(max_length=64, description="a harness that brings tasks of its own (GET /harnesses)"),
    dataset: str = Query("", max_length=1024, description="dataset directory, relative to the harness's tasks root (empty: that root)"),
    split: str | None = Query(None, max_length=128, description="a subdirectory of the dataset"),
) -> list[DatasetTaskInfo]:
    """The tasks of a dataset as the harness lists them (its `list_tasks`), in the order its
    task index counts them; 404 for an unknown harness, 422 for one that brings none."""
    if harness not in HARNESSES:
        raise HTTPException(404, f"no harness {harness[:64]!r}")
    return RolloutService.list_tasks(dataset, split or None, harness)  # a plain def: FastAPI runs it off the event loop


@router.get("/catalog")
async def catalog() -> list[dict]:
    return RolloutService.catalog()
