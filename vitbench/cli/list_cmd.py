"""``vitbench list methods|scorers|models|families|tasks``."""
from __future__ import annotations

import argparse
import fnmatch
import textwrap

from vitbench.catalog import METHOD_KINDS, MethodSpec
from vitbench.host import get_host
from vitbench.task import option_flags
from vitbench.tasks.embedded import DEFAULT_MODEL, EMBEDDED_MODELS

KINDS = ("methods", "scorers", "models", "families", "tasks")
#: the widest line a listing prints (a terminal's 100 columns)
WIDTH = 100


def trains_in_words(spec: MethodSpec) -> str:
    """Whether ``spec``'s method fine-tunes before it is measured, as the listings say it."""
    if spec.needs_training:
        return "learnable: fine-tuned before measuring"
    if spec.trains_when:
        return f"training-free; fine-tuned when {spec.trains_when} > 0"
    return "training-free"


def fit(text: str, indent: int = 0, width: int = WIDTH) -> str:
    """``text`` wrapped to ``width`` columns, continuation lines indented 4 more than the first."""
    lead = " " * indent
    return textwrap.fill(text, width=width, initial_indent=lead, subsequent_indent=lead + "    ",
                         break_on_hyphens=False)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="list registered methods, scorers, models, families or tasks")
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--filter", default=None, help="only models matching this wildcard (e.g. 'deit_*')")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    host = get_host()  # listings read host.specs: a clashed name is listed (its keeper's), not refused
    if args.kind == "methods":
        specs = [spec for _, spec in sorted(host.specs("methods").items())]
        for kind in METHOD_KINDS:  # grouped by what they reduce (MethodSpec.kind)
            group = [spec for spec in specs if spec.kind == kind]
            if not group:
                continue
            print(f"{kind}:")
            for spec in group:
                extra = f" (aliases: {', '.join(spec.aliases)})" if spec.aliases else ""
                trains = trains_in_words(spec)
                knob = (f"; budget knob: {spec.budget.param} ({spec.budget.mode})" if spec.budget is not None
                        else "; not matchable (no budget knob)")
                print(fit(f"{spec.name}{extra}  [{trains}; runs on: {', '.join(host.families_for(spec))}; needs: "
                          f"{', '.join(sorted(spec.needs))}; plugin: "
                          f"{host.owner('methods', spec.name)}{knob}]  {spec.description}", indent=2))
    elif args.kind == "scorers":
        for name, spec in sorted(host.specs("scorers").items()):
            print(fit(f"{name}  [plugin: {host.owner('scorers', name)}]  {spec.description}"))
    elif args.kind == "families":
        for name, spec in sorted(host.specs("families").items()):
            print(fit(f"{name}  [plugin: {host.owner('families', name)}; models: "
                      f"{', '.join(spec.model_patterns)}; provides: {', '.join(sorted(spec.provides))}]  "
                      f"{spec.description}"))
    elif args.kind == "tasks":
        for name, spec in sorted(host.specs("tasks").items()):
            control = "; control row" if spec.info.control else ""
            flags = option_flags(spec)
            options = f"; options: {', '.join(flags)}" if flags else ""
            print(fit(f"{name}  [plugin: {host.owner('tasks', name)}; metrics: {', '.join(spec.info.metrics)}; budgets "
                      f"matched on the {spec.info.counts}'s GMACs{control}{options}]  {spec.info.description}"))
    else:
        # torch/pandas: when this command runs; `vitbench --help` stays light
        from vitbench.tasks.model_names import accepted_models

        accepted = accepted_models()
        names = [n for n in accepted if args.filter is None or fnmatch.fnmatch(n, args.filter)]
        shown = f" matching {args.filter!r}" if args.filter else ""
        print(fit(f"# {len(names)} timm models{shown} `run` accepts (families' patterns less what they refuse); "
                  f"filter: --filter 'deit*'"))
        for name, summary in EMBEDDED_MODELS.items():
            if args.filter is None or fnmatch.fnmatch(name, args.filter):
                print(fit(f"{name}  (embedded{', the default' if name == DEFAULT_MODEL else ''}: {summary})"))
        for name in names:
            print(name)
    return 0
