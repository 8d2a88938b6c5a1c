"""What a task image costs a rollout: the first pull (skopeo + umoci into the cache), then the start
of a sandbox from the cached image against one on the host's root (create, one command, close),
interleaved, median of R, in one run; and the disk each rollout adds (its writable layer) beside
the image's one shared copy. The image is assembled here (bash and coreutils from the host, as
tests/core/sandbox/test_images.py does) in an oci: layout.

    .venv/bin/python bench/images.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness_env.core.sandbox.cachebound import tree_bytes  # noqa: E402
from harness_env.core.sandbox.images import ensure_image, release_image  # noqa: E402
from harness_env.core.sandbox.local import create_local_sandbox  # noqa: E402
from tests.core.sandbox.test_images import _build_image  # noqa: E402  (the suite's image builder)

PROGRAMS = ("ls", "cat", "mkdir", "rm", "cp", "grep", "sed", "head", "tail", "env", "id", "timeout")
# Writes to the workspace and, where there is an image, to the image's own /data (its writable layer).
COMMAND = "mkdir -p out && echo hello > out/hello.txt && ls out >/dev/null && if [ -d /data ]; then echo x > /data/x; fi"


async def start(image: str | None) -> tuple[float, int]:
    """Seconds to create a sandbox, run COMMAND in it and close it; bytes the rollout held on disk
    (its directory: workspace, home, writable layer; not the image it shares)."""
    t0 = time.monotonic()
    sb = create_local_sandbox(image=image)
    try:
        r = await sb.exec(COMMAND, timeout=60)
        if r.exit_code != 0:
            raise SystemExit(f"image={image}: {r.stderr}")
        root = Path(sb.root)
        written = sum(tree_bytes(p) for p in root.iterdir() if p.name != "image")
        written += tree_bytes(root / "image" / "upper") if (root / "image").exists() else 0
    finally:
        await sb.close()
    return time.monotonic() - t0, written


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="harness-env-bench-")
    os.environ["HARNESS_ENV_SANDBOX_DIR"] = tmp + "/sandboxes"
    try:
        layout = _build_image(Path(tmp) / "image", programs=PROGRAMS, user="0:0")
        t0 = time.monotonic()
        image = ensure_image(layout)
        pull = time.monotonic() - t0
        release_image(image.digest)
        size = tree_bytes(Path(image.rootfs))
        await start(layout)  # warm-up
        await start(None)
        walls: dict[bool, list[float]] = {True: [], False: []}
        layers = []
        for _ in range(args.repeats):
            for with_image in (True, False):
                wall, written = await start(layout if with_image else None)
                walls[with_image].append(wall)
                if with_image:
                    layers.append(written)
        cached, host = statistics.median(walls[True]), statistics.median(walls[False])
        print(f"{os.cpu_count()} CPUs; image of {size / 1e6:.1f} MB ({len(PROGRAMS) + 1} programs and their libraries)")
        print(f"first pull + unpack into the cache: {pull:.2f} s")
        print(f"sandbox start + one command + close, median of {args.repeats}: cached image {cached:.3f} s, host root {host:.3f} s, ratio {cached / host:.2f}")
        print(
            f"disk per rollout (its directory and writable layer): {statistics.median(layers) / 1e3:.1f} kB; "
            f"the image's {size / 1e6:.1f} MB is one copy for all"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
