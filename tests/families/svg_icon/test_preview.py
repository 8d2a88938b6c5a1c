"""The preview helper: shipped as source, run by the system python3 inside a real sandbox."""

from pathlib import Path

from harness_env.core.sandbox.local import create_local_sandbox
from harness_env.families.svg_icon import checks, preview
from harness_env.families.svg_icon.pngcodec import decode_png
from harness_env.families.svg_icon.preview import PREVIEW_COMMAND, PREVIEW_OUTPUT, preview_files

RED_SQUARE = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 4 4"><rect x="1" y="1" width="2" height="2" fill="#ff0000"/></svg>'
BLANK = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 4 4"><rect width="4" height="4" fill="#ffffff"/></svg>'


def test_one_implementation_is_shipped():
    files = preview_files()
    here = Path(checks.__file__).parent
    assert files == {
        ".harness/preview.py": (here / "preview.py").read_text(),
        ".harness/checks.py": (here / "checks.py").read_text(),
        ".harness/pngcodec.py": (here / "pngcodec.py").read_text(),
        ".harness/chromium.py": (here / "chromium.py").read_text(),
    }
    assert PREVIEW_COMMAND == "python3 .harness/preview.py"
    for source in files.values():  # the sandbox has the standard library only
        assert "harness_env" not in "".join(line for line in source.splitlines() if line.startswith(("import", "from")))


async def test_preview_runs_inside_the_sandbox():
    sb = create_local_sandbox(ro_paths=[])
    try:
        for path, content in preview_files().items():
            sb.write_file(path, content)

        sb.write_file("icon.svg", RED_SQUARE)
        r = await sb.exec(PREVIEW_COMMAND, timeout=90)
        assert r.exit_code == 0, (r.stdout, r.stderr)
        out = r.stdout
        assert f"file: icon.svg, {len(RED_SQUARE)} bytes" in out
        assert "blank: no" in out
        assert "drawn area: x 128..384, y 128..384" in out
        assert "main colours: #ff0000 25.0%" in out
        assert "verdict: ok" in out
        png = sb.read_file(PREVIEW_OUTPUT)
        assert png is not None
        w, h, _ = decode_png(png)
        assert (w, h) == (512, 512)
        stats = checks.image_stats(png)
        assert stats.colours[0][0] == "#ff0000" and stats.background == "#ffffff"

        sb.write_file("icon.svg", BLANK)
        r = await sb.exec(PREVIEW_COMMAND, timeout=90)
        assert r.exit_code == 1 and "problem: blank" in r.stdout, (r.stdout, r.stderr)

        sb.write_file("icon.svg", "<svg xmlns='http://www.w3.org/2000/svg'><g></svg>")  # no Chromium run
        r = await sb.exec(PREVIEW_COMMAND, timeout=30)
        assert r.exit_code == 1 and "problem: not_xml: line 1" in r.stdout, (r.stdout, r.stderr)

        r = await sb.exec(PREVIEW_COMMAND + " other.svg", timeout=30)
        assert r.exit_code == 1 and "problem: missing" in r.stdout
        assert r.stderr == ""
    finally:
        await sb.close()


def test_preview_without_chromium_says_how_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_ENV_CHROMIUM", "/nonexistent/chromium")
    (tmp_path / "icon.svg").write_text(RED_SQUARE)
    code = preview.main([str(tmp_path / "icon.svg")])
    out = capsys.readouterr().out
    assert code == 2
    assert "apt-get install chromium" in out
    assert not (tmp_path / PREVIEW_OUTPUT).exists()
