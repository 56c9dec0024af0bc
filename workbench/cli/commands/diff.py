"""`quant-workbench diff A B [--source FLOAT] [--no-check] [--calib FILE] [--samples N] [--json]`:
compare two quantizations (plans or quantized files) tensor by tensor (workbench.planning.diff)."""

from __future__ import annotations

from workbench.cli.common import drive, fmt_bytes, print_json


def register(sub) -> None:
    p = sub.add_parser("diff", help="compare two quantizations (plans or quantized files: GGUF, "
                                    "quantized safetensors, compressed-tensors) tensor by tensor")
    p.add_argument("a", metavar="A", help="plan JSON or quantized file")
    p.add_argument("b", metavar="B", help="plan JSON or quantized file")
    p.add_argument("--source", metavar="FLOAT",
                   help="the float model both quantize: errors against it, plans resolved on it, "
                        "and (when runnable) the model-level figures of `check` for both")
    p.add_argument("--no-check", action="store_true",
                   help="skip the model-level figures even when the source is runnable")
    p.add_argument("--calib", help="inputs for the model-level figures (default: "
                                   "resources/calibration.txt)")
    p.add_argument("--samples", type=int, default=None, help="use the first N samples")
    p.add_argument("--all", action="store_true",
                   help="list every tensor (default: only those whose types differ, plus totals)")
    p.add_argument("--json", action="store_true", help="machine-readable output (every tensor)")
    p.set_defaults(func=run)


def _fmt(v, spec=".4g"):
    return "-" if v is None else format(v, spec)


def run(args) -> int:
    from workbench.api import diff_quantizations
    res = diff_quantizations(args.a, args.b, source=args.source, check=not args.no_check,
                             calib=args.calib, samples=args.samples,
                             driver=lambda job: drive(job, quiet=args.json))
    if args.json:
        print_json(res)
        return 0
    print(f"A: {res['a']['path']} ({res['a']['kind']})")
    print(f"B: {res['b']['path']} ({res['b']['kind']})")
    if res["source"]:
        print(f"source: {res['source']}")
    rows = res["tensors"] if args.all else [
        r for r in res["tensors"] if not r["same_type"] and (r["a"] or r["b"])]
    if rows:
        w = min(56, max(len(r["name"]) for r in rows))
        print(f"\n{'tensor':<{w}}  {'A type':>10} {'A bpw':>7} {'A rel_rmse':>10}   "
              f"{'B type':>10} {'B bpw':>7} {'B rel_rmse':>10}")
        for r in rows:
            cells = []
            for side in (r["a"], r["b"]):
                if side is None:
                    cells.append(f"{'(none)':>10} {'':>7} {'':>10}")
                else:
                    cells.append(f"{side['type']:>10} {side['bits_per_weight']:7.3f} "
                                 f"{_fmt(side['rel_rmse']):>10}")
            print(f"{r['name'][-w:]:<{w}}  {cells[0]}   {cells[1]}")
    t = res["totals"]
    print(f"\n{t['matched']} tensors matched ({t['same_type']} same type, "
          f"{t['different_type']} different), {t['only_a']} only in A, {t['only_b']} only in B"
          + ("" if args.all else "; --all lists every tensor"))
    for tag in ("a", "b"):
        s = t[tag]
        err = "" if s["rel_rmse"] is None else \
            f", rel_rmse {s['rel_rmse']:.4g}, SQNR {_fmt(s['sqnr_db'], '.2f')} dB"
        print(f"{tag.upper()}: {s['tensors']} tensors, {fmt_bytes(s['bytes'])}, "
              f"{s['bits_per_weight']:.3f} bits/weight{err}")
    if t["only_a"] or t["only_b"]:
        for tag in ("a", "b"):
            s = t[f"{tag}_matched"]
            err = "" if s["rel_rmse"] is None else \
                f", rel_rmse {s['rel_rmse']:.4g}, SQNR {_fmt(s['sqnr_db'], '.2f')} dB"
            print(f"{tag.upper()} on the {t['matched']} tensors both hold: {fmt_bytes(s['bytes'])}, "
                  f"{s['bits_per_weight']:.3f} bits/weight{err}")
    chk = res.get("check")
    if chk:
        if "skipped" in chk:
            print(f"model-level check skipped: {chk['skipped']}")
        else:
            for tag in ("a", "b"):
                c = chk[tag]
                figs = ", ".join(f"{k} {v:.6g}" for k, v in c.items()
                                 if k not in ("model_kind", "samples", "tokens")
                                 and isinstance(v, (int, float)))
                print(f"check {tag.upper()} ({c['model_kind']}, {c['samples']} samples): {figs}")
    return 0
