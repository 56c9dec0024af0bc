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
    import os
    from workbench.running.calibration import DEFAULT_CALIB
    from workbench.core.errors import WorkbenchError
    from workbench.running.imatrix import collect, write_imatrix_gguf
    model = open_model_arg(args)
    from workbench.running.inputs import validate_calibration_inputs
    validate_calibration_inputs(model, args.calib)       # before the network is built
    if os.path.abspath(args.output) in (os.path.abspath(model.path),
                                        os.path.abspath(args.calib or DEFAULT_CALIB)):
        raise WorkbenchError("refusing to write over an input", path=args.output)
    stats, n, longest = drive(collect(model, args.calib, args.samples))
    write_imatrix_gguf(model, stats, args.output, os.path.basename(args.calib or DEFAULT_CALIB),
                       n, longest)
    print(f"wrote {args.output}: {len(stats)} tensors, {n} samples")
    return 0
