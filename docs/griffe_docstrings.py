"""Docstrings written for ``help()`` and doctest, shown as Markdown in the API reference.

lazyseq's docstrings use reStructuredText's small vocabulary: doctest blocks
(``>>>`` lines and their output, up to a blank line) and roles such as
``:func:`~lazyseq.batch```. This griffe extension, run by mkdocstrings while the
site is built, fences the doctest blocks as Python console code and turns
``:func:``, ``:class:``, ``:meth:``, ``:attr:`` and ``:exc:`` roles into
cross-references, so a role naming nothing documented fails the strict build.
``:mod:`` roles name internal modules, which the reference does not document:
they become code.

It also makes the documented tree match what Python sees: where a package
exports a function under the name of the module defining it
(``lazyseq.evaluate``, ``lazyseq.rng``, ``lazyseq.torch.predict``), griffe keeps
the module under that name; the extension puts the function there.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(func|class|meth|attr|exc|mod|data|obj):`(~?)([\w.]+)`")
FENCE = "```"


def fence_doctests(text: str) -> str:
    """Wrap each doctest block (from a ``>>>`` line up to the next blank line) in a ``pycon`` code fence."""
    lines, out, inside, in_fence = text.splitlines(), [], False, False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(FENCE):
            in_fence = not in_fence
        if not inside and not in_fence and stripped.startswith(">>>"):
            out.append(FENCE + "pycon")
            inside = True
        elif inside and not stripped:
            out.append(FENCE)
            inside = False
        out.append(line)
    if inside:
        out.append(FENCE)
    return "\n".join(out)


def resolve(obj: griffe.Object, name: str) -> str:
    """The full path of ``name`` as written in a docstring of ``obj``: dotted names as they are, others in scope."""
    if "." in name:
        return name
    scope: Any = obj
    while scope is not None:
        if name in scope.members:
            return scope.members[name].path
        scope = scope.parent
    return name  # left as written: the cross-reference fails the build, naming it


def link_roles(obj: griffe.Object, text: str) -> str:
    """Roles as Markdown cross-references (``:mod:`` as code)."""

    def replace(match: re.Match) -> str:
        role, short, name = match.groups()
        shown = name.rsplit(".", 1)[-1] if short else name
        if role == "mod":
            return f"`{shown}`"
        return f"[`{shown}`][{resolve(obj, name)}]"

    return ROLE.sub(replace, text)


def unshadow(module: griffe.Module) -> None:
    """Exported names that Python binds to a function, where griffe kept the same-named submodule instead."""
    for name in module.exports or ():
        member = module.members.get(name)
        if member is not None and not member.is_alias and member.is_module:
            if name in member.members and not member.members[name].is_module:
                module.set_member(name, griffe.Alias(name, member.members[name], parent=module))
    for member in list(module.members.values()):
        if not member.is_alias and member.is_module:
            unshadow(member)


class RestDocstrings(griffe.Extension):
    """Rewrite every docstring once the package is loaded (roles then resolve against the whole tree)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self.rewrite(pkg, set())
        unshadow(pkg)

    def rewrite(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(link_roles(obj, obj.docstring.value))
        for member in obj.members.values():
            if not member.is_alias:
                self.rewrite(member, seen)
