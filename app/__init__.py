"""The Qt desktop app: thin views over `workbench` (DESIGN.md examples 5-8, 10).

Nothing here computes over a tensor on the GUI thread: every number shown comes from a
`workbench` (or `kernels`) call run by :mod:`app.workers` on the compute thread.
"""
