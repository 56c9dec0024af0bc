"""The base every other package stands on: errors, atomic writes, input limits, optional
dependencies, progress and cancellation, output paths, memory pages and spill files, name patterns.

Imports nothing from the rest of workbench.
"""
