"""Jobs spread over a Dask cluster (or local worker processes): the executor and its tasks.

Lower packages never import this: evaluation and statistics take an executor as an argument and
call its methods.
"""
