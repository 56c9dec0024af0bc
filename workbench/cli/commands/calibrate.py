"""`quant-workbench calibrate [MODEL] --calib FILE -o IMATRIX.gguf`."""

from __future__ import annotations

from workbench.cli.common import add_model_arg, drive, open_model_arg


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="activation statistics as a llama.cpp imatrix GGUF")
    add_model_arg(p)
    p.add_argument("--calib", help="calibration inputs (default: resources/calibration.txt)")
    p.add_argument("--samples", type=int, default=None)
    p.add_argument("-o", "--output", required=True)
    from workbench.cli.common import add_device_arg
    add_device_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from workbench.api import calibrate
    info = calibrate(open_model_arg(args), args.output, calib=args.calib, samples=args.samples,
                     driver=drive)
    print(f"wrote {info['output']}: {info['tensors']} tensors, {info['samples']} samples")
    return 0
