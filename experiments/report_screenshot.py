"""A report as a person sees it: headless Chromium renders an HTML report (`tfsync report`)
and writes a PNG screenshot, e.g. for the docs.

    python experiments/report_screenshot.py runs/mnist/report.html results/report_example.png

Needs Debian's chromium (`apt-get install chromium`)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys


def screenshot(html: str, png: str, width: int = 1200, height: int = 2400) -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        raise FileNotFoundError("no chromium on PATH (apt-get install chromium)")
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}", f"--screenshot={os.path.abspath(png)}",
                    "file://" + os.path.abspath(html)], check=True, capture_output=True, timeout=120)
    return png


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("html")
    p.add_argument("png")
    p.add_argument("--height", type=int, default=2400)
    args = p.parse_args()
    print(screenshot(args.html, args.png, height=args.height))
    return 0


if __name__ == "__main__":
    sys.exit(main())
