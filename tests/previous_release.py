"""The previous release of Skiplock, installed in a virtualenv of its own (tests/test_upgrade.py).

The previous release is the highest tag `vX.Y.Z` of this repository below the version in
pyproject.toml (so the test keeps working once the current version is tagged too). Its source
is `git archive <tag>`; it is installed the way a user installs a release, `pip install <source>`
(hatchling builds the wheel, its dependencies come from the package index or pip's cache), with
this venv's pip into a `python -m venv --without-pip` environment. The result is kept in
.venv/releases/<tag>-<commit> (a venv's scripts name their own path, so it is built in place,
under a lock, and marked complete at the end): later runs on the same checkout reuse it, and a
fresh clone (CI) builds it once, which took 30-45 s on the project's machine (docs/reliability.md,
"Upgrades").
"""

from __future__ import annotations

import fcntl
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASES = ROOT / ".venv" / "releases"
_TAG = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")


class NoPreviousRelease(LookupError):
    pass


@dataclass(frozen=True)
class Release:
    tag: str
    commit: str
    venv: Path
    install_seconds: float | None  # None: reused from an earlier run

    @property
    def version(self) -> str:
        return self.tag[1:]

    @property
    def skiplock(self) -> str:
        return str(self.venv / "bin" / "skiplock")

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")


def current_version() -> tuple[int, ...]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return tuple(int(part) for part in tomllib.loads(text)["project"]["version"].split("."))


def _git(*args: str) -> str:
    result = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise NoPreviousRelease(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


# Each release's commit, as its tag names it. A clone made without tags (some CI checkouts)
# still finds the previous release by its commit, which is in the history.
RELEASE_COMMITS = {"v0.1.0": "5f2668f5613330c6c6b4d12ed9cf6a0479fec262"}


def previous_tag() -> tuple[str, str]:
    """(tag, commit) of the highest release tag below the current version: the clone's tags,
    and the releases recorded in RELEASE_COMMITS whose commit the clone has."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        raise NoPreviousRelease("not a git checkout: the previous release is found by its tag")
    current = current_version()
    tags = []
    known = set(_git("tag", "--list", "v*").split())
    for tag, commit in RELEASE_COMMITS.items():
        if tag not in known and subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                                               capture_output=True).returncode == 0:
            known.add(tag)
    for tag in known:
        match = _TAG.match(tag)
        if match and tuple(int(g) for g in match.groups()) < current:
            tags.append((tuple(int(g) for g in match.groups()), tag))
    if not tags:
        raise NoPreviousRelease(
            f"no tag vX.Y.Z below {'.'.join(map(str, current))} in this clone (`git fetch --tags`?)"
        )
    tag = max(tags)[1]
    if tag in RELEASE_COMMITS and _git("tag", "--list", tag).strip() != tag:
        return tag, RELEASE_COMMITS[tag]
    return tag, _git("rev-parse", f"{tag}^{{commit}}").strip()


def install(tag: str, commit: str) -> Release:
    """The release's venv, built now or found complete from an earlier run."""
    RELEASES.mkdir(parents=True, exist_ok=True)
    dest = RELEASES / f"{tag}-{commit[:12]}"
    stamp = dest / ".complete"
    with open(RELEASES / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions at once: the second waits, then reuses
        if stamp.exists():
            return Release(tag, commit, dest, None)
        shutil.rmtree(dest, ignore_errors=True)  # a build that died halfway
        started = time.monotonic()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit],
                                 capture_output=True, check=True, timeout=120).stdout
        with tempfile.TemporaryDirectory(prefix="skiplock-release-") as work:
            source = Path(work) / "src"
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(source, filter="data")
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
            result = subprocess.run(
                [sys.executable, "-m", "pip", "--python", str(dest / "bin" / "python"), "install", "-q",
                 "--disable-pip-version-check", str(source)],
                capture_output=True, text=True, timeout=600,
            )
            if result.returncode != 0:
                raise RuntimeError(f"pip install of {tag} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        seconds = time.monotonic() - started
        stamp.write_text(f"{tag} {commit} installed in {seconds:.1f}s\n")
        return Release(tag, commit, dest, seconds)
