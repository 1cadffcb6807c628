"""Capacity planning: the fitted cost model of a cluster's collectives and the plan built from it and the training
strategies' formulas.

``costmodel`` (the model: scaling formulas, the layout rule, predict with an interval), ``fitting`` (fit it to a
run's points; ``commbench fit``), ``costmodel_io`` (its JSON file), ``options`` (the strategies, precisions and
optimizers a plan crosses), ``pricing`` (memory, bytes and time of one option), ``plan`` (validate, build the grid,
rank; ``commbench.plan``) and ``plan_render`` (plan.csv/md/html and the console table).
"""
