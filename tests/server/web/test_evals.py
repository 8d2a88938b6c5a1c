"""The Evals view of /web in real headless Chromium: two evals of a few tasks x 4 attempts, run
from the CLI into a data directory, shown by a server on that directory with summary.json's
numbers; a run's rollouts filtered; the two runs compared; /web/?eval=ID. Takes docs/evals.png."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness_env.evals.report import headline
from tests.fakes.policy import FakePolicyServer
from tests.server.web.driver import LOAD_TIMEOUT_MS, WebDriver
from tests.server_process import ServerProcess
from tests.test_cli_eval import PerTaskPolicy, _task, _write_jsonl

pytestmark = pytest.mark.e2e
DOCS = Path(__file__).resolve().parents[3] / "docs"
TASKS = [_task("always", ["test -f out.txt"]), _task("never", ["test -f out.txt"]), _task("half", ["test -f out.txt"]), _task("down", ["test -f out.txt"])]
EASIER = [*TASKS[:1], _task("never", ["true"]), *TASKS[2:3]]  # B: "never" always passes, "down" left out


def run_eval(policy, tasks: list[dict], out: Path, data_dir: Path, model: str) -> dict:
    path = _write_jsonl(out.parent / f"{out.name}.jsonl", tasks)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness_env.cli",
            "eval",
            str(path),
            "--harness",
            "whitebox",
            "--base-url",
            policy.base_url,
            "--model",
            model,
            "--out",
            str(out),
            "-n",
            "4",
            "--concurrency",
            "4",
            "--data-dir",
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    return json.loads((out / "summary.json").read_text())


def cells(web: WebDriver, selector: str) -> list[list[str]]:
    return web.page.evaluate(
        """(sel) => [...document.querySelectorAll(sel + ' tbody tr')]
        .map(tr => [...tr.querySelectorAll('td')].map(td => td.innerText.trim()))""",
        selector,
    )


def pm(mean, se) -> str:
    return "-" if mean is None else f"{mean:.3f} ± {'-' if se is None else f'{se:.3f}'}"


@pytest.fixture(scope="module")
def evals(tmp_path_factory):
    """Two eval runs recorded in one data directory, and a server showing it."""
    root = tmp_path_factory.mktemp("evals")
    data_dir = root / "data"
    with FakePolicyServer(PerTaskPolicy()) as policy:
        a = run_eval(policy, TASKS, root / "run-a", data_dir, "model-a")
        b = run_eval(policy, EASIER, root / "run-b", data_dir, "model-b")
    keys = [json.loads((root / r / "eval.json").read_text())["run_key"] for r in ("run-a", "run-b")]
    server = ServerProcess(tmp_path_factory.mktemp("evals-sandboxes"), env={"HARNESS_ENV_DATA_DIR": str(data_dir)})
    try:
        yield server, (a, keys[0], root / "run-a"), (b, keys[1])
    finally:
        server.stop()
    assert os.listdir(server.sandbox_dir) == []


def open_evals(web: WebDriver, runs: int) -> list[list[str]]:
    web.page.goto(web.base_url + "/web/", timeout=LOAD_TIMEOUT_MS)
    web.page.wait_for_selector("#run", timeout=LOAD_TIMEOUT_MS)
    web.tab("Evals")
    web.page.wait_for_function(
        "(n) => { const g = document.querySelector('#ev-list [role=grid]'); return g && g.getAttribute('aria-rowcount') === String(n + 1); }",
        arg=runs,
        timeout=30_000,
    )
    return web.page.evaluate("""() => { const out = [];
        for (const el of document.querySelectorAll('#ev-list [data-testid^="cell-"]')) {
            const m = el.dataset.testid.match(/^cell-(\\d+)-(\\d+)$/); if (!m) continue;
            (out[+m[1]] = out[+m[1]] || [])[+m[2]] = el.innerText.trim(); }
        return out.filter(Boolean); }""")


def pick(web: WebDriver, elem_id: str, run_id: str) -> None:
    """Choose run `run_id` in a run dropdown (each dropdown lists the same runs)."""
    web.page.locator(f"#{elem_id} input").click()
    web.page.locator(f'#{elem_id} [role=option][aria-label^="{run_id[:12]}"]').click()
    web.page.wait_for_function("([id, v]) => document.querySelector(`#${id} input`)?.value.startsWith(v)", arg=[elem_id, run_id[:12]])


def test_a_cli_eval_shows_its_summary_numbers_and_two_runs_compare(chromium, evals):
    server, (summary, key, out), (summary_b, key_b) = evals
    web = WebDriver(chromium, server.url)
    try:
        listed = open_evals(web, 2)
        assert [r[1] for r in listed] == [key_b[:12], key[:12]] and [r[3] for r in listed] == ["model-b", "model-a"]  # newest first
        o = summary["overall"]
        assert listed[1][6:10] == ["16/16", pm(o["mean_reward"], o["stderr"]), f"{o['pass_at_k']['1']:.3f}", str(o["infra_failures"])]

        web.page.locator('#ev-list [data-testid="cell-1-1"]').click()
        web.page.wait_for_selector(f'#ev-run .he-eval-run[data-run="{key}"]')
        assert web.page.inner_text("#ev-headline") == headline(summary)
        rows = cells(web, "#ev-run table.he-eval-tasks")
        ks = [str(k) for k in range(1, 5)]
        expected = [
            [
                tid,
                str(s["scored"]),
                str(s["infra_failures"]),
                pm(s["mean_reward"], s["stderr"]),
                *("-" if s["pass_at_k"][k] is None else f"{s['pass_at_k'][k]:.3f}" for k in ks),
            ]
            for tid, s in summary["tasks"].items()
        ]
        expected.append(["overall", str(o["scored"]), str(o["infra_failures"]), pm(o["mean_reward"], o["stderr"]), *(f"{o['pass_at_k'][k]:.3f}" for k in ks)])
        assert [r[:8] for r in rows] == expected
        assert cells(web, "#ev-run table.he-eval-passk") == [["pass@k", *(f"{o['pass_at_k'][k]:.3f}" for k in ks)]]
        assert web.page.locator("#ev-passk-chart .he-passk-overall circle").count() == 4
        # Infrastructure failures apart, with the messages behind their error kind.
        assert web.page.inner_text("#ev-infra") == str(o["infra_failures"]) == "4"
        message = json.loads((out / "results" / "down" / "0.json").read_text())["error"].splitlines()[0][:200]
        assert message in web.page.inner_text('#ev-infra-errors li[data-kind="endpoint"]')
        assert web.page.inner_text("#ev-graded-errors") == "none"
        DOCS.mkdir(exist_ok=True)
        web.page.locator("#ev-run").screenshot(path=str(DOCS / "evals.png"))

        # Its rollouts, filtered: each links to its page in the Rollouts tab.
        assert web.page.inner_text("#ev-attempts-count") == "16 of 16 rollouts"
        web.choose("ev-filter-outcome", "infrastructure failure")
        web.page.wait_for_function("document.querySelector('#ev-attempts-count')?.innerText === '4 of 16 rollouts'")
        assert {r[1] for r in cells(web, "#ev-attempts table")} == {"down"}
        web.choose("ev-filter-outcome", re.compile("^passed$"))
        web.page.wait_for_function("document.querySelector('#ev-attempts-count')?.innerText === '6 of 16 rollouts'")
        web.choose("ev-filter-task", "half")
        web.page.wait_for_function("document.querySelector('#ev-attempts-count')?.innerText === '2 of 16 rollouts'")
        link = web.page.locator("#ev-attempts table a").first
        rollout = link.inner_text()
        link.click()
        web.page.wait_for_selector(f"#ro-title code:text-is('{rollout}')", timeout=LOAD_TIMEOUT_MS)
        web.page.wait_for_selector("#ro-reward .he-reward[data-reward='1.0']", timeout=30_000)

        # Compare A with B: per-task deltas with their standard errors.
        open_evals(web, 2)
        pick(web, "ev-compare-a", key)
        pick(web, "ev-compare-b", key_b)
        web.page.click("#ev-compare")
        web.page.wait_for_selector("#ev-compare-out table")
        compared = {r[0]: r for r in cells(web, "#ev-compare-out table")}
        ta, tb = summary["tasks"], summary_b["tasks"]
        assert compared["never"][1:] == [pm(0.0, 0.0), pm(1.0, 0.0), "+1.000 ± 0.000"]
        assert compared["always"][3] == "0.000 ± 0.000" and compared["down"][2:] == ["-", "-"]
        se = (ta["half"]["stderr"] ** 2 + tb["half"]["stderr"] ** 2) ** 0.5
        assert compared["half"][3] == f"{tb['half']['mean_reward'] - ta['half']['mean_reward']:+.3f} ± {se:.3f}".replace("+0.000", "0.000")
    finally:
        web.close()


def test_an_eval_run_opens_by_its_address(chromium, evals):
    server, (summary, key, _), _ = evals
    web = WebDriver(chromium, server.url)
    try:
        web.page.goto(f"{server.url}/web/?eval={key}", timeout=LOAD_TIMEOUT_MS)
        web.page.wait_for_selector(f'#ev-run .he-eval-run[data-run="{key}"]', timeout=LOAD_TIMEOUT_MS)
        assert web.page.inner_text("#ev-headline") == headline(summary)
        web.page.goto(f"{server.url}/web/?eval=nosuchrun", timeout=LOAD_TIMEOUT_MS)
        web.page.wait_for_function(
            "(() => { const e = document.querySelector('#ev-run'); return e && e.innerText.includes('no eval run nosuchrun'); })()", timeout=LOAD_TIMEOUT_MS
        )
    finally:
        web.close()
