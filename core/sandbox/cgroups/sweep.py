"""Removing what a dead server left: at start-up, the rollout cgroups of servers that no longer
run are killed and removed; those of live servers (this one included) are left alone."""

from __future__ import annotations

import os

from harness_env.core.sandbox.cgroups.layout import Layout, detect, owner_alive, owner_name, remove_parents
from harness_env.core.sandbox.cgroups.rollout import RolloutCgroup
from harness_env.core.sandbox.cgroups.values import ResourceLimits


def _attach(layout: Layout, owner: str, name: str) -> RolloutCgroup:
    """A RolloutCgroup for an existing directory (a leftover), with unknown limits."""
    dirs = {c: p / owner / name for c, p in layout.parents.items() if (p / owner / name).is_dir()}
    return RolloutCgroup(layout, name, ResourceLimits(None, None, None), dirs)


def sweep_stale(prefix: str = "rollout-") -> list[str]:
    """Kill and remove the rollout cgroups of servers that are no longer running (call at server
    start). The cgroups of live servers, this one included, are left alone. Never raises; returns
    one sentence per cgroup removed or left."""
    layout, _ = detect()
    return [] if layout is None else _sweep(layout, prefix)


def _sweep(layout: Layout, prefix: str) -> list[str]:
    notes: list[str] = []
    owners: set[str] = set()
    for parent in layout.dirs:
        try:
            owners.update(e.name for e in os.scandir(parent) if e.is_dir())
        except OSError:
            continue
    for owner in sorted(owners):
        if owner == owner_name() or owner_alive(owner):
            continue
        names: set[str] = set()
        for parent in layout.dirs:
            try:
                names.update(e.name for e in os.scandir(parent / owner) if e.is_dir() and e.name.startswith(prefix))
            except OSError:
                continue
        for name in sorted(names):
            cg = _attach(layout, owner, name)
            try:
                killed = cg.kill_all()
            except OSError as e:
                killed = 0
                cg.notes.append(f"cgroup {name}: kill failed: {e}")
            for d in cg.dirs:
                try:
                    d.rmdir()
                except OSError as e:
                    cg.notes.append(f"cgroup {name}: could not remove {d} ({e.strerror})")
            notes.extend(cg.notes or [f"removed stale cgroup {owner}/{name} ({killed} process(es) killed)"])
        remove_parents(layout, owner)
    return notes
