"""URL rules whose builders are compiled on first use.

Werkzeug compiles two small Python functions per URL rule when the rule is added (one builds
the URL with the rule's defaults, one appends unknown arguments as a query string): generated
AST, `compile`, `exec`. The console has close to 300 routes (every page, its fragments and its
JSON twin), so that is most of `create_app`'s time: 0.1 s on a quiet machine, 0.3 s on a loaded
one, paid by every gunicorn worker, every `skiplock serve` and every test's app. A page builds
URLs for a few dozen endpoints; `LazyBuildRule` compiles a rule's builder the first time
`url_for` needs it and keeps it, so an app pays only for the rules it links to.

Matching is untouched: Werkzeug's matcher reads the rule's parsed parts, which `compile`
still computes when the rule is added. This leans on one private method of Werkzeug's `Rule`
(`_compile_builder`, which returns the builder function taking the rule as its first
argument); tests/test_web_core.py builds URLs of every kind of rule, so a Werkzeug that changes
it fails there, not in production.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from werkzeug.routing import Rule


class LazyBuildRule(Rule):
    def _compile_builder(self, append_unknown: bool = True) -> Callable[..., tuple[str, str]]:
        compile_now = super()._compile_builder
        compiled: list[Callable[..., tuple[str, str]]] = []

        def build(rule: Rule, *args: Any, **kwargs: Any) -> tuple[str, str]:
            if not compiled:  # a race compiles it twice, both results are the same
                compiled.append(compile_now(append_unknown))
            return compiled[0](rule, *args, **kwargs)

        return build
