"""Write a config, synthetic weights and test vectors for one preset, and print detections.

    python -m examples.bevformer.generate --config tiny --out out/bevformer_tiny [--seed 0]

Files: config.json, weights.safetensors, test_vectors.safetensors (first frame, no prev_bev)
and test_vectors_prev.safetensors (with prev_bev). Prints forward times and the decoded
detections (seed-notebook format).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "examples.bevformer"

from .config import CONFIGS  # noqa: E402
from .decode import decode, print_detections  # noqa: E402
from .inputs import make_inputs, save_test_vectors  # noqa: E402
from .weights import build_model, save_checkpoint  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="test", choices=sorted(CONFIGS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = CONFIGS[args.config]

    t0 = time.perf_counter()
    model = build_model(cfg, args.seed)
    print(f"[{cfg.name}] model built in {time.perf_counter() - t0:.2f}s, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.3f}M parameters")
    results = {}
    for with_prev in (False, True):
        inp = make_inputs(cfg, args.seed, with_prev_bev=with_prev)
        with torch.no_grad():
            t0 = time.perf_counter()
            cls, bbox, bev = model(inp["img"], inp["lidar2img"], inp["can_bus"], inp.get("prev_bev"),
                                   return_bev=True)
            dt = time.perf_counter() - t0
        tag = "prev_bev" if with_prev else "first frame"
        print(f"[{cfg.name}] forward ({tag}): {dt:.2f}s")
        det = decode(cls, bbox, cfg)
        print_detections(det)
        results[with_prev] = (inp, cls, bbox)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
        save_checkpoint(args.out / "weights.safetensors", model.state_dict(),
                        metadata={"config": cfg.name, "seed": str(args.seed), "synthetic": "true"})
        for with_prev, name in ((False, "test_vectors.safetensors"), (True, "test_vectors_prev.safetensors")):
            inp, cls, bbox = results[with_prev]
            save_test_vectors(args.out / name, inp, (cls, bbox),
                              metadata={"config": cfg.name, "seed": str(args.seed)})
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
