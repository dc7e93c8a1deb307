"""``vitbench describe METHOD``: one method's card, read from its registered spec and params
dataclass (each field's meaning is its ``metadata["help"]``, :func:`vitbench.catalog.param_docs`).
Imports no torch: the spec's ``build`` reference stays unresolved."""
from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap

from vitbench.catalog import MethodSpec, param_docs
from vitbench.cli.list_cmd import WIDTH, trains_in_words
from vitbench.errors import choices_error
from vitbench.host import get_host

NO_HELP = "(no description)"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("describe", help="explain one method: what it does, its parameters and their defaults")
    p.add_argument("method", help="a method's name or alias (vitbench list methods)")
    p.set_defaults(handler=run)


def find_method(name: str) -> MethodSpec:
    """The listed spec registered as ``name`` or under that alias; an unknown name is an error
    listing the valid names."""
    specs = get_host().specs("methods")
    if name in specs:
        return specs[name]
    for spec in specs.values():
        if name in spec.aliases:
            return spec
    raise choices_error("method", name, [*specs, *(a for s in specs.values() for a in s.aliases)])


def source_line(spec: MethodSpec) -> str:
    """The first paragraph of the docstring of the module that defines the method's params (built-in
    plugins name the paper and the docs/methods.md section there); ``""`` when there is none."""
    doc = getattr(sys.modules.get(spec.params.__module__), "__doc__", None) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def card(spec: MethodSpec) -> list[str]:
    """The lines ``vitbench describe`` prints for ``spec``."""
    lines = [spec.name]
    if spec.aliases:
        lines.append(f"  aliases:   {', '.join(spec.aliases)}")
    lines.append(f"  kind:      {spec.kind}")
    lines.append(f"  about:     {spec.description or NO_HELP}")
    source = source_line(spec)
    if source:
        lines.append(f"  source:    {source}")
    lines.append(f"  runs on:   {', '.join(get_host().families_for(spec))} (needs {', '.join(sorted(spec.needs))})")
    lines.append("  training:  " + trains_in_words(spec))
    if spec.budget is None:
        lines.append("  budget:    none (not matchable with --match-gmacs)")
    else:
        fewer = "fewer" if spec.budget.larger_means == "less" else "more"
        lines.append(f"  budget:    {spec.budget.param} (a larger value gives {fewer} GMACs; --match-gmacs "
                     f"{'searches it' if spec.budget.mode == 'search' else 'sets it to the fraction'})")
    docs = param_docs(spec.params)
    lines.append("  parameters (--param " + f"{spec.name}.NAME=VALUE):" if docs else "  parameters: none")
    for doc in docs:
        default = "(required)" if doc.default is dataclasses.MISSING else repr(doc.default)
        lines.append(f"    {doc.name}: {doc.type} = {default}")
        lines.append(f"        {doc.help or NO_HELP}")
        if doc.limits:
            lines.append(f"        valid: {doc.limits}")
    return lines


def _wrap(line: str) -> str:
    """``line`` wrapped to :data:`~vitbench.cli.list_cmd.WIDTH`, continuations under its text."""
    text = line.lstrip()
    lead = len(line) - len(text)
    key, sep, rest = text.partition(":  ")
    hang = lead + len(key) + len(sep) + len(rest) - len(rest.lstrip()) if sep else lead
    return textwrap.fill(line, width=WIDTH, subsequent_indent=" " * hang, break_on_hyphens=False,
                         drop_whitespace=True, replace_whitespace=False)


def run(args: argparse.Namespace) -> int:
    print("\n".join(_wrap(line) for line in card(find_method(args.method))))
    return 0
