"""Ship a fine-tuned method's weights from a result store: the method state of a fine-tuned
run's checkpoint, with the settings that made it, into the plugin's weights folder
(:mod:`vitbench.train.shipped`; docs/measuring.md, "Shipped fine-tuned weights").

    python scripts/ship_method_weights.py STORE METHOD NAME

STORE is the ``--out`` folder of a ``vitbench run`` on an embedded model whose METHOD row was
fine-tuned there (not loaded); NAME the entry's file stem."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from vitbench.core.params import training_params
from vitbench.host import get_host
from vitbench.host.apply import apply
from vitbench.results import ResultStore
from vitbench.tasks.cls.default_model import load_default_model
from vitbench.tasks.cls.weights_from import default_model_sha256
from vitbench.train import load_trained
from vitbench.train.shipped import ENV_SHIPPED, SETTINGS, write_shipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("method")
    parser.add_argument("name")
    args = parser.parse_args(argv)
    spec = get_host().method(args.method)
    rows = [r for r in ResultStore(Path(args.store)).records()
            if r.get("method") == spec.name and r.get("status") == "ok" and r.get("trained") == "fine-tuned"]
    if not rows:
        print(f"ship: no {spec.name} row fine-tuned in {args.store}", file=sys.stderr)
        return 2
    rec = rows[-1]
    command = (rec.get("env") or {}).get("command")
    command = shlex.join(map(str, command)) if isinstance(command, (list, tuple)) else str(command)
    model = apply(load_default_model(model=rec["model"])[0], spec.name, **rec["params"])
    load_trained(model, rec["checkpoint_path"])
    settings = {"model": rec["model"], "model_sha256": default_model_sha256(rec["model"]), "method": spec.name,
                "params": dict(sorted(training_params(spec.params, rec["params"]).items())),
                "train_limit": rec["train_images"],
                "train_backbone": False, "seed": rec["seed"], "precision": rec["train_precision"],
                "data": rec["data"]}
    assert set(settings) == set(SETTINGS)
    stage = rec["train_stages"][-1]
    meta = {"trained": f"trained {stage['epochs']} epoch{'s' if stage['epochs'] != 1 else ''} on "
                       f"{rec['train_images']:,} images",
            "command": f"{ENV_SHIPPED}=off {command}",
            "ship_command": shlex.join(["python", "scripts/ship_method_weights.py", *sys.argv[1:]]),
            "train_s": rec["train_s"], "train_images": rec["train_images"],
            "trainable_params": rec["trainable_params"], "train_stages": rec["train_stages"],
            "top1_pct": rec.get("top1_pct"), "gmacs": rec.get("gmacs"), "spec_id": rec["spec_id"],
            "revision": (rec.get("env") or {}).get("git_rev")}
    folder = Path(__file__).resolve().parents[1] / "plugins" / spec.name / "weights"
    path = write_shipped(model, folder, args.name, settings, meta)
    print(json.dumps({"wrote": str(path), **meta["train_stages"][-1]}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
