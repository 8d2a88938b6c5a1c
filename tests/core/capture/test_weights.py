"""The weight version and announced syncs, as the proxy's engine calls see them."""

import asyncio

from harness_env.core.capture.weights import CHECK_S, WeightVersions


async def test_a_held_call_goes_on_when_the_sync_ends_or_its_rollout_is_gone():
    weights = WeightVersions()
    weights.update(3)
    assert await weights.current() == 3  # no sync: at once
    weights.update(syncing=True)
    held = asyncio.ensure_future(weights.current())
    await asyncio.sleep(0.2)
    assert not held.done()
    weights.update(4, syncing=False)
    assert await held == 4  # sampled by the new weights
    weights.update(syncing=True)
    gone = False
    abandoned = asyncio.ensure_future(weights.current(lambda: gone))
    await asyncio.sleep(CHECK_S * 2)  # held past its first look
    assert not abandoned.done() and weights.held == 1
    gone = True  # the rollout ended while its call was held: it stops waiting at its next look
    assert await asyncio.wait_for(abandoned, 5) == 4 and weights.syncing and weights.held == 0


async def test_a_sync_never_ended_holds_calls_at_most_max_sync_s():
    weights = WeightVersions(max_sync_s=0.3)
    weights.update(1, syncing=True)
    assert await asyncio.wait_for(weights.current(), 5) == 1
