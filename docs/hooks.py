"""MkDocs hook: the pictures the benchmarks write to ``results/`` are part of the site, at
``results/NAME.png``, so a page shows the latest without a copy kept under ``docs/``."""

from pathlib import Path

from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parents[1] / "results"


def on_files(files, config):
    for png in sorted(RESULTS.glob("*.png")):
        files.append(File(f"results/{png.name}", str(RESULTS.parent), config["site_dir"],
                          config["use_directory_urls"]))
    return files
