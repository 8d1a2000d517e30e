"""Every bash and python block of README.md runs as written, in order, in a fresh folder.

A block may be marked by an HTML comment on the line before it, `<!-- readme-test: KIND ... -->`:

- unmarked: run (bash through `bash -euo pipefail`, python in this process), from the folder;
- `install`: run without its `pip install` lines (this test runs inside the installed checkout);
- `ci`: the test command; checked to be the command `.ci/run` runs, not run again here;
- `server`: a long-running `dpsql serve`; started with `--port` of a free port, waited for,
  stopped at the end;
- `client`: run against that server, with the README's port 5433 replaced by its port.

HOME is the folder, so `~/.dpsql` (the demo's ledger, the shell's history) starts empty.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
KINDS = {"run", "install", "ci", "server", "client"}
_BLOCK = re.compile(
    r"(?:<!-- readme-test: (?P<kind>[a-z]+)[^>]*-->\n)?```(?P<lang>[a-z]*)\n(?P<code>.*?)```",
    re.DOTALL,
)


@dataclass(frozen=True)
class Block:
    lang: str
    kind: str
    code: str


def readme_blocks() -> list[Block]:
    """The README's fenced blocks in order, each with its marker's kind (`run` if none)."""
    return [
        Block(m["lang"], m["kind"] or "run", m["code"]) for m in _BLOCK.finditer(README.read_text())
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, server: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"dpsql serve exited with {server.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.2)
    raise AssertionError(f"dpsql serve did not listen on port {port} within {timeout} s")


class _Runner:
    """Runs blocks in one folder; holds the server a `server` block started."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.env = {
            **os.environ,
            "HOME": str(folder),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.port: int | None = None
        self.server: subprocess.Popen | None = None
        self.skipped: list[str] = []

    def run(self, block: Block) -> None:
        code = block.code
        if block.kind == "install":
            code = "\n".join(line for line in code.splitlines() if not line.startswith("pip "))
        if block.kind == "client":
            assert self.port is not None, "a client block comes before the server block"
            code = code.replace("5433", str(self.port))
        if block.kind == "server":
            self._serve(code)
        elif block.lang == "python":
            exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
        elif block.lang == "bash":
            self._bash(code)

    def _bash(self, code: str) -> None:
        program = code.split()[0]
        if shutil.which(program, path=self.env["PATH"]) is None:
            self.skipped.append(f"{program} is not installed")
            return
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", code],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"{code}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"

    def _serve(self, code: str) -> None:
        self.port = _free_port()
        command = code.replace("\\\n", " ").strip() + f" --port {self.port}"
        self.server = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=self.folder,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_for_port(self.port, self.server)

    def stop(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGINT)
            try:
                self.server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Runner]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    r = _Runner(tmp_path)
    yield r
    r.stop()


def test_every_block_is_marked_with_a_known_kind() -> None:
    blocks = readme_blocks()
    assert {b.kind for b in blocks} <= KINDS
    runnable = [b for b in blocks if b.lang in ("bash", "python")]
    assert len(runnable) >= 8, "the quick start and the tour"
    assert [b.kind for b in runnable].count("server") == 1


def test_the_test_command_is_the_one_ci_runs() -> None:
    (ci,) = [b for b in readme_blocks() if b.kind == "ci"]
    command = ci.code.strip()
    ci_script = (REPO / ".ci" / "run").read_text()
    assert command.replace("pip install -e", "pip install --quiet -e") in ci_script


def test_every_linked_page_exists() -> None:
    links = re.findall(r"\]\(((?:docs/)?[A-Za-z-]+\.md)\)", README.read_text())
    assert links
    for link in links:
        assert (REPO / link).is_file(), link


def test_readme_blocks_run_as_written_on_the_demo(runner: _Runner) -> None:
    for block in readme_blocks():
        if block.lang in ("bash", "python") and block.kind != "ci":
            runner.run(block)
    # what the blocks promise to leave behind
    assert (runner.folder / "demo" / "census.duckdb").is_file()
    assert "max_rows_per_unit" in (runner.folder / "shop.yaml").read_text()
    if runner.skipped:
        pytest.skip(f"every other block ran; not run: {', '.join(runner.skipped)}")
