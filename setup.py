"""The one thing setup.cfg cannot say: migrations/ ships inside the app package.

Alembic loads migrations/env.py and versions/ by file path, so they need not be an
importable top-level package, and a top-level `migrations` in site-packages would
collide with a user's own Alembic directory. The wheel carries them as
app/_migrations (found by app.registry.migrate); a source checkout or an editable
install reads migrations/ in place.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["app", "app.*"]) + ["app._migrations", "app._migrations.versions"],
    package_dir={"app._migrations": "migrations"},
    package_data={"app._migrations": ["*.mako"]},
)
