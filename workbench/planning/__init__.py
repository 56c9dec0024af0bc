"""Planning: deciding a scheme per tensor. Sensitivity measures, the budget, the allocator and its
method weighing, the frontier, naming conventions, scheme choice, estimates, the model map and diff.
"""
