"""``vitbench plugins [--json]``: every plugin, what it registered, load failures and name clashes."""
from __future__ import annotations

import argparse
import json

from vitbench.host import SINGULAR, get_host


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plugins", help="list loaded plugins, what each registered, failures and name clashes")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    info = get_host().describe()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for plugin in info["plugins"]:
        what = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in plugin["registered"].items() if names)
        print(f"{plugin['name']}  ({plugin['distribution']} {plugin['version']})  {what or 'nothing registered'}")
    for failure in info["failures"]:
        print(f"FAILED {failure['name']}  ({failure['distribution']})  {failure['error']}")
    for clash in info["clashes"]:
        print(f"CLASH {SINGULAR[clash['kind']]} {clash['name']!r}  kept by plugin {clash['kept_by']!r}, left out of "
              f"plugin {clash['refused_from']!r} (asking for it is an error)")
    if info["skipped"]:
        print(f"skipped by VITBENCH_PLUGINS / VITBENCH_DISABLE_PLUGINS: {', '.join(info['skipped'])}")
    return 0
