"""docs/api.md and docs/design.md stay in step with the code, and the repository stands alone.

docs/api.md is the reference of the HTTP API, the CLI and the configuration. These
tests read its tables and compare them with what the code builds: the routes of the
OpenAPI document, the PUNCTUAL_* variables of app.settings, the options the client
commands read from the environment, and the commands of the `punctual` click group.
docs/design.md names the tests that pin each invariant; they must exist, as must
every module the two documents name and every section the code cites. No tracked
file may point outside the repository or cite a document it does not have.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from datetime import date
from pathlib import Path

import click
import pytest

from app.api.openapi import document
from app.cli import main as punctual
from app.settings import VARIABLES

ROOT = Path(__file__).resolve().parents[2]
API_MD = ROOT / "docs" / "api.md"
DESIGN_MD = ROOT / "docs" / "design.md"
README_MD = ROOT / "README.md"

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
# Options documented once for every command that has them, not in each row.
COMMON_OPTIONS = {"--help", "--json", "--url", "--api-key"}
# Built from pieces so that this file does not itself contain what it looks for.
OUTSIDE_REFERENCES = ("../" + "shared", "shared/" + "API" + ".md", "shared/" + "DESIGN" + ".md")
# The documents the code used to cite, which the repository does not have (the old
# contract outside it, and the two files merged into docs/api.md and docs/design.md).
GONE_DOCUMENTS = re.compile(
    r"\b(?:"
    + "|".join(
        re.escape(name)
        for name in ("API" + ".md", "DESIGN" + ".md", "internals" + ".md", "api-decisions" + ".md")
    )
    + r")"
)
# How the code cites a section: docs/api.md "Limits", docs/design.md ("API verbs"),
# docs/design.md's "Off-schedule runs", docs/design.md invariant 3.
SECTION_CITATION = re.compile(r"docs/(api|design)\.md(?:'s)?,? \(?\"([^\"]+)\"")
INVARIANT_CITATION = re.compile(r"docs/design\.md,? invariants? (\d+)")


def section(text: str, heading: str) -> str:
    """The body of the section that starts with `heading` (a whole line), up to the
    next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if re.match(rf"^#{{1,{level}}} ", lines[i])), len(lines))
    return "\n".join(lines[start:end])


def table_rows(text: str) -> list[list[str]]:
    """The cells of every table row in `text`, header and separator rows left out."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if set("".join(cells)) <= set("-: "):
            continue
        rows.append(cells)
    return rows[1:] if rows else rows  # the first row is the header


def unquote(cell: str) -> str:
    return cell.strip("`")


@pytest.fixture(scope="module")
def api_md() -> str:
    return API_MD.read_text(encoding="utf-8")


# --- routes -------------------------------------------------------------------------


def openapi_routes() -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in document()["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def documented_routes(api_md: str) -> set[tuple[str, str]]:
    rows = table_rows(section(api_md, "## Routes"))
    return {(unquote(method), unquote(path)) for method, path, *_ in rows}


def test_the_routes_table_has_every_route_of_the_openapi_document(api_md):
    missing = openapi_routes() - documented_routes(api_md)
    assert not missing, f"in the OpenAPI document but not in docs/api.md 'Routes': {sorted(missing)}"


def test_every_route_in_the_routes_table_is_in_the_openapi_document(api_md):
    extra = documented_routes(api_md) - openapi_routes()
    assert not extra, f"in docs/api.md 'Routes' but not in the OpenAPI document: {sorted(extra)}"


def test_every_route_is_described_below_the_table(api_md):
    # The table is not the only mention: each route has its prose, as `METHOD /path`.
    below = api_md.split("## Routes", 1)[1].split("\n## ", 1)[1]
    undescribed = sorted(
        f"{method} {path}" for method, path in openapi_routes() if f"`{method} {path}" not in below
    )
    assert not undescribed, f"routes with no description below the table: {undescribed}"


# --- configuration ------------------------------------------------------------------


def documented_variables(api_md: str, heading: str) -> list[str]:
    return [unquote(row[0]) for row in table_rows(section(api_md, heading))]


def test_the_configuration_table_lists_exactly_the_settings_variables(api_md):
    documented = documented_variables(api_md, "### Configuration")
    assert sorted(documented) == sorted(v.name for v in VARIABLES)
    assert len(documented) == len(set(documented)), "a variable is listed twice"


def test_the_configuration_table_gives_each_default_as_the_code_has_it(api_md):
    defaults = {unquote(row[0]): row[2] for row in table_rows(section(api_md, "### Configuration"))}
    for variable in VARIABLES:
        if variable.default:  # an empty default is an embedded one, described in words
            assert defaults[variable.name].split()[0].strip("`") == variable.default, variable.name


def test_every_punctual_name_in_the_settings_module_is_documented(api_md):
    import app.settings

    source = Path(app.settings.__file__).read_text(encoding="utf-8")
    names = set(re.findall(r"PUNCTUAL_[A-Z_]*[A-Z]", source))
    documented = set(documented_variables(api_md, "### Configuration"))
    documented |= set(documented_variables(api_md, "### The client commands' variables"))
    undocumented = sorted(name for name in names - documented if not name.startswith("PUNCTUAL_TEST"))
    assert not undocumented, f"read or allowed by app.settings but not in docs/api.md: {undocumented}"


def walk(command: click.Command, path: tuple[str, ...] = ()):
    """(path, command) for every command under `command`, the group itself left out."""
    if isinstance(command, click.Group):
        if path and command.invoke_without_command:  # a group that is a command too (`punctual shards`)
            yield path, command
        for name, sub in command.commands.items():
            yield from walk(sub, path + (name,))
    elif path:
        yield path, command


def test_the_client_variables_table_lists_exactly_what_the_commands_read(api_md):
    envvars = set()
    for _path, command in walk(punctual):
        envvars |= {p.envvar for p in command.params if isinstance(p.envvar, str)}
    for group in punctual.commands.values():
        envvars |= {p.envvar for p in group.params if isinstance(p.envvar, str)}
    settings_names = {v.name for v in VARIABLES}
    client = sorted(envvars - settings_names)  # --data-dir reads PUNCTUAL_DATA_DIR, a setting
    assert client, "walking the click group found no client variables: the walk is broken"
    assert sorted(documented_variables(api_md, "### The client commands' variables")) == client


# --- commands -----------------------------------------------------------------------


def documented_commands(api_md: str) -> dict[str, str]:
    """'jobs get' -> its whole row, for every row of the Commands table."""
    commands = {}
    for row in table_rows(section(api_md, "### Commands")):
        match = re.fullmatch(r"`punctual ([a-z -]+?)(?: [A-Z_]+)?`", row[0])
        assert match, f"not a `punctual ...` command: {row[0]}"
        commands[match.group(1)] = " | ".join(row)
    return commands


def test_the_commands_table_lists_exactly_the_punctual_commands(api_md):
    built = sorted(" ".join(path) for path, _command in walk(punctual))
    assert len(built) >= 10, "walking the click group found too few commands: the walk is broken"
    assert sorted(documented_commands(api_md)) == built


def test_each_command_row_names_every_option_of_the_command(api_md):
    rows = documented_commands(api_md)
    for path, command in walk(punctual):
        row = rows[" ".join(path)]
        for param in command.params:
            for option in getattr(param, "opts", ()):
                if option.startswith("--") and option not in COMMON_OPTIONS:
                    assert f"`{option}" in row, f"punctual {' '.join(path)}: {option} is not in its row"


def test_the_processes_table_names_every_process(api_md):
    commands = " ".join(row[1] for row in table_rows(section(api_md, "### Processes")))
    for expected in (
        "punctual migrate",
        "punctual api",
        "celery -A app beat",
        "celery -A app worker",
        "celery -A app flower",
        "punctual dev",
    ):
        assert expected in commands


# --- design.md ----------------------------------------------------------------------


def test_design_names_each_invariant_with_tests_that_exist():
    text = DESIGN_MD.read_text(encoding="utf-8")
    invariants = section(text, "## Invariants")
    numbers = [int(n) for n in re.findall(r"^(\d+)\. \*\*", invariants, flags=re.M)]
    assert numbers == list(range(1, 10))
    for block in re.split(r"^\d+\. \*\*", invariants, flags=re.M)[1:]:
        cited = re.findall(r"(tests/[\w/]+\.py)::(\w+)", block)
        assert cited, f"an invariant without a test: {block.splitlines()[0]}"
        for path, name in cited:
            source = ROOT / path
            assert source.is_file(), f"{path} does not exist"
            assert re.search(rf"^\s*def {name}\(", source.read_text(encoding="utf-8"), flags=re.M), (
                f"{path} has no test {name}"
            )


# --- the repository stands alone ----------------------------------------------------


def tracked_text_files(prefixes: tuple[str, ...]) -> list[Path]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = (
        subprocess.run(["git", "ls-files", "-z", "--", *prefixes], cwd=ROOT, check=True, capture_output=True)
        .stdout.decode()
        .split("\0")
    )
    files = []
    for name in filter(None, listed):
        path = ROOT / name
        if not path.is_file():
            continue
        head = path.read_bytes()[:8192]
        if b"\0" not in head:  # text, not an image
            files.append(path)
    return files


def test_no_tracked_file_points_outside_the_repository():
    files = tracked_text_files(())
    assert len(files) > 100, "git ls-files found too little: the check would pass vacuously"
    offending = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        offending += [f"{path.relative_to(ROOT)}: {ref}" for ref in OUTSIDE_REFERENCES if ref in text]
    assert not offending, "files that point outside the repository:\n" + "\n".join(offending)


def test_no_tracked_file_cites_a_document_the_repository_does_not_have():
    files = tracked_text_files(())
    offending = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            offending += [
                f"{path.relative_to(ROOT)}:{number}: {match.group()}"
                for match in GONE_DOCUMENTS.finditer(line)
            ]
    assert not offending, "cite docs/api.md or docs/design.md instead:\n" + "\n".join(offending)


def test_every_module_the_docs_name_exists():
    missing = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        text = doc.read_text(encoding="utf-8")
        for name in sorted(set(re.findall(r"\b(?:app|tests|bench|migrations)/[\w/.-]*\w", text))):
            if not (ROOT / name).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {name}")
    assert not missing, "the docs name modules that do not exist:\n" + "\n".join(missing)


def flat(text: str) -> str:
    """`text` on one line: wrapped comments and docstrings joined, spaces collapsed."""
    return " ".join(re.sub(r"\n\s*#\s?", " ", text).split())


def anchors(text: str) -> set[str]:
    """What a citation can name: a heading, a table row's first cell, or the words a
    paragraph begins with (design.md's "Completion of a schedule run ...")."""
    found = set()
    for paragraph in re.split(r"\n\s*\n", text):
        first = paragraph.strip().splitlines()[0] if paragraph.strip() else ""
        if first.startswith("#"):
            found.add(first.lstrip("#").strip())
        elif not first.startswith("|"):
            found.add(first)
    found |= {unquote(row[0]) for row in table_rows(text)}
    found |= {line.split("|")[1].strip() for line in text.splitlines() if line.startswith("|")}
    return found


def test_every_section_the_code_cites_exists():
    design = DESIGN_MD.read_text(encoding="utf-8")
    docs = {"api": anchors(API_MD.read_text(encoding="utf-8")), "design": anchors(design)}
    invariants = re.findall(r"^(\d+)\. \*\*", section(design, "## Invariants"), flags=re.M)
    cited, missing = 0, []
    sources = ("app/", "tests/", "bench/", "migrations/", "celeryconfig.py", "README.md")
    for path in tracked_text_files(sources):
        text = flat(path.read_text(encoding="utf-8", errors="replace"))
        for doc, title in SECTION_CITATION.findall(text):
            cited += 1
            if not any(anchor == title or anchor.startswith(title + " ") for anchor in docs[doc]):
                missing.append(f'{path.relative_to(ROOT)}: docs/{doc}.md "{title}"')
        for number in INVARIANT_CITATION.findall(text):
            cited += 1
            if number not in invariants:
                missing.append(f"{path.relative_to(ROOT)}: docs/design.md invariant {number}")
    assert cited >= 10, "found too few citations: the patterns no longer match how the code cites"
    assert not missing, "citations of sections the docs do not have:\n" + "\n".join(missing)


def test_the_module_map_names_every_module():
    module_map = section(DESIGN_MD.read_text(encoding="utf-8"), "## Module map")
    rows = [" ".join(row) for row in table_rows(module_map)]
    unnamed = []
    for path in tracked_text_files(("app/",)):
        relative = path.relative_to(ROOT)
        if relative.suffix != ".py" or relative.name in ("__init__.py", "__main__.py"):
            continue
        # A row names a module in full (app/api/jobs.py) or after its package's first
        # module in the same row ("app/api/jobs.py, runs.py").
        package, name = relative.parent.as_posix(), re.escape(relative.name)
        if not any(re.search(rf"\b{re.escape(package)}/(?:[\w.]+, )*{name}\b", row) for row in rows):
            unnamed.append(relative.as_posix())
    assert not unnamed, "modules missing from docs/design.md 'Module map':\n" + "\n".join(unnamed)


# --- README.md: a newcomer's hour ---------------------------------------------------


def test_the_readme_is_short_and_its_lines_are_readable():
    lines = README_MD.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; what is longer belongs in docs/"
    long = [number for number, line in enumerate(lines, 1) if len(line) > 400]
    assert not long, f"README.md lines over 400 characters: {long}"


def test_the_performance_section_is_one_short_table_with_dated_commands():
    performance = section(README_MD.read_text(encoding="utf-8"), "## Performance")
    tables = re.findall(r"(?:^\|.*\n?)+", performance, flags=re.M)
    assert len(tables) == 1, "README.md 'Performance' holds one table"
    rows = table_rows(tables[0])
    assert 5 <= len(rows) <= 10, f"{len(rows)} rows: at most 10, the most important"
    for row in rows:
        assert all(len(cell) <= 160 for cell in row), f"a cell over 160 characters: {row[0]}"
        line = " | ".join(row)
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", line), f"no date: {row[0]}"
        assert "python -m bench." in line, f"no command: {row[0]}"


def test_the_readme_points_at_the_configuration_table_and_names_only_real_variables(api_md):
    readme = README_MD.read_text(encoding="utf-8")
    configuration = section(readme, "## Configuration")
    assert "punctual --help" in configuration and "docs/api.md" in configuration
    assert '"Configuration"' in configuration, "the pointer names docs/api.md's section"
    known = {v.name for v in VARIABLES}
    known |= set(documented_variables(api_md, "### The client commands' variables"))
    unknown = sorted(set(re.findall(r"PUNCTUAL_[A-Z_]*[A-Z]", readme)) - known)
    assert not unknown, f"README.md names variables that do not exist: {unknown}"


# --- bench/: a methods document and the results it cites ----------------------------

RESULT_FILE = re.compile(r"\bbench/results/[\w.-]+\.json\b")


def test_the_bench_readme_is_a_methods_document_not_a_diary():
    lines = (ROOT / "bench" / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 500, f"bench/README.md has {len(lines)} lines; history goes to docs/design.md"


def test_bench_results_tracks_exactly_the_files_the_docs_cite():
    documents = [README_MD, ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    cited = {name for doc in documents for name in RESULT_FILE.findall(doc.read_text(encoding="utf-8"))}
    tracked = {path.relative_to(ROOT).as_posix() for path in tracked_text_files(("bench/results/",))}
    assert cited, "no document cites a result file: the pattern no longer matches how they cite"
    assert len(tracked) <= 40, f"bench/results/ tracks {len(tracked)} files"
    assert not cited - tracked, f"cited but not tracked (git add -f): {sorted(cited - tracked)}"
    assert not tracked - cited, f"tracked but cited nowhere (git rm): {sorted(tracked - cited)}"


# --- layers -------------------------------------------------------------------------


def layers() -> list[tuple[str, ...]]:
    """docs/design.md "Layers": the modules and packages of each layer, lowest first,
    as dotted names (`app/core/` -> app.core, `app/celery.py` -> app.celery)."""
    listed = section(DESIGN_MD.read_text(encoding="utf-8"), "### Layers")
    found = []
    for line in re.findall(r"^\d+\. (.*)$", listed, flags=re.M):
        paths = re.findall(r"`(app/[\w/.]+)`", line)
        found.append(tuple(p.removesuffix(".py").strip("/").replace("/", ".") for p in paths))
    return found


def layer_of(module: str, order: list[tuple[str, ...]]) -> int | None:
    for index, names in enumerate(order):
        if any(module == name or module.startswith(name + ".") for name in names):
            return index
    return None


def app_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of an app module in `path`, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "app":  # `from app import metrics`
                found += [(node.lineno, f"app.{alias.name}") for alias in node.names]
            elif node.module.startswith("app."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("app.")]
    return found


def test_no_module_imports_from_a_layer_above_its_own():
    order = layers()
    assert len(order) >= 10 and order[0] == ("app.core",), "docs/design.md 'Layers' no longer reads"
    upward, unplaced = [], []
    for path in tracked_text_files(("app/",)):
        if path.suffix != ".py":
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if module == "app":
            continue  # the package itself: its version and nothing else
        own = layer_of(module, order)
        if own is None:
            unplaced.append(module)
            continue
        for line, imported in app_imports(path):
            if imported == "app.__version__":
                continue
            theirs = layer_of(imported, order)
            if theirs is None or theirs > own:
                upward.append(f"{module}:{line} imports {imported}")
    assert not unplaced, f"modules in no layer of docs/design.md 'Layers': {unplaced}"
    assert not upward, "imports from a layer above:\n" + "\n".join(upward)


# --- no measurement diary in app/ ---------------------------------------------------

# Figures live in the docs: a comment or docstring in app/ states the contract and the
# reason, not a dated run, a bench reference, a profiler's share or a timing. The hot
# path's modules (the bulk writes, the claim, the relay, a run's lifecycle, the engine)
# keep theirs until their SQL is gathered in one place; this covers every other module.
MEASUREMENT_NOTE = re.compile(
    r"\bbench(?:/README\.md|/results|\.[a-z_]+)"  # bench/README.md, bench.dispatch
    r"|\bpy-spy\b|\bcProfile\b|\bCPU-ms\b"
    r"|\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?(?:us|µs)\b"  # a timing in microseconds
    r"|\b\d+(?:\.\d+)?% of\b"  # a profile's share
)
DATE = re.compile(r"\b(20\d\d)-(\d\d)-(\d\d)\b(?![T ]\d\d:)")


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                found.append((node.body[0].lineno, docstring))
    return found


def measurement_notes(text: str) -> list[str]:
    """The measurement notes in a comment or docstring. A date is one unless it is an
    example: an instant with its time of day, or a day that does not exist (bad input)."""
    notes = [match.group() for match in MEASUREMENT_NOTE.finditer(text)]
    for match in DATE.finditer(text):
        try:
            date(*(int(part) for part in match.groups()))
        except ValueError:
            continue
        notes.append(match.group())
    return notes


def cleaned_modules() -> list[Path]:
    return [path for path in tracked_text_files(("app/", "celeryconfig.py")) if path.suffix == ".py"]


def test_comments_and_docstrings_in_app_hold_no_measurement_notes():
    modules = cleaned_modules()
    assert len(modules) > 50, "found too few modules: the check would pass vacuously"
    found = [
        f"{path.relative_to(ROOT)}:{line}: {note}"
        for path in modules
        for line, text in comments_and_docstrings(path.read_text(encoding="utf-8"))
        for note in measurement_notes(text)
    ]
    assert not found, "measurement notes belong in the docs:\n" + "\n".join(found)


def test_the_note_finder_finds_what_it_is_for():
    assert measurement_notes("(bench/README.md, 2026-12-05)") == ["bench/README.md", "2026-12-05"]
    assert measurement_notes("13 us a run in bench.dispatch, 43% of the CPU (py-spy)") == [
        "13 us",
        "bench.dispatch",
        "43% of",
        "py-spy",
    ]
    assert measurement_notes("such as 2026-12-01T00:00:00Z; 2026-02-30 is refused") == []


def test_module_docstrings_in_app_are_at_most_25_lines():
    long = []
    for path in cleaned_modules():
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False) or ""
        if len(docstring.splitlines()) > 25:
            long.append(f"{path.relative_to(ROOT)}: {len(docstring.splitlines())} lines")
    assert not long, "module docstrings over 25 lines (the rest belongs in docs/design.md):\n" + "\n".join(
        long
    )
