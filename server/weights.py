"""PUT /policy/weights: a trainer tells the server the policy's weight version, and announces a
weight sync (core/capture/weights.py). Every captured turn records the version current when it
was sent; while a sync is announced, new engine calls wait for its end (calls in flight go on).

With several servers (replicas), each has its own proxy: the client tells every one of them.
"""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel, Field, model_validator

from harness_env.core.capture.weights import WeightVersions


class WeightsUpdate(BaseModel):
    version: int | None = Field(None, ge=0, le=2**53, description="the policy's weight version from now on")
    syncing: bool | None = Field(None, description="true: a weight sync begins (new engine calls wait); false: it ended")

    @model_validator(mode="after")
    def _says_something(self) -> WeightsUpdate:
        if self.version is None and self.syncing is None:
            raise ValueError('give "version", "syncing" or both, e.g. {"version": 3}')
        return self


class WeightsState(BaseModel):
    version: int | None = Field(description="the policy's weight version (null: none announced)")
    syncing: bool = Field(description="a weight sync is under way: new engine calls wait for its end")
    held: int = Field(0, description="engine calls waiting for the sync's end now")


def add_weight_routes(app: FastAPI, weights: WeightVersions) -> None:
    def state() -> WeightsState:
        return WeightsState(version=weights.version, syncing=weights.syncing, held=weights.held)

    @app.put("/policy/weights", response_model=WeightsState)
    async def set_weights(update: WeightsUpdate) -> WeightsState:
        """Set the policy's weight version, begin a weight sync (`syncing: true`) or end one
        (`syncing: false`, with the new version)."""
        weights.update(update.version, update.syncing)
        return state()

    @app.get("/policy/weights", response_model=WeightsState)
    async def get_weights() -> WeightsState:
        """The policy's weight version as last announced, and whether a sync is under way."""
        return state()
