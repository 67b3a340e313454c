"""What `punctual dev` prints once the stack is up (pure text).

The URL, the dev owner's API key and signing secret, and two examples to copy and
paste that schedule a call of the built-in echo target: the SDK one fires once,
five seconds after it runs, and prints the run history; the curl one creates a
job that fires every ten seconds. The examples carry the real URL and key; each
is a block of lines indented by two spaces after its heading line, which the
acceptance tests take out of the output and run as they are.
"""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path

from app.services.owners import NewKey

SDK_HEADING = "Schedule a call of the echo target 5 s from now, with the SDK (paste it into a shell):"
CURL_HEADING = "Or with curl: a job that calls the echo target every 10 s (cancel it with DELETE /jobs/<id>):"


def sdk_example(url: str, api_key: str) -> str:
    return textwrap.dedent(f"""\
        python - <<'EOF'
        import time
        from datetime import datetime, timedelta, timezone
        from punctual_client import Client

        with Client({json.dumps(url)}, {json.dumps(api_key)}) as punctual:
            job = punctual.create_job(
                "hello",
                target={{"type": "webhook", "url": {json.dumps(url + "/dev/echo")}}},
                schedule={{"run_at": datetime.now(timezone.utc) + timedelta(seconds=5)}},
                payload={{"hello": "world"}},
            )
            print("job", job.id, "due at", job.next_run_at.isoformat())
            time.sleep(7)
            for run in punctual.list_runs(job.id).items:
                print("run", run.id, run.state, "started", run.lateness_ms, "ms after its due time")
        EOF""")


def curl_example(url: str, api_key: str) -> str:
    body = (
        '{"name": "every-10s", "target": {"type": "webhook", "url": "' + url + '/dev/echo"}, '
        '"schedule": {"interval_s": 10}}'
    )
    auth = shlex.quote(f"Authorization: Bearer {api_key}")
    return "\n".join(
        [
            f"curl -s -w '\\n' {url}/jobs -H {auth} -H 'Content-Type: application/json' \\",
            f"  -d {shlex.quote(body)}",
            f"curl -s -w '\\n' {url}/jobs/<id>/runs -H {auth}    # the run history, newest first",
            f"curl -s -w '\\n' {url}/dev/echo    # what the echo target received",
        ]
    )


def banner(url: str, key: NewKey, data_dir: Path, env_file: Path, ignored: tuple[str, ...] = ()) -> str:
    lines = [
        f"Punctual dev is up: the API, beat and one worker, with everything kept in {data_dir}",
        "",
        f"  URL             {url}",
        f"  API key         {key.api_key}",
        f"  Signing secret  {key.signing_secret}",
        f"  Echo target     {url}/dev/echo  (GET it to see what it received)",
        "",
        SDK_HEADING,
        "",
        textwrap.indent(sdk_example(url, key.api_key), "  "),
        "",
        CURL_HEADING,
        "",
        textwrap.indent(curl_example(url, key.api_key), "  "),
        "",
        f"In another shell, `. {shlex.quote(str(env_file))}` sets PUNCTUAL_URL and PUNCTUAL_API_KEY for",
        "`punctual jobs ...` and the SDK, and WEBHOOK_SIGNING_SECRET for a receiver's verify_signature.",
        "Loopback and private targets are allowed in dev mode.",
    ]
    if ignored:
        lines.append(f"Ignored in dev mode (the embedded defaults are used): {', '.join(ignored)}.")
    lines.append("Stop with Ctrl-C; the jobs and their history stay in the data dir for the next start.")
    return "\n".join(lines)


def example_block(output: str, heading: str) -> str:
    """The example printed under `heading` in `output`, un-indented (for tests)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.rstrip() == heading) + 1
    block = []
    for line in lines[start:]:
        if line.strip() and not line.startswith("  "):
            break
        block.append(line[2:])
    return "\n".join(block).strip("\n")
