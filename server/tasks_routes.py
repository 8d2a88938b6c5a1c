"""GET /tasks?harness=&dataset=&split=: a dataset's tasks as a harness that brings its own lists
them, any harness by name or, without one, the first registered harness that lists tasks (what a
client asks when it names none; the built-in one that does is Harbor). GET /<harness>/tasks is
the same listing with the harness in the path (server/app.py)."""

from __future__ import annotations

from typing import Protocol

from fastapi import FastAPI, HTTPException, Query

from harness_env.core.registry import HARNESSES
from harness_env.models import DatasetTaskInfo


class ListsTasks(Protocol):
    def list_tasks(self, dataset: str = "", split: str | None = None, harness: str | None = None) -> list[DatasetTaskInfo]: ...


def add_task_routes(app: FastAPI, service: ListsTasks) -> None:
    @app.get("/tasks", response_model=list[DatasetTaskInfo])
    def tasks(
        harness: str | None = Query(None, max_length=64, description="a harness that brings tasks of its own (GET /harnesses); none: the first that does"),
        dataset: str = Query("", max_length=1024, description="dataset directory, relative to the harness's tasks root (empty: that root)"),
        split: str | None = Query(None, max_length=128, description="a subdirectory of the dataset"),
    ) -> list[DatasetTaskInfo]:
        """The tasks of a dataset as the harness lists them (its `list_tasks`), in the order its
        task index counts them; 404 for an unknown harness, 422 for one that brings none."""
        if harness and harness not in HARNESSES:
            raise HTTPException(404, f"no harness {harness[:64]!r}")
        return service.list_tasks(dataset, split or None, harness or None)  # a plain def: FastAPI runs it off the event loop
