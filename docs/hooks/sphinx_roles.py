"""Griffe extension: spherenet's docstrings, written with Sphinx roles, read as Markdown.

``:class:`~spherenet.optim.RiemannianAdam``` becomes ```RiemannianAdam``` (code font), a
trailing ``::`` that opens a literal block becomes ``:`` (the indented block below it is
Markdown's code block already), and double backticks stay (Markdown reads them as code).
"""

from __future__ import annotations

import re

from griffe import Extension

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|obj|exc|const):`(~?)([^`]+)`")
LITERAL = re.compile(r"::$", re.M)


def _role(match: re.Match) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def markdown(text: str) -> str:
    return LITERAL.sub(":", ROLE.sub(_role, text))


class SphinxRoles(Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
