"""The README and the documentation site (docs/, mkdocs.yml): the site builds with every
warning an error, what the README shows is what the repository holds, and every TOML
block a reader may paste parses."""

import argparse
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
README_LIMIT = 15_000   # bytes: a newcomer reads it in five minutes; the rest is in docs/


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    """A broken link, a page left out of the navigation, an include of a results/ file that
    is not there or an API name that moved stops the build."""
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "TrainSetup" in api and "SyncSwitch" in api and "on_push" in api   # the docstrings were read
    assert (tmp_path / "site" / "results" / "bench_heterogeneity_mlp_4w.png").is_file()


def test_the_readme_stays_short_and_its_links_lead_somewhere():
    text = README.read_text()
    assert len(text.encode()) <= README_LIMIT, f"README.md is {len(text.encode())} bytes; move detail to docs/"
    targets = re.findall(r"\]\(([^)#]+)\)", text)
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, missing


def test_the_readme_headline_table_is_the_benchmarks_own_summary():
    """The table is the one `bench_heterogeneity.py --summarise` writes from the CSVs in
    results/, not figures typed in by hand: a new run that is not copied over fails here."""
    text = README.read_text()
    shown = text.split("tests/test_docs.py keeps it current -->\n", 1)[1].split("<!-- end of table -->", 1)[0]
    summary = (ROOT / "results" / "bench_heterogeneity_mlp_4w.md").read_text()
    first = summary.split("\n\n")[1].strip() + "\n"
    assert shown == first


def test_the_readme_first_job_is_the_example_it_names():
    """The job the README walks through is examples/regression/job.toml, key for key."""
    shown = tomllib.loads(blocks(README.read_text(), "toml")[0])
    job = tomllib.loads((ROOT / "examples" / "regression" / "job.toml").read_text())
    job.pop("job")
    assert shown == job


def test_the_readme_keeps_the_two_set_up_commands():
    shell = blocks(README.read_text(), "bash")
    assert shell[0].strip() == ("python3 -m venv .venv && .venv/bin/pip install -e . && "
                                ".venv/bin/tfsync run jobs/mnist.toml")
    assert shell[1].strip() == ('python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && '
                                ".venv/bin/python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -e ".[test]" && .venv/bin/python -m pytest' in ci


@pytest.mark.parametrize("page", [README] + PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_toml_block_parses(page):
    for block in blocks(page.read_text(), "toml"):
        tomllib.loads(block)   # raises, naming the line


def readme_commands() -> list[list[str]]:
    lines = [line.split("  #", 1)[0].strip() for block in blocks(README.read_text(), "bash") for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith("tfsync ")]


def test_every_command_the_readme_shows_is_one_the_command_line_takes():
    """Each `tfsync ...` line of the README parses with tfsync's own parser, and each
    `tfsync run` line's job file, with its --set overrides, passes the job's checks (a key
    or value the README got wrong is one line naming the field, as a user would get)."""
    from tfsync.cli import build_parser
    from tfsync.job.config import load_job

    commands = readme_commands()
    assert len(commands) >= 2
    parser = build_parser()
    for argv in commands:
        args = parser.parse_args(argv[1:])
        if args.command == "run":
            load_job(ROOT / args.job, args.set or ())
    table = README.read_text().split("## Commands at a glance", 1)[1].split("\n\n", 2)[1]
    named = {name for cell in re.findall(r"^\| (.+?) \|", table, flags=re.M)[2:]
             for name in re.findall(r"`(?:tfsync )?([a-z0-9-]+)", cell)}
    subcommands = set(next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices)
    assert named and named <= subcommands, named - subcommands
