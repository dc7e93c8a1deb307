"""``vitbench cache [list|clear]``: the decoded evaluation images kept between runs
(:mod:`vitbench.data.decoded`): what each entry holds, its size and when a run last read it."""
from __future__ import annotations

import argparse
import time


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="list or clear the decoded evaluation images kept between runs")
    p.add_argument("action", nargs="?", default="list", choices=("list", "clear"),
                   help="list the entries (default) or remove them all")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # torch/pandas: when this command runs; `vitbench --help` stays light
    from vitbench.data.decoded import cache_limit_bytes, clear_entries, decoded_root, list_entries

    if args.action == "clear":
        removed = clear_entries()
        print(f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} "
              f"({sum(e.nbytes for e in removed) / 1e9:.2f} GB) from {decoded_root()}")
        return 0
    entries = list_entries()
    limit = cache_limit_bytes()
    print(f"{decoded_root()}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, "
          f"{sum(e.nbytes for e in entries) / 1e9:.2f} GB of {limit / 1e9:g} GB"
          + (" (off: $VITBENCH_DECODED_CACHE_GB=0)" if limit == 0 else ""))
    for e in reversed(entries):  # most recently used first
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
        print(f"  {e.key}  {e.images} images of {'x'.join(map(str, e.shape))}  {e.nbytes / 1e9:.2f} GB  "
              f"last read {used}  from {e.source}")
    return 0
