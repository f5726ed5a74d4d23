"""Render a what-if report's index.html in headless Chromium and check the charts show.

    python benchmarks/whatif_screenshot.py out/                 # an existing report
    python benchmarks/whatif_screenshot.py out/ --run           # run the acceptance sweep first
    python benchmarks/whatif_screenshot.py out/ --png shot.png

Prints the wall time of the sweep (with --run), the screenshot path, and for every chart
image on the page whether Chromium decoded it (naturalWidth > 0, read from the DOM dump).
Needs Debian's `chromium` package (apt-get install chromium).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ACCEPTANCE = [
    "examples/gpt.py:llama3_70b", "--hw", "a100x8", "--vary", "nodes=4,8,16,32",
    "--vary", "hw=a100x8,h100x8", "--tokens", "1e12",
]
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--allow-file-access-from-files",
]
# Replaces the page's body with one line per image: "IMG name naturalWidth naturalHeight".
PROBE = """<script>window.addEventListener('load', () => {
  const rows = [...document.images].map(i => `IMG ${i.getAttribute('src')} ${i.naturalWidth} ${i.naturalHeight}`);
  document.body.innerHTML = '<pre id="probe">' + rows.join('\\n') + '</pre>';
});</script>"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("chromium not found; apt-get install -y chromium")


def run_sweep(out: Path) -> float:
    start = time.perf_counter()
    cmd = [sys.executable, "-c", "from smplan.cli import main; main()", "whatif", *ACCEPTANCE, "-o", str(out), "--force"]
    subprocess.run(cmd, check=True)
    return time.perf_counter() - start


def screenshot(index: Path, png: Path, width: int = 1400, height: int = 3000) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
             f"--window-size={width},{height}", "--hide-scrollbars", index.resolve().as_uri()],
            check=True, capture_output=True, timeout=120,
        )


def decoded_images(index: Path) -> list[tuple[str, int, int]]:
    """(src, naturalWidth, naturalHeight) of every <img> as Chromium loaded it."""
    probe = index.with_name(".probe.html")
    probe.write_text(index.read_text().replace("</body>", PROBE + "</body>"))
    try:
        with tempfile.TemporaryDirectory() as profile:
            dom = subprocess.run(
                [chromium(), *FLAGS, f"--user-data-dir={profile}", "--dump-dom", "--virtual-time-budget=5000",
                 probe.resolve().as_uri()],
                check=True, capture_output=True, text=True, timeout=120,
            ).stdout
    finally:
        probe.unlink()
    return [(m[0], int(m[1]), int(m[2])) for m in re.findall(r"IMG (\S+) (\d+) (\d+)", dom)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", type=Path, help="report directory holding index.html")
    ap.add_argument("--run", action="store_true", help="run the acceptance sweep into it first")
    ap.add_argument("--png", type=Path, help="screenshot path (default REPORT/screenshot.png)")
    args = ap.parse_args()
    if args.run:
        print(f"sweep wall time: {run_sweep(args.report):.1f} s")
    index = args.report / "index.html"
    if not index.is_file():
        sys.exit(f"{index} does not exist; run smplan whatif -o {args.report} first (or pass --run)")
    png = args.png or args.report / "screenshot.png"
    images = decoded_images(index)
    screenshot(index, png)
    print(f"screenshot: {png} ({png.stat().st_size / 1024:.0f} KiB)")
    bad = [src for src, w, h in images if not (w and h)]
    for src, w, h in images:
        print(f"  {src}: {w}x{h} {'ok' if w and h else 'NOT RENDERED'}")
    if not images or bad:
        print("FAIL: " + ("no images on the page" if not images else f"{len(bad)} image(s) did not render"))
        return 1
    print(f"ok: {len(images)} chart(s) rendered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
