"""docs/api.md is the public API's docstrings and signatures as they are (issue 29 item 5)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import skiplock

ROOT = Path(__file__).resolve().parent.parent


def test_docs_api_md_is_generated_from_the_current_docstrings():
    out = subprocess.run([sys.executable, "scripts/api_reference.py", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_every_public_name_has_a_section_and_a_docstring_of_its_own():
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for name in skiplock.__all__:
        assert f"## `{name}`" in page
        doc = getattr(skiplock, name).__doc__ or ""
        assert doc.strip() and not doc.startswith(f"{name}("), f"{name} has no docstring of its own"
