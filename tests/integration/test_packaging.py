"""The built distributions, installed as a user installs them (not editable):

- the server's wheel ships every package of app/ (setup.cfg lists them), and the
  Alembic scripts inside the app package (app/_migrations), with no top-level
  `migrations` that would shadow a user's own;
- `punctual migrate` from that install, outside the repository, creates the schema;
- punctual-client's wheel holds punctual_client only, with its py.typed marker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from app.registry.migrate import head_revision
from tests.conftest import _pg_url, create_database, drop_database
from tests.integration.test_migrations import _schema_diff

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
# What a build reads: the files the Dockerfile copies.
SOURCE_SET = (
    "setup.cfg",
    "pyproject.toml",
    "README.md",
    "celeryconfig.py",
    "app",
    "migrations",
    "client",
)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """Both wheels, built from a copy of the source (a build writes build/ and *.egg-info beside it)."""
    source = tmp_path_factory.mktemp("source")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in SOURCE_SET:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=ignore)
        else:
            shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("wheels")
    # No build isolation: the test venv has setuptools (test extras), so nothing is downloaded.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(source / "client"),
            str(source),
            "-w",
            str(out),
        ],
        check=True,
        capture_output=True,
        cwd=out,
    )
    return {"client": next(out.glob("punctual_client-*.whl")), "server": next(out.glob("punctual-*.whl"))}


def test_the_server_wheel_ships_migrations_inside_app(wheels):
    names = zipfile.ZipFile(wheels["server"]).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"app", "celeryconfig.py", "punctual-0.1.0.dist-info"}
    migrations = sorted(n for n in names if n.startswith("app/_migrations/"))
    assert {"app/_migrations/env.py", "app/_migrations/script.py.mako"} <= set(migrations)
    shipped = {n.rsplit("/", 1)[1] for n in migrations if n.startswith("app/_migrations/versions/0")}
    in_repo = {p.name for p in (REPO / "migrations" / "versions").glob("0*.py")}
    assert shipped == in_repo and len(in_repo) >= 3
    assert not any(n.startswith(("app/sdk/", "punctual_client/")) for n in names)


def test_the_server_wheel_ships_every_package_of_app(wheels):
    names = set(zipfile.ZipFile(wheels["server"]).namelist())
    packages = sorted(init.parent for init in (REPO / "app").rglob("__init__.py"))
    assert len(packages) >= 10
    missing = [
        package.relative_to(REPO).as_posix()
        for package in packages
        if f"{package.relative_to(REPO).as_posix()}/__init__.py" not in names
    ]
    assert not missing, f"packages of app/ not in the wheel (setup.cfg [options] packages): {missing}"


def test_the_client_wheel_holds_the_client_only(wheels):
    names = zipfile.ZipFile(wheels["client"]).namelist()
    assert {name.split("/")[0] for name in names} == {"punctual_client", "punctual_client-0.1.0.dist-info"}
    assert "punctual_client/py.typed" in names  # PEP 561: its annotations are for type checkers
    metadata = zipfile.ZipFile(wheels["client"]).read("punctual_client-0.1.0.dist-info/METADATA").decode()
    assert [line for line in metadata.splitlines() if line.startswith("Requires-Dist")] == [
        "Requires-Dist: requests<3,>=2.32"
    ]


@pytest.fixture(scope="module")
def installed(wheels, tmp_path_factory) -> Path:
    """A fresh venv with both wheels installed (not editable); the rest borrowed from this venv."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    [site] = (venv / "lib").glob("python3*/site-packages")
    # Third-party dependencies come from this venv's site-packages; its editable finders
    # (for app and punctual_client) are .pth files there, which a path added this way
    # does not run: the two packages can only come from the wheels.
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheels["client"]),
            str(wheels["server"]),
        ],
        check=True,
        capture_output=True,
    )
    return venv


def test_punctual_migrate_works_from_a_wheel_install_outside_the_repository(installed, pg_admin):
    python = installed / "bin" / "python"
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import app, punctual_client, importlib.util as u;"
            "print(app.__file__); print(punctual_client.__file__);"
            "print(u.find_spec('migrations'))",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd="/",
    ).stdout.splitlines()
    assert all(str(installed) in line for line in where[:2]) and where[2] == "None"
    name = create_database(pg_admin)
    try:
        env = {"PATH": os.environ["PATH"], "PUNCTUAL_DATABASE_URLS": _pg_url(name)}
        result = subprocess.run(
            [str(installed / "bin" / "punctual"), "migrate"], capture_output=True, text=True, env=env, cwd="/"
        )
        assert result.returncode == 0, result.stderr
        assert f"empty -> {head_revision()}" in result.stdout
        assert _schema_diff(_pg_url(name)) == []
    finally:
        drop_database(pg_admin, name)
